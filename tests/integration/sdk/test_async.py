"""What only the async twin has: cancellation, concurrency, arun()."""

from __future__ import annotations

import asyncio
import os
import time

import corral
from corral import AsyncSandbox

from ..conftest import World, needs_bwrap, processes_with

pytestmark = needs_bwrap


def test_cancelling_exec_stops_the_sandbox_and_leaves_no_process(world: World) -> None:
    marker = f"corral-cancel-{os.getpid()}-{time.monotonic_ns()}"

    async def main() -> float:
        async with AsyncSandbox(workspace=world.workspace, environ=world.environ) as sbx:
            # it ignores SIGTERM, and its timeout is far away: only killGrace's SIGKILL
            # stops it (the supervisor must not sleep on towards the old deadline)
            task = asyncio.create_task(
                sbx.exec(["sh", "-c", f"trap '' TERM; sleep 300 # {marker}"], timeout=60)
            )
            deadline = time.monotonic() + 10
            while not processes_with(marker) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            assert processes_with(marker), "the command never started"
            started = time.monotonic()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            else:
                raise AssertionError("exec was not cancelled")
            return time.monotonic() - started

    elapsed = asyncio.run(main())
    assert processes_with(marker) == []
    assert elapsed < 30  # killGrace (2 s) plus slack for a loaded machine; the timeout is 60 s


def test_aclose_stops_commands_still_running(world: World) -> None:
    marker = f"corral-aclose-{os.getpid()}-{time.monotonic_ns()}"

    async def main() -> None:
        sbx = AsyncSandbox(workspace=world.workspace, environ=world.environ)
        task = asyncio.create_task(
            sbx.exec(["sh", "-c", f"trap '' TERM; sleep 300 # {marker}"], timeout=600)
        )
        while not processes_with(marker):  # noqa: ASYNC110 - polls the host process table
            await asyncio.sleep(0.02)
        await sbx.aclose()
        outcome = await task
        assert outcome.returncode != 0
        assert outcome.stopped == "the sandbox was closed"
        assert not outcome.timed_out
        assert not os.path.exists(sbx.tmp_dir)  # noqa: ASYNC240

    asyncio.run(asyncio.wait_for(main(), 40))
    assert processes_with(marker) == []


def test_commands_of_one_session_run_concurrently(world: World) -> None:
    async def main() -> float:
        async with AsyncSandbox(workspace=world.workspace, environ=world.environ) as sbx:
            started = time.monotonic()
            outcomes = await asyncio.gather(*(sbx.exec(["sleep", "0.5"]) for _ in range(3)))
            assert all(o.ok for o in outcomes)
            return time.monotonic() - started

    assert asyncio.run(main()) < 1.4  # three half-second sleeps, side by side


def test_run_and_arun_are_one_shot_twins(world: World) -> None:
    sync = corral.run(
        "echo $0-$X", workspace=world.workspace, environ=world.environ, env={"X": "1"}
    )
    asynchronous = asyncio.run(
        corral.arun("echo $0-$X", workspace=world.workspace, environ=world.environ, env={"X": "1"})
    )
    assert sync.stdout == asynchronous.stdout == b"/bin/sh-1\n"
    assert sync.sandbox_id != asynchronous.sandbox_id
    # the one-shot sandboxes are gone
    assert os.listdir(os.path.join(world.state_dir, "sessions")) == []
