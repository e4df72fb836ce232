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
        await call(client, "sandbox_apply", sandbox_id=sid)
        await call(client, "sandbox_destroy", sandbox_id=sid)

    with_client(world, body)
    assert world.read(os.path.join(world.workspace, "made.txt")) == "new\n"


def test_destroy_with_discard_drops_the_changes(world: World) -> None:
    async def body(client: Any) -> None:
        sid = (await call(client, "sandbox_create"))["sandbox_id"]
        await call(client, "sandbox_exec", sandbox_id=sid, command="echo gone > dropped.txt")
        await call(client, "sandbox_destroy", sandbox_id=sid, discard=True)

    with_client(world, body)
    assert not os.path.exists(os.path.join(world.workspace, "dropped.txt"))
