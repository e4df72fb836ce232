"""Removing sandbox-owned trees never follows a link the sandbox planted (issue 10, section 5).

The removal runs as an unprivileged user (root ignores the modes that force
the chmod path): a read-only directory holding a symlink to a file outside,
and a mode-000 directory. Afterwards the tree is gone and the outside file
keeps its mode and content.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as uid 65534")

REMOVERS = {
    "preview": "from corral.preview._mechanism import remove_tree as rm",
    "session": "from corral._session_dirs import remove_tree as rm",
}


def _as_nobody(code: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
        ],
        capture_output=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize("remover", sorted(REMOVERS))
def test_removal_does_not_follow_planted_symlinks(remover: str) -> None:
    base = tempfile.mkdtemp(prefix="corral-rmtree-")  # pytest's tmp_path is 0700 root
    os.chmod(base, 0o755)
    os.chown(base, NOBODY, NOBODY)  # nobody removes tree/ from it
    try:
        _attempt(base, remover)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _attempt(base: str, remover: str) -> None:
    probe = _as_nobody("import corral")
    if probe.returncode != 0:
        pytest.skip(f"corral is not importable as uid {NOBODY}: {probe.stderr[-200:]!r}")
    outside = os.path.join(base, "outside.txt")
    with open(outside, "w") as f:
        f.write("keep\n")
    os.chmod(outside, 0o600)
    os.chown(outside, NOBODY, NOBODY)
    tree = os.path.join(base, "tree")
    ro = os.path.join(tree, "ro")
    zero = os.path.join(tree, "zero")
    os.makedirs(ro)
    os.makedirs(os.path.join(zero, "deep"))
    with open(os.path.join(zero, "deep", "f"), "w") as f:
        f.write("x")
    os.symlink(outside, os.path.join(ro, "link"))
    os.symlink(outside, os.path.join(tree, "dirlink"))
    for directory, dirs, files in os.walk(tree):
        for name in (*dirs, *files):
            os.lchown(os.path.join(directory, name), NOBODY, NOBODY)
    os.lchown(tree, NOBODY, NOBODY)
    os.chmod(ro, 0o500)
    os.chmod(os.path.join(zero, "deep"), 0o000)
    os.chmod(zero, 0o000)
    result = _as_nobody(f"{REMOVERS[remover]}\nrm({tree!r})")
    assert result.returncode == 0, result.stderr
    assert not os.path.lexists(tree)
    assert oct(os.stat(outside).st_mode & 0o777) == oct(0o600)
    with open(outside) as f:
        assert f.read() == "keep\n"
