"""The proxy on a unix socket (the microvm backend's guestfwd target): it decides, logs, and
its socket file is gone after close."""

from __future__ import annotations

import base64
import os
import socket

from corral.backends._plan import EgressSpec
from corral.egress import start_on_unix_socket


def test_the_proxy_serves_a_unix_socket_and_removes_it(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "egress.sock")
    spec = EgressSpec(allow=("example.test",), token="tok", netns="unix", socket=path)
    handle = start_on_unix_socket(spec)
    try:
        assert os.path.exists(path)
        auth = base64.b64encode(b"corral:tok").decode()
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(10)
            client.connect(path)
            client.sendall(
                f"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n"
                f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
            )
            answer = client.recv(4096)
        assert answer.startswith(b"HTTP/1.1 403")
    finally:
        attempts = handle.close()
    assert handle.error is None
    assert [(a.host, a.port, a.decision) for a in attempts] == [("evil.test", 443, "deny")]
    assert not os.path.exists(path)
