"""A session whose process was killed (never closed) leaves its TMPDIR; the next session sweeps it."""

from __future__ import annotations

import os
import subprocess
import sys

from corral import Sandbox
from tests.conftest import World, needs_bwrap

pytestmark = needs_bwrap


def test_tmpdirs_of_killed_sessions_are_swept(world: World) -> None:
    code = (
        "import os, sys\n"
        "from corral import Sandbox\n"
        f"s = Sandbox(workspace={world.workspace!r}, environ={world.environ!r})\n"
        "s.exec(['sh', '-c', 'echo data > /tmp/left-behind'])\n"
        "print(s.tmp_dir, flush=True)\n"
        "os._exit(0)  # no close(): as if killed\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=world.environ
    )
    leftover = out.stdout.strip()
    assert os.path.exists(os.path.join(leftover, "left-behind"))
    with Sandbox(workspace=world.workspace, environ=world.environ) as sbx:
        assert not os.path.exists(leftover)
        assert os.path.basename(sbx.tmp_dir).startswith(f"{os.getpid()}-")
