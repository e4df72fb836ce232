"""A root caller's writable roots must not be steerable by another host user.

For a root caller the ``--as-user`` stage idmaps each writable root (the host's
0 appears as the sandbox's uid) with ``open_tree`` + ``move_mount`` *by path,
as root*, and the write broker opens the same roots by path as root. When
another, unprivileged host user controls a directory on the way to such a root
(``/home/alice/proj/out`` with ``/home/alice`` alice's), she can replace a
component by a symbolic link to any root-owned directory: both the clone and
the broker follow it, so the sandbox owns that directory (reads root's 0600
files, stores new files as root's) although the policy granted only a path
below her directory. These tests make that attempt with uid 65534 as "alice"
against a scratch root-owned directory standing in for ``/etc``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.pipeline._request import ExecRequest
from corral.pipeline._runner import execute
from corral.policy import Policy
from tests.conftest import needs_bwrap, needs_root

pytestmark = [needs_root, needs_bwrap]

ALICE = 65534  # an unprivileged host user (nobody)


@pytest.fixture
def scene() -> Iterator[Path]:
    """base/{ws (root's workspace), alice (alice's 0755 dir), victim (root's, a 0600 secret)}."""
    base = Path("/tmp") / f"corral-other-user-{os.getpid()}"
    for name in ("ws", "alice", "victim"):
        (base / name).mkdir(parents=True)
    base.chmod(0o755)
    os.chown(base / "alice", ALICE, ALICE)
    secret = base / "victim" / "secret"
    secret.write_text("root-only-secret\n")
    secret.chmod(0o600)
    yield base
    shutil.rmtree(base)


@pytest.mark.xfail(
    strict=True,
    reason="ATK5: a root caller's allowWrite below another user's directory follows her "
    "symlink as root (the stage's idmapped clone and the write broker's root): the "
    "sandbox reads and writes the root-owned directory it points at",
)
def test_another_users_link_does_not_hand_the_sandbox_a_root_directory(scene: Path) -> None:
    # alice (uid 65534) plants proj -> the root-owned base (in real life: -> /)
    link = scene / "alice" / "proj"
    link.symlink_to(scene)
    os.chown(link, ALICE, ALICE, follow_symlinks=False)
    granted = f"{link}/victim"  # the root user meant "alice's proj/victim"
    policy = Policy.for_workspace(str(scene / "ws"), home=os.path.expanduser("~"))
    policy = policy.replace(
        backend="bubblewrap",
        filesystem=policy.filesystem.replace(
            allow_write=(*policy.filesystem.allow_write, granted)
        ),
    )
    script = f"cat {scene}/victim/secret {granted}/secret; echo x > {granted}/planted"
    request = ExecRequest.from_argv(["/bin/sh", "-c", script], cwd=str(scene / "ws"))
    outcome = execute(request, policy, environ=dict(os.environ))
    # refused (125) or run without reaching the root-owned directory: either way
    assert b"root-only-secret" not in outcome.stdout + outcome.stderr
    assert sorted(os.listdir(scene / "victim")) == ["secret"]
