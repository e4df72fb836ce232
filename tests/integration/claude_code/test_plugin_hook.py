"""The Claude Code plugin's hook script (``plugins/corral/hooks/corral-hook``) on real input.

It answers with the ``corral`` on ``PATH`` until that corral recorded its
fast client (``<state dir>/fast-client``), then with the fast client - whose
answers a real corral server gives, byte for byte the same.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.conftest import fast_client_path
from tests.integration.server.conftest import status, stop

from ..conftest import World, corral_executable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PLUGIN = os.path.join(ROOT, "plugins", "corral")


def _command() -> str:
    with open(os.path.join(PLUGIN, "hooks", "hooks.json"), encoding="utf-8") as f:
        command: str = json.load(f)["hooks"]["PreToolUse"][0]["hooks"][0]["command"]
    return command


def _hook(world: World, path: str) -> subprocess.CompletedProcess[bytes]:
    payload = {
        "session_id": "s-plugin",
        "cwd": world.workspace,
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "make test"},
    }
    return subprocess.run(
        ["/bin/sh", "-c", _command()],
        input=json.dumps(payload).encode(),
        capture_output=True,
        env={**world.environ, "PATH": path, "CLAUDE_PLUGIN_ROOT": PLUGIN},
        cwd=world.workspace,
        timeout=60,
        check=False,
    )


def test_the_plugin_hook_switches_to_the_fast_client_once_recorded(world: World) -> None:
    fast = fast_client_path()
    if fast is None:
        pytest.skip("corral-client was not built (make native)")
    path = f"{os.path.dirname(corral_executable())}:/usr/bin:/bin"
    record = os.path.join(world.state_dir, "fast-client")
    del world.environ["CORRAL_SERVER"]
    assert world.corral("server", "--detach").returncode == 0
    try:
        first = _hook(world, path)  # the corral on PATH answers, and records the fast client
        assert first.returncode == 0, first.stderr
        assert World.read(record) == f"{corral_executable()}\n{fast}\n"
        assert status(world)["hooks"] == 0  # type: ignore[index]
        second = _hook(world, path)  # now the fast client, through the server
        assert (second.returncode, second.stdout, second.stderr) == (0, first.stdout, b"")
        assert status(world)["hooks"] == 1  # type: ignore[index]
        World.write(record, f"/elsewhere/bin/corral\n{fast}\n")  # another corral's record
        third = _hook(world, path)
        assert third.stdout == first.stdout
        assert status(world)["hooks"] == 1  # type: ignore[index]  # not used ...
        assert World.read(record) == f"{corral_executable()}\n{fast}\n"  # ... and replaced
    finally:
        stop(world)


def test_the_plugin_hook_blocks_without_corral_on_path(world: World) -> None:
    result = _hook(world, "/nonexistent")
    assert result.returncode == 2
    assert result.stderr == b"corral: the corral command is not on PATH; the tool call is blocked\n"
