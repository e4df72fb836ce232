"""Live output and background processes for the SDK.

A streamed run is an ordinary run (one sandbox per command, planned, enforced
and audited like any other) whose output the engine copies, as it arrives and
within the same output cap, into two pipes instead of keeping it. A
:class:`Pump` thread reads those pipes and hands each chunk to a consumer:
the caller's ``on_stdout``/``on_stderr`` callbacks, or the queue a
:class:`Process` / :class:`AsyncProcess` handle is iterated from. What was
streamed is also put on the final :class:`~corral.Outcome`, so a streamed
``exec`` returns the same Outcome a captured one does.

Background processes (:meth:`Sandbox.spawn <corral.Sandbox.spawn>`) run that
way in a worker thread, each in its own sandbox sharing the session's private
``/tmp`` and preview (docs/sdk.md, "Background processes"); their handle waits,
kills (TERM, ``killGrace``, KILL of the whole sandbox) and reads output.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from collections.abc import AsyncIterator, Callable, Iterator
    from typing import Any

    from .pipeline._engine import Running
    from .pipeline._outcome import Outcome
    from .pipeline._resident import ResidentCommand

    #: ``("stdout" | "stderr", chunk)``
    Chunk = tuple[str, bytes]

__all__ = ["AsyncProcess", "Process", "Pump"]

_POLLIN = 0x001
_READ = 65536


class Cancellation:
    """Links a worker thread's run to the task that awaits it (thread-safe)."""

    __slots__ = ("_lock", "cancelled", "reason", "running")

    def __init__(self) -> None:
        import _thread

        self._lock = _thread.allocate_lock()
        self.running: Running | ResidentCommand | None = None
        self.cancelled = False
        self.reason = ""

    def started(self, running: Running | ResidentCommand) -> None:
        """``on_start`` of the run: remember the handle; cancel at once if asked already."""
        with self._lock:
            self.running = running
            cancel = self.cancelled
        if cancel:
            running.cancel()

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the run (TERM, grace, KILL), now or as soon as it starts; *reason* says why."""
        with self._lock:
            self.cancelled = True
            self.reason = self.reason or reason
            running = self.running
        if running is not None:
            running.cancel()


class Cancelled(Exception):
    """The run was cancelled before it started (internal to the SDK)."""


class Pump:
    """Reads a streamed run's stdout/stderr pipes in a thread; *emit* gets each chunk.

    ``streams`` is what the run writes to. After the run, :meth:`finish`
    closes the write ends, waits for the last chunk and returns everything
    read (the engine already applied the output cap). *emit* is called from
    the pump's thread, in order; if it raises, the pump keeps draining the
    pipes (so the run never blocks on them), calls *on_error* once (the SDK
    stops the command) and :meth:`finish` re-raises the error.
    """

    def __init__(
        self,
        emit: Callable[[str, bytes], object],
        *,
        on_error: Callable[[], None] | None = None,
        on_end: Callable[[], None] | None = None,
    ) -> None:
        import _thread

        self._emit = emit
        self._on_error = on_error
        self._on_end = on_end
        self.error: BaseException | None = None
        self.stdout = bytearray()
        self.stderr = bytearray()
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        self._readers = {out_r: ("stdout", self.stdout), err_r: ("stderr", self.stderr)}
        self._writers = [out_w, err_w]
        #: (inherited stdin: unused, stdout, stderr) for the run
        self.streams = (0, out_w, err_w)
        self._done = _thread.allocate_lock()
        self._done.acquire()
        _thread.start_new_thread(self._loop, ())

    def _loop(self) -> None:
        import select

        try:
            poller = select.poll()
            for fd in self._readers:
                poller.register(fd, _POLLIN)
            open_fds = set(self._readers)
            while open_fds:
                for fd, _mask in poller.poll():
                    chunk = os.read(fd, _READ)
                    if not chunk:
                        poller.unregister(fd)
                        open_fds.discard(fd)
                        continue
                    name, kept = self._readers[fd]
                    kept += chunk
                    if self.error is None:
                        try:
                            self._emit(name, chunk)
                        except BaseException as exc:  # the caller's callback failed
                            self.error = exc
                            if self._on_error is not None:
                                self._on_error()
        finally:
            for fd in self._readers:
                os.close(fd)
            if self._on_end is not None:
                self._on_end()
            self._done.release()

    def finish(self) -> tuple[bytes, bytes]:
        """After the run: close the write ends, drain, return (stdout, stderr) as streamed."""
        for fd in self._writers:
            os.close(fd)
        self._writers = []
        with self._done:
            pass
        if self.error is not None:
            raise self.error
        return bytes(self.stdout), bytes(self.stderr)

    def abandon(self) -> None:
        """The run never started (or failed): close the write ends so the thread ends."""
        for fd in self._writers:
            os.close(fd)
        self._writers = []


def callbacks(
    on_stdout: Callable[[bytes], object] | None, on_stderr: Callable[[bytes], object] | None
) -> Callable[[str, bytes], None]:
    """One ``emit`` function calling *on_stdout* / *on_stderr* (either may be ``None``)."""

    def emit(name: str, chunk: bytes) -> None:
        target = on_stdout if name == "stdout" else on_stderr
        if target is not None:
            target(chunk)

    return emit


def _never_started(command: str, reason: str) -> Exception:
    from ._exceptions import SessionClosed

    return SessionClosed(
        f"Failed to run {command!r} in the background: it was stopped ({reason}) before it started"
    )


class _Handle:
    """What both background handles share: the output received so far."""

    _pump: Pump

    @property
    def stdout(self) -> bytes:
        """Standard output received so far."""
        return bytes(self._pump.stdout)

    @property
    def stderr(self) -> bytes:
        """Standard error received so far."""
        return bytes(self._pump.stderr)


class Process(_Handle):
    """A command running in the background of a :class:`~corral.Sandbox` session.

    Iterate it for ``("stdout" | "stderr", chunk)`` as the output arrives (the
    iteration ends when the command does); :meth:`wait` returns its
    :class:`~corral.Outcome`; :meth:`kill` stops it. ``stdout`` / ``stderr``
    are the bytes received so far.

    Example::

        proc = sbx.spawn("python3 -m http.server 8000")
        ...
        proc.kill()
        print(proc.wait().stopped)   # "killed"
    """

    def __init__(self, start: Callable[[Pump, Cancellation], Outcome], command: str) -> None:
        import _thread
        import queue

        self.command = command
        self._queue: queue.SimpleQueue[Chunk | None] = queue.SimpleQueue()
        self._cancellation = Cancellation()
        self._pump = Pump(
            lambda name, chunk: self._queue.put((name, chunk)),
            on_end=lambda: self._queue.put(None),
        )
        self._outcome: Outcome | None = None
        self._error: BaseException | None = None
        self._finished = _thread.allocate_lock()
        self._finished.acquire()
        self._start = start
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:

        try:
            self._outcome = self._start(self._pump, self._cancellation)
        except Cancelled:
            self._pump.abandon()
            self._error = _never_started(self.command, self._cancellation.reason)
        except BaseException as exc:
            self._pump.abandon()
            self._error = exc
        finally:
            self._finished.release()

    @property
    def running(self) -> bool:
        """Whether the command has not finished yet."""
        return self._finished.locked()

    def __iter__(self) -> Iterator[Chunk]:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.put(None)  # for any other iteration
                return
            yield item

    def wait(self, timeout: float | None = None) -> Outcome:
        """Wait for the command to end; return its Outcome.

        Raises:
            TimeoutError: it is still running after *timeout* seconds.
            SessionClosed: it was stopped (``kill()``, ``close()``) before it started.
            SandboxError: the sandbox could not be provided; nothing ran.
        """
        if not self._finished.acquire(True, -1 if timeout is None else timeout):
            raise TimeoutError(f"{self.command!r} is still running after {timeout} s")
        self._finished.release()
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome

    def kill(self) -> Outcome:
        """Stop it (TERM to every process, KILL after ``killGrace``); return its Outcome."""
        self._cancellation.cancel("killed")
        return self.wait()

    def __repr__(self) -> str:
        return f"<Process {self.command!r} {'running' if self.running else 'finished'}>"


class AsyncProcess(_Handle):
    """A command running in the background of an :class:`~corral.AsyncSandbox` session.

    The async twin of :class:`Process`: ``async for stream, chunk in proc``,
    ``await proc.wait()``, ``await proc.kill()``, ``stdout`` / ``stderr``.
    """

    def __init__(
        self,
        start: Callable[[Pump, Cancellation], Any],
        command: str,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        import asyncio

        self.command = command
        self._queue: asyncio.Queue[Chunk | None] = asyncio.Queue()
        self._cancellation = Cancellation()

        def put(item: Chunk | None) -> None:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)

        self._pump = Pump(lambda name, chunk: put((name, chunk)), on_end=lambda: put(None))

        async def run() -> Outcome:
            try:
                outcome: Outcome = await start(self._pump, self._cancellation)
            except asyncio.CancelledError:
                if self._cancellation.cancelled:  # stopped before it started
                    raise _never_started(command, self._cancellation.reason) from None
                raise
            return outcome

        self._task: asyncio.Future[Outcome] = asyncio.ensure_future(run())

    @property
    def running(self) -> bool:
        """Whether the command has not finished yet."""
        return not self._task.done()

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        while True:
            item = await self._queue.get()
            if item is None:
                self._queue.put_nowait(None)  # for any other iteration
                return
            yield item

    async def wait(self) -> Outcome:
        """Wait for the command to end; return its Outcome (cancelling this wait does not stop it).

        Raises:
            SessionClosed: it was stopped (``kill()``, ``aclose()``) before it started.
            SandboxError: the sandbox could not be provided; nothing ran.
        """
        import asyncio

        return await asyncio.shield(self._task)

    async def kill(self) -> Outcome:
        """Stop it (TERM to every process, KILL after ``killGrace``); return its Outcome."""
        self._cancellation.cancel("killed")
        return await self.wait()

    def __repr__(self) -> str:
        return f"<AsyncProcess {self.command!r} {'running' if self.running else 'finished'}>"
