"""``corral run`` stopped with SIGTERM stops a command that ignores SIGTERM.

SIGTERM is how service managers, ``timeout(1)`` and ``kill`` ask a program to
stop. A sandboxed command may ignore it; corral must not: it stops the whole
sandbox as a timeout would (SIGTERM to every process, SIGKILL after
``resources.killGrace``), whether the run is in-process or goes through the
corral server, and leaves no process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.conftest import World, client_command, corral_command, needs_bwrap
from tests.integration.conftest import processes_with

pytestmark = needs_bwrap


def _sigterm_a_run_that_ignores_it(world: World, command: list[str]) -> tuple[int, float]:
    """Start *command* ``run``, SIGTERM it once the sandboxed sleep runs; (status, seconds)."""
    marker = f"corral-sigterm-{os.getpid()}-{time.monotonic_ns()}"
    ready = world.ws("ready")  # written once the trap is set
    proc = subprocess.Popen(
        # the timeout is far away: only killGrace's SIGKILL can end it soon
        [
            *command,
            "run",
            "--timeout",
            "120s",
            "-c",
            f"trap '' TERM; : > {ready}; sleep 300 # {marker}",
        ],
        cwd=world.workspace,
        env=world.environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            assert time.monotonic() < deadline, "the sandboxed command never started"
            assert proc.poll() is None, "corral run exited early"
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=60)
        elapsed = time.monotonic() - sent
        deadline = time.monotonic() + 10
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker) == [], "a sandboxed process outlived corral run"
        return status, elapsed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_stops_an_in_process_run_that_ignores_it(world: World) -> None:
    status, elapsed = _sigterm_a_run_that_ignores_it(world, corral_command())
    assert status == 137  # SIGKILLed after the grace period
    assert elapsed < 60  # killGrace (2 s) plus slack for a loaded machine; the timeout is 120 s


@pytest.mark.parametrize("client", ["corral", "corral-client"])
def test_sigterm_stops_a_served_run_that_ignores_it(served: World, client: str) -> None:
    status, elapsed = _sigterm_a_run_that_ignores_it(served, client_command(client))
    assert status == 137
    assert elapsed < 60
