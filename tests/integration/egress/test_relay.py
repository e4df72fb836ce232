"""A tunnel relays and counts every byte, the ones pipelined after CONNECT included."""

from __future__ import annotations

import base64
import socket
from typing import Any

from .conftest import TOKEN, Upstream

AUTH = base64.b64encode(f"corral:{TOKEN}".encode()).decode()
SIZE = 8 << 20


def test_a_tunnel_moves_and_counts_every_byte(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=20)
    target = f"127.0.0.1:{upstream.port}"
    request = f"GET /bytes/{SIZE} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    # the request is pipelined after the CONNECT: early bytes go first, past the name check
    sock.sendall(
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
        f"Proxy-Authorization: Basic {AUTH}\r\n\r\n{request}".encode()
    )
    data = b""
    while chunk := sock.recv(1 << 20):
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 Connection established")
    assert len(body.partition(b"\r\n\r\n")[2]) == SIZE
    (attempt,) = proxy.close()
    assert attempt.bytes_up == len(request)
    assert attempt.bytes_down == len(body)
