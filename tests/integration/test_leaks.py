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


def _corral_cgroups() -> list[str]:
    found = []
    for base in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/freezer", "/sys/fs/cgroup"):
        for directory, dirs, _files in os.walk(base):
            found += [os.path.join(directory, d) for d in dirs if d.startswith("corral-")]
            if directory.count("/") > 7:
                dirs[:] = []
    return found


def _corral_tmp() -> list[str]:
    return sorted(name for name in os.listdir("/tmp") if "corral" in name)


def _mounts() -> int:
    with open("/proc/self/mountinfo") as f:
        return len(f.readlines())


def test_a_thousand_in_process_runs_leak_nothing(world: World) -> None:
    from corral._request import ExecRequest
    from corral._runner import execute
    from corral.policy import load_settings

    resolved = load_settings(cwd=world.workspace, environ=world.environ, command="true")
    policy = resolved.policy
    state = world.state_dir
    baseline = (_fds(), _children(), _mounts(), _corral_tmp(), threading.active_count())
    for i in range(1000):
        request = ExecRequest.from_argv(["sh", "-c", f"echo {i} > out.txt; true"], cwd=world.workspace)
        outcome = execute(request, policy, environ=world.environ, state_dir=state)
        assert outcome.returncode == 0, outcome.stderr
    assert World.read(world.ws("out.txt")) == "999\n"
    assert _fds() == baseline[0]
    assert _children() == baseline[1]
    assert _mounts() == baseline[2]
    assert _corral_tmp() == baseline[3]
    assert threading.active_count() == baseline[4]
    assert _corral_cgroups() == []
    from corral._audit import verify

    assert verify(state) == (True, "1000 records, chain intact")


def test_two_hundred_cli_runs_leak_nothing(world: World) -> None:
    import subprocess

    before = (_children(), _corral_tmp())
    script = "; ".join([f"{' '.join(corral_command())} run -- true || exit 1"] * 200)
    result = subprocess.run(["sh", "-c", script], cwd=world.workspace, env=world.environ,
                            capture_output=True, check=False, timeout=600)
    assert result.returncode == 0, result.stderr
    assert (_children(), _corral_tmp()) == before
    assert _corral_cgroups() == []
