"""connect_unix.py PATH: connect to a unix socket ("pair": use socketpair instead)."""

import socket
import sys

try:
    if sys.argv[1] == "pair":
        a, b = socket.socketpair()
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    else:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(sys.argv[1])
            s.sendall(b"escaped\n")
except OSError as exc:
    print(f"BLOCKED {exc.errno} {exc.strerror}")
    sys.exit(1)
print("CONNECTED")
