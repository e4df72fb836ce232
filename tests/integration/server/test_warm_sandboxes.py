"""Warm sandboxes (issue 12 item 1): a served ``corral run`` takes the sandbox the server
started ahead for its policy, workspace and environment, and it is exactly a fresh one.

Every test makes the real attempt through a real server and real bubblewrap: the
second run is proven to have run warm (its init serves commands: ``--serve`` on
``/proc/1/cmdline``), and then what a fresh sandbox guarantees is checked of it -
nothing of an earlier run, the host as it is *now*, this caller's environment
only, the policy as edited a moment ago, its own timeout and process kill.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.conftest import _processes_mentioning

from ..conftest import World, needs_bwrap
from .conftest import held_open, status, wait_for

pytestmark = needs_bwrap

#: prints whether this ran warm, then the command's own output
PROBE = (
    '[ "$(tr "\\0" " " </proc/1/cmdline | cut -d" " -f3)" = --serve ] && echo WARM || echo FRESH; '
)


def _run(world: World, command: str, *options: str, **kwargs: object) -> tuple[bool, str, str, int]:
    result = world.corral("run", *options, "--", "sh", "-c", PROBE + command, **kwargs)  # type: ignore[arg-type]
    out = result.stdout.decode(errors="replace")
    first, _, rest = out.partition("\n")
    return first == "WARM", rest, result.stderr.decode(errors="replace"), result.returncode


def _warm_ready(world: World) -> None:
    """Wait until the server holds a started warm sandbox (after a first run)."""

    def ready() -> bool:
        data = status(world)
        return bool(data and data["warm"]["ready"] >= 1)

    wait_for(ready, what="a warm sandbox")


@pytest.fixture
def warm(served: World) -> World:
    """A served world whose server has a warm sandbox ready for the plain runs below."""
    warm_, _out, err, code = _run(served, "true")
    assert code == 0, err
    assert not warm_  # the first run of a key has none: it starts one
    _warm_ready(served)
    return served


def test_a_run_takes_the_warm_sandbox_and_leaves_nothing_for_the_next(warm: World) -> None:
    ran_warm, out, err, code = _run(warm, "echo $$ > /tmp/mark; sleep 317.5 & echo $PWD")
    assert (ran_warm, code) == (True, 0), err
    assert out.strip() == warm.workspace  # PWD as bubblewrap sets it for a fresh sandbox
    _warm_ready(warm)
    ran_warm, out, err, code = _run(warm, "ls -A /tmp; pgrep -f 'sleep 31[7]' || echo none")
    assert (ran_warm, code) == (True, 0), err
    assert out.split() == ["none"]  # another sandbox: no /tmp/mark, no sleep
    records = warm.audit_records()
    assert [r.get("warm") for r in records[-3:]] == [None, True, True]
    data = status(warm)
    assert data is not None and data["warm"]["served"] == 2


@pytest.fixture
def guarded(served: World) -> World:
    """A served world whose policy hides two files by name (one there, one not yet), and a
    warm sandbox planned from the host as it was then."""
    served.write(os.path.join(served.home, "token.txt"), "OLD-TOKEN\n")
    settings = os.path.join(served.home, ".config", "corral", "settings.json")
    deny = [os.path.join(served.home, "token.txt"), os.path.join(served.home, "later.txt")]
    served.write(settings, json.dumps({"filesystem": {"denyRead": deny}}))
    _ran_warm, _out, err, code = _run(served, "true")
    assert code == 0, err
    _warm_ready(served)
    return served


def test_a_secret_the_host_creates_after_the_warm_sandbox_started_stays_hidden(
    guarded: World,
) -> None:
    """Planned before the file existed, the warm sandbox has no mask for it: the look at
    the host retires it, and the command runs in a sandbox planned from the host as it is."""
    later = guarded.write(os.path.join(guarded.home, "later.txt"), "LATER-SECRET\n")
    ran_warm, out, _err, code = _run(guarded, f"cat {later}")
    assert "LATER-SECRET" not in out
    assert code != 0
    assert not ran_warm
    _warm_ready(guarded)  # the next one is planned from the host as it is now
    ran_warm, out, _err, code = _run(guarded, f"cat {later}")
    assert (ran_warm, code != 0) == (True, True)
    assert "LATER-SECRET" not in out


def test_a_masked_file_the_host_replaces_by_rename_stays_masked(guarded: World) -> None:
    """A rename detaches the warm sandbox's mask from the path (the new file would show
    through): the look at the host sees the new inode and retires it."""
    token = os.path.join(guarded.home, "token.txt")
    fresh = guarded.write(token + ".new", "ROTATED-TOKEN\n")
    os.rename(fresh, token)
    ran_warm, out, _err, _code = _run(guarded, f"cat {token}")
    assert "ROTATED-TOKEN" not in out
    assert not ran_warm


def test_an_edited_setting_applies_to_the_very_next_run(warm: World) -> None:
    target = warm.ws("notes.txt")
    settings = os.path.join(warm.home, ".config", "corral", "settings.json")
    warm.write(settings, json.dumps({"filesystem": {"denyWrite": [target]}}))
    ran_warm, _out, _err, code = _run(warm, f"echo x > {target}")
    assert code != 0
    assert not os.path.exists(target)
    assert not ran_warm  # another policy: another key


def test_a_warm_sandbox_is_never_another_environments(warm: World) -> None:
    """A warm sandbox was started with one caller's environment (the host facts its plan
    was made from): a caller with another environment gets its own values, never those."""
    show = 'echo "$WARM_PROBE"'
    passed = ("--env", "WARM_PROBE")  # the policy passes the caller's value through
    ran_warm, out, err, code = _run(warm, show, *passed, env={"WARM_PROBE": "first"})
    assert (ran_warm, code, out.strip()) == (False, 0, "first"), err
    _warm_ready(warm)
    ran_warm, out, err, code = _run(warm, show, *passed, env={"WARM_PROBE": "first"})
    assert (ran_warm, code, out.strip()) == (True, 0, "first"), err
    _warm_ready(warm)  # one started with "first" is ready again
    ran_warm, out, err, code = _run(warm, show, *passed, env={"WARM_PROBE": "second"})
    assert (ran_warm, code, out.strip()) == (False, 0, "second"), err


def test_a_warm_run_keeps_its_own_timeout_and_kills_its_tree(warm: World) -> None:
    _run(warm, "true", "--timeout", "1")  # another policy: warms a sandbox of its own
    _warm_ready(warm)
    started = time.monotonic()
    ran_warm, _out, err, code = _run(warm, "sleep 317.25 & sleep 317.25", "--timeout", "1")
    assert ran_warm
    assert code == 124, err
    assert time.monotonic() - started < 30
    # nothing of it is left on the host (the world fixture also checks at the end)
    wait_for(
        lambda: not _processes_mentioning("sleep 317.25"),  # the sleeps and their shell
        what="the command's processes to go",
    )


def test_no_warm_sandbox_outlives_the_server(warm: World) -> None:
    data = status(warm)
    assert data is not None and data["warm"]["ready"] >= 1
    assert warm.corral("server", "--stop").returncode == 0
    # the served fixture then checks the server left no process and no cgroup behind


def test_the_workspace_is_held_only_while_its_warm_sandbox_waits(world: World) -> None:
    """A warm sandbox's write broker holds its workspace (an ``O_PATH`` descriptor of the
    supervised root) while it waits for a run; once it ends unused (``CORRAL_WARM_IDLE``),
    the server holds nothing of the workspace open."""
    del world.environ["CORRAL_SERVER"]
    world.environ["CORRAL_WARM_IDLE"] = "1"
    assert world.corral("server", "--detach").returncode == 0
    try:
        _ran_warm, _out, err, code = _run(world, "true")
        assert code == 0, err
        _warm_ready(world)
        data = status(world)
        assert data is not None
        pid = data["pid"]

        wait_for(
            lambda: held_open(pid, world.workspace),
            what="the warm sandbox's broker to hold the workspace",
        )

        def ended() -> bool:
            data = status(world)
            return bool(data and data["warm"]["ready"] == 0 and not held_open(pid, world.workspace))

        wait_for(ended, what="the unused warm sandbox to end and let go of the workspace")
    finally:
        world.corral("server", "--stop")


def test_warm_sandboxes_can_be_turned_off(world: World) -> None:
    del world.environ["CORRAL_SERVER"]
    world.environ["CORRAL_WARM_MAX"] = "0"
    assert world.corral("server", "--detach").returncode == 0
    try:
        for _ in range(2):
            ran_warm, _out, err, code = _run(world, "true")
            assert (ran_warm, code) == (False, 0), err
        data = status(world)
        assert data is not None and data["warm"] == {
            "ready": 0,
            "starting": 0,
            "served": 0,
            "started": 0,
        }
    finally:
        world.corral("server", "--stop")


def test_many_runs_leave_at_most_the_warm_sandboxes_bounded(warm: World) -> None:
    """Twenty warm runs: each sandbox ends with its command, and what is left is the
    bounded number of warm sandboxes (two, each a bubblewrap and an init)."""
    for i in range(20):
        _ran_warm, out, err, code = _run(warm, f"echo {i}")
        assert (code, out.strip()) == (0, str(i)), err

    def started() -> bool:
        data = status(warm)
        return bool(data and data["warm"]["starting"] == 0)

    wait_for(started, what="the warm sandboxes to start")
    sandboxes = [p for p in _processes_mentioning(warm.root) if "--serve" in p]
    assert len(sandboxes) <= 2 * 2, sandboxes
    data = status(warm)
    assert data is not None and data["warm"]["served"] >= 1
