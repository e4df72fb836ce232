"""Shared fixtures: a throw-away world (home with secrets, a git workspace,
files outside it) and a way to run the installed ``corral`` command.

Worlds live outside ``/tmp``: inside a sandbox ``/tmp`` is a private tmpfs,
so a fake home under ``/tmp`` would be invisible anyway and secret-hiding
tests would pass for the wrong reason. ``CORRAL_TEST_ROOT`` picks the base
directory (default ``/var/lib/corral-tests``).

An autouse fixture fails a test that leaves a process behind whose command
line or working directory mentions its world.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

TEST_ROOT = os.environ.get("CORRAL_TEST_ROOT", "/var/lib/corral-tests")
# `corral run` starts a per-user server when none runs; with a HOME per test that
# would be a server per test. Tests run corral in-process unless they say otherwise
# (tests/integration/server/ starts and stops its own servers).
os.environ["CORRAL_SERVER"] = "off"
SECRET_ENV_VALUE = "s3cr3t-env-value-4711"
SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- corral-test-key -----END OPENSSH PRIVATE KEY-----\n"
AWS_CREDENTIALS = "[default]\naws_secret_access_key = corral-test-aws-secret\n"
PROBE_PYTHON = "/usr/bin/python3"  # visible in every sandbox (a venv under /tmp is not)


def corral_command() -> list[str]:
    """How to start the installed corral (the script next to this interpreter)."""
    candidate = os.path.join(os.path.dirname(sys.executable), "corral")
    if os.access(candidate, os.X_OK):
        return [candidate]
    return [sys.executable, "-m", "corral"]


def unreadable_for(uid: int, *paths: str) -> str | None:
    """Why *uid* cannot read one of *paths* (checked as that user), or None.

    Tests that run corral as an unprivileged user need its interpreter and
    package; a checkout inside a private directory (``mktemp -d`` is 0700)
    hides them. Needs root and setpriv.
    """
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv (util-linux) to act as another user"
    for path in paths:
        probe = subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "test", "-r", path],
            check=False,
        )
        if probe.returncode != 0:
            return (
                f"uid {uid} cannot read {path}: a directory above it is private "
                "(make the checkout world-readable, e.g. chmod 755)"
            )
    return None


def fast_client_path() -> str | None:
    """This installation's compiled client, its sidecar written; None when it was not built."""
    from corral.server._fastclient import usable_client

    return usable_client()


def client_command(client: str) -> list[str]:
    """``corral`` (the Python CLI) or ``corral-client`` (the compiled fast client)."""
    if client == "corral":
        return corral_command()
    path = fast_client_path()
    if path is None:
        pytest.skip("corral-client was not built (make native)")
    return [path]


class World:
    """A home, a workspace (a git repository skeleton) and an outside directory."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.home = os.path.join(root, "home")
        self.workspace = os.path.join(root, "ws")
        self.outside = os.path.join(root, "outside")
        for directory in (self.home, self.outside, os.path.join(self.workspace, ".git")):
            os.makedirs(directory)
        self.write(os.path.join(self.home, ".ssh", "id_ed25519"), SSH_KEY)
        self.write(os.path.join(self.home, ".ssh", "id_rsa"), "SECRET-KEY\n")
        self.write(os.path.join(self.home, ".aws", "credentials"), AWS_CREDENTIALS)
        self.write(os.path.join(self.home, ".bashrc"), "# home bashrc\n")
        self.write(os.path.join(self.outside, "target.txt"), "outside original\n")
        self.write(os.path.join(self.outside, "victim.txt"), "original\n")
        self.write(os.path.join(self.workspace, "README"), "hello\n")
        self.environ: dict[str, str] = {
            "HOME": self.home,
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "SECRET_TOKEN": SECRET_ENV_VALUE,
            "PYTHONDONTWRITEBYTECODE": "1",
            "CORRAL_SERVER": "off",
        }
        # CORRAL_SETTINGS: the unprivileged pass; CORRAL_RESIDENT=0: SDK sessions without a
        # resident sandbox (to compare a test against fresh sandboxes)
        for name in ("CORRAL_BWRAP", "CORRAL_SETTINGS", "CORRAL_RESIDENT"):
            if name in os.environ:
                self.environ[name] = os.environ[name]

    def seed_persistence_points(self) -> None:
        """Existing persistence points in the workspace: .git/config, a hook, .bashrc."""
        self.write(os.path.join(self.workspace, ".git", "config"), "[core]\n\tbare = false\n")
        self.write(
            os.path.join(self.workspace, ".git", "hooks", "pre-commit"), "#!/bin/sh\nexit 0\n"
        )
        self.write(os.path.join(self.workspace, ".bashrc"), "# workspace bashrc\n")

    @staticmethod
    def write(path: str, content: str | bytes) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
        return path

    @staticmethod
    def read(path: str) -> str:
        with open(path, encoding="utf-8") as f:
            return f.read()

    def ws(self, *parts: str) -> str:
        return os.path.join(self.workspace, *parts)

    @property
    def state_dir(self) -> str:
        return os.path.join(self.home, ".local", "state", "corral")

    @property
    def secret(self) -> str:
        """A private key that must never be readable inside a sandbox."""
        return os.path.join(self.home, ".ssh", "id_rsa")

    @property
    def victim(self) -> str:
        """A file outside the workspace that must never change."""
        return os.path.join(self.outside, "victim.txt")

    def audit_records(self) -> list[dict[str, object]]:
        import json

        path = os.path.join(self.state_dir, "audit.jsonl")
        if not os.path.exists(path):
            return []
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    def corral(
        self,
        *args: str,
        cwd: str | None = None,
        input: bytes | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        client: str = "corral",
    ) -> subprocess.CompletedProcess[bytes]:
        """Run the installed ``corral`` (or *client*, e.g. ``corral-client``) with this world's environment."""
        environ = dict(self.environ)
        if env:
            environ.update(env)
        return subprocess.run(
            [*client_command(client), *args],
            cwd=cwd or self.workspace,
            env=environ,
            input=input,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def run(self, command: str, *options: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        """``corral run [options] -c COMMAND`` in the workspace."""
        extra = ("--backend", "none") if os.environ.get("CORRAL_TEST_FORCE_NONE") else ()
        return self.corral("run", *extra, *options, "-c", command, **kwargs)

    def tree(self) -> dict[str, bytes]:
        """Every file under the world (path -> content), to prove nothing changed."""
        result: dict[str, bytes] = {}
        for directory, _dirs, files in os.walk(self.root):
            if directory.startswith(self.state_dir):
                continue
            for name in files:
                path = os.path.join(directory, name)
                if os.path.islink(path):
                    result[path] = b"->" + os.readlink(path).encode()
                else:
                    with open(path, "rb") as f:
                        result[path] = f.read()
        return result


def _processes_mentioning(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if marker in cmdline or marker in cwd:
            found.append(f"{pid}: {cmdline.strip()} (cwd {cwd})")
    return found


@pytest.fixture
def world() -> Iterator[World]:
    """A fresh world; fails the test if a process that mentions it outlives it."""
    os.makedirs(TEST_ROOT, exist_ok=True)
    root = os.path.join(TEST_ROOT, f"w-{uuid.uuid4().hex[:12]}")
    os.makedirs(root)
    w = World(root)
    try:
        yield w
        strays = _processes_mentioning(root)
        assert not strays, f"processes outlived the test: {strays}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def corral_servers() -> dict[int, str]:
    """Running ``corral server`` processes of this checkout's interpreter: pid -> command line."""
    here = os.path.dirname(sys.executable)
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue  # another user's (the unprivileged pass runs beside root's tests)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if b"corral" in b" ".join(words[:4]) and b"server" in words and b"--state-dir" in words:
            if os.path.dirname(words[0].decode(errors="replace")) != here:
                continue  # another checkout's (engineers working side by side on one machine)
            found[int(pid)] = b" ".join(words).decode(errors="replace")
    return found


@pytest.fixture(autouse=True, scope="session")
def _no_server_outlives_the_tests() -> Iterator[None]:
    """Fails the session if a test left a corral server running."""
    before = corral_servers()
    yield
    import time

    deadline = time.monotonic() + 10
    left = {}
    while time.monotonic() < deadline:
        left = {pid: cmd for pid, cmd in corral_servers().items() if pid not in before}
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"corral servers outlived the tests: {left}"


def bwrap_available() -> str | None:
    """Why the bubblewrap backend cannot be tested here, or None."""
    from corral.backends import _find_bwrap, helper_path

    if _find_bwrap(dict(os.environ)) is None:
        return "no bwrap binary (apt-get install bubblewrap)"
    if helper_path() is None:
        return "corral's exec helper was not built (make native)"
    return None


def is_root() -> bool:
    return os.geteuid() == 0


needs_bwrap = pytest.mark.skipif(bwrap_available() is not None, reason=str(bwrap_available()))
needs_root = pytest.mark.skipif(not is_root(), reason="needs root (cgroup v1 limits)")
