"""The escape battery, once more as an unprivileged user.

CI runs as root, and a root caller is a different sandbox (its uid 0 maps to
the host's uid 0; cgroups are its own to create). This test re-runs the escape
modules under pytest as an unprivileged user (``CORRAL_TEST_UNPRIVILEGED_UID``,
default 65534) in the same CI run and asserts that they pass - and that they
really ran, not skipped. Every one of those modules attempts the real escape
and checks the host afterwards.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import TEST_ROOT, needs_bwrap, unreadable_for

#: The modules whose tests attempt escapes (paths from the repository root).
ESCAPE_MODULES = (
    "tests/integration/test_bubblewrap_escapes.py",
    "tests/integration/test_write_broker.py",
    "tests/integration/test_process_escapes.py",
    "tests/integration/test_git_persistence.py",
    "tests/integration/test_git_worktree_workspace.py",
    "tests/integration/test_resident_sessions.py",
    "tests/integration/server/test_warm_attacks.py",
    "tests/integration/server/test_one_server.py",
    "tests/integration/egress/test_unix_sockets.py",
    "tests/integration/test_host_terminals.py",
)

#: An unprivileged user has no cgroup to put limits in on a cgroup v1 host: the
#: defaults' limits are degraded (recorded) instead of refusing every run. The
#: tests of the limits themselves need root and skip.
_SETTINGS = '{"allowDegraded": ["resources.memory", "resources.pids", "resources.cpus"]}\n'


#: Set in the inner run, so that it never starts a third.
_INNER = "CORRAL_TEST_UNPRIVILEGED_PASS"

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@needs_bwrap
@pytest.mark.skipif(bool(os.environ.get(_INNER)), reason="already the unprivileged pass")
def test_escape_battery_passes_as_an_unprivileged_user() -> None:
    uid = int(os.environ.get("CORRAL_TEST_UNPRIVILEGED_UID", "65534"))
    import corral

    package = os.path.dirname(os.path.abspath(corral.__file__))
    problem = unreadable_for(
        uid, sys.executable, package, *(f"{_REPO}/{m}" for m in ESCAPE_MODULES)
    )
    if problem is not None:
        pytest.skip(problem)
    # where root's worlds live too: outside the private /tmp and /var/tmp of a sandbox,
    # so a world's "outside" directory is visible (read-only) to its commands
    os.makedirs(TEST_ROOT, mode=0o755, exist_ok=True)
    # short: a unix socket's path (the corral server's, the tests' own) must fit in 107 bytes
    scratch = tempfile.mkdtemp(prefix="corral-u-", dir=TEST_ROOT)
    try:
        os.chmod(scratch, 0o755)  # the test user must reach its own home below
        home, worlds = os.path.join(scratch, "home"), os.path.join(scratch, "worlds")
        for path in (home, worlds):
            os.mkdir(path)
            os.chown(path, uid, uid)
        settings = os.path.join(scratch, "settings.json")
        with open(settings, "w", encoding="utf-8") as f:
            f.write(_SETTINGS)
        os.chmod(settings, 0o644)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "LANG": "C.UTF-8",
            "CORRAL_TEST_ROOT": worlds,
            "CORRAL_SETTINGS": settings,
            "PYTHONDONTWRITEBYTECODE": "1",
            _INNER: "1",
        }
        result = subprocess.run(
            [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--",
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                *ESCAPE_MODULES,
            ],
            cwd=_REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    tail = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    summary = result.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed is not None and int(passed.group(1)) >= 40, tail
    # "1 xfailed" is a known hole held by a strict xfail, not a failure
    assert not re.search(r"\b\d+ (failed|errors?)\b", summary), tail
    # the sandbox itself ran: nothing skipped because bubblewrap or landlock is unusable
    skips = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert not [s for s in skips if "bubblewrap is not available" in s or "bwrap" in s], skips
    assert not [s for s in skips if "landlock is not available" in s], skips
