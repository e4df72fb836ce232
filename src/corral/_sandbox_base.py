"""What the SDK's twins share: :class:`BaseSandbox` (state, requests, I/O-free logic) and helpers.

:class:`~corral.AsyncSandbox` and :class:`~corral.Sandbox` (:mod:`corral._sandbox`)
are built on it; nothing here waits on a command.
"""

from __future__ import annotations

import _thread
import os

from ._exceptions import (
    CorralError,
    InvalidRequest,
    LaunchFailed,
    SessionClosed,
)
from ._files import FileRequests
from ._sandbox_vm import VmSessions
from ._session_dirs import remove_tree as _remove_tree
from ._session_dirs import sweep_sessions as _sweep_sessions
from ._streaming import Cancellation, Cancelled

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, Literal

    from ._streaming import Process, Pump
    from .pipeline._outcome import Outcome
    from .pipeline._request import ExecRequest
    from .pipeline._resident import Resident
    from .policy import Policy
    from .preview import Preview

__all__ = ["LANGUAGES", "BaseSandbox"]

if TYPE_CHECKING:
    #: the languages of :meth:`AsyncSandbox.run_code`
    Language = Literal["python", "node", "bash"]

#: Interpreters of :meth:`AsyncSandbox.run_code`: language (a ``Language``) -> argv
#: prefix (the code follows as one argument).
LANGUAGES: dict[str, tuple[str, ...]] = {
    "python": ("python3", "-c"),
    "node": ("node", "-e"),
    "bash": ("bash", "-c"),
}

#: The kernel's limit on one argument (MAX_ARG_STRLEN): longer code must be a file.
_MAX_CODE = 128 * 1024 - 1


class BaseSandbox(FileRequests, VmSessions):
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
        backend: str | None = None,
        isolation: Literal["process", "namespace", "kernel", "vm"] | None = None,
        read_only: bool | None = None,
        network: Literal["none", "allowlist", "open"] | None = None,
        allow_unix_sockets: bool | None = None,
        memory: int | str | None = None,
        pids: int | str | None = None,
        cpus: float | str | None = None,
        cpu_time: float | str | None = None,
        timeout: float | str | None = None,
        max_output: int | str | None = None,
        allow_write: Sequence[str] | None = None,
        deny_write: Sequence[str] | None = None,
        allow_read: Sequence[str] | None = None,
        deny_read: Sequence[str] | None = None,
        allow_hosts: Sequence[str] | None = None,
        pass_env: Sequence[str] | None = None,
        allow_degraded: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        options: dict[str, Any] = {
            "backend": backend,
            "isolation": isolation,
            "read_only": read_only,
            "network": network,
            "allow_unix_sockets": allow_unix_sockets,
            "memory": memory,
            "pids": pids,
            "cpus": cpus,
            "cpu_time": cpu_time,
            "timeout": timeout,
            "max_output": max_output,
            "allow_write": allow_write,
            "deny_write": deny_write,
            "allow_read": allow_read,
            "deny_read": deny_read,
            "allow_hosts": allow_hosts,
            "pass_env": pass_env,
            "allow_degraded": allow_degraded,
            "env": env,
            "settings": settings,
        }
        options = {name: value for name, value in options.items() if value is not None}
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
            from ._options import options_to_flags

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
        self._preview: Preview | None = None
        self._active: dict[Cancellation, Any] = {}  # running commands (async twin)
        self._processes: list[Process] = []  # background processes (sync twin)
        # the kept sandbox whose init runs the session's commands (pipeline/_resident.py);
        # CORRAL_RESIDENT=0 runs each command in a fresh sandbox instead
        self._resident: Resident | None = None
        self._resident_lock = _thread.allocate_lock()
        self._resident_wanted = self._environ.get("CORRAL_RESIDENT", "1") != "0"
        self._digest: tuple[Policy | None, str] = (None, "")  # the last policy's digest
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
        self._boot_vm_ahead()  # isolation "vm": the kept VM boots from now (_sandbox_vm.py)

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
    def preview(self) -> Preview | None:
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
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
    ) -> ExecRequest:
        """The ExecRequest for one command of this session."""
        from .pipeline._request import ExecRequest

        self._check_open()
        if isinstance(timeout, str):
            from .policy._units import parse_duration

            try:
                timeout = parse_duration(timeout)
            except ValueError as exc:
                raise InvalidRequest(f"Failed to build the request: timeout: {exc}") from None
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
        self,
        request: ExecRequest,
        cancellation: Cancellation | None = None,
        pump: Pump | None = None,
        fresh: bool = False,
    ) -> Outcome:
        """Plan, launch and audit *request* in this thread; with a *pump*, stream its output.

        *fresh*: in a sandbox of its own, never the session's resident one (a
        background process, which would hold it for as long as it runs).
        """
        if pump is not None:
            try:
                outcome = self._launch(
                    request.replace(capture=False), cancellation, streams=pump.streams, fresh=fresh
                )
            except BaseException:
                pump.abandon()
                raise
            stdout, stderr = pump.finish()  # raises what an output callback raised
            return outcome.replace(stdout=stdout, stderr=stderr)
        return self._launch(request, cancellation, fresh=fresh)

    def _launch(
        self,
        request: ExecRequest,
        cancellation: Cancellation | None = None,
        streams: tuple[int, int, int] | None = None,
        *,
        fresh: bool = False,
    ) -> Outcome:
        from .pipeline._runner import execute
        from .policy import policy_digest

        policy = self._policy_for(request)
        extra: dict[str, Any] = {}
        if self._preview is not None:
            extra["preview"] = self._preview
        if cancellation is not None:
            if cancellation.cancelled:
                raise Cancelled
            extra["on_start"] = cancellation.started
        if streams is not None:
            extra["streams"] = streams
        if not fresh:  # a VM session's kept VM (_sandbox_vm.py)
            outcome = self._run_vm(request, policy, cancellation, streams)
            if outcome is not None:
                return outcome
        if self._preview is None and self._resident_wanted and not fresh:
            outcome = self._run_resident(request, policy, cancellation, streams)
            if outcome is not None:
                return outcome
        try:
            outcome = execute(
                request,
                policy,
                environ=self._environ,
                state_dir=self._state_dir,
                policy_digest=policy_digest(policy),
                **extra,
            )
        except LaunchFailed as exc:
            raise _caller_mistake(request, exc) from None
        if cancellation is not None and cancellation.cancelled:
            outcome = outcome.replace(stopped=cancellation.reason)
        return outcome

    def _run_resident(
        self,
        request: ExecRequest,
        policy: Policy,
        cancellation: Cancellation | None,
        streams: tuple[int, int, int] | None,
    ) -> Outcome | None:
        """Run *request* in the session's resident sandbox (started on first use), audited.

        ``None``: it must run in a fresh sandbox (see :mod:`corral.pipeline._resident`).
        """
        from .pipeline._resident import Resident
        from .pipeline._runner import audit_outcome
        from .policy import policy_digest

        with self._resident_lock:
            resident = self._resident
            if resident is not None and resident.broken:
                self._resident = None
                resident.close()
                resident = None
            if resident is None:
                if not self._resident_wanted or self._closed:
                    return None
                base = request.replace(
                    argv=("/bin/true",), cwd=self._workspace, env=(), stdin_mode="null", stdin=b""
                )
                resident = Resident.open(base, policy, environ=self._environ)
                if resident is None:
                    self._resident_wanted = False  # not possible with this policy here
                    return None
                self._resident = resident
                import weakref

                # a session dropped without close(): its sandbox ends with the object
                weakref.finalize(self, resident.close)
        extra: dict[str, Any] = {}
        if cancellation is not None:
            extra["on_start"] = cancellation.started
        if streams is not None:
            extra["streams"] = streams
        try:
            outcome = resident.run(request, policy, **extra)
        except LaunchFailed as exc:
            raise _caller_mistake(request, exc) from None
        if outcome is None:
            if resident.broken and resident.commands == 0:
                self._resident_wanted = False  # it cannot run here: fresh sandboxes from now on
            return None
        if self._digest[0] is not policy:
            self._digest = (policy, policy_digest(policy))
        outcome = outcome.replace(policy_digest=self._digest[1])
        problem = audit_outcome(outcome, request, state_dir=self._state_dir)
        if problem is not None:
            raise CorralError(f"Failed to record the run: {problem}")
        if cancellation is not None and cancellation.cancelled:
            outcome = outcome.replace(stopped=cancellation.reason)
        return outcome

    def _close_resident(self) -> None:
        with self._resident_lock:
            resident, self._resident = self._resident, None
            self._resident_wanted = False
        if resident is not None:
            resident.close()

    def _code_request(self, code: str, language: Language, **kwargs: Any) -> ExecRequest:
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

    def _require_preview(self, action: str) -> Preview:
        self._check_open()
        if self._preview is None:
            raise InvalidRequest(
                f"Failed to {action}: this sandbox has no preview",
                hint="create the sandbox with preview=True",
            )
        return self._preview

    def _finish_close(self) -> None:
        self._closed = True
        self._close_resident()
        self._close_vm()
        _remove_tree(self._tmp_dir)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.id} {self._workspace} {state}>"


def _caller_mistake(request: ExecRequest, exc: LaunchFailed) -> CorralError:
    """*exc*, or InvalidRequest when the sandbox could not enter the request's cwd."""
    if request.cwd and "chdir" in exc.message.lower():
        return InvalidRequest(
            f"Failed to run the command: its working directory {request.cwd} "
            "does not exist (or is not a directory) in the sandbox",
            hint="give an existing directory as cwd, absolute or relative to the workspace",
        )
    return exc


def _in_thread(function: Callable[..., Outcome], *args: Any) -> asyncio.Future[Outcome]:
    """Run *function* in a new thread; its result as a future of the running loop."""
    import _thread
    import asyncio

    loop = asyncio.get_running_loop()
    future: asyncio.Future[Outcome] = loop.create_future()

    def settle(result: Outcome | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = function(*args)
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    _thread.start_new_thread(work, ())
    return future


def _create_preview(workspace: str, state_dir: str) -> Any:
    """Create a :class:`corral.preview.Preview` of *workspace* (imported on first use).

    Raises:
        PreviewError: the preview could not be created.
    """
    from .preview import Preview

    return Preview.create(workspace, state_dir=state_dir)
