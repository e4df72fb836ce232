"""A deeply nested JSON-RPC message to ``corral mcp`` is an error answer, not a crash.

The server's messages are parsed by the MCP SDK (pydantic-core, which stops
at a nesting limit); this proves it over the real stdio transport: the server
answers the next request after the hostile line.
"""

from __future__ import annotations

import json
import select
import subprocess
import time

import pytest

from ..conftest import World, corral_executable, needs_bwrap

pytest.importorskip("mcp", reason="the mcp package (2.x) is not installed")
pytestmark = needs_bwrap


def _read_reply(proc: subprocess.Popen[bytes], want_id: int, deadline: float) -> dict[str, object]:
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if not ready:
            continue
        line = proc.stdout.readline()
        if not line:
            break
        message = json.loads(line)
        if message.get("id") == want_id:
            return message  # type: ignore[no-any-return]
    raise AssertionError(f"no reply to request {want_id}")


def test_a_deep_message_does_not_crash_the_server(world: World) -> None:
    proc = subprocess.Popen(
        [corral_executable(), "mcp"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=world.environ,
        cwd=world.workspace,
    )
    assert proc.stdin is not None
    try:
        deadline = time.monotonic() + 60

        def send(message: str) -> None:
            assert proc.stdin is not None
            proc.stdin.write(message.encode() + b"\n")
            proc.stdin.flush()

        send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "deep", "version": "1"},
                    },
                }
            )
        )
        assert "result" in _read_reply(proc, 1, deadline)
        send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        deep = "[" * 100_000 + "]" * 100_000
        send('{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"x": ' + deep + "}}")
        send(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        reply = _read_reply(proc, 3, deadline)
        assert "result" in reply, reply  # still serving after the hostile line
        assert proc.poll() is None
    finally:
        proc.kill()
        _out, err = proc.communicate(timeout=30)
    assert b"RecursionError" not in err
