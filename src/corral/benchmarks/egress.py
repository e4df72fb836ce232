"""Egress proxy: added latency per connection, 100 MB throughput, 500 concurrent connections.

Everything runs on this machine's loopback, in one run, against baselines
measured in the same run:

* a load server (a separate process on the host's 127.0.0.1) answers
  ``ping`` with ``pong``, ``bytes N`` with N bytes, ``echo`` by echoing, and
  ``GET /bytes/N`` as HTTP;
* the *direct* client runs on the host and connects to it;
* the *proxied* client is the same code running inside a real sandbox
  (``network.mode = "allowlist"``, the server's address allowed), reaching
  the server through corral's proxy with ``CONNECT`` (the HTTPS path).

Rows: the median time of a connection (connect, request, reply, close) both
ways and the difference (target: at most 2 ms added); the median throughput
of a 100 MB transfer both ways, with a raw-socket client and with curl
(target: at least 80 % of direct); 500 tunnels open at once, each verified
with an echo (target: all 500, no error); the time of an HTTPS request (a
new connection each) through a plain tunnel and through a tunnel the proxy
terminates (request rules, masked credentials); and what allowlist mode
adds to ``corral run -- true``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys

from . import Context, Row

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy import Policy

__all__ = ["run"]

SIZE = 100 << 20
CONCURRENT = 500

#: The load server (host side). Prints its port, then serves until killed.
SERVER = r"""
import asyncio, sys
CHUNK = memoryview(b"x" * (1 << 20))
HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
async def send_bytes(writer, n):
    while n > 0:
        piece = CHUNK[: min(n, len(CHUNK))]
        writer.write(piece)
        n -= len(piece)
        await writer.drain()
async def handle(reader, writer):
    try:
        line = await reader.readline()
        if line.startswith(b"ping"):
            writer.write(b"pong\n")
        elif line.startswith(b"bytes "):
            await send_bytes(writer, int(line.split()[1]))
        elif line.startswith(b"echo"):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        elif line.startswith(b"GET /bytes/"):
            size = int(line.split()[1].rsplit(b"/", 1)[1])
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            writer.write(HEAD % size)
            await send_bytes(writer, size)
        await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""

#: An HTTPS load server: ``GET /bytes/N`` over TLS, one thread per connection
#: (OpenSSL encrypts without the GIL). argv: certificate, key. Prints its port.
TLS_SERVER = r"""
import socket, ssl, sys, threading
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
listener = socket.create_server(("127.0.0.1", 0), backlog=128)
print(listener.getsockname()[1], flush=True)
chunk = b"x" * (1 << 20)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
def serve(conn):
    try:
        with context.wrap_socket(conn, server_side=True) as tls:
            request = b""
            while b"\r\n\r\n" not in request:
                data = tls.recv(4096)
                if not data:
                    return
                request += data
            size = int(request.split()[1].rsplit(b"/", 1)[1])
            tls.sendall(HEAD % size)
            while size > 0:
                tls.sendall(chunk[: min(size, len(chunk))])
                size -= len(chunk)
    except OSError:
        pass
while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""

#: The client, identical on the host and in the sandbox. argv: mode port [args].
#: With HTTPS_PROXY set (in the sandbox) every connection is a CONNECT tunnel.
CLIENT = r"""
import base64, json, os, socket, sys, time
from urllib.parse import urlsplit
mode, port = sys.argv[1], int(sys.argv[2])
proxy = urlsplit(os.environ["HTTPS_PROXY"]) if os.environ.get("HTTPS_PROXY") else None
def connect():
    if proxy is None:
        return socket.create_connection(("127.0.0.1", port))
    s = socket.create_connection((proxy.hostname, proxy.port))
    auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
    s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
              f"Proxy-Authorization: Basic {auth}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("proxy closed")
        head += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(head.split(b"\r\n")[0].decode())
    return s
def read_exactly(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed early")
        data += chunk
    return data
if mode == "latency":
    samples = []
    for i in range(int(sys.argv[3]) + 10):
        start = time.perf_counter()
        s = connect()
        s.sendall(b"ping\n")
        assert read_exactly(s, 5) == b"pong\n"
        s.close()
        if i >= 10:
            samples.append((time.perf_counter() - start) * 1000)
    print(json.dumps(samples))
elif mode == "throughput":
    results = []
    buf = bytearray(1 << 20)
    for _ in range(int(sys.argv[4])):
        size, received = int(sys.argv[3]), 0
        start = time.perf_counter()
        s = connect()
        s.sendall(b"bytes %d\n" % size)
        while (n := s.recv_into(buf)):
            received += n
        elapsed = time.perf_counter() - start
        s.close()
        assert received == size, received
        results.append(size / elapsed / 1e6)
    print(results[0] if len(results) == 1 else json.dumps(results))
elif mode == "concurrent":
    count, opened, errors = int(sys.argv[3]), [], []
    start = time.perf_counter()
    for i in range(count):
        try:
            s = connect()
            s.sendall(b"echo\n")
            opened.append(s)
        except OSError as exc:
            errors.append(str(exc))
    established = time.perf_counter() - start
    verified = 0
    for i, s in enumerate(opened):  # all are open at once now
        try:
            s.sendall(b"%d;" % i)
            if read_exactly(s, len(b"%d;" % i)) == b"%d;" % i:
                verified += 1
        except OSError as exc:
            errors.append(str(exc))
    for s in opened:
        s.close()
    print(json.dumps({"opened": len(opened), "verified": verified, "errors": errors[:5],
                      "establish_ms": established * 1000}))
"""


def _start(script: str, *args: str) -> tuple[subprocess.Popen[str], int]:
    server = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    return server, int(server.stdout.readline())


def _host_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}


def _policy(ctx: Context, *ports: int) -> Policy:
    from ..policy import NetworkPolicy, Policy, ResourceLimits

    return Policy.for_workspace(ctx.workspace, home=os.path.expanduser("~")).replace(
        network=NetworkPolicy(mode="allowlist", allow=tuple(f"127.0.0.1:{p}" for p in ports)),
        resources=ResourceLimits(timeout=600.0, output=64 << 20),
    )


def _direct(ctx: Context, argv: list[str]) -> str:
    out = subprocess.run(
        argv, capture_output=True, text=True, env=_host_env(), check=True, timeout=600
    )
    return out.stdout


def _sandboxed(
    ctx: Context, policy: Policy, argv: list[str], extra_env: dict[str, str] | None = None
) -> tuple[str, int]:
    """Run *argv* in an allowlist sandbox; return its stdout and how many attempts were allowed."""
    from ..pipeline._request import ExecRequest
    from ..pipeline._runner import execute

    outcome = execute(
        ExecRequest.from_argv(argv, cwd=ctx.workspace),
        policy,
        environ={**os.environ, **(extra_env or {})},
    )
    if outcome.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed in the sandbox: {outcome.text('stderr')[-500:]}")
    return outcome.text(), sum(1 for a in outcome.network if a.decision == "allow")


def _interleaved(
    ctx: Context, policy: Policy, repeats: int, direct: list[str], proxied: list[str]
) -> tuple[float, float]:
    """Median of *repeats* alternating direct and proxied runs (each prints one number)."""
    d, p = [], []
    for _ in range(repeats):
        d.append(float(_direct(ctx, direct)))
        p.append(float(_sandboxed(ctx, policy, proxied)[0]))
    return statistics.median(d), statistics.median(p)


def _throughput_rows(name: str, direct: float, proxied: float, repeats: int) -> list[Row]:
    return [
        Row(f"{name}, direct", direct, unit="MB/s", samples=repeats),
        Row(
            f"{name}, through the proxy",
            proxied,
            unit="MB/s",
            samples=repeats,
            baseline="direct",
            target=">= 80%",
            note=f"{proxied / direct:.0%} of direct",
        ),
    ]


def _certificate(ctx: Context) -> tuple[str, str] | None:
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = os.path.join(ctx.workspace, "cert.pem"), os.path.join(ctx.workspace, "key.pem")
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
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:bench.test",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _termination_rows(
    ctx: Context, policy: Policy, curl: str, certificate: tuple[str, str], port: int
) -> list[Row]:
    """One HTTPS request per connection: plain tunnel against a terminated one (same run)."""
    count = max(20, ctx.runs)
    # a name (resolved by the proxy from a hosts file): 127.0.0.1 itself is a forwarded
    # local service, which clients reach without the proxy
    hosts = os.path.join(ctx.workspace, "bench-hosts")
    with open(hosts, "w", encoding="utf-8") as f:
        f.write("127.0.0.1 bench.test\n")
    env = {"CORRAL_EGRESS_HOSTS": hosts, "CORRAL_EGRESS_UPSTREAM_CA": certificate[0]}
    policy = policy.replace(
        network=policy.network.replace(allow=(*policy.network.allow, "bench.test"))
    )
    url = f"https://bench.test:{port}/bytes/1024"
    loop = (
        f"for i in $(seq {count}); do {curl} -sS -o /dev/null -w '%{{time_total}}\\n' "
        f'"$@" {url}; done'
    )
    # the plain tunnel's client loads as many roots as the terminated one (the system's
    # bundle plus one certificate), so the rows differ by the termination only
    from ..backends._egress import trust_bundle

    with open(certificate[0], "rb") as f:
        _path, roots = trust_bundle(f.read())
    bundle = os.path.join(ctx.workspace, "bench-roots.pem")
    with open(bundle, "wb") as f:
        f.write(roots)
    plain, _ = _sandboxed(ctx, policy, ["sh", "-c", loop, "sh", "--cacert", bundle], env)
    terminated_policy = policy.replace(
        network=policy.network.replace(allow_requests=("GET bench.test/*",))
    )
    # the sandbox trusts the per-run CA (CURL_CA_BUNDLE)
    terminated, _ = _sandboxed(ctx, terminated_policy, ["sh", "-c", loop, "sh"], env)
    plain_ms = statistics.median(float(x) * 1000 for x in plain.split())
    terminated_ms = statistics.median(float(x) * 1000 for x in terminated.split())
    return [
        Row("HTTPS request, new connection, plain tunnel (curl)", plain_ms, samples=count),
        Row(
            "HTTPS request, new connection, TLS terminated by the proxy",
            terminated_ms,
            samples=count,
            baseline="plain tunnel",
            note=f"+{terminated_ms - plain_ms:.1f} ms (two handshakes, request checked)",
        ),
    ]


def _startup_rows(ctx: Context, port: int) -> list[Row]:
    base = ["--memory", "none", "--pids", "none", "--timeout", "none", "--max-output", "none"]
    closed = ctx.median_cmd_ms([*ctx.corral, "run", *base, "--", "true"])
    allowlist = ctx.median_cmd_ms(
        [*ctx.corral, "run", *base, "--allow-host", f"127.0.0.1:{port}", "--", "true"]
    )
    return [
        Row("corral run -- true (--net none, no limits)", closed, samples=ctx.runs),
        Row(
            "corral run -- true (--allow-host, no limits)",
            allowlist,
            samples=ctx.runs,
            baseline="--net none",
            note=f"+{allowlist - closed:.1f} ms (starting the proxy)",
        ),
    ]


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""
    client = os.path.join(ctx.workspace, "egress_client.py")
    with open(client, "w", encoding="utf-8") as f:
        f.write(CLIENT)
    py = [ctx.python, "-I", client]
    servers: list[subprocess.Popen[str]] = []
    try:
        server, port = _start(SERVER)
        servers.append(server)
        certificate = _certificate(ctx)
        tls_port = 0
        if certificate is not None:
            tls_server, tls_port = _start(TLS_SERVER, *certificate)
            servers.append(tls_server)
        policy = _policy(ctx, port, tls_port)
        samples = max(100, ctx.runs)
        repeats = max(5, min(11, ctx.runs))
        rows: list[Row] = []

        latency = [*py, "latency", str(port), str(samples)]
        direct_ms = statistics.median(json.loads(_direct(ctx, latency)))
        proxied_ms = statistics.median(json.loads(_sandboxed(ctx, policy, latency)[0]))
        rows += [
            Row("connection (connect, ping, pong, close), direct", direct_ms, samples=samples),
            Row("connection through the proxy (CONNECT)", proxied_ms, samples=samples),
            Row(
                "added latency per connection",
                proxied_ms - direct_ms,
                samples=samples,
                target="<= 2 ms",
                note="median through the proxy minus median direct",
            ),
        ]

        transfer = [*py, "throughput", str(port), str(SIZE), "1"]
        rows += _throughput_rows(
            "100 MB, raw TCP, memory to memory",
            *_interleaved(ctx, policy, repeats, transfer, transfer),
            repeats,
        )
        curl = shutil.which("curl")
        if curl is None:
            rows.append(Row("curl 100 MB downloads", 0.0, unit="MB/s", note="skipped: no curl"))
        else:
            # -p: a CONNECT tunnel; --noproxy '': 127.0.0.1 is in NO_PROXY
            fetch = [curl, "-s", "-o", "/dev/null", "-w", "%{speed_download}"]
            tunnel = [fetch[0], "-p", "--noproxy", "", *fetch[1:]]
            url = f"http://127.0.0.1:{port}/bytes/{SIZE}"
            d, p = _interleaved(ctx, policy, repeats, [*fetch, url], [*tunnel, url])
            rows += _throughput_rows("curl 100 MB HTTP download", d / 1e6, p / 1e6, repeats)
            if certificate is not None:
                url = f"https://127.0.0.1:{tls_port}/bytes/{SIZE}"
                tls = ["--cacert", certificate[0]]
                d, p = _interleaved(ctx, policy, repeats, [*fetch, *tls, url], [*tunnel, *tls, url])
                rows += _throughput_rows("curl 100 MB HTTPS download", d / 1e6, p / 1e6, repeats)
                rows += _termination_rows(ctx, policy, curl, certificate, tls_port)

        out, allowed = _sandboxed(ctx, policy, [*py, "concurrent", str(port), str(CONCURRENT)])
        held = json.loads(out)
        rows.append(
            Row(
                f"{CONCURRENT} concurrent tunnels held and echoed",
                float(held["verified"]),
                unit="conns",
                target=f"{CONCURRENT} without error",
                note=(
                    f"opened {held['opened']}, errors {len(held['errors'])} {held['errors']}, "
                    f"established in {held['establish_ms']:.0f} ms, {allowed} attempts logged"
                ),
            )
        )
        rows += _startup_rows(ctx, port)
        return rows
    finally:
        for server in servers:
            server.kill()
            server.wait()
