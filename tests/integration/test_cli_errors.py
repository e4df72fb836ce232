"""Bad input never runs anything: exit 125 with one clear ``corral:`` line.

Each case asks the command to create a marker file; the marker must not exist
afterwards.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import World, needs_bwrap

pytestmark = needs_bwrap

MARKER = "ran.marker"


def _assert_refused(world: World, result: object, *needles: str) -> None:
    assert result.returncode == 125, (result.returncode, result.stderr)  # type: ignore[attr-defined]
    err = result.stderr.decode()  # type: ignore[attr-defined]
    lines = [
        line for line in err.splitlines() if line.startswith("corral:") and "hint:" not in line
    ]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not os.path.exists(world.ws(MARKER)), "the command ran"
    assert result.stdout == b""  # type: ignore[attr-defined]


def _project_settings(world: World, content: str) -> str:
    return World.write(world.ws(".corral", "settings.json"), content)


def test_malformed_json_is_refused(world: World) -> None:
    path = _project_settings(world, '{"network": {"mode": "none",}}')
    result = world.run(f"touch {MARKER}")
    _assert_refused(world, result, path, "line 1")


def test_unknown_key_is_refused_with_did_you_mean(world: World) -> None:
    path = _project_settings(world, '{"filesystem": {"alowWrite": ["/x"]}}')
    result = world.run(f"touch {MARKER}")
    _assert_refused(world, result, path, "filesystem.alowWrite", "allowWrite")


def test_wrong_type_is_refused(world: World) -> None:
    path = World.write(
        os.path.join(world.home, ".config", "corral", "settings.json"),
        '{"resources": {"pids": "many"}}',
    )
    result = world.run(f"touch {MARKER}")
    _assert_refused(world, result, path, "resources.pids")


@pytest.mark.parametrize(
    "flag", [["--memory", "12Q"], ["--timeout", "soon"], ["--pids", "x"], ["--max-output", "-5"]]
)
def test_bad_size_or_duration_is_refused(world: World, flag: list[str]) -> None:
    result = world.run(f"touch {MARKER}", *flag)
    _assert_refused(world, result, flag[0])


def test_unknown_backend_is_refused(world: World) -> None:
    result = world.run(f"touch {MARKER}", "--backend", "chroot")
    _assert_refused(world, result, "chroot")


def test_unknown_option_is_refused(world: World) -> None:
    result = world.corral("run", "--memroy", "1G", "--", "touch", MARKER)
    _assert_refused(world, result, "--memroy", "--memory")


def test_missing_bwrap_is_refused(world: World) -> None:
    result = world.run(
        f"touch {MARKER}", "--backend", "bubblewrap", env={"CORRAL_BWRAP": "/nonexistent/bwrap"}
    )
    _assert_refused(world, result, "bubblewrap", "CORRAL_BWRAP")


def test_missing_workspace_is_refused(world: World) -> None:
    result = world.run(f"touch {MARKER}", "--workspace", os.path.join(world.root, "nope"))
    _assert_refused(world, result, "nope")


def test_no_command_is_refused(world: World) -> None:
    result = world.corral("run")
    _assert_refused(world, result, "no command")


def test_unknown_subcommand_is_refused(world: World) -> None:
    result = world.corral("rnu", "--", "touch", MARKER)
    _assert_refused(world, result, "rnu", "run")


def _package_dir() -> str:
    import corral

    return os.path.dirname(corral.__file__)


def _as_nobody(world: World) -> list[str]:
    """Run corral as an unprivileged user (no writable cgroup): setpriv + a world it owns."""
    for directory, dirs, files in os.walk(world.root):
        for name in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
            os.lchown(name, 65534, 65534)
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_unenforceable_limit_is_refused_unless_degraded(world: World) -> None:
    import subprocess

    from tests.conftest import corral_command, unreadable_for

    if os.geteuid() == 0:
        problem = unreadable_for(65534, corral_command()[0], _package_dir())
        if problem is not None:
            pytest.skip(problem)
    prefix = _as_nobody(world) if os.geteuid() == 0 else []
    env = dict(world.environ)

    def run(*options: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [*prefix, *corral_command(), "run", *options, "-c", f"touch {MARKER}"],
            cwd=world.workspace,
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )

    result = run("--memory", "64M")
    _assert_refused(world, result, "resources.memory")
    assert b"--allow-degraded resources.memory" in result.stderr
    result = run("--memory", "64M", "--pids", "none", "--allow-degraded", "resources.memory")
    assert result.returncode == 0, result.stderr
    assert b"resources.memory was not enforced" in result.stderr
    assert os.path.exists(world.ws(MARKER))
