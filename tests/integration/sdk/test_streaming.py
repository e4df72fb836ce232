"""Live output (callbacks, iterators) and background processes, in both twins.

Liveness is proved, not timed: the command waits for a file that only the
test's output consumer creates once it has *received* the first line, so
output that arrived only at the end would leave the command waiting until
its timeout (and the test fails on ``timed_out``).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from typing import Any

import pytest

from corral import AsyncSandbox, Sandbox

from ..conftest import World, needs_bwrap, processes_with

pytestmark = needs_bwrap

WAITS_FOR_GO = "echo first; while [ ! -e go ]; do sleep 0.02; done; echo second; echo err >&2"


def sync_sandbox(world: World, **options: Any) -> Sandbox:
    return Sandbox(workspace=world.workspace, environ=world.environ, **options)


def async_sandbox(world: World, **options: Any) -> AsyncSandbox:
    return AsyncSandbox(workspace=world.workspace, environ=world.environ, **options)


def test_exec_callbacks_see_output_as_it_arrives(world: World) -> None:
    seen: list[tuple[str, bytes]] = []

    def out(chunk: bytes) -> None:
        seen.append(("stdout", chunk))
        if b"first" in chunk:
            open(world.ws("go"), "w").close()

    with sync_sandbox(world) as sbx:
        outcome = sbx.exec(
            WAITS_FOR_GO,
            timeout=30,
            on_stdout=out,
            on_stderr=lambda c: seen.append(("stderr", c)),
        )
    assert not outcome.timed_out, "the output did not arrive while the command ran"
    assert (outcome.stdout, outcome.stderr) == (b"first\nsecond\n", b"err\n")
    assert b"".join(c for s, c in seen if s == "stdout") == b"first\nsecond\n"
    assert b"".join(c for s, c in seen if s == "stderr") == b"err\n"


def test_async_exec_callbacks_run_on_the_event_loop(world: World) -> None:
    async def main() -> Any:
        loop_thread = None
        threads = set()

        def out(chunk: bytes) -> None:
            threads.add(__import__("threading").get_ident())
            if b"first" in chunk:
                open(world.ws("go"), "w").close()

        async with async_sandbox(world) as sbx:
            loop_thread = __import__("threading").get_ident()
            outcome = await sbx.exec(WAITS_FOR_GO, timeout=30, on_stdout=out)
        assert threads == {loop_thread}
        return outcome

    outcome = asyncio.run(main())
    assert not outcome.timed_out and outcome.stdout == b"first\nsecond\n"


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_raising_callback_stops_the_command_and_propagates(world: World, twin: str) -> None:
    marker = f"corral-callback-{os.getpid()}-{time.monotonic_ns()}"
    command = f"trap '' TERM; echo boom; sleep 300 # {marker}"

    def out(chunk: bytes) -> None:
        raise ValueError(f"cannot handle {chunk!r}")

    def run_sync() -> None:
        with sync_sandbox(world) as sbx:
            sbx.exec(command, timeout=120, on_stdout=out)

    async def run_async() -> None:
        async with async_sandbox(world) as sbx:
            await sbx.exec(command, timeout=120, on_stdout=out)

    started = time.monotonic()
    with pytest.raises(ValueError, match="cannot handle"):
        run_sync() if twin == "sync" else asyncio.run(run_async())
    assert time.monotonic() - started < 60  # stopped (killGrace), not the 120 s timeout
    assert processes_with(marker) == []


def test_a_background_process_streams_waits_and_is_killed(world: World) -> None:
    marker = f"corral-spawn-{os.getpid()}-{time.monotonic_ns()}"
    with sync_sandbox(world) as sbx:
        proc = sbx.spawn(WAITS_FOR_GO, timeout=30)
        chunks = []
        for stream, chunk in proc:  # live: "go" is created only after "first" arrived
            chunks.append((stream, chunk))
            if b"first" in chunk:
                open(world.ws("go"), "w").close()
        outcome = proc.wait()
        assert not outcome.timed_out and outcome.stdout == b"first\nsecond\n"
        assert b"".join(c for s, c in chunks if s == "stderr") == b"err\n"
        assert not proc.running
        # a foreground command meanwhile, and a background one that ignores SIGTERM
        stubborn = sbx.spawn(f"trap '' TERM; echo ready; sleep 300 # {marker}", timeout=600)
        assert sbx.exec("echo alongside").stdout == b"alongside\n"
        assert next(iter(stubborn)) == ("stdout", b"ready\n")
        with pytest.raises(TimeoutError):
            stubborn.wait(timeout=0.1)
        killed = stubborn.kill()
        assert killed.stopped == "killed" and killed.returncode == 137
        assert stubborn.stdout == b"ready\n"
        # closing the session stops what still runs in the background
        left = sbx.spawn(f"trap '' TERM; echo ready; sleep 300 # {marker}", timeout=600)
        assert next(iter(left)) == ("stdout", b"ready\n")
    assert left.wait().stopped == "the sandbox was closed"
    assert processes_with(marker) == []


def test_async_background_processes_iterate_and_stop_on_aclose(world: World) -> None:
    marker = f"corral-aspawn-{os.getpid()}-{time.monotonic_ns()}"

    async def main() -> None:
        async with async_sandbox(world) as sbx:
            proc = await sbx.spawn(WAITS_FOR_GO, timeout=30)
            seen = b""
            async for stream, chunk in proc:
                if stream == "stdout":
                    seen += chunk
                if b"first" in chunk:
                    open(world.ws("go"), "w").close()  # noqa: ASYNC230
            assert seen == b"first\nsecond\n"
            assert (await proc.wait()).stdout == seen
            stubborn = await sbx.spawn(
                f"trap '' TERM; echo ready; sleep 300 # {marker}", timeout=600
            )
            async for item in stubborn:
                assert item == ("stdout", b"ready\n")
                break
            killed = await stubborn.kill()
            assert killed.stopped == "killed"
            left = await sbx.spawn(f"trap '' TERM; echo ready; sleep 300 # {marker}", timeout=600)
            async for item in left:
                assert item == ("stdout", b"ready\n")
                break
        assert (await left.wait()).stopped == "the sandbox was closed"

    asyncio.run(asyncio.wait_for(main(), 90))
    assert processes_with(marker) == []


@pytest.mark.parametrize("twin", ["sync", "async"])
def test_a_background_process_stopped_before_it_started_says_so(world: World, twin: str) -> None:
    """Closed at once: either it ran and was stopped, or wait() says it never started."""
    from corral import SessionClosed

    def settle(wait: Any) -> str:
        try:
            return str(wait().stopped)
        except SessionClosed as exc:
            return str(exc)

    if twin == "sync":
        sbx = sync_sandbox(world)
        proc = sbx.spawn("sleep 30")
        sbx.close()
        said = settle(proc.wait)
    else:

        async def main() -> str:
            sbx = async_sandbox(world)
            proc = await sbx.spawn("sleep 30")
            await sbx.aclose()
            try:
                return str((await proc.wait()).stopped)
            except SessionClosed as exc:
                return str(exc)

        said = asyncio.run(main())
    assert said == "the sandbox was closed" or "before it started" in said, said


def test_the_twins_have_the_same_public_names_and_signatures() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {
            name: inspect.signature(getattr(cls, name))
            for name in dir(cls)
            if not name.startswith("_") and callable(getattr(cls, name))
        }

    sync, asynchronous = public(Sandbox), public(AsyncSandbox)
    sync["aclose"] = sync.pop("close")  # the one deliberate difference in name
    assert set(sync) == set(asynchronous)
    for name, signature in sync.items():
        assert list(signature.parameters) == list(asynchronous[name].parameters), name
        assert inspect.iscoroutinefunction(getattr(AsyncSandbox, name)), name
