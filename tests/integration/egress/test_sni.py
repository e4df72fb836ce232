"""The TLS name check on plain tunnels, with real TLS clients against a loopback proxy."""

from __future__ import annotations

import base64
import socket
import ssl
from typing import Any

import pytest

from .conftest import TOKEN, Upstream

AUTH = base64.b64encode(f"corral:{TOKEN}".encode()).decode()


def _connect(proxy: Any, target: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(
        f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
        f"Proxy-Authorization: Basic {AUTH}\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def _get(sock: socket.socket, cafile: str, server_hostname: str | None) -> bytes:
    context = ssl.create_default_context(cafile=cafile)
    if server_hostname is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with context.wrap_socket(sock, server_hostname=server_hostname) as tls:
        tls.sendall(b"GET /sni HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
        return data


def test_a_tunnel_whose_server_name_is_another_host_is_refused(
    make_proxy: Any, tls_upstream: Upstream, tls_files: tuple[str, str]
) -> None:
    port = tls_upstream.port
    proxy = make_proxy(
        allow=["example.test", "*.example.test", f"127.0.0.1:{port}"],
        hosts={"example.test": ["127.0.0.1"], "api.example.test": ["127.0.0.1"]},
    )
    # the name it asked for: served
    ok = _get(_connect(proxy, f"api.example.test:{port}"), tls_files[0], "api.example.test")
    assert ok.startswith(b"HTTP/1.1 200")
    # fronting: CONNECT to an allowed name, TLS to another (the certificate would even match)
    with pytest.raises((ssl.SSLError, OSError)):
        _get(_connect(proxy, f"api.example.test:{port}"), tls_files[0], "www.example.test")
    # no name at all in a tunnel to a name
    with pytest.raises((ssl.SSLError, OSError)):
        _get(_connect(proxy, f"api.example.test:{port}"), tls_files[0], None)
    # an IP-literal tunnel may omit the name; a name it gives must be allowed
    assert _get(_connect(proxy, f"127.0.0.1:{port}"), tls_files[0], None).startswith(b"HTTP/1.1")
    with pytest.raises((ssl.SSLError, OSError)):
        _get(_connect(proxy, f"127.0.0.1:{port}"), tls_files[0], "evil.test")
    attempts = proxy.close()
    refused = [a for a in attempts if a.decision == "deny"]
    assert [a.rule for a in refused] == [
        "TLS name check: the server name www.example.test is not the tunnel's host "
        "api.example.test (domain fronting)",
        "TLS name check: no server name (SNI) in a tunnel to api.example.test",
        "TLS name check: the server name evil.test in a tunnel to 127.0.0.1 is not in "
        "network.allow",
    ]
    # the fronted requests never reached the server
    assert [r["path"] for r in tls_upstream.seen.requests] == ["/sni", "/sni"]


def test_server_first_and_non_tls_tunnels_are_relayed(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    sock = _connect(proxy, f"127.0.0.1:{upstream.port}")
    sock.sendall(b"GET /plain HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    assert data.startswith(b"HTTP/1.1 200")
    # a server that speaks first (a banner) is relayed without waiting for the client
    banner = socket.socket()
    banner.bind(("127.0.0.1", 0))
    banner.listen(1)
    proxy2 = make_proxy(allow=[f"127.0.0.1:{banner.getsockname()[1]}"])
    client = _connect(proxy2, f"127.0.0.1:{banner.getsockname()[1]}")
    conn, _ = banner.accept()
    conn.sendall(b"220 hello\r\n")
    assert client.recv(100) == b"220 hello\r\n"
    client.sendall(b"QUIT\r\n")
    assert conn.recv(100) == b"QUIT\r\n"
    for s in (conn, client, banner):
        s.close()
