"""The egress proxy over real sockets on the host's loopback: HTTP CONNECT,
absolute-form HTTP, SOCKS5, credentials, refusals, and hostile clients.

(The same proxy inside a real sandbox's network namespace: test_sandbox.py.)
"""

from __future__ import annotations

import base64
import http.client
import os
import shutil
import socket
import subprocess
import threading
import time
from typing import Any

import pytest

from corral.egress._context import ProxyLimits

from .conftest import TOKEN, Upstream

CURL = shutil.which("curl")
needs_curl = pytest.mark.skipif(CURL is None, reason="curl is not installed (apt-get install curl)")
AUTH = "Proxy-Authorization: Basic " + base64.b64encode(f"corral:{TOKEN}".encode()).decode()


def curl(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    assert CURL is not None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}  # no proxy variables from the host
    return subprocess.run(
        [CURL, "-sS", "--max-time", "10", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def open_client(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_response(sock: socket.socket, method: str = "GET") -> http.client.HTTPResponse:
    response = http.client.HTTPResponse(sock, method=method)
    response.begin()
    return response


def exchange(port: int, head: str, method: str = "GET") -> tuple[http.client.HTTPResponse, bytes]:
    with open_client(port) as sock:
        sock.sendall(head.encode())
        response = read_response(sock, method)
        return response, response.read()


# ---------------------------------------------------------------- allowed traffic
@needs_curl
def test_forwards_absolute_form_http_to_an_allowed_host(
    make_proxy: Any, upstream: Upstream
) -> None:
    proxy = make_proxy(
        allow=["example.test", f"127.0.0.1:{upstream.port}"], hosts={"example.test": ["127.0.0.1"]}
    )
    result = curl("-x", proxy.url, f"http://example.test:{upstream.port}/hello.txt")
    assert result.stdout == "hello through the proxy\n", result.stderr
    request = upstream.seen.requests[-1]
    assert request["path"] == "/hello.txt"  # origin form upstream
    assert request["headers"]["host"] == f"example.test:{upstream.port}"
    assert "proxy-authorization" not in request["headers"]  # the credential never leaves
    (attempt,) = proxy.close()
    assert (attempt.host, attempt.port, attempt.method, attempt.decision) == (
        "example.test",
        upstream.port,
        "GET",
        "allow",
    )
    assert attempt.rule == "network.allow: example.test"
    assert attempt.bytes_up > 0
    assert attempt.bytes_down > len("hello through the proxy\n")


@needs_curl
def test_tunnels_https_with_connect(
    make_proxy: Any, tls_upstream: Upstream, tls_files: tuple[str, str]
) -> None:
    proxy = make_proxy(
        allow=["*.example.test", f"127.0.0.1:{tls_upstream.port}"],
        hosts={"api.example.test": ["127.0.0.1"]},
    )
    result = curl(
        "--cacert", tls_files[0], "-x", proxy.url, f"https://api.example.test:{tls_upstream.port}/x"
    )
    assert result.stdout == f"hello from api.example.test:{tls_upstream.port} /x\n", result.stderr
    (attempt,) = proxy.close()
    assert (attempt.method, attempt.decision, attempt.rule) == (
        "CONNECT",
        "allow",
        "network.allow: *.example.test",
    )
    assert attempt.bytes_up > 200  # a TLS handshake each way
    assert attempt.bytes_down > 200


def test_keeps_a_client_connection_alive_across_requests(
    make_proxy: Any, upstream: Upstream
) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    with open_client(proxy.port) as sock:
        for name in ("a", "b", "c"):
            sock.sendall(
                f"GET http://127.0.0.1:{upstream.port}/{name} HTTP/1.1\r\n"
                f"Host: 127.0.0.1\r\n{AUTH}\r\n\r\n".encode()
            )
            response = read_response(sock)
            assert response.read() == f"hello from 127.0.0.1:{upstream.port} /{name}\n".encode()
    assert upstream.seen.connections == 1  # the upstream connection was reused too
    assert [a.method for a in proxy.close()] == ["GET", "GET", "GET"]


def test_sets_host_from_the_target_not_the_host_header(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(
        allow=["example.test", f"127.0.0.1:{upstream.port}"], hosts={"example.test": ["127.0.0.1"]}
    )
    response, _body = exchange(
        proxy.port,
        f"GET http://example.test:{upstream.port}/ HTTP/1.1\r\nHost: evil.test\r\n"
        f"Connection: close, X-Drop-Me\r\nX-Drop-Me: 1\r\nKeep-Alive: 5\r\n{AUTH}\r\n\r\n",
    )
    assert response.status == 200
    headers = upstream.seen.requests[-1]["headers"]
    assert headers["host"] == f"example.test:{upstream.port}"
    assert "x-drop-me" not in headers  # hop-by-hop
    assert "keep-alive" not in headers


@needs_curl
def test_streams_request_bodies_with_expect_continue_and_chunking(
    make_proxy: Any, upstream: Upstream, tmp_path: Any
) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    payload = tmp_path / "payload"
    payload.write_bytes(b"z" * 2_000_000)
    result = curl(
        "-x",
        proxy.url,
        "-H",
        "Expect: 100-continue",
        "--data-binary",
        f"@{payload}",
        f"http://127.0.0.1:{upstream.port}/upload",
    )
    assert result.stdout == "got 2000000 bytes\n", result.stderr
    result = curl(
        "-x",
        proxy.url,
        "-H",
        "Transfer-Encoding: chunked",
        "--data-binary",
        "abc",
        f"http://127.0.0.1:{upstream.port}/chunked",
    )
    assert result.stdout == "got 3 bytes\n", result.stderr
    assert upstream.seen.requests[-1]["body"] == b"abc"


def test_forwards_bytes_sent_right_after_connect(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    with open_client(proxy.port) as sock:
        sock.sendall(
            f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}\r\n\r\n"
            f"GET /early HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200")
    assert data.endswith(b"hello from x /early\n")


def test_counts_the_bytes_of_a_large_tunnelled_download(
    make_proxy: Any, upstream: Upstream
) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    size = 20_000_000
    with open_client(proxy.port) as sock:
        sock.sendall(
            f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"{AUTH}\r\n\r\n".encode()
        )
        assert read_response(sock, "CONNECT").status == 200
        sock.sendall(f"GET /bytes/{size} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        received = 0
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
    (attempt,) = proxy.close()
    assert received > size
    assert attempt.bytes_down == received
    assert attempt.duration > 0


# ---------------------------------------------------------------- credentials
@pytest.mark.parametrize(
    ("header", "decision"),
    [
        ("", "challenge"),
        (
            "Proxy-Authorization: Basic " + base64.b64encode(b"corral:wrong").decode() + "\r\n",
            "deny",
        ),
        ("Proxy-Authorization: Bearer " + TOKEN + "\r\n", "deny"),
        ("Proxy-Authorization: Basic !!!notbase64\r\n", "deny"),
        (
            "Proxy-Authorization: Basic " + base64.b64encode(TOKEN.encode()).decode() + "\r\n",
            "deny",
        ),
    ],
)
def test_answers_407_without_the_sandbox_credential(
    make_proxy: Any, upstream: Upstream, header: str, decision: str
) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    response, body = exchange(
        proxy.port,
        f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1\r\nHost: 127.0.0.1\r\n{header}\r\n",
        "CONNECT",
    )
    assert response.status == 407
    assert response.getheader("Proxy-Authenticate") == 'Basic realm="corral"'
    assert response.getheader("X-Corral-Reason") == "proxy-auth-required"
    assert b"missing or wrong proxy credential" in body
    assert upstream.seen.connections == 0
    (attempt,) = proxy.close()
    assert (attempt.decision, attempt.rule) == (decision, "missing or wrong proxy credential")


@needs_curl
def test_accepts_the_credential_any_user_name(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    result = curl(
        "-x",
        f"http://someone:{TOKEN}@127.0.0.1:{proxy.port}",
        f"http://127.0.0.1:{upstream.port}/ok",
    )
    assert result.stdout.startswith("hello from"), result.stderr


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("target", "rule", "reason"),
    [
        ("unlisted.test:443", "not in network.allow", "not-allowed"),
        ("example.test:444", "not in network.allow", "not-allowed"),
        ("evil.example.test:443", "network.deny: evil.example.test", "denied-by-rule"),
        ("pkg.test:443", "not in network.allow", "not-allowed"),
        ("evil-example.test:443", "not in network.allow", "not-allowed"),
        ("example.test.evil.test:443", "not in network.allow", "not-allowed"),
        ("2130706433:443", "not in network.allow", "not-allowed"),
        ("127.1:443", "not in network.allow", "not-allowed"),
        ("[::ffff:127.0.0.1]:443", "not in network.allow", "not-allowed"),
        ("0x7f.0.0.1:443", "not in network.allow", "not-allowed"),
        (
            "rebind.example.test:443",
            "resolves to 127.0.0.1, a loopback address not in network.allow",
            "special-address",
        ),
        (
            "meta.example.test:80",
            "resolves to 169.254.169.254, a cloud-metadata address not in network.allow",
            "special-address",
        ),
    ],
)
def test_refuses_with_403_naming_the_rule(
    make_proxy: Any, target: str, rule: str, reason: str
) -> None:
    proxy = make_proxy(
        allow=["example.test:443", "*.example.test", "*.pkg.test"],
        deny=["evil.example.test"],
        hosts={"rebind.example.test": ["127.0.0.1"], "meta.example.test": ["169.254.169.254"]},
    )
    response, body = exchange(
        proxy.port, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{AUTH}\r\n\r\n", "CONNECT"
    )
    assert response.status == 403
    assert response.getheader("X-Corral-Decision") == "deny"
    assert response.getheader("X-Corral-Reason") == reason
    assert response.getheader("X-Corral-Rule") == rule
    (attempt,) = proxy.close()
    assert body.decode() == f"corral: blocked connection to {attempt.target} ({rule})\n"
    assert (attempt.decision, attempt.rule) == ("deny", rule)


def test_refuses_plain_http_to_an_unlisted_host(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=["example.test"], hosts={"evil.test": ["127.0.0.1"]})
    response, body = exchange(
        proxy.port,
        f"GET http://evil.test:{upstream.port}/ HTTP/1.1\r\nHost: evil.test\r\n{AUTH}\r\n\r\n",
    )
    assert response.status == 403
    assert (
        body
        == f"corral: blocked connection to evil.test:{upstream.port} "
        "(not in network.allow)\n".encode()
    )
    assert upstream.seen.connections == 0


def test_answers_502_when_an_allowed_destination_fails(make_proxy: Any) -> None:
    # bound but never listening: connections are refused, and the port stays
    # ours while the test runs (a closed one could be reused, or the proxy's
    # connect could pick it as its own source port and connect to itself)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    proxy = make_proxy(allow=[f"127.0.0.1:{port}", "nowhere.test"])
    with closed:
        response, body = exchange(
            proxy.port,
            f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}\r\n\r\n",
            "CONNECT",
        )
    assert response.status == 502
    assert response.getheader("X-Corral-Reason") == "connect-failed"
    assert b"could not connect to 127.0.0.1" in body
    response, body = exchange(
        proxy.port,
        f"CONNECT nowhere.test:443 HTTP/1.1\r\nHost: nowhere.test\r\n{AUTH}\r\n\r\n",
        "CONNECT",
    )
    assert response.status == 502
    assert response.getheader("X-Corral-Reason") == "resolve-failed"
    first, second = proxy.close()
    assert (first.decision, second.decision) == ("allow", "allow")
    assert "connection refused" in first.error
    assert "not in the static hosts table" in second.error


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("GET / HTTP/1.1", "only absolute-form requests"),
        ("GET https://example.test/ HTTP/1.1", "tunnelled with CONNECT"),
        ("GET ftp://example.test/ HTTP/1.1", "ftp:// scheme is not proxied"),
        ("GET http://user@example.test/ HTTP/1.1", "user info"),
        ("GET http://example.test:99999/ HTTP/1.1", "not a number from 1 to 65535"),
        ("CONNECT example.test HTTP/1.1", "names no port"),
        ("CONNECT exa%6dple.test:443 HTTP/1.1", "zone ids and percent escapes"),
        ("CONNECT [fe80::1%25eth0]:443 HTTP/1.1", "zone ids"),
    ],
)
def test_answers_400_for_targets_it_cannot_proxy(make_proxy: Any, line: str, message: str) -> None:
    proxy = make_proxy(allow=["example.test"])
    response, body = exchange(proxy.port, f"{line}\r\nHost: example.test\r\n{AUTH}\r\n\r\n")
    assert response.status == 400
    assert response.getheader("X-Corral-Reason") == "bad-target"
    assert message in body.decode()
    (attempt,) = proxy.close()
    assert attempt.decision == "deny"


# ---------------------------------------------------------------- SOCKS5
@needs_curl
def test_socks5_with_remote_name_resolution(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(
        allow=["example.test", f"127.0.0.1:{upstream.port}"], hosts={"example.test": ["127.0.0.1"]}
    )
    result = curl(
        "-x",
        f"socks5h://corral:{TOKEN}@127.0.0.1:{proxy.port}",
        f"http://example.test:{upstream.port}/s",
    )
    assert result.stdout == f"hello from example.test:{upstream.port} /s\n", result.stderr
    result = curl("-x", f"socks5h://corral:{TOKEN}@127.0.0.1:{proxy.port}", "http://evil.test/")
    assert result.returncode != 0
    result = curl(
        "-x",
        f"socks5://corral:{TOKEN}@127.0.0.1:{proxy.port}",
        f"http://127.0.0.1:{upstream.port}/ip",
    )  # an address (ATYP 1)
    assert result.stdout.startswith("hello from"), result.stderr
    first, denied, third = proxy.close()
    assert (first.method, first.decision, first.host) == ("SOCKS5", "allow", "example.test")
    assert (denied.host, denied.port, denied.decision, denied.rule) == (
        "evil.test",
        80,
        "deny",
        "not in network.allow",
    )
    assert third.host == "127.0.0.1"


def _socks(port: int, *steps: tuple[bytes, int]) -> list[bytes]:
    """Send each step's bytes and read its expected reply length."""
    replies = []
    with open_client(port) as sock:
        for data, length in steps:
            sock.sendall(data)
            reply = b""
            while len(reply) < length:
                chunk = sock.recv(length - len(reply))
                if not chunk:
                    break
                reply += chunk
            replies.append(reply)
    return replies


_GREET = (b"\x05\x01\x02", 2)
_LOGIN = (b"\x01\x06corral" + bytes([len(TOKEN)]) + TOKEN.encode(), 2)


def test_socks5_refuses_clients_without_credentials(make_proxy: Any) -> None:
    proxy = make_proxy(allow=["example.test"])
    assert _socks(proxy.port, (b"\x05\x01\x00", 2)) == [b"\x05\xff"]
    assert _socks(proxy.port, _GREET, (b"\x01\x06corral\x05wrong", 2)) == [b"\x05\x02", b"\x01\x01"]
    no_offer, wrong = proxy.close()
    assert (
        no_offer.rule
        == "missing or wrong proxy credential (the client did not offer username/password)"
    )
    assert (wrong.method, wrong.decision) == ("SOCKS5", "deny")


@pytest.mark.parametrize(
    ("request_bytes", "reply_code", "rule"),
    [
        (b"\x05\x02\x00\x03\x0cexample.test\x01\xbb", 7, "SOCKS5 command 2 is not supported"),
        (b"\x05\x01\x00\x05\x00\x00", 8, "invalid destination: SOCKS5 address type 5"),
        (b"\x05\x01\x00\x03\x09evil.test\x01\xbb", 2, "not in network.allow"),
        (b"\x05\x01\x00\x01\x7f\x00\x00\x01\x01\xbb", 2, "not in network.allow"),
        (b"\x05\x01\x00\x04" + b"\x00" * 15 + b"\x01\x01\xbb", 2, "not in network.allow"),
        (b"\x05\x01\x00\x03\x0bevil\r\n.test\x01\xbb", 1, "invalid destination: the host contains"),
        (b"\x05\x01\x00\x03\x0cexample.test\x00\x00", 1, "invalid destination: port 0"),
    ],
)
def test_socks5_refusals(make_proxy: Any, request_bytes: bytes, reply_code: int, rule: str) -> None:
    proxy = make_proxy(allow=["example.test"])
    replies = _socks(proxy.port, _GREET, _LOGIN, (request_bytes, 10))
    assert replies[2][:2] == bytes([5, reply_code])
    (attempt,) = proxy.close()
    assert attempt.rule.startswith(rule)
    assert "\r" not in attempt.host
    assert "\n" not in attempt.host


# ---------------------------------------------------------------- hostile clients
def _raw(port: int, data: bytes, *, shutdown: bool = False) -> bytes:
    with open_client(port) as sock:
        sock.sendall(data)
        if shutdown:
            sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        return reply


def _assert_still_serves(proxy: Any, upstream: Upstream) -> None:
    _response, body = exchange(
        proxy.port,
        f"GET http://127.0.0.1:{upstream.port}/alive HTTP/1.1\r\n"
        f"Host: x\r\nConnection: close\r\n{AUTH}\r\n\r\n",
    )
    assert body.endswith(b"/alive\n")


def _wait_idle(proxy: Any) -> None:
    deadline = time.monotonic() + 5
    while proxy.proxy.statistics()["active"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.proxy.statistics()["active"] == 0  # no handler task left behind


def test_answers_garbage_with_400_and_keeps_serving(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    for garbage in (
        b"\x00\x01\x02\xff\r\n\r\n",
        b"GET\r\n\r\n",
        b"\x16\x03\x01\x02\x00hello\r\n\r\n",
        b"GET http://x/ HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nBad Header\r\n\r\n",
    ):
        reply = _raw(proxy.port, garbage)
        assert reply.startswith(b"HTTP/1.1 400 "), (garbage, reply)
    assert _raw(proxy.port, b"\x04\x01\x00\x50\x7f\x00\x00\x01\x00").startswith(
        b"HTTP/1.1 400 "
    )  # SOCKS4
    _assert_still_serves(proxy, upstream)
    _wait_idle(proxy)


def test_answers_huge_headers_with_431(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    head = b"GET http://127.0.0.1/ HTTP/1.1\r\n" + b"X-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    with open_client(proxy.port) as sock:
        try:
            sock.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the proxy may close before the client finishes writing
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 431 ")
    _assert_still_serves(proxy, upstream)
    _wait_idle(proxy)


def test_closes_half_open_connections(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    reply = _raw(proxy.port, b"GET http://127.0.0.1/ HTTP/1.1\r\nHo", shutdown=True)
    assert reply.startswith(b"HTTP/1.1 400 ")  # the head ended early: an error, then close
    assert _raw(proxy.port, b"\x05\x01", shutdown=True) == b""  # half a SOCKS greeting
    assert _raw(proxy.port, b"", shutdown=True) == b""
    _assert_still_serves(proxy, upstream)
    _wait_idle(proxy)


def test_times_out_slowloris_clients(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"], limits=ProxyLimits(header_timeout=0.5))
    started = time.monotonic()
    with (
        open_client(proxy.port) as slow,
        open_client(proxy.port) as silent,
        open_client(proxy.port) as socks,
    ):
        slow.sendall(b"GET http://127.0.0.1/ HTTP/1.1\r\n")
        socks.sendall(b"\x05\x01")
        for _ in range(3):  # a byte at a time, never finishing the head
            time.sleep(0.1)
            try:
                slow.sendall(b"X")
            except OSError:
                break
        assert slow.recv(65536).startswith(b"HTTP/1.1 408 ")
        assert silent.recv(65536) == b""
        assert socks.recv(65536) == b""
    assert time.monotonic() - started < 5
    _assert_still_serves(proxy, upstream)
    _wait_idle(proxy)


def test_closes_connections_over_the_limit(make_proxy: Any, upstream: Upstream) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"], limits=ProxyLimits(max_connections=2))
    first, second = open_client(proxy.port), open_client(proxy.port)
    try:
        first.sendall(b"G")  # both are being served (waiting for their heads)
        second.sendall(b"G")
        deadline = time.monotonic() + 5
        while proxy.proxy.statistics()["active"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with open_client(proxy.port) as third:
            assert third.recv(100) == b""
        assert proxy.proxy.statistics()["rejected"] == 1
    finally:
        first.close()
        second.close()
    _wait_idle(proxy)
    _assert_still_serves(proxy, upstream)


def test_stopping_cancels_open_tunnels_and_closes_the_listener(
    make_proxy: Any, upstream: Upstream
) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    tunnel = open_client(proxy.port)
    tunnel.sendall(
        f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}\r\n\r\n".encode()
    )
    assert read_response(tunnel, "CONNECT").status == 200
    attempts = proxy.close()  # while the tunnel is open
    assert tunnel.recv(100) == b""  # the proxy closed its end
    tunnel.close()
    assert [a.method for a in attempts] == ["CONNECT"]  # recorded although cancelled
    assert proxy.proxy.statistics()["active"] == 0
    assert not any(t.name == "corral-egress" for t in threading.enumerate())  # its thread ended
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    assert proxy.proxy.close() == attempts  # idempotent


def test_a_proxy_that_cannot_start_reports_why() -> None:
    from corral.egress._server import EgressProxy
    from corral.egress.allowlist import Allowlist

    with pytest.raises(ValueError, match="non-empty token"):
        EgressProxy(allowlist=Allowlist(), token="")
    proxy = EgressProxy(allowlist=Allowlist(), token=TOKEN)
    scratch = os.open("/dev/null", os.O_RDONLY)  # not a socket
    with pytest.raises(OSError, match="Socket operation on non-socket"):
        proxy.start(scratch)
    with pytest.raises(OSError):
        os.fstat(scratch)  # the proxy owned the descriptor and closed it
    assert proxy.close() == []


def test_a_failing_proxy_refuses_connections_and_reports_why(upstream: Upstream) -> None:
    from corral.egress._server import EgressProxy
    from corral.egress.allowlist import Allowlist

    class Broken(EgressProxy):
        async def _serve(self) -> None:
            raise RuntimeError("the event loop broke")

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    proxy = Broken(allowlist=Allowlist(allow=[f"127.0.0.1:{upstream.port}"]), token=TOKEN)
    proxy.start(listener.detach())
    try:
        with open_client(port) as first:  # wakes the proxy up: it fails, and closes its listener
            assert first.recv(100) == b""
    except ConnectionResetError:
        pass  # the kernel resets connections left in a closed listener's backlog (maybe early)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    assert proxy.close() == []
    assert str(proxy.error) == "the event loop broke"
    with pytest.raises(RuntimeError, match="started already"):
        proxy.start(0)


def test_loads_nothing_until_the_first_client_connects() -> None:
    code = (
        "import socket, sys\n"
        "from corral.egress._server import EgressProxy\n"
        "from corral.egress.allowlist import Allowlist\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(8)\n"
        "proxy = EgressProxy(allowlist=Allowlist(), token='t')\n"
        "proxy.start(s.detach()); proxy.wait_ready()\n"
        "assert proxy.close() == [] and proxy.error is None\n"
        "print(sorted(m for m in ('asyncio', 'h11') if m in sys.modules))\n"
    )
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout == "[]\n"


def test_a_proxy_closed_before_it_started_releases_its_listener() -> None:
    from corral.egress._server import EgressProxy
    from corral.egress.allowlist import Allowlist

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    proxy = EgressProxy(allowlist=Allowlist(), token=TOKEN)
    proxy.start(listener.detach())
    assert proxy.close() == []  # possibly before its thread got going
    assert proxy.error is None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


class _RawServer:
    """A TCP server on 127.0.0.1 that answers every connection with fixed bytes, then closes."""

    def __init__(self, reply: bytes) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.reply)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept(); close() alone does not
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)


@pytest.mark.parametrize(
    ("reply", "reason"),
    [(b"", "upstream-closed"), (b"SSH-2.0-OpenSSH\r\n\r\n", "upstream-protocol-error")],
)
def test_answers_502_when_the_upstream_does_not_speak_http(
    make_proxy: Any, reply: bytes, reason: str
) -> None:
    server = _RawServer(reply)
    try:
        proxy = make_proxy(allow=[f"127.0.0.1:{server.port}"])
        response, _body = exchange(
            proxy.port,
            f"GET http://127.0.0.1:{server.port}/ HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n\r\n",
        )
    finally:
        server.close()
    assert response.status == 502
    assert response.getheader("X-Corral-Reason") == reason
    assert response.getheader("X-Corral-Decision") == "allow"
    (attempt,) = proxy.close()
    assert attempt.decision == "allow"


def test_switches_upstreams_between_requests_on_one_connection(
    make_proxy: Any, upstream: Upstream, evil: Any
) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}", f"127.0.0.1:{evil.port}"])
    with open_client(proxy.port) as sock:
        for port, path in ((upstream.port, "/one"), (evil.port, "/two?x=1"), (upstream.port, "?q")):
            sock.sendall(
                f"GET http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: x\r\n{AUTH}\r\n\r\n".encode()
            )
            body = read_response(sock).read()
            shown = path if path.startswith("/") else "/" + path
            assert body == f"hello from 127.0.0.1:{port} {shown.split('?')[0]}\n".encode()
    assert [r["path"] for r in upstream.seen.requests] == ["/one", "/?q"]
    assert [r["path"] for r in evil.seen.requests] == ["/two?x=1"]
    assert [a.port for a in proxy.close()] == [upstream.port, evil.port, upstream.port]


def test_does_not_reuse_an_upstream_that_asked_to_close(
    make_proxy: Any, upstream: Upstream
) -> None:
    proxy = make_proxy(allow=[f"127.0.0.1:{upstream.port}"])
    with open_client(proxy.port) as sock:
        for name in ("a", "b"):
            sock.sendall(
                f"GET http://127.0.0.1:{upstream.port}/{name} HTTP/1.1\r\nHost: x\r\n"
                f"Connection: close\r\n{AUTH}\r\n\r\n".encode()
            )
            assert read_response(sock).read().endswith(f"/{name}\n".encode())
            break  # the client asked to close: the proxy closes after the response
        assert sock.recv(10) == b""
    assert upstream.seen.connections == 1


def test_refuses_non_ascii_targets(make_proxy: Any) -> None:
    proxy = make_proxy(allow=["example.test"])
    reply = _raw(proxy.port, "GET http://exämple.test/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 400 ")
