"""A launch aborted during set-up leaves nothing behind (bubblewrap's first
sandbox process has no parent-death signal until its set-up is done)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from corral._exceptions import LaunchFailed
from corral.pipeline._engine import Running
from corral.pipeline._request import ExecRequest
from corral.pipeline._runner import prepare
from corral.policy import load_settings
from tests.conftest import World, needs_bwrap, needs_root

pytestmark = [needs_bwrap, needs_root]


def _alive(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                continue
    return found


def test_abort_during_set_up_kills_the_half_started_sandbox(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    # a read-only workspace: no write broker, whose missing listener would also stop the command
    policy = load_settings(
        cwd=world.workspace,
        environ=world.environ,
        command="true",
        flags={"filesystem": {"readOnly": True}},
    ).policy
    request = ExecRequest.from_argv(["sh", "-c", f"sleep 60 # {marker}"], cwd=world.workspace)
    prepared = prepare(request, policy, environ=world.environ)
    assert prepared.plan.fd("info") is not None  # the default limits use the cgroup hand-shake
    assert prepared.plan.broker is None

    def fail_after_clone(self: Running) -> None:
        time.sleep(0.2)  # bubblewrap has cloned its first sandbox process by now
        raise LaunchFailed("injected set-up failure")

    monkeypatch.setattr(Running, "_setup_phase", fail_after_clone)
    running = Running(prepared.plan, cgroup_layout=prepared.layout)
    with pytest.raises(LaunchFailed, match="injected"):
        running.start()
    deadline = time.monotonic() + 5
    while _alive(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(marker) == []
