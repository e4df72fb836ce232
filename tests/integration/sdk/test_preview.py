"""Sandbox(preview=True) end to end: commands change a copy-on-write view; diff, apply, discard."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from ..conftest import World, needs_bwrap

pytestmark = [needs_bwrap]


def test_preview_changes_land_only_on_apply(open_sandbox: Callable[..., Any], world: World) -> None:
    sbx = open_sandbox(workspace=world.workspace, environ=world.environ, preview=True)
    assert sbx.preview is not None
    sbx.exec("echo new > created.txt").check()
    sbx.write_file("written.txt", "via write_file\n")
    assert sbx.read_file("created.txt") == b"new\n"
    assert not os.path.exists(os.path.join(world.workspace, "created.txt"))
    changes = json.dumps(sbx.diff().to_json())
    assert "created.txt" in changes
    assert "written.txt" in changes
    sbx.apply()
    assert world.read(os.path.join(world.workspace, "created.txt")) == "new\n"


def test_discard_drops_the_changes(open_sandbox: Callable[..., Any], world: World) -> None:
    sbx = open_sandbox(workspace=world.workspace, environ=world.environ, preview=True)
    sbx.exec("echo gone > dropped.txt").check()
    sbx.discard()
    assert not os.path.exists(os.path.join(world.workspace, "dropped.txt"))
