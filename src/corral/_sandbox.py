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

import os

from ._exceptions import (
    CommandFailed,
    InvalidRequest,
    PolicyDenied,
    SessionClosed,
)
from ._frozen import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Self

    from .pipeline._engine import Running
    from .pipeline._outcome import Outcome
    from .pipeline._request import ExecRequest
    from .policy import Policy

__all__ = ["AsyncSandbox", "BaseSandbox", "FileInfo", "Sandbox"]

#: Interpreters of :meth:`AsyncSandbox.run_code`: language -> argv prefix (the
#: code follows as one argument).
LANGUAGES: dict[str, tuple[str, ...]] = {
    "python": ("python3", "-c"),
    "node": ("node", "-e"),
    "bash": ("bash", "-c"),
}

#: The kernel's limit on one argument (MAX_ARG_STRLEN): longer code must be a file.
_MAX_CODE = 128 * 1024 - 1

#: ``find -printf`` type letters -> FileInfo.kind
_KINDS = {"f": "file", "d": "dir", "l": "symlink"}

#: Keyword options that map one-to-one to a settings key.
_SCALAR_OPTIONS: dict[str, str] = {
    "backend": "backend",
    "isolation": "isolation",
    "read_only": "filesystem.readOnly",
    "network": "network.mode",
    "allow_unix_sockets": "network.allowUnixSockets",
    "memory": "resources.memory",
    "pids": "resources.pids",
    "cpus": "resources.cpus",
    "cpu_time": "resources.cpuTime",
    "timeout": "resources.timeout",
    "max_output": "resources.output",
}
_LIST_OPTIONS: dict[str, str] = {
    "allow_write": "filesystem.allowWrite",
    "deny_write": "filesystem.denyWrite",
    "allow_read": "filesystem.allowRead",
    "deny_read": "filesystem.denyRead",
    "allow_hosts": "network.allow",
    "pass_env": "env.pass",
    "allow_degraded": "allowDegraded",
}


class FileInfo(Record):
    """One entry of :meth:`AsyncSandbox.list_files`.

    Attributes:
        name: the entry's name.
        path: its path as the sandbox sees it.
        kind: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"``.
        size: size in bytes (of the link itself for symlinks).
    """

    name: str
    path: str
    kind: str
    size: int


def _set(flags: dict[str, Any], dotted: str, value: Any) -> None:
    node = flags
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = [*into[key], *value]
        else:
            into[key] = value


def options_to_flags(options: Mapping[str, Any]) -> dict[str, Any]:
    """Turn SDK keyword options into a flags dict in the settings-JSON shape.

    ``None`` means "not given"; the string ``"none"`` removes a resource limit
    (as on the command line). ``env`` (a mapping) becomes ``env.set``;
    ``allow_hosts`` implies ``network.mode = "allowlist"`` unless ``network``
    is given; ``settings`` (a settings-shaped dict) is merged last.

    Raises:
        InvalidRequest: an unknown option or a value of the wrong shape.
    """
    flags: dict[str, Any] = {}
    for name, value in options.items():
        if value is None or name == "settings":
            continue
        if name in _SCALAR_OPTIONS:
            key = _SCALAR_OPTIONS[name]
            if key.startswith("resources.") and isinstance(value, str) and value.lower() == "none":
                value = None  # explicitly no limit
            _set(flags, key, value)
        elif name in _LIST_OPTIONS:
            if isinstance(value, str) or not hasattr(value, "__iter__"):
                raise InvalidRequest(
                    f"Failed to build the sandbox: {name} must be a list of strings, "
                    f"not {type(value).__name__}"
                )
            _set(flags, _LIST_OPTIONS[name], list(value))
        elif name == "env":
            if not hasattr(value, "items"):
                raise InvalidRequest(
                    "Failed to build the sandbox: env must be a mapping of names to values"
                )
            _set(flags, "env.set", {str(k): str(v) for k, v in value.items()})
        else:
            import difflib

            known = [*_SCALAR_OPTIONS, *_LIST_OPTIONS, "env", "settings"]
            close = difflib.get_close_matches(name, known, n=1)
            raise InvalidRequest(
                f"Failed to build the sandbox: unknown option {name!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
            )
    if "allow_hosts" in options and options["allow_hosts"] and options.get("network") is None:
        _set(flags, "network.mode", "allowlist")
    settings = options.get("settings")
    if settings is not None:
        if not isinstance(settings, dict):
            raise InvalidRequest(
                "Failed to build the sandbox: settings must be a dict shaped like a settings file"
            )
        _merge(flags, settings)
    return flags


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


def _sweep_sessions(directory: str) -> None:
    """Remove the TMPDIRs of sessions whose process no longer exists (killed, not closed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        pid = name.split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _remove_tree(os.path.join(directory, name))


def _remove_tree(path: str) -> None:
    """Remove a session directory, whatever modes the sandbox left inside it.

    Never follows a symlink the sandbox planted (see ``remove_tree``).
    """
    from .preview._mechanism import remove_tree

    remove_tree(path)


class _Cancellation:
    """Links a worker thread's run to the task that awaits it (thread-safe)."""

    __slots__ = ("_lock", "cancelled", "running")

    def __init__(self) -> None:
        import _thread

        self._lock = _thread.allocate_lock()
        self.running: Running | None = None
        self.cancelled = False

    def started(self, running: Running) -> None:
        """``on_start`` of the run: remember the handle; cancel at once if asked already."""
        with self._lock:
            self.running = running
            cancel = self.cancelled
        if cancel:
            running.cancel()

    def cancel(self) -> None:
        """Stop the run (TERM, grace, KILL), now or as soon as it starts."""
        with self._lock:
            self.cancelled = True
            running = self.running
        if running is not None:
            running.cancel()


class BaseSandbox:
    """State and I/O-free logic shared by :class:`AsyncSandbox` and :class:`Sandbox`.

    Not instantiated directly; see :class:`AsyncSandbox` for the options.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        workspace: str | None = None,
        preview: bool = False,
        profile: str | None = None,
        settings_files: Sequence[str] = (),
        agent_session: str | None = None,
        environ: Mapping[str, str] | None = None,
        state_dir: str | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> None:
        from . import _state
        from .pipeline._request import new_sandbox_id
        from .policy import load_settings

        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._state_dir = state_dir or _state.state_dir(self._environ)
        self._agent_session = agent_session
        self._profile = profile
        self._settings_files = tuple(settings_files)
        self._cwd = cwd
        self._flags: dict[str, Any] = {}
        self._workspace_arg = workspace
        self._has_rules = False
        #: warnings from loading the settings (ignored untrusted values ...)
        self.warnings: tuple[str, ...] = ()
        if policy is not None:
            if options or workspace is not None or profile is not None or settings_files:
                raise InvalidRequest(
                    "Failed to build the sandbox: give either a Policy or keyword "
                    "options (settings are loaded from the options), not both"
                )
            self._policy = policy
            self._workspace = policy.filesystem.workspace
        else:
            self._flags = options_to_flags(options)
            resolved = load_settings(
                cwd=cwd,
                environ=self._environ,
                flags=self._flags,
                settings_files=self._settings_files,
                profile=profile,
                workspace=workspace,
            )
            self._policy = resolved.policy
            self._workspace = resolved.workspace
            self._has_rules = bool(resolved.values.get("rules"))
            self.warnings = resolved.warnings
        self.id = new_sandbox_id()
        self._closed = False
        self._preview: Any = None
        self._active: dict[_Cancellation, Any] = {}  # running commands (async twin)
        # the session's private TMPDIR (mounted as /tmp in the sandbox)
        sessions = _state.ensure_dir(os.path.join(self._state_dir, "sessions"))
        _sweep_sessions(sessions)
        # named <pid>-<id>: a session whose process died without closing is swept later
        self._tmp_dir = os.path.join(sessions, f"{os.getpid()}-{self.id}")
        os.mkdir(self._tmp_dir, 0o700)
        if preview:
            try:
                self._preview = _create_preview(self._workspace, self._state_dir)
            except BaseException:
                _remove_tree(self._tmp_dir)
                raise

    # ------------------------------------------------------------ properties
    @property
    def policy(self) -> Policy:
        """The effective policy (before per-command ``rules``)."""
        return self._policy

    @property
    def workspace(self) -> str:
        """The workspace directory (the real one; with a preview, commands see its copy)."""
        return self._workspace

    @property
    def tmp_dir(self) -> str:
        """The host directory mounted as the sandbox's ``/tmp`` (removed on close)."""
        return self._tmp_dir

    @property
    def closed(self) -> bool:
        """Whether the sandbox was closed."""
        return self._closed

    @property
    def preview(self) -> Any:
        """The :class:`corral.preview.Preview` the commands run against, or ``None``."""
        return self._preview

    # ------------------------------------------------------------ requests
    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed(
                f"Failed to use sandbox {self.id}: it was closed", hint="create a new sandbox"
            )

    def _request(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
    ) -> ExecRequest:
        """The ExecRequest for one command of this session."""
        from .pipeline._request import ExecRequest

        self._check_open()
        where = (
            self._workspace if cwd is None else os.path.normpath(os.path.join(self._workspace, cwd))
        )
        common: dict[str, Any] = {
            "cwd": where,
            "env": env,
            "stdin": stdin,
            "timeout": timeout,
            "sandbox_id": self.id,
            "agent_session": self._agent_session,
        }
        if isinstance(command, str):
            request = ExecRequest.from_shell(command, **common)
        elif isinstance(command, (list, tuple)):
            request = ExecRequest.from_argv(command, **common)
        else:
            raise InvalidRequest(
                "Failed to build the request: the command must be a shell string or a "
                f"list of arguments, not {type(command).__name__}"
            )
        return request.replace(tmp_dir=self._tmp_dir)

    def _policy_for(self, request: ExecRequest) -> Policy:
        """The policy for *request*: the session's, plus the ``rules`` matching its command."""
        if not self._has_rules:
            return self._policy
        from .policy import load_settings

        resolved = load_settings(
            cwd=self._cwd,
            environ=self._environ,
            flags=self._flags,
            settings_files=self._settings_files,
            profile=self._profile,
            workspace=self._workspace_arg,
            command=request.command_line(),
        )
        return resolved.policy

    def _run_blocking(
        self, request: ExecRequest, cancellation: _Cancellation | None = None
    ) -> Outcome:
        """Plan, launch and audit *request* in this thread."""
        from .pipeline._runner import execute
        from .policy import policy_digest

        policy = self._policy_for(request)
        extra: dict[str, Any] = {}
        if self._preview is not None:
            extra["preview"] = self._preview
        if cancellation is not None:
            if cancellation.cancelled:
                raise _Cancelled
            extra["on_start"] = cancellation.started
        return execute(
            request,
            policy,
            environ=self._environ,
            state_dir=self._state_dir,
            policy_digest=policy_digest(policy),
            **extra,
        )

    def _code_request(self, code: str, language: str, **kwargs: Any) -> ExecRequest:
        prefix = LANGUAGES.get(language)
        if prefix is None:
            raise InvalidRequest(
                f"Failed to run code: unknown language {language!r} (known: {', '.join(LANGUAGES)})"
            )
        if len(code.encode()) > _MAX_CODE:
            raise InvalidRequest(
                "Failed to run code: it is longer than 128 KiB",
                hint="write it to a file with write_file() and exec() that file",
            )
        return self._request([*prefix, code], **kwargs)

    # ------------------------------------------------------------ file operations
    def _write_request(self, path: str, data: bytes | str, *, parents: bool) -> ExecRequest:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"' if parents else 'cat > "$1"'
        return self._request(
            ["/bin/sh", "-c", script, "corral-write", path], stdin=data, env={"LC_ALL": "C"}
        )

    def _read_request(self, path: str) -> ExecRequest:
        return self._request(["cat", "--", path], env={"LC_ALL": "C"})

    def _list_request(self, path: str) -> ExecRequest:
        return self._request(
            ["find", "-H", path, "-mindepth", "1", "-maxdepth", "1", "-printf", "%y\\t%s\\t%p\\0"],
            env={"LC_ALL": "C"},
        )

    @staticmethod
    def _check_file(action: str, outcome: Outcome) -> Outcome:
        """Raise when a file operation was blocked or failed (see AsyncSandbox.write_file)."""
        if outcome.violations:
            raise PolicyDenied(
                f"Failed to {action}: the policy {outcome.violations[0].describe()}",
                outcome=outcome,
            )
        if not outcome.ok:
            why = _last_line(outcome.stderr) or f"exit status {outcome.returncode}"
            raise CommandFailed(f"Failed to {action}: {why}", outcome=outcome)
        if outcome.truncated:
            raise InvalidRequest(
                f"Failed to {action}: the output went over the sandbox's output "
                "limit (resources.output)",
                hint="raise it with max_output=...",
            )
        return outcome

    @staticmethod
    def _parse_listing(outcome: Outcome) -> list[FileInfo]:
        entries = []
        for record in outcome.stdout.split(b"\0"):
            if not record:
                continue
            kind, size, path = record.decode("utf-8", "surrogateescape").split("\t", 2)
            entries.append(
                FileInfo(
                    name=os.path.basename(path),
                    path=path,
                    kind=_KINDS.get(kind, "other"),
                    size=int(size),
                )
            )
        return sorted(entries, key=lambda e: e.name)

    def _require_preview(self, action: str) -> Any:
        self._check_open()
        if self._preview is None:
            raise InvalidRequest(
                f"Failed to {action}: this sandbox has no preview",
                hint="create the sandbox with preview=True",
            )
        return self._preview

    def _finish_close(self) -> None:
        self._closed = True
        _remove_tree(self._tmp_dir)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.id} {self._workspace} {state}>"


class _Cancelled(Exception):
    """The run was cancelled before it started (internal)."""


def _create_preview(workspace: str, state_dir: str) -> Any:
    """Create a :class:`corral.preview.Preview` of *workspace* (imported on first use).

    Raises:
        PreviewError: the preview could not be created.
    """
    from .preview import Preview

    return Preview.create(workspace, state_dir=state_dir)


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

    async def _run(self, request: ExecRequest) -> Outcome:
        import asyncio
        import time

        cancellation = _Cancellation()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, self._run_blocking, request, cancellation)
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
        except _Cancelled:
            raise asyncio.CancelledError from None
        finally:
            self._active.pop(cancellation, None)

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the sandbox's wall-clock limit, not an await timeout
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
    ) -> Outcome:
        """Run *command* in the sandbox and return its :class:`~corral.Outcome`.

        Args:
            command: an argv list (run as is), or a string (run with ``/bin/sh -c``).
            timeout: wall-clock seconds for this command (default: the policy's).
            env: extra variables for this command only.
            stdin: bytes or text fed to the command (default: ``/dev/null``).
            cwd: working directory, absolute or relative to the workspace.

        A policy denial is data on the Outcome (``violations``); a failing
        command is not an error (``outcome.check()`` raises on request).

        Raises:
            SessionClosed: the sandbox was closed.
            InvalidRequest: an empty command, a bad timeout or cwd.
            SandboxError: the sandbox could not be provided; nothing ran.
        """
        return await self._run(
            self._request(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)
        )

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the sandbox's wall-clock limit, not an await timeout
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

    async def read_file(self, path: str) -> bytes:
        """Return the contents of *path* as the sandbox sees it (secrets are hidden).

        Raises:
            CommandFailed: the file cannot be read in the sandbox.
            InvalidRequest: it is larger than the sandbox's output limit.
        """
        outcome = await self._run(self._read_request(path))
        return self._check_file(f"read {path}", outcome).stdout

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        """List the entries of directory *path* as the sandbox sees it, sorted by name.

        Raises:
            CommandFailed: the directory cannot be listed in the sandbox.
        """
        outcome = await self._run(self._list_request(path))
        return self._parse_listing(self._check_file(f"list {path}", outcome))

    async def diff(self) -> Any:
        """The preview's change set (``ChangeSet``; ``.to_json()`` for JSON).

        Raises:
            InvalidRequest: the sandbox has no preview.
            PreviewError: the change set cannot be computed.
        """
        import asyncio

        preview = self._require_preview("compute the diff")
        return await asyncio.to_thread(preview.changes)

    async def apply(
        self,
        *,
        allow_protected: tuple[str, ...] = (),
        force: bool = False,
        skip_conflicts: bool = False,
    ) -> Any:
        """Land the preview's changes in the real workspace (see ``Preview.apply``).

        Raises:
            InvalidRequest: the sandbox has no preview.
            ApplyConflict: the real workspace changed under the preview.
            PreviewError: the changes cannot be applied.
        """
        import asyncio

        preview = self._require_preview("apply the changes")
        return await asyncio.to_thread(
            preview.apply,
            allow_protected=allow_protected,
            force=force,
            skip_conflicts=skip_conflicts,
        )

    async def discard(self) -> None:
        """Drop the preview's changes.

        Raises:
            InvalidRequest: the sandbox has no preview.
        """
        import asyncio

        preview = self._require_preview("discard the changes")
        await asyncio.to_thread(preview.discard)

    async def aclose(self) -> None:
        """Stop running commands, remove the private ``/tmp``; idempotent.

        A preview is kept (it persists until applied or discarded).
        """
        import asyncio

        if self._closed:
            return
        self._closed = True
        running = list(self._active.items())
        for cancellation, _future in running:
            cancellation.cancel()
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
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
    ) -> Outcome:
        """See :meth:`AsyncSandbox.exec`."""
        return self._run_blocking(
            self._request(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)
        )

    def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
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

    def read_file(self, path: str) -> bytes:
        """See :meth:`AsyncSandbox.read_file`."""
        return self._check_file(f"read {path}", self._run_blocking(self._read_request(path))).stdout

    def list_files(self, path: str = ".") -> list[FileInfo]:
        """See :meth:`AsyncSandbox.list_files`."""
        outcome = self._run_blocking(self._list_request(path))
        return self._parse_listing(self._check_file(f"list {path}", outcome))

    def diff(self) -> Any:
        """See :meth:`AsyncSandbox.diff`."""
        return self._require_preview("compute the diff").changes()

    def apply(
        self,
        *,
        allow_protected: tuple[str, ...] = (),
        force: bool = False,
        skip_conflicts: bool = False,
    ) -> Any:
        """See :meth:`AsyncSandbox.apply`."""
        return self._require_preview("apply the changes").apply(
            allow_protected=allow_protected, force=force, skip_conflicts=skip_conflicts
        )

    def discard(self) -> None:
        """See :meth:`AsyncSandbox.discard`."""
        self._require_preview("discard the changes").discard()

    def close(self) -> None:
        """Remove the private ``/tmp``; idempotent. A preview is kept."""
        if not self._closed:
            self._finish_close()
