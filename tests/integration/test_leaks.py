"""1,000 runs in a row leave no stray process, mount, cgroup, temp dir, thread or open fd."""

from __future__ import annotations

import os
import threading

import pytest

from tests.conftest import World, corral_command, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.slow]


def _fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def _children() -> list[int]:
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rfind(b")") + 2 :].split()[1].decode() == me:
                found.append(int(pid))
    return found


def _named_cgroups() -> list[tuple[str, int]]:
    """corral's cgroups on the host with the pid each is named after (``corral-<pid>-...``)."""
    found = []
    for base in (
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/freezer",
        "/sys/fs/cgroup",
    ):
        for directory, dirs, _files in os.walk(base):
            found += [
                (os.path.join(directory, d), int(d.split("-")[1]))
                for d in dirs
                if d.startswith("corral-") and d.split("-")[1].isdigit()
            ]
            if directory.count("/") > 7:
                dirs[:] = []
    return found


#: corral's cgroups on the host when this module was imported: groups an earlier, killed
#: corral left behind (named after a pid this run may reuse: pid_max is 32768 here) are not
#: this run's leaks
_EXISTING = frozenset(path for path, _pid in _named_cgroups())


def _corral_cgroups(pids: set[int]) -> list[str]:
    """cgroups named by corral processes among *pids*, less those that existed before this
    module ran."""
    return [path for path, pid in _named_cgroups() if pid in pids and path not in _EXISTING]


def _private_tmp(world: World) -> str:
    """A TMPDIR for this test only: anything corral leaves in a temp dir shows up here
    (a shared /tmp would also show other programs' files)."""
    path = os.path.join(world.root, "host-tmp")
    os.makedirs(path, exist_ok=True)
    world.environ["TMPDIR"] = path
    return path


def _mounts(marker: str) -> list[str]:
    """Host mounts that mention *marker* (the test's world)."""
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if marker in line]


def test_a_thousand_in_process_runs_leak_nothing(world: World) -> None:
    from corral.pipeline._request import ExecRequest
    from corral.pipeline._runner import execute
    from corral.policy import load_settings

    tmp = _private_tmp(world)
    resolved = load_settings(cwd=world.workspace, environ=world.environ, command="true")
    policy = resolved.policy
    state = world.state_dir
    baseline = (_fds(), _children(), threading.active_count())
    saved_tmpdir = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = tmp
    try:
        for i in range(1000):
            request = ExecRequest.from_argv(
                ["sh", "-c", f"echo {i} > out.txt; true"], cwd=world.workspace
            )
            outcome = execute(request, policy, environ=world.environ, state_dir=state)
            assert outcome.returncode == 0, outcome.stderr
    finally:
        if saved_tmpdir is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = saved_tmpdir
    assert World.read(world.ws("out.txt")) == "999\n"
    assert _fds() == baseline[0]
    assert _children() == baseline[1]
    assert _mounts(world.root) == []
    assert threading.active_count() == baseline[2]
    assert os.listdir(tmp) == []
    assert _corral_cgroups({os.getpid()}) == []
    from corral._audit import verify

    assert verify(state) == (True, "1000 records, chain intact")


def test_two_hundred_cli_runs_leak_nothing(world: World) -> None:
    import subprocess

    tmp = _private_tmp(world)
    before = _children()
    pids = set()
    for _ in range(200):
        proc = subprocess.Popen(
            [*corral_command(), "run", "--", "true"],
            cwd=world.workspace,
            env=world.environ,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        pids.add(proc.pid)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert _children() == before
    assert os.listdir(tmp) == []
    assert _mounts(world.root) == []
    assert _corral_cgroups(pids) == []


def test_two_hundred_runs_through_a_server_leak_nothing(world: World) -> None:
    """The server's fds, threads and cgroups come back to where they were."""
    import json
    import time

    from tests.integration.server.conftest import stop

    del world.environ["CORRAL_SERVER"]
    # warm sandboxes hold launcher groups for a while (how many is timing, not a leak): off
    # here; test_warm_sandboxes.py bounds them
    world.environ["CORRAL_WARM_MAX"] = "0"
    tmp = _private_tmp(world)
    assert world.corral("server", "--detach").returncode == 0
    try:

        def status() -> dict[str, object]:
            data = json.loads(world.corral("server", "--status", "--json").stdout)
            assert isinstance(data, dict)
            return data

        server = status()["pid"]
        assert isinstance(server, int)

        def resources() -> tuple[int, int, int]:
            """Once nothing runs and the launcher pool is full again: fds, threads, cgroups."""
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                data = status()
                pool = data["launchers"]
                if data["running"] == 0 and (pool is None or pool["ready"] == 2):  # type: ignore[index]
                    break
                time.sleep(0.05)
            return (
                len(os.listdir(f"/proc/{server}/fd")),
                len(os.listdir(f"/proc/{server}/task")),
                len(_corral_cgroups({server})),
            )

        def settled(expected: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
            """resources() once two readings agree (a released launcher thread exits late)."""
            deadline = time.monotonic() + 10
            previous = resources()
            while time.monotonic() < deadline:
                now = resources()
                if now == previous and (expected is None or now == expected):
                    return now
                previous = now
            return previous

        assert world.run("true").returncode == 0  # warm: lazy imports, the pool's groups
        before = settled()
        for i in range(200):
            result = world.corral("run", "-c", f"echo {i}")
            assert result.stdout == f"{i}\n".encode(), result.stderr
        assert status()["served"] == 201
        assert settled(before) == before
        assert os.listdir(tmp) == []
        assert _mounts(world.root) == []
    finally:
        stop(world)
