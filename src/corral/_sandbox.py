"""The Python SDK: ``AsyncSandbox`` (the source of truth) and ``Sandbox`` (its sync twin).

A sandbox is a *session*: it keeps its id, its settings and a private
``TMPDIR`` (a host directory under corral's state dir, mounted as the
sandbox's ``/tmp``) across :meth:`~AsyncSandbox.exec` calls until it is
closed. Every command goes through :mod:`corral.pipeline._runner` exactly like
``corral run``, so it is planned, enforced and audited the same way; the SDK
has no policy logic of its own.

The twins mirror each other name for name (STYLE rule 7): ``exec``,
``write_file``, ``read_file``, ``list_files``, ``run_code``, ``diff``,
``apply``, ``discard``, and ``close`` / ``aclose``. Shared, I/O-free logic
(building requests, judging file-operation outcomes) lives in
:class:`BaseSandbox`. The engine is synchronous (``posix_spawn`` + ``poll``);
the async twin runs it in a worker thread and turns the cancellation of the
awaiting task into :meth:`Running.cancel() <corral.pipeline._engine.Running.cancel>`
(TERM, grace, KILL of the whole sandbox), then waits for the thread, so a
cancelled ``exec`` never leaves a process behind (docs/design.md, "The SDK").

File operations act *inside the sandbox's view*: ``write_file``, ``read_file``
and ``list_files`` run a tiny program (``sh``/``cat``/``find``) in the sandbox,
so every rule the sandbox enforces (read-only areas, protected persistence
points, hidden secrets, the private ``/tmp``, a preview's copy-on-write view)
applies to them exactly; there is no second, host-side implementation of the
policy that could drift from it.

Example::

    from corral import Sandbox

    with Sandbox(workspace="/src/app", network="none", memory="2G") as sbx:
        sbx.write_file("hello.py", "print('hi')\\n")
        print(sbx.exec(["python3", "hello.py"]).check().text())
"""

from __future__ import annotations

from ._files import FileInfo
from ._sandbox_base import BaseSandbox, _in_thread
from ._streaming import Cancellation, Cancelled

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Self

    from ._sandbox_base import Language
    from ._streaming import AsyncProcess, Process, Pump
    from .pipeline._outcome import Outcome
    from .pipeline._request import ExecRequest
    from .preview import ApplyResult, ChangeSet

__all__ = ["AsyncSandbox", "BaseSandbox", "FileInfo", "Sandbox"]


class AsyncSandbox(BaseSandbox):
    """A sandbox session for asyncio code (the source of truth; :class:`Sandbox` is its twin).

    Args:
        policy: a complete :class:`~corral.Policy` to use as is. Without it the
            settings are loaded like ``corral run`` does (defaults, user,
            project - tighten-only until trusted -, environment) with the
            keyword options as the last layer.
        workspace: the project directory (default: the git top-level above
            *cwd*, else *cwd*).
        preview: run every command against a copy-on-write preview of the
            workspace; review with :meth:`diff`, land with :meth:`apply`.
        profile: a settings profile to apply.
        settings_files: extra settings files (trusted).
        agent_session: the agent's session id, recorded in the audit log.
        environ: the host environment (default :data:`os.environ`).
        state_dir: corral's state directory (default ``$XDG_STATE_HOME/corral``).
        cwd: where workspace detection starts (default: the current directory).
        backend, isolation, read_only, network, allow_unix_sockets, memory,
        pids, cpus, cpu_time, timeout, max_output: the settings of the same
            name (``"512M"``, ``"30s"``, ...; ``"none"`` removes a limit).
        allow_write, deny_write, allow_read, deny_read, allow_hosts, pass_env,
        allow_degraded: lists for the settings of the same name.
        env: variables set in the sandbox (``env.set``).
        settings: any other settings, shaped like a settings file.

    Raises:
        SettingsError: a settings file or option is invalid.
        InvalidRequest: both a Policy and options, or an unknown option.
        PreviewError: ``preview=True`` but the preview cannot be created.

    Example::

        async with AsyncSandbox(workspace="/src/app", timeout="5m") as sbx:
            outcome = await sbx.exec("pytest -q")
            print(outcome.returncode, outcome.violations)
    """

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def _run(
        self,
        request: ExecRequest,
        pump: Pump | None = None,
        cancellation: Cancellation | None = None,
        *,
        fresh: bool = False,
    ) -> Outcome:
        import asyncio
        import time

        cancellation = cancellation or Cancellation()
        # a thread of its own (not the loop's executor: background processes would
        # hold its few workers for as long as they run)
        future = _in_thread(self._run_blocking, request, cancellation, pump, fresh)
        self._active[cancellation] = future
        try:
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                # stop the sandbox, then wait for the worker so nothing outlives us
                cancellation.cancel()
                while not future.done():
                    try:
                        await asyncio.shield(future)
                    except asyncio.CancelledError:
                        # anyio's cancel scopes re-deliver the cancellation at every
                        # await; wait a little without spinning (bounded by killGrace)
                        time.sleep(0.005)  # noqa: ASYNC251 - deliberate: see the comment above
                    except BaseException:
                        break
                raise
        except Cancelled:
            raise asyncio.CancelledError from None
        finally:
            self._active.pop(cancellation, None)

    async def _run_streamed(
        self,
        request: ExecRequest,
        on_stdout: Callable[[bytes], object] | None,
        on_stderr: Callable[[bytes], object] | None,
    ) -> Outcome:
        """Run *request*, calling the callbacks on this event loop as output arrives."""
        import asyncio

        from ._streaming import Pump, callbacks

        loop = asyncio.get_running_loop()
        cancellation = Cancellation()
        call = callbacks(on_stdout, on_stderr)
        failed: list[BaseException] = []

        def dispatch(name: str, chunk: bytes) -> None:
            if failed:
                return
            try:
                call(name, chunk)
            except Exception as exc:
                failed.append(exc)
                cancellation.cancel("an output callback raised")

        pump = Pump(lambda name, chunk: loop.call_soon_threadsafe(dispatch, name, chunk))
        outcome = await self._run(request, pump, cancellation)
        if failed:
            raise failed[0]
        return outcome

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | str | None = None,  # noqa: ASYNC109 - the sandbox's wall-clock limit, not an await timeout
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[bytes], object] | None = None,
        on_stderr: Callable[[bytes], object] | None = None,
    ) -> Outcome:
        """Run *command* in the sandbox and return its :class:`~corral.Outcome`.

        Args:
            command: an argv list (run as is), or a string (run with ``/bin/sh -c``).
            timeout: wall-clock seconds (or a duration such as ``"5m"``) for this
                command (default: the policy's ``resources.timeout``).
            env: extra variables for this command only.
            stdin: bytes or text fed to the command (default: ``/dev/null``).
            cwd: working directory, absolute or relative to the workspace.
            on_stdout, on_stderr: called with each chunk of output as it arrives
                (on the event loop; the async twin); the Outcome still has all of it.
                If one raises, the command is stopped and the error propagates.

        A policy denial is data on the Outcome (``violations``); a failing
        command is not an error (``outcome.check()`` raises on request).

        Raises:
            SessionClosed: the sandbox was closed.
            InvalidRequest: an empty command, a bad timeout, a cwd that does not exist.
            SandboxError: the sandbox could not be provided; nothing ran.
        """
        request = self._request(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)
        if on_stdout is None and on_stderr is None:
            return await self._run(request)
        return await self._run_streamed(request, on_stdout, on_stderr)

    async def spawn(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | str | None = None,  # noqa: ASYNC109 - the sandbox's wall-clock limit, not an await timeout
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
    ) -> AsyncProcess:
        """Start *command* in the background; return its handle at once.

        It runs in a sandbox of its own with this session's policy, private
        ``/tmp`` and preview (see docs/sdk.md, "Background processes").
        ``async for stream, chunk in proc`` reads its output live;
        ``await proc.wait()`` returns its Outcome; ``await proc.kill()`` stops
        it. :meth:`aclose` stops it too.

        Raises:
            SessionClosed: the sandbox was closed.
            InvalidRequest: an empty command or a bad timeout.
        """
        import asyncio

        from ._streaming import AsyncProcess

        request = self._request(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)
        process = AsyncProcess(
            lambda pump, cancellation: self._run(request, pump, cancellation, fresh=True),
            request.command_line(),
            asyncio.get_running_loop(),
        )
        # known to aclose() from now on, not only once its task has started
        self._active[process._cancellation] = process._task
        return process

    async def run_code(
        self,
        code: str,
        language: Language = "python",
        *,
        timeout: float | str | None = None,  # noqa: ASYNC109 - the sandbox's wall-clock limit, not an await timeout
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> Outcome:
        """Run *code* with ``python3 -c``, ``node -e`` or ``bash -c`` in the sandbox.

        Raises:
            InvalidRequest: unknown *language*, or code over 128 KiB (the
                kernel's limit for one argument; write a file instead).
        """
        return await self._run(
            self._code_request(code, language, timeout=timeout, env=env, stdin=stdin)
        )

    async def write_file(self, path: str, data: bytes | str, *, parents: bool = False) -> None:
        """Write *data* to *path* (relative to the workspace) from inside the sandbox.

        The write is done by ``sh``/``cat`` in the sandbox, so it is allowed
        exactly where the sandbox may write: the workspace (minus protected
        paths and ``denyWrite``), ``allowWrite`` paths and the private ``/tmp``.
        *parents* creates missing parent directories.

        Raises:
            PolicyDenied: the policy blocked it (``e.outcome.violations``).
            CommandFailed: the write failed (read-only area, missing directory ...).
        """
        outcome = await self._run(self._write_request(path, data, parents=parents))
        self._check_file(f"write {path}", outcome)

    async def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """Return the contents of *path* as the sandbox sees it (secrets are hidden).

        Only regular files are read (a device such as ``/dev/zero`` or a FIFO
        would never end or never answer). *offset* skips that many bytes;
        *limit* returns at most that many (default: to the end of the file).

        Raises:
            CommandFailed: the file cannot be read in the sandbox, or is not a
                regular file.
            InvalidRequest: a bad offset or limit, or what would be returned is
                larger than the sandbox's output limit (read it in parts).
        """
        outcome = await self._run(self._read_request(path, offset, limit))
        return self._check_file(f"read {path}", outcome).stdout

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        """List the entries of directory *path* as the sandbox sees it, sorted by name.

        Raises:
            CommandFailed: the directory cannot be listed in the sandbox.
        """
        outcome = await self._run(self._list_request(path))
        return self._parse_listing(self._check_file(f"list {path}", outcome))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove the file, link or empty directory *path* inside the sandbox (*recursive*: a tree).

        Raises:
            PolicyDenied: the policy blocked it.
            CommandFailed: it failed (missing, read-only, a directory that is not empty).
        """
        outcome = await self._run(self._remove_request(path, recursive=recursive))
        self._check_file(f"remove {path}", outcome)

    async def make_dir(self, path: str, *, parents: bool = False) -> None:
        """Create directory *path* inside the sandbox (*parents*: and missing parents, no error
        if it exists).

        Raises:
            PolicyDenied: the policy blocked it.
            CommandFailed: it failed (exists, read-only, missing parent).
        """
        outcome = await self._run(self._mkdir_request(path, parents=parents))
        self._check_file(f"create {path}", outcome)

    async def upload_dir(self, local_dir: str, path: str) -> None:
        """Copy the host directory *local_dir* into *path* (created if missing) in the sandbox.

        The copy is unpacked by ``tar`` inside the sandbox, so the policy's write
        rules apply to every file of it.

        Raises:
            InvalidRequest: *local_dir* is not a directory.
            PolicyDenied: the policy blocked a write.
            CommandFailed: the copy failed.
        """
        outcome = await self._run(self._upload_request(local_dir, path))
        self._check_file(f"upload {local_dir} to {path}", outcome)

    async def download_dir(self, path: str, local_dir: str) -> None:
        """Copy directory *path*, as the sandbox sees it, to the new or empty host *local_dir*.

        What comes out of the sandbox is untrusted: no absolute names, ``..``,
        links leaving *local_dir*, devices or set-id bits are unpacked.

        Raises:
            InvalidRequest: *local_dir* exists and is not empty, or the copy is
                larger than the sandbox's output limit.
            CommandFailed: *path* cannot be read, or the copy is unsafe.
        """
        import asyncio

        from ._files import check_download_target, extract_download

        check_download_target(local_dir, path)
        outcome = await self._run(self._download_request(path))
        self._check_file(f"download {path}", outcome)
        await asyncio.to_thread(extract_download, outcome, local_dir, path)

    async def diff(self) -> ChangeSet:
        """The preview's change set (``ChangeSet``; ``.to_json()`` for JSON).

        Raises:
            InvalidRequest: the sandbox has no preview.
            PreviewError: the change set cannot be computed.
        """
        import asyncio

        preview = self._require_preview("compute the diff")
        changes: ChangeSet = await asyncio.to_thread(preview.changes)
        return changes

    async def apply(
        self,
        *,
        allow_protected: tuple[str, ...] = (),
        force: bool = False,
        skip_conflicts: bool = False,
    ) -> ApplyResult:
        """Land the preview's changes in the real workspace (see ``Preview.apply``).

        Raises:
            InvalidRequest: the sandbox has no preview.
            ApplyConflict: the real workspace changed under the preview.
            PreviewError: the changes cannot be applied.
        """
        import asyncio

        preview = self._require_preview("apply the changes")
        self._retire_vm()  # its view of the preview goes stale (_sandbox_vm.py)
        result: ApplyResult = await asyncio.to_thread(
            preview.apply,
            allow_protected=allow_protected,
            force=force,
            skip_conflicts=skip_conflicts,
        )
        return result

    async def discard(self) -> None:
        """Drop the preview's changes.

        Raises:
            InvalidRequest: the sandbox has no preview.
        """
        import asyncio

        preview = self._require_preview("discard the changes")
        self._retire_vm()
        await asyncio.to_thread(preview.discard)

    async def aclose(self) -> None:
        """Stop running commands, remove the private ``/tmp``; idempotent.

        Each running command is stopped (SIGTERM to every process, SIGKILL after
        ``resources.killGrace``) and its ``Outcome.stopped`` says so. A preview is
        kept (it persists until applied or discarded).
        """
        await self._close("the sandbox was closed")

    async def _close(self, reason: str) -> None:
        """:meth:`aclose`, with *reason* as the running commands' ``Outcome.stopped``."""
        import asyncio

        if self._closed:
            return
        self._closed = True
        running = list(self._active.items())
        for cancellation, _future in running:
            cancellation.cancel(reason)
        try:
            if running:
                waiting = asyncio.gather(*(f for _, f in running), return_exceptions=True)
                await asyncio.shield(waiting)
        finally:
            self._finish_close()  # even when the wait itself is cancelled


class Sandbox(BaseSandbox):
    """The synchronous twin of :class:`AsyncSandbox`: the same options, names and behaviour.

    Example::

        with Sandbox(workspace="/src/app") as sbx:
            sbx.exec(["make", "test"]).check()
    """

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[bytes], object] | None = None,
        on_stderr: Callable[[bytes], object] | None = None,
    ) -> Outcome:
        """See :meth:`AsyncSandbox.exec` (the callbacks run in a thread of corral's, in order)."""
        request = self._request(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)
        if on_stdout is None and on_stderr is None:
            return self._run_blocking(request)
        from ._streaming import Pump, callbacks

        cancellation = Cancellation()
        pump = Pump(
            callbacks(on_stdout, on_stderr),
            on_error=lambda: cancellation.cancel("an output callback raised"),
        )
        return self._run_blocking(request, cancellation, pump)

    def spawn(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
    ) -> Process:
        """See :meth:`AsyncSandbox.spawn` (iterate the handle for live output)."""
        from ._streaming import Process

        request = self._request(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)
        process = Process(
            lambda pump, cancellation: self._run_blocking(request, cancellation, pump, fresh=True),
            request.command_line(),
        )
        self._processes = [p for p in self._processes if p.running]
        self._processes.append(process)
        return process

    def run_code(
        self,
        code: str,
        language: Language = "python",
        *,
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
    ) -> Outcome:
        """See :meth:`AsyncSandbox.run_code`."""
        return self._run_blocking(
            self._code_request(code, language, timeout=timeout, env=env, stdin=stdin)
        )

    def write_file(self, path: str, data: bytes | str, *, parents: bool = False) -> None:
        """See :meth:`AsyncSandbox.write_file`."""
        self._check_file(
            f"write {path}", self._run_blocking(self._write_request(path, data, parents=parents))
        )

    def read_file(self, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
        """See :meth:`AsyncSandbox.read_file`."""
        outcome = self._run_blocking(self._read_request(path, offset, limit))
        return self._check_file(f"read {path}", outcome).stdout

    def list_files(self, path: str = ".") -> list[FileInfo]:
        """See :meth:`AsyncSandbox.list_files`."""
        outcome = self._run_blocking(self._list_request(path))
        return self._parse_listing(self._check_file(f"list {path}", outcome))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """See :meth:`AsyncSandbox.remove`."""
        outcome = self._run_blocking(self._remove_request(path, recursive=recursive))
        self._check_file(f"remove {path}", outcome)

    def make_dir(self, path: str, *, parents: bool = False) -> None:
        """See :meth:`AsyncSandbox.make_dir`."""
        outcome = self._run_blocking(self._mkdir_request(path, parents=parents))
        self._check_file(f"create {path}", outcome)

    def upload_dir(self, local_dir: str, path: str) -> None:
        """See :meth:`AsyncSandbox.upload_dir`."""
        outcome = self._run_blocking(self._upload_request(local_dir, path))
        self._check_file(f"upload {local_dir} to {path}", outcome)

    def download_dir(self, path: str, local_dir: str) -> None:
        """See :meth:`AsyncSandbox.download_dir`."""
        from ._files import check_download_target, extract_download

        check_download_target(local_dir, path)
        outcome = self._run_blocking(self._download_request(path))
        extract_download(self._check_file(f"download {path}", outcome), local_dir, path)

    def diff(self) -> ChangeSet:
        """See :meth:`AsyncSandbox.diff`."""
        return self._require_preview("compute the diff").changes()

    def apply(
        self,
        *,
        allow_protected: tuple[str, ...] = (),
        force: bool = False,
        skip_conflicts: bool = False,
    ) -> ApplyResult:
        """See :meth:`AsyncSandbox.apply`."""
        preview = self._require_preview("apply the changes")
        self._retire_vm()  # its view of the preview goes stale (_sandbox_vm.py)
        return preview.apply(
            allow_protected=allow_protected, force=force, skip_conflicts=skip_conflicts
        )

    def discard(self) -> None:
        """See :meth:`AsyncSandbox.discard`."""
        preview = self._require_preview("discard the changes")
        self._retire_vm()
        preview.discard()

    def close(self) -> None:
        """Stop background processes, remove the private ``/tmp``; idempotent.

        A preview is kept.
        """
        if self._closed:
            return
        self._closed = True
        try:
            for process in self._processes:
                process._cancellation.cancel("the sandbox was closed")
            import contextlib

            for process in self._processes:
                with contextlib.suppress(Exception):  # its own error: its wait() reports it
                    process.wait()
        finally:
            self._finish_close()
