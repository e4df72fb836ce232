"""``corral ui``: the Runs page's first screen over an audit log of 10,000 records.

Rows (medians of server time: the ASGI application called in-process, from the
request to the last byte of the response, no browser and no socket):

* ``cold``: a fresh server's first ``GET /``: the first page (50 rows) read
  from the log's tail and rendered, while the whole log is indexed and its
  chain verified in a background thread (started by that request, competing
  for the interpreter). Target: <= 300 ms.
* ``full index``: reading, parsing and verifying the whole log (what the
  background thread does; every later page and filter uses it).
* ``warm``: the next ``GET /`` (the index is kept; only the head is re-read).
* ``after one new record``: a ``GET /`` after a run was appended (the index
  reads only the new record, after hashing the prefix it already read).
* baseline: :func:`corral._audit.verify` over the same log in the same run -
  what ``corral audit --verify`` costs - and the ratio of ``cold`` to it.

Needs the ``ui`` extra; without it the rows are NaN with the reason.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time

from . import Context, Row, ratio

__all__ = ["RECORDS", "fill_audit_log", "run"]

#: records in the benchmark's audit log
RECORDS = 10_000


def fill_audit_log(state_dir: str, count: int) -> None:
    """Write *count* realistic, correctly chained records (and ``audit.head``) at once."""
    from .._audit import GENESIS, audit_path
    from .._hashing import sha256
    from .._jsonfast import dumps

    os.makedirs(state_dir, exist_ok=True)
    prev = GENESIS
    lines = []
    backends = ("bubblewrap", "landlock", "podman", "gvisor")
    for i in range(1, count + 1):
        record = {
            "seq": i,
            "time": f"2026-01-{1 + i * 28 // count:02d}T{i % 24:02d}:{i % 60:02d}:00Z",
            "sandbox_id": f"sbx-{i:012x}",
            "agent_session": f"session-{i // 100}",
            "cwd": "/home/me/src/app",
            "argv": ["pytest", "-q", f"tests/test_{i % 97}.py"],
            "backend": backends[i % len(backends)],
            "policy_digest": "0" * 64,
            "exit_status": 0 if i % 7 else 1,
            "exit_code": 0 if i % 7 else 1,
            "signal": None,
            "timed_out": False,
            "oom_killed": False,
            "duration": 0.05 + (i % 13) * 0.1,
            "stdout": {"sha256": "1" * 64, "size": 1200},
            "stderr": {"sha256": None, "size": 0},
            "output_dropped": False,
            "violations": (
                [{"kind": "fs-write", "target": "/w/.bashrc", "rule": "filesystem.protect"}]
                if i % 11 == 0
                else []
            ),
            "network": [
                {
                    "host": "pypi.org" if i % 5 else f"exfil-{i % 3}.example",
                    "port": 443,
                    "method": "CONNECT",
                    "decision": "allow" if i % 5 else "deny",
                    "rule": "network.allow: pypi.org",
                    "bytes_up": 900,
                    "bytes_down": 40000,
                }
            ],
            "degraded": [],
            "unsandboxed": False,
            "credentials": [],
            "prev": prev,
        }
        line = dumps(record).encode()
        prev = sha256(line).hexdigest()
        lines.append(line)
    with open(audit_path(state_dir), "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    with open(os.path.join(state_dir, "audit.head"), "w", encoding="ascii") as f:
        f.write(f"{count:>20} {prev}\n")


async def _get(app: object, host: str, path: str) -> int:
    status = 0
    body = 0

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        nonlocal status, body
        if message["type"] == "http.response.start":
            status = int(message["status"])  # type: ignore[call-overload]
        elif message["type"] == "http.response.body":
            body += len(message.get("body", b""))  # type: ignore[arg-type]

    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", host.encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 1),
    }
    await app(scope, receive, send)  # type: ignore[operator]
    if status != 200 or body < 1000:
        raise RuntimeError(f"GET {path} answered {status} with {body} bytes")
    return body


def run(ctx: Context) -> list[Row]:
    """The rows described in the module docstring."""
    try:
        from ..ui._app import build, build_app
        from ..ui._guard import Secrets
        from ..ui._runs import RunIndex
    except ImportError as exc:
        nan = float("nan")
        note = f"needs the ui extra ({exc.name} missing)"
        return [Row(f"runs page, first screen, cold ({RECORDS:,} records)", nan, note=note)]
    from .._audit import append, verify

    with tempfile.TemporaryDirectory(prefix="corral-bench-ui-", dir=ctx.workspace) as state:
        fill_audit_log(state, RECORDS)
        secrets = Secrets("t" * 43, "c" * 43, "127.0.0.1", 1)
        host = "127.0.0.1:1"
        url = f"/?token={secrets.token}"
        runs = max(5, ctx.runs // 3)
        loop = asyncio.new_event_loop()
        try:

            def cold() -> float:
                app, ui = build(state, secrets)  # a server's start (templates compiled)
                start = time.perf_counter()
                loop.run_until_complete(_get(app, host, url))
                elapsed = (time.perf_counter() - start) * 1000
                ui.index.refresh()  # let its background indexing finish, untimed
                return elapsed

            app = build_app(state, secrets)

            def warm() -> None:
                loop.run_until_complete(_get(app, host, url))

            def appended() -> None:
                append(state, {"argv": ["true"], "backend": "bubblewrap", "duration": 0.01})
                loop.run_until_complete(_get(app, host, url))

            cold()
            cold_ms = statistics.median(cold() for _ in range(runs))
            warm_ms = ctx.median_ms(warm, runs)
            appended_ms = ctx.median_ms(appended, runs)
            verify_ms = ctx.median_ms(lambda: verify(state), runs, warmup=1)
            index_ms = ctx.median_ms(lambda: RunIndex(state).refresh(), runs, warmup=1)
        finally:
            loop.close()
    return [
        Row(
            f"runs page, first screen, cold ({RECORDS:,} records)",
            cold_ms,
            samples=runs,
            baseline="audit --verify",
            target="<= 300 ms",
            note=ratio(cold_ms, verify_ms),
        ),
        Row(
            "full index (background)",
            index_ms,
            samples=runs,
            baseline="audit --verify",
            note=ratio(index_ms, verify_ms),
        ),
        Row("runs page, warm (index kept)", warm_ms, samples=runs),
        Row("runs page after one new record", appended_ms, samples=runs),
        Row(f"baseline: audit --verify ({RECORDS:,} records)", verify_ms, samples=runs),
    ]
