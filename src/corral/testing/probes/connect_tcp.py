"""connect_tcp.py HOST PORT: connect and send a line."""

import socket
import sys

try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        s.sendall(b"escaped\n")
except OSError as exc:
    print(f"BLOCKED {exc.errno} {exc.strerror}")
    sys.exit(1)
print("CONNECTED")
