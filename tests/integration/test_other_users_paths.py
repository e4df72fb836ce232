"""Paths another host user can re-point never steer a rule (docs/threat-model.md).

For a root caller the ``--as-user`` stage idmaps each writable root (the host's
0 appears as the sandbox's uid) with ``open_tree`` + ``move_mount`` *by path,
as root*, and the write broker opens the same roots by path as root. When
another, unprivileged host user controls a directory on the way to such a root
(``/home/alice/proj/out`` with ``/home/alice`` alice's), she can replace a
component by a symbolic link to any root-owned directory: both the clone and
the broker follow it, so the sandbox owns that directory (reads root's 0600
files, stores new files as root's) although the policy granted only a path
below her directory. These tests make that attempt with uid 65534 as "alice"
against a scratch root-owned directory standing in for ``/etc``; corral refuses
such a path for a root caller (``corral.backends._root_paths``). An
``allowRead`` entry below her directory would re-expose whatever she links it
to (the caller's ``~/.ssh``, hidden by the defaults): refused for every caller
(``corral.policy._expand``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import UsageError
from corral.backends import helper_path
from corral.backends.bubblewrap import ROOT_SANDBOX_ID
from corral.pipeline._request import ExecRequest
from corral.pipeline._runner import execute
from corral.policy import Policy
from corral.policy._owners import is_host_root, redirectable_by
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


def test_another_users_link_does_not_hand_the_sandbox_a_root_directory(scene: Path) -> None:
    # alice (uid 65534) plants proj -> the root-owned base (in real life: -> /)
    link = scene / "alice" / "proj"
    link.symlink_to(scene)
    os.chown(link, ALICE, ALICE, follow_symlinks=False)
    granted = f"{link}/victim"  # the root user meant "alice's proj/victim"
    policy = Policy.for_workspace(str(scene / "ws"), home=os.path.expanduser("~"))
    policy = policy.replace(
        backend="bubblewrap",
        filesystem=policy.filesystem.replace(allow_write=(*policy.filesystem.allow_write, granted)),
    )
    script = f"cat {scene}/victim/secret {granted}/secret; echo x > {granted}/planted"
    request = ExecRequest.from_argv(["/bin/sh", "-c", script], cwd=str(scene / "ws"))
    with pytest.raises(UsageError, match=f"uid {ALICE} can change {scene}/alice on the way"):
        execute(request, policy, environ=dict(os.environ))  # the CLI's exit 125
    assert sorted(os.listdir(scene / "victim")) == ["secret"]


def test_a_path_below_another_users_directory_is_refused_without_any_link(scene: Path) -> None:
    # no link yet: she could swap one in between the stage's clone and its mount (a race
    # that won 3 times in 40 runs before this rule), so the path itself is refused
    (scene / "alice" / "out").mkdir()
    os.chown(scene / "alice" / "out", ALICE, ALICE)
    assert redirectable_by(f"{scene}/alice/out") == (f"{scene}/alice", ALICE)
    # a path that does not exist yet below her directory: she may create it (as a link)
    assert redirectable_by(f"{scene}/alice/later/x") == (f"{scene}/alice", ALICE)
    # her own directory in a root-only parent is fine (only root can replace it) ...
    assert redirectable_by(f"{scene}/alice") is None
    # ... and so is root's entry in a sticky world-writable directory, but not hers
    sticky = scene / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "root-owned").mkdir()
    (sticky / "hers").mkdir()
    os.chown(sticky / "hers", ALICE, ALICE)
    assert redirectable_by(f"{sticky}/root-owned/x") is None
    assert redirectable_by(f"{sticky}/hers/x") == (f"{sticky}/hers", ALICE)
    assert redirectable_by(f"{sticky}/missing") == (f"{sticky}/missing", -1)  # anyone's to make
    sticky.chmod(0o777)  # without the sticky bit anyone may rename even root's entry
    assert redirectable_by(f"{sticky}/root-owned/x") == (str(sticky), -1)


def test_only_the_hosts_root_is_checked() -> None:
    # uid 0 of a user namespace (a sandbox's, `unshare --map-root-user`) sees host
    # directories as the overflow uid: checking it would refuse every path
    assert is_host_root()
    code = "from corral.policy._owners import is_host_root; print(is_host_root())"
    inner = subprocess.run(
        ["unshare", "--map-root-user", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert inner.stdout == "False\n"


def test_another_users_link_does_not_re_expose_a_hidden_secret(scene: Path) -> None:
    # root's home with a secret the defaults hide (~/.ssh), outside the sandbox's private /tmp
    home = Path("/var/lib") / f"corral-other-user-home-{os.getpid()}"
    (home / ".ssh").mkdir(parents=True)
    try:
        (home / ".ssh" / "id_rsa").write_text("root-ssh-key\n")
        link = scene / "alice" / "shared"
        link.symlink_to(home / ".ssh")  # alice: "shared" -> root's ~/.ssh
        os.chown(link, ALICE, ALICE, follow_symlinks=False)
        policy = Policy.for_workspace(str(scene / "ws"), home=str(home))
        policy = policy.replace(
            backend="bubblewrap",
            filesystem=policy.filesystem.replace(
                deny_read=(*policy.filesystem.deny_read, str(scene / "alice")),
                allow_read=(str(link),),
            ),
        )
        assert f"{home}/.ssh" in policy.filesystem.deny_read
        script = f"cat {home}/.ssh/id_rsa {link}/id_rsa"
        request = ExecRequest.from_argv(["/bin/sh", "-c", script], cwd=str(scene / "ws"))
        with pytest.raises(UsageError, match=f"uid {ALICE} can change {scene}/alice on the way"):
            execute(request, policy, environ={**os.environ, "HOME": str(home)})
    finally:
        shutil.rmtree(home)


def test_a_staged_source_another_user_links_below_a_root_only_directory(scene: Path) -> None:
    guarded = scene / "guarded"
    (guarded / "inner").mkdir(parents=True)
    (guarded / "inner" / "file").write_text("behind-a-0700-directory\n")  # 0644 itself
    guarded.chmod(0o700)
    source = scene / "alice" / "src"
    # alice's link (or one the sandbox left in an earlier run); 65533 cannot walk through it,
    # so the stage clones the source as root
    source.symlink_to(guarded / "inner")
    os.chown(source, ALICE, ALICE, follow_symlinks=False)
    helper = helper_path()
    assert helper is not None
    argv = [helper, "--as-user", str(ROOT_SANDBOX_ID), "--stage", str(source), "--"]
    argv += [shutil.which("bwrap") or "/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev", "/dev"]
    argv += ["--ro-bind", "/dev/shm/0", "/mnt", "--", "/bin/cat", "/mnt/file"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    # root clones what the sandbox's uid cannot reach, so it must not follow her link there
    assert "behind-a-0700-directory" not in done.stdout
    assert done.returncode == 125
    assert "must have no symbolic link on its way" in done.stderr
