"""The cgroup v1 launcher pool: processes born inside their group, threads that never stay there."""

from __future__ import annotations

import os
import time

import pytest

from tests.conftest import PROBE_PYTHON, needs_root

pytestmark = needs_root


@pytest.fixture
def layout():  # type: ignore[no-untyped-def]
    from corral.pipeline._cgroups import probe

    found, why = probe(frozenset({"memory", "pids"}))
    if found is None or found.version != 1:
        pytest.skip(f"no cgroup v1 memory+pids here: {why}")
    return found


def _tids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _groups() -> list[str]:
    found = []
    for base in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/freezer"):
        for _directory, dirs, _files in os.walk(base):
            found += [d for d in dirs if d.startswith(f"corral-{os.getpid()}-launch-")]
    return found


def _wait(predicate, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def test_a_process_is_born_in_the_group_and_the_launcher_is_not_left_in_it(layout) -> None:  # type: ignore[no-untyped-def]
    from corral.pipeline._launchers import LauncherPool

    before = _tids()
    pool = LauncherPool(layout, size=1)
    try:
        assert _wait(lambda: pool.statistics()["ready"] == 1)
        group = pool.take()
        assert group is not None and group.spawner is not None
        group.set_limits(memory=64 << 20, pids=8, cpus=None, freezer=True)
        # a child that dies when the thread that started it exits (PR_SET_PDEATHSIG)
        code = "import ctypes, time; ctypes.CDLL(None).prctl(1, 9, 0, 0, 0); time.sleep(30)"
        pid = group.spawner(PROBE_PYTHON, [PROBE_PYTHON, "-c", code], {}, file_actions=[])
        with open(f"/proc/{pid}/cgroup") as f:
            membership = f.read()
        for controller in ("memory", "pids", "freezer"):
            assert f"{group.name}\n" in next(
                line for line in membership.splitlines(keepends=True) if f":{controller}:" in line
            )
        # none of our threads is inside: not counted by pids.max, never frozen, never killed
        for path in group.dirs.values():
            with open(os.path.join(path, "tasks")) as f:
                assert not set(f.read().split()) & _tids()
        assert os.getpid() not in group.procs()
        time.sleep(0.3)  # the launcher thread lives on: the child is still there
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)
        group.kill_all()
        os.waitpid(pid, 0)
        group.remove()  # handed to the pool's thread; the launcher exits after it
        assert group.dirs == {}
    finally:
        pool.close()
    assert _groups() == []
    assert _wait(lambda: not _tids() - before), _tids() - before  # the pool's threads are gone


def test_an_unused_group_goes_back_cleanly(layout) -> None:  # type: ignore[no-untyped-def]
    from corral.pipeline._launchers import LauncherPool

    before = _tids()
    pool = LauncherPool(layout, size=2)
    assert _wait(lambda: pool.statistics()["ready"] == 2)
    group = pool.take()
    assert group is not None
    group.remove()  # taken, never spawned from (e.g. the run failed before its start)
    pool.close()
    assert _groups() == []
    assert _wait(lambda: not _tids() - before), _tids() - before  # the pool's threads are gone
    assert pool.take() is None  # closed


def _stage_groups() -> list[str]:
    found = []
    for base in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/freezer"):
        for _directory, dirs, _files in os.walk(base):
            found += [d for d in dirs if d.startswith(f"corral-{os.getpid()}-stage-")]
    return found


def test_an_in_process_runs_group_comes_with_a_launcher_parked_inside(layout) -> None:  # type: ignore[no-untyped-def]
    # corral run in-process (the first run after a server stop, CORRAL_SERVER=off, the SDK):
    # its group is prepared at the start with a launcher thread inside, so the sandbox is
    # born there with its limits already written - no cgroup.procs move on the critical path
    from corral.pipeline._cgroups import Prestage

    before = _tids()
    stage = Prestage(f"corral-{os.getpid()}-stage-1")
    group = stage.take()
    assert group is not None and group.spawner is not None
    group.set_limits(memory=64 << 20, pids=4, cpus=None, freezer=True)
    # the very first instruction of the child is limited: it forks until pids.max says no
    code = (
        "import os, time\nn = 0\nwhile n < 50:\n"
        "    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(2)\n        os._exit(0)\n    n += 1\nprint(n)"
    )
    r, w = os.pipe()
    pid = group.spawner(
        PROBE_PYTHON, [PROBE_PYTHON, "-c", code], {}, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)]
    )
    os.close(w)
    with os.fdopen(r) as out:
        assert out.read().strip() == "3"  # itself and 3 children: pids.max 4
    for path in group.dirs.values():
        with open(os.path.join(path, "tasks")) as f:
            assert not set(f.read().split()) & _tids()  # the launcher left before the pid
    group.kill_all()
    os.waitpid(pid, 0)
    group.remove()  # lets the launcher thread go
    stage.finish()
    assert _stage_groups() == []
    assert _wait(lambda: not _tids() - before), _tids() - before


def test_an_unused_in_process_group_and_its_launcher_go(layout) -> None:  # type: ignore[no-untyped-def]
    from corral.pipeline._cgroups import Prestage

    before = _tids()
    stage = Prestage(f"corral-{os.getpid()}-stage-2")
    stage.discard()  # the run needs no cgroup (no limits)
    stage.finish()
    assert _stage_groups() == []
    assert _wait(lambda: not _tids() - before), _tids() - before
