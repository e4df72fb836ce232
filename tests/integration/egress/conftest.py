"""Loopback servers and a proxy harness for the egress tests.

Everything listens on 127.0.0.1; test host names (``example.test``,
``evil.test`` ...) reach those servers only through the proxy's static
resolver (never real DNS).
"""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from corral.egress._context import ProxyLimits
from corral.egress._resolve import StaticResolver
from corral.egress._server import EgressProxy
from corral.egress.allowlist import Allowlist

TOKEN = "t0ken-for-tests"


class Seen:
    """What a test server received."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.connections = 0
        self.lock = threading.Lock()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        del format, args

    def setup(self) -> None:
        super().setup()
        with self.server.seen.lock:
            self.server.seen.connections += 1

    def _record(self, body: bytes) -> None:
        with self.server.seen.lock:
            self.server.seen.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body,
                }
            )

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_GET(self) -> None:
        self._record(b"")
        path = self.path.split("?")[0]
        if path.startswith("/bytes/"):
            size = int(path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            while size > 0:
                self.wfile.write(chunk[: min(size, len(chunk))])
                size -= len(chunk)
            return
        file = os.path.join(self.server.root, path.lstrip("/"))
        if os.path.isdir(file):
            file = os.path.join(file, "index.html")
        if os.path.isfile(file):
            with open(file, "rb") as f:
                data = f.read()
            self.send_response(200)
            if file.endswith(".html"):
                self.send_header("Content-Type", "text/html")
        else:
            data = f"hello from {self.headers.get('Host')} {path}\n".encode()
            self.send_response(200 if path != "/missing" else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = self._body()
        self._record(body)
        reply = b"got %d bytes\n" % len(body)
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the default 5 overflows under the concurrency tests
    root: str
    seen: Seen
    tls: ssl.SSLContext | None = None

    def server_activate(self) -> None:
        super().server_activate()
        # serve_forever() polls, then accept()s; a connection that is gone by
        # then (reset in the queue) must not leave accept() - and with it
        # shutdown() and the test's teardown - blocked for good. A timeout
        # there is an OSError, which socketserver skips; accepted connections
        # are blocking again (socket.accept clears an inherited timeout).
        self.socket.settimeout(1.0)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake happens here, on the connection's own thread and
        # under a timeout - not in accept() on the serving thread, where a
        # client that never says hello would block serve_forever and with it
        # shutdown() (and so the test's teardown) for good.
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(10)
        try:
            tls = self.tls.wrap_socket(request, server_side=True)
        except OSError:  # ssl.SSLError included
            return
        with tls:
            super().finish_request(tls, client_address)


class Upstream:
    """An HTTP (or HTTPS) server on 127.0.0.1 in a background thread."""

    def __init__(self, root: str, tls: ssl.SSLContext | None = None) -> None:
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.root = root
        self.server.seen = Seen()
        self.server.tls = tls
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    @property
    def seen(self) -> Seen:
        return self.server.seen

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def upstream(tmp_path: Any) -> Iterator[Upstream]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello through the proxy\n")
    server = Upstream(str(root))
    yield server
    server.close()


@pytest.fixture
def evil(tmp_path: Any) -> Iterator[Upstream]:
    """A second server: one the policy does not allow, or a second allowed one."""
    root = tmp_path / "evil-www"
    root.mkdir()
    server = Upstream(str(root))
    yield server
    server.close()


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: Any) -> tuple[str, str]:
    """A self-signed certificate for example.test and *.example.test, and its key."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed (apt-get install openssl)")
    where = tmp_path_factory.mktemp("tls")
    cert, key = str(where / "cert.pem"), str(where / "key.pem")
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-out",
            cert,
            "-days",
            "2",
            "-subj",
            "/CN=example.test",
            "-addext",
            "subjectAltName=DNS:example.test,DNS:*.example.test",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def tls_upstream(tmp_path: Any, tls_files: tuple[str, str]) -> Iterator[Upstream]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*tls_files)
    root = tmp_path / "tls-www"
    root.mkdir()
    server = Upstream(str(root), tls=context)
    yield server
    server.close()


class ProxyHarness:
    """An EgressProxy on the host's loopback (the sandbox tests use the real namespace)."""

    def __init__(
        self,
        *,
        allow: list[str],
        deny: list[str] = (),  # type: ignore[assignment]
        hosts: dict[str, list[str]] | None = None,
        limits: ProxyLimits | None = None,
    ) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        self.port = listener.getsockname()[1]
        self.proxy = EgressProxy(
            allowlist=Allowlist(allow=allow, deny=deny),
            token=TOKEN,
            resolver=StaticResolver(hosts or {}),
            limits=limits,
        )
        self.proxy.start(listener.detach())
        self.proxy.wait_ready()
        self.attempts: list[Any] = []

    @property
    def url(self) -> str:
        return f"http://corral:{TOKEN}@127.0.0.1:{self.port}"

    def close(self) -> list[Any]:
        self.attempts = self.proxy.close()
        return self.attempts


@pytest.fixture
def make_proxy() -> Iterator[Any]:
    made: list[ProxyHarness] = []

    def make(**kwargs: Any) -> ProxyHarness:
        harness = ProxyHarness(**kwargs)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.proxy.close()
        assert harness.proxy.error is None, harness.proxy.error
        assert harness.proxy.statistics()["handler_errors"] == 0
