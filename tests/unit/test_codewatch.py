"""CodeWatch without inotify: the kernel refuses it, the stat check still sees every change.

The refusal is real: the watch runs in a user namespace whose
``max_inotify_instances`` is 0, so ``inotify_init1`` fails with ``EMFILE``
exactly as it does when a user's 128 instances are spent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import os, shutil, sys
from corral.server._codewatch import CodeWatch

root = sys.argv[1]
code = os.path.join(root, "corral")

def watch():
    w = CodeWatch(code)
    assert w.fd is None and "no inotify" in w.fallback, (w.fd, w.fallback)
    assert w.poll() == ""
    return w

def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(data)

w = watch()  # not code: bytecode caches and the fast client's sidecar
write(os.path.join(code, "__pycache__", "a.cpython-311.pyc"), "cache")
write(os.path.join(code, "sub", "__pycache__", "b.cpython-311.pyc"), "cache")
write(os.path.join(code, "_bin", "corral-client.cli.tmp"), "record")
os.replace(os.path.join(code, "_bin", "corral-client.cli.tmp"),
           os.path.join(code, "_bin", "corral-client.cli"))
assert w.poll() == "", w.poll()

changes = {
    "same-size rewrite": lambda: write(os.path.join(code, "a.py"), "X = 2\n"),
    "new module": lambda: write(os.path.join(code, "sub", "new.py"), ""),
    "removed module": lambda: os.unlink(os.path.join(code, "sub", "b.py")),
    "new package": lambda: write(os.path.join(code, "pkg", "__init__.py"), ""),
    "renamed over": lambda: (write(os.path.join(root, "c.py"), "Y = 1\n"),
                             os.replace(os.path.join(root, "c.py"), os.path.join(code, "a.py"))),
    "chmod": lambda: os.chmod(os.path.join(code, "sub", "b.py"), 0o600),
}
for name, change in changes.items():
    shutil.rmtree(code)
    shutil.copytree(os.path.join(root, "pristine"), code)
    w = watch()
    change()
    assert w.poll(), name
    assert w.poll(), name  # a change seen stays seen
print("ok")
"""


def test_without_inotify_the_stat_check_sees_every_change(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    pristine = tmp_path / "pristine"
    (pristine / "sub").mkdir(parents=True)
    (pristine / "_bin").mkdir()
    (pristine / "a.py").write_text("X = 1\n")
    (pristine / "sub" / "b.py").write_text("B = 1\n")
    shutil.copytree(pristine, tmp_path / "corral")
    result = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            'echo 0 > /proc/sys/user/max_inotify_instances && exec "$0" -c "$1" "$2"',
            sys.executable,
            SCRIPT,
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 and "max_inotify_instances" in result.stderr:
        pytest.skip(f"cannot lower the inotify limit in a user namespace: {result.stderr}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"


def test_with_inotify_the_watch_has_a_descriptor(tmp_path: Path) -> None:
    from corral.server._codewatch import CodeWatch

    (tmp_path / "a.py").write_text("")
    watch = CodeWatch(str(tmp_path))
    try:
        if watch.fd is None:
            pytest.skip(f"this user has no inotify instance left: {watch.fallback}")
        assert watch.fallback == ""
        assert watch.poll() == ""
        (tmp_path / "a.py").write_text("X = 1\n")
        assert watch.poll() == "a.py"
    finally:
        watch.close()
    assert os.path.exists(tmp_path / "a.py")
