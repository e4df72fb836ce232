"""MCP sandboxes on a preview of the workspace: sandbox_diff and sandbox_apply end to end."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from ..conftest import World, needs_bwrap
from .test_mcp_server import call, with_client

pytest.importorskip(
    "mcp", reason="the mcp package (2.x) is not installed: pip install 'corral[mcp]'"
)


pytestmark = needs_bwrap


def test_changes_are_reviewed_then_applied(world: World) -> None:
    async def body(client: Any) -> None:
        created = await call(client, "sandbox_create")  # preview by default
        sid = created["sandbox_id"]
        assert created["preview_id"].startswith("pv-")
        await call(client, "sandbox_exec", sandbox_id=sid, command="echo new > made.txt")
        assert not os.path.exists(os.path.join(world.workspace, "made.txt"))  # noqa: ASYNC240
        assert "made.txt" in json.dumps(await call(client, "sandbox_diff", sandbox_id=sid))
        await call(client, "sandbox_exec", sandbox_id=sid, command="printf 'a\\nB\\n' > tracked")
        diff = await call(client, "sandbox_diff", sandbox_id=sid)
        by_path = {c["path"]: c for c in diff["changes"]}
        assert by_path["tracked"]["kind"] == "modified"
        assert by_path["tracked"]["diff"] == "@@ -1,2 +1,2 @@\n a\n-b\n+B"
        assert by_path["made.txt"]["diff"] == "@@ -0,0 +1 @@\n+new"
        assert diff["diff_truncated"] is False
        applied = await call(client, "sandbox_apply", sandbox_id=sid)
        assert sorted(applied["applied"]) == ["made.txt", "tracked"], applied
        assert applied["quarantined"] == [] and applied["failed"] == [], applied
        await call(client, "sandbox_destroy", sandbox_id=sid)

    with open(os.path.join(world.workspace, "tracked"), "w") as f:
        f.write("a\nb\n")
    with_client(world, body)
    assert world.read(os.path.join(world.workspace, "made.txt")) == "new\n"
    assert world.read(os.path.join(world.workspace, "tracked")) == "a\nB\n"


def test_destroy_with_discard_drops_the_changes(world: World) -> None:
    async def body(client: Any) -> None:
        sid = (await call(client, "sandbox_create"))["sandbox_id"]
        await call(client, "sandbox_exec", sandbox_id=sid, command="echo gone > dropped.txt")
        await call(client, "sandbox_destroy", sandbox_id=sid, discard=True)

    with_client(world, body)
    assert not os.path.exists(os.path.join(world.workspace, "dropped.txt"))


def test_diffs_are_capped_in_size(world: World) -> None:
    settings = os.path.join(world.home, ".config", "corral", "settings.json")
    os.makedirs(os.path.dirname(settings))
    with open(settings, "w") as f:
        json.dump({"integrations": {"mcp": {"maxOutput": 1000}}}, f)

    async def body(client: Any) -> None:
        sid = (await call(client, "sandbox_create"))["sandbox_id"]
        command = "seq 1 2000 > big.txt; echo small > small.txt"
        await call(client, "sandbox_exec", sandbox_id=sid, command=command)
        diff = await call(client, "sandbox_diff", sandbox_id=sid)
        assert diff["diff_truncated"] is True
        texts = {c["path"]: c["diff"] for c in diff["changes"]}
        assert texts["big.txt"].startswith("@@ -0,0 +1,2000 @@\n+1\n+2\n")
        assert "output truncated" in texts["big.txt"]
        assert "maxOutput reached" in texts["small.txt"]
        assert sum(len(t.encode()) for t in texts.values()) < 1300

    with_client(world, body)


def test_destroy_removes_a_preview_without_changes(world: World) -> None:
    async def body(client: Any) -> tuple[str, str]:
        empty = await call(client, "sandbox_create")
        await call(client, "sandbox_exec", sandbox_id=empty["sandbox_id"], command="true")
        changed = await call(client, "sandbox_create")
        await call(client, "sandbox_exec", sandbox_id=changed["sandbox_id"], command=": > x")
        for created, removed in ((empty, True), (changed, False)):
            result = await call(client, "sandbox_destroy", sandbox_id=created["sandbox_id"])
            assert result["preview_removed"] is removed
        return empty["preview_id"], changed["preview_id"]

    empty_id, changed_id = with_client(world, body)
    listed = world.corral("previews", "--json")
    assert changed_id in listed.stdout.decode() and empty_id not in listed.stdout.decode()
