"""Worlds whose ``corral run`` goes through a real corral server.

The ``served`` fixture starts ``corral server --detach`` for the world's state
directory and stops it afterwards, then checks that the server is gone and
left no cgroup behind. The ``client`` fixture runs a test with each client of
the server: ``corral`` (Python) and ``corral-client`` (compiled).
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import World, client_command


def status(world: World) -> dict[str, Any] | None:
    """``corral server --status --json`` for the world (None: no server)."""
    result = world.corral("server", "--status", "--json")
    data = json.loads(result.stdout or b"null")
    assert data is None or isinstance(data, dict)
    return data


def wait_for(predicate: Any, timeout: float = 20.0, what: str = "the condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


_SLEEPS = itertools.count()


def sleep_duration(seconds: int) -> str:
    """A ``sleep`` argument worth about *seconds* that no other process on the host uses.

    :func:`sleeping` scans every process of the host: a plain ``sleep 300`` of
    another test run, a helper or a user would read as this test's survivor.
    """
    return f"{seconds}.{os.getpid()}{next(_SLEEPS):03d}"


def sleeping(duration: str) -> bool:
    """Whether any process on the host runs ``sleep <duration>``."""
    wanted = f"sleep\x00{duration}\x00".encode()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read() == wanted:
                        return True
            except OSError:
                continue  # gone between the listing and the look
    return False


def held_open(pid: int, prefix: str) -> list[str]:
    """What the process *pid* holds open under *prefix*."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:  # a descriptor the process closes between the listing and the look
            held.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except FileNotFoundError:
            pass
    return [path for path in held if path.startswith(prefix)]


def server_cgroups(pid: int) -> list[str]:
    """cgroup directories named after server *pid* (``corral-<pid>-...``)."""
    found = []
    for base in (
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/freezer",
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup",
    ):
        for directory, dirs, _files in os.walk(base):
            found += [os.path.join(directory, d) for d in dirs if d.startswith(f"corral-{pid}-")]
            if directory.count("/") > 7:
                dirs[:] = []
    return found


def gone(pid: int) -> bool:
    """Whether process *pid* has exited (a zombie waiting for init to reap it counts)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 :].split()[0] in (b"Z", b"X")


def stop(world: World) -> None:
    """Stop the world's server (if any) and check it left nothing behind."""
    before = status(world)
    result = world.corral("server", "--stop")
    assert result.returncode == 0, result.stderr
    assert status(world) is None
    if before is not None:
        pid = before["pid"]
        wait_for(lambda: gone(pid), what="the server to exit")
        assert server_cgroups(pid) == []
    assert not os.path.exists(os.path.join(world.state_dir, "server", "server.sock"))


@pytest.fixture(params=["corral", "corral-client"], ids=["python-client", "fast-client"])
def client(request: pytest.FixtureRequest) -> str:
    """The command a test talks to the server with (skips the fast client when it is not built)."""
    name: str = request.param
    client_command(name)
    return name


@pytest.fixture
def unwarmed(world: World) -> Iterator[World]:
    """A served world without warm sandboxes (``CORRAL_WARM_MAX=0``): what a test sees of
    the server is then the run it made, not the warm sandbox started behind it (a worker
    starting one, a warm sandbox's broker holding the workspace open)."""
    del world.environ["CORRAL_SERVER"]
    world.environ["CORRAL_WARM_MAX"] = "0"
    assert world.corral("server", "--detach").returncode == 0
    try:
        yield world
    finally:
        stop(world)


@pytest.fixture
def served(world: World) -> Iterator[World]:
    """A world with a running corral server; ``corral run`` uses it."""
    del world.environ["CORRAL_SERVER"]
    result = world.corral("server", "--detach")
    assert result.returncode == 0, result.stderr
    try:
        yield world
    finally:
        stop(world)
