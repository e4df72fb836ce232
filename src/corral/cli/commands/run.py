"""``corral run``: run one command in the sandbox (the hot path).

One function, :func:`run`, carries out a ``corral run`` command line for a
:class:`Caller` - the process that asked: its working directory, its
environment and its stdin/stdout/stderr. In-process (:func:`main`) the caller
is this process; in the corral server it is the client, whose fds arrived over
the socket. Nothing here changes process-wide state: no ``os.chdir``, no
``os.environ`` writes, no ``sys.stdout``/``sys.stderr`` (every ``corral:``
line goes to the caller's stderr fd), relative paths are the caller's.

Imports are kept to what a run needs; see docs/design.md, "Start-up budget".
"""

from __future__ import annotations

import os

from ..._exceptions import CorralError
from ...pipeline._runner import SignalRelay
from .. import EXIT_USAGE
from .._options import RunOptions, parse_run_options, run_options_help

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ...pipeline._cgroups import Cgroup, Prestage
    from ...pipeline._launchers import LauncherPool
    from ...pipeline._outcome import Outcome
    from ...pipeline._request import ExecRequest
    from ...policy._model import Policy
    from ...policy._settings import ResolvedSettings
    from ...preview import Preview
    from ...server._kept import KeptSessions
    from ...server._warm import WarmSandboxes

__all__ = [
    "Caller",
    "build_request",
    "execute_options",
    "main",
    "report",
    "resolve",
    "run",
]

SUMMARY = "Run COMMAND in the sandbox. The exit status is the command's own (124: timed out, 125: corral refused)."

EXTRA = {"--keep": "flag", "--report-fd": "value"}
EXTRA_HELP = (
    (
        "--keep",
        "with --agent-session: run in the session's kept sandbox (through the corral server; "
        "a fresh one when it cannot)",
    ),
    (
        "--report-fd FD",
        "when the command exits 0, write the directory it reported ($CORRAL_REPORT_DIR/cwd, "
        "or a kept sandbox's report) to descriptor FD (3 or more) as one line, if it is a "
        "directory at or under the workspace",
    ),
)
_MAX_VIOLATION_LINES = 20


class Caller:
    """The process a ``corral run`` is for: working directory, environment, stdio fds.

    Example::

        caller = Caller.here()                                   # this process
        caller = Caller(cwd="/src/app", environ=env, stdio=(7, 8, 9))   # a server's client
        caller.error("something failed", "how to fix it")        # -> its stderr
    """

    __slots__ = ("afterwards", "cwd", "environ", "reports", "stderr", "stdin", "stdout")

    def __init__(
        self,
        *,
        cwd: str,
        environ: Mapping[str, str],
        stdio: tuple[int, int, int],
        reports: list[tuple[int, str]] | None = None,
        afterwards: list[Callable[[], None]] | None = None,
    ) -> None:
        self.cwd = cwd
        self.environ = environ
        self.stdin, self.stdout, self.stderr = stdio
        self.reports = reports
        #: work for after the caller has its answer (a server's client: the server runs it
        #: once the exit status is sent); None: run it at once
        self.afterwards = afterwards

    def later(self, work: Callable[[], None]) -> None:
        """Do *work* once the caller has its answer (at once without :attr:`afterwards`)."""
        if self.afterwards is None:
            work()
        else:
            self.afterwards.append(work)

    @classmethod
    def here(cls) -> Caller:
        """This process: ``os.getcwd()``, ``os.environ``, fds 0, 1, 2."""
        return cls(cwd=os.getcwd(), environ=os.environ, stdio=(0, 1, 2))

    @property
    def streams(self) -> tuple[int, int, int]:
        """``(stdin, stdout, stderr)``."""
        return self.stdin, self.stdout, self.stderr

    def path(self, path: str) -> str:
        """*path* relative to the caller's working directory."""
        return os.path.join(self.cwd, path)

    def write_out(self, text: str) -> None:
        """Write *text* to the caller's stdout."""
        _write_fd(self.stdout, text)

    def error(self, message: str, hint: str | None = None) -> None:
        """``corral: message`` (and ``corral: hint: ...``) on the caller's stderr."""
        _write_fd(self.stderr, f"corral: {message}\n" + (f"corral: hint: {hint}\n" if hint else ""))

    def hand_report(self, fd: int, line: str) -> None:
        """Write *line* to the caller's descriptor *fd* (``--report-fd``), best effort.

        With :attr:`reports` (a server's client) it is kept there instead: the
        server sends it with the exit status and the client writes it.
        """
        if self.reports is not None:
            self.reports.append((fd, line))
            return
        try:
            os.write(fd, os.fsencode(line))
        except OSError:
            pass  # nothing reported: the caller's directory stays


def main(args: list[str], *, pending: tuple[int, ...] = ()) -> int:
    """``corral run [OPTIONS] -- COMMAND...`` in this process.

    SIGHUP, SIGINT, SIGQUIT, SIGTERM and SIGWINCH sent to corral are forwarded to the command;
    SIGTSTP (Ctrl-Z) stops the whole sandbox and then corral itself, SIGCONT continues it
    (:data:`corral.cli._client.FORWARDED_SIGNALS`). *pending* are signals that arrived
    before (the client tried the server first).
    """
    import _signal  # type: ignore[import-not-found]  # not signal: its enum wrappers import enum

    from .._client import FORWARDED_SIGNALS, SIGTSTP, stop_like_a_job

    relay = SignalRelay(pending)

    def forward(signum: int, _frame: object) -> None:
        relay.deliver(signum)
        if signum == SIGTSTP:
            stop_like_a_job(forward)

    previous = {sig: _signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        return run(args, Caller.here(), relay)
    finally:
        for sig, handler in previous.items():
            _signal.signal(sig, handler)


def run(
    args: list[str],
    caller: Caller,
    relay: SignalRelay,
    *,
    launchers: LauncherPool | None = None,
    prestage: bool = True,
    kept: KeptSessions | None = None,
    warm: WarmSandboxes | None = None,
) -> int:
    """Carry out ``corral run ARGS`` for *caller*; return the exit status.

    Args:
        args: the words after ``run``.
        caller: whose cwd, environment and stdio the run uses.
        relay: signals for the command (the caller forwards them into it).
        launchers: the corral server's pool of ready cgroups (v1): a run with
            limits takes one instead of moving its sandbox into a new group.
        prestage: as root, create the run's group and start the slow first
            cgroup move at once (:class:`corral.pipeline._cgroups.Prestage`); the
            server turns this off (its no-op move of a whole multi-threaded
            process would stall the other runs' forks).
        kept: the corral server's kept sandboxes: ``--keep --agent-session ID``
            runs there when it can (:mod:`corral.server._kept`), else fresh.
        warm: the corral server's warm sandboxes (:mod:`corral.server._warm`): a
            fresh run takes the one started ahead for its policy and workspace
            when there is one, and one is started behind it.

    Everything the user sees - the command's output, ``corral:`` lines, help
    text - goes to the caller's fds. Exit statuses as documented in
    :mod:`corral.cli`.
    """
    if args[:1] in (["-h"], ["--help"]):
        caller.write_out(run_options_help("run", SUMMARY, EXTRA_HELP))
        return 0
    try:
        opts = parse_run_options(args, extra=EXTRA)
        keep, report_fd = _keep_options(opts)
        if report_fd is not None and caller.reports is None:
            _not_inherited(report_fd)  # only this process writes it: no sandbox, no server
        resolved = resolve(opts, caller.environ, caller=caller)
        if keep and kept is not None:
            status = _run_kept(opts, resolved, caller, relay, kept, report_fd)
            if status is not None:
                return status
        if report_fd is not None:
            return _run_reporting(opts, caller, relay, report_fd, launchers, prestage)
        if warm is not None and not _writes_through_preview(resolved.policy):
            return _run_warm(opts, resolved, caller, relay, warm, launchers)
        return _run_fresh(opts, resolved, caller, relay, launchers, prestage)
    except CorralError as exc:
        caller.error(exc.message, exc.hint)
        return EXIT_USAGE


def _run_fresh(
    opts: RunOptions,
    resolved: ResolvedSettings,
    caller: Caller,
    relay: SignalRelay,
    launchers: LauncherPool | None,
    prestage: bool,
) -> int:
    if _writes_through_preview(resolved.policy) and not resolved.policy.filesystem.read_only:
        return _run_in_new_preview(opts, resolved, caller, relay)
    return execute_options(
        opts,
        resolved=resolved,
        caller=caller,
        relay=relay,
        launchers=launchers,
        prestage=prestage,
    )


def _run_warm(
    opts: RunOptions,
    resolved: ResolvedSettings,
    caller: Caller,
    relay: SignalRelay,
    warm: WarmSandboxes,
    launchers: LauncherPool | None,
) -> int:
    """A fresh run in the warm sandbox started ahead for its key (else in a new one), and
    the next warm sandbox of that key started once the caller has its answer."""
    from ...pipeline._request import new_sandbox_id
    from ...policy import policy_digest

    policy = resolved.policy
    digest = policy_digest(policy)
    key = (digest, resolved.workspace, _environ_digest(caller.environ, policy))
    sandbox_id = new_sandbox_id()
    request = build_request(opts, resolved.workspace, cwd=caller.cwd).replace(sandbox_id=sandbox_id)
    outcome = warm.run(key, request, policy, relay=relay, streams=caller.streams)
    environ = caller.environ  # refill() copies what it keeps
    if outcome is None:
        status = execute_options(
            opts, resolved=resolved, caller=caller, relay=relay, launchers=launchers, prestage=False
        )
        caller.later(
            lambda: warm.refill(key, request, policy, environ=environ, launchers=launchers)
        )
        return status
    caller.later(lambda: warm.refill(key, request, policy, environ=environ, launchers=launchers))
    outcome = _conclude(
        opts, caller, outcome, request, digest, policy.resources.timeout, {"warm": True}
    )
    return outcome.returncode


#: what a shell changes from one command to the next (``cd``, each command line): never read
#: by corral; in a sandbox key only when the policy passes them into the sandbox
_VOLATILE = frozenset({"PWD", "OLDPWD", "_", "SHLVL"})


def _environ_digest(environ: Mapping[str, str], policy: Policy) -> str:
    """A digest of the caller's environment, for the key of a sandbox started ahead (warm)
    or kept: such a sandbox's plan was made from the environment of the call that started
    it (the variables it passes, and whatever else the host facts read), so a call with
    another environment never gets it. Only a shell's own bookkeeping (:data:`_VOLATILE`)
    is left out, unless the policy passes it in."""
    import hashlib

    from ...backends.bubblewrap import _name_passes

    passes = _name_passes(policy.env.pass_through, policy.env.deny)
    entries = [
        f"{name}={value}\0"
        for name, value in sorted(environ.items())
        if name not in _VOLATILE or passes(name)
    ]
    return hashlib.sha256(os.fsencode("".join(entries))).hexdigest()


def _run_reporting(
    opts: RunOptions,
    caller: Caller,
    relay: SignalRelay,
    report_fd: int,
    launchers: LauncherPool | None,
    prestage: bool,
) -> int:
    """A fresh run with ``--report-fd``: corral makes the report directory, the command may
    write ``$CORRAL_REPORT_DIR/cwd`` there (``--allow-write``), corral takes the report,
    removes the directory and hands the checked directory to the caller."""
    from ...server._cwd_report import REPORT_VARIABLE, make_report_dir, take_report

    try:
        directory = make_report_dir(caller.environ)
    except OSError as exc:
        caller.error(f"warning: no directory for the command's cwd report: {exc}")
        directory = None
    if directory is not None:
        opts.flags.setdefault("filesystem", {}).setdefault("allowWrite", []).append(directory)
        opts.flags.setdefault("env", {}).setdefault("set", {})[REPORT_VARIABLE] = directory
    try:
        quiet = Caller(cwd=caller.cwd, environ=caller.environ, stdio=(-1, -1, -1))
        # warned once already; the flags name this run's report directory: never cached
        resolved = resolve(opts, caller.environ, caller=quiet, cache=False)
        status = _run_fresh(opts, resolved, caller, relay, launchers, prestage)
    finally:
        report = take_report(directory) if directory is not None else None
    if status == 0:
        _hand_report(caller, report_fd, report, resolved.workspace)
    return status


def _not_inherited(fd: int) -> None:
    try:
        os.set_inheritable(fd, False)
    except OSError:
        pass  # not open: nothing is reported


def _keep_options(opts: RunOptions) -> tuple[bool, int | None]:
    """``--keep`` and ``--report-fd`` (3 or more); a kept run's shell-state variable is "" unless kept.

    Raises:
        UsageError: ``--keep`` without ``--agent-session``, or a ``--report-fd`` that is not
            a descriptor number of 3 or more.
    """
    from ..._exceptions import UsageError

    keep = bool(opts.extra.get("--keep"))
    given = opts.extra.get("--report-fd")
    if keep and not opts.agent_session:
        raise UsageError("--keep needs --agent-session ID (the session whose sandbox is kept)")
    report_fd = None
    if given is not None:
        if not (given.isascii() and given.isdigit() and 3 <= int(given) < 1 << 20):
            raise UsageError(
                f"--report-fd {given!r}: expected a descriptor number of 3 or more "
                "(0, 1 and 2 are the command's)"
            )
        report_fd = int(given)
    if keep:
        from ...server._kept import STATE_VARIABLE  # (a run without --keep never needs it)

        # set in every run: only a kept sandbox's command gets a value (_run_kept)
        opts.flags.setdefault("env", {}).setdefault("set", {})[STATE_VARIABLE] = ""
    return keep, report_fd


def _run_kept(
    opts: RunOptions,
    resolved: ResolvedSettings,
    caller: Caller,
    relay: SignalRelay,
    kept: KeptSessions,
    report_fd: int | None,
) -> int | None:
    """Run in the agent session's kept sandbox; ``None``: run it in a fresh one instead.

    Not kept (``None``): a policy that writes through a preview, and whatever
    :meth:`KeptSessions.run` declines (another backend, the egress proxy,
    credentials, a terminal, the kept sandbox busy or gone).
    """
    from ...pipeline._request import new_sandbox_id
    from ...policy import policy_digest

    policy = resolved.policy
    if _writes_through_preview(policy):
        return None
    digest = policy_digest(policy)
    # the session, and the environment its sandbox was planned from (_environ_digest)
    session = f"{opts.agent_session or ''}\0{_environ_digest(caller.environ, policy)}"
    key = (session, digest, resolved.workspace)
    request = build_request(opts, resolved.workspace, cwd=caller.cwd).replace(
        sandbox_id=new_sandbox_id()
    )
    done = kept.run(
        key, request, policy, environ=caller.environ, relay=relay, streams=caller.streams
    )
    if done is None:
        return None
    outcome, cwd_report = done
    # a shell started ahead has the id chosen for its call (corral.pipeline._resident_next)
    ran = request.replace(sandbox_id=outcome.sandbox_id)
    outcome = _conclude(opts, caller, outcome, ran, digest, policy.resources.timeout)
    if report_fd is not None and outcome.returncode == 0:
        _hand_report(caller, report_fd, cwd_report, resolved.workspace)

    # the shell of the session's next call, started once this call's client has its answer
    def start_next() -> None:
        kept.start_next(key, request)

    caller.later(start_next)
    return outcome.returncode


def _hand_report(caller: Caller, fd: int, report: bytes | None, workspace: str) -> None:
    """The (untrusted) *report*, if it names a directory at or under *workspace*, to *fd*."""
    from ...server._cwd_report import checked_directory

    directory = checked_directory(report, workspace)
    if directory is not None:
        caller.hand_report(fd, directory + "\n")


def _writes_through_preview(policy: Policy) -> bool:
    """Whether the policy's backend writes the workspace only through a preview
    (``boxlite``, ``firecracker``, or ``microvm``: named, or the only one ``auto`` picks for
    ``isolation: "vm"``)."""
    name = policy.backend
    if name == "auto" and policy.isolation == "vm":
        name = "microvm"
    if name not in ("microvm", "boxlite", "firecracker"):  # no backend import on the hot path
        return False
    from ...backends import get_backend

    return get_backend(name).writes_through_preview


def _run_in_new_preview(
    opts: RunOptions, resolved: ResolvedSettings, caller: Caller, relay: SignalRelay
) -> int:
    """A writable run on a VM backend: in a new preview, kept when it has changes.

    A VM writes the workspace only through a preview (docs/backends/microvm.md):
    the changes come back for review (``corral diff``/``apply``/``discard``),
    as with ``corral preview``; a preview with nothing in it is removed.
    """
    from ..._state import state_dir
    from ...backends import get_backend
    from ...preview import Preview

    name = resolved.policy.backend if resolved.policy.backend != "auto" else "microvm"
    preview = Preview.create(
        resolved.workspace,
        state_dir=state_dir(caller.environ),
        mechanism=get_backend(name).preview_mechanism(),
    )
    try:
        status = execute_options(
            opts, resolved=resolved, caller=caller, relay=relay, preview=preview
        )
        changes = preview.changes()
    except BaseException:
        try:
            if not preview.changes():
                preview.discard()
        except (CorralError, OSError):
            pass  # kept: 'corral previews' lists it
        raise
    if not changes:
        preview.discard()
        return status
    caller.error(
        f"the micro-VM's changes are in preview {preview.id} ({changes.summary()}); review: "
        f"'corral diff {preview.id}', land: 'corral apply {preview.id}', "
        f"drop: 'corral discard {preview.id}'"
    )
    return status


def resolve(
    opts: RunOptions,
    environ: Mapping[str, str],
    *,
    caller: Caller | None = None,
    cache: bool = True,
) -> ResolvedSettings:
    """Load the settings layers with the command line's flags; print warnings.

    Relative paths (``--settings``, ``--workspace``, the workspace search)
    start from the caller's directory; warnings go to its stderr. In the
    corral server (with *cache*), the result comes from its settings cache
    when nothing it read has changed (:func:`_cached_settings`).
    """
    from ..._exceptions import SettingsError, UsageError
    from ...policy import load_settings
    from .._options import option_for_key

    caller = caller or Caller.here()
    command = opts.shell if opts.shell is not None else (opts.argv or None)

    def load(env: Mapping[str, str], command: str | list[str] | None) -> ResolvedSettings:
        return load_settings(
            cwd=caller.cwd,
            environ=env,
            flags=opts.flags,
            settings_files=tuple(opts.settings_files),
            profile=opts.profile,
            command=command,
        )

    try:
        resolved = _cached_settings(opts, caller.cwd, environ, load) if cache else None
        if resolved is None:
            resolved = load(environ, command)
    except SettingsError as exc:
        option = option_for_key(exc.key or "") if exc.source == "flags" else None
        if option is None:
            raise
        raise UsageError(f"{option}: {exc.reason}", hint=exc.hint) from exc
    for warning in resolved.warnings:
        caller.error(warning)
    return resolved


def _cached_settings(
    opts: RunOptions,
    cwd: str,
    environ: Mapping[str, str],
    load: Callable[[Mapping[str, str], str | list[str] | None], ResolvedSettings],
) -> ResolvedSettings | None:
    """The settings through the corral server's settings cache, or None: load them directly.

    The cache (:mod:`corral.policy._watched`) keys a result by *cwd* and a
    kind that must name every other input: here the flags, the ``--settings``
    files and the profile, as canonical JSON. The command line is the one
    input left out - it only selects ``rules`` - so the result is computed
    without it and used only when the settings define no rule at all (then
    the command changes nothing); with rules, None. None too outside the
    server (no cache installed).
    """
    from ..._jsonfast import dumps
    from ...policy._watched import cached, installed

    if installed() is None:
        return None
    try:
        kind = "run " + dumps([opts.flags, list(opts.settings_files), opts.profile], sort_keys=True)
    except (TypeError, ValueError):
        return None
    resolved = cached(kind, cwd, environ, lambda env: load(env, None))
    return None if resolved.values.get("rules") else resolved


def build_request(
    opts: RunOptions,
    workspace: str,
    *,
    capture: bool = False,
    stdin_inherit: bool = True,
    cwd: str | None = None,
) -> ExecRequest:
    """The ExecRequest for the parsed command line (cwd: *cwd* if visible, else the workspace).

    *cwd* defaults to this process's working directory.
    """
    from ...pipeline._request import ExecRequest

    cwd = os.getcwd() if cwd is None else cwd
    hidden = ("/tmp", "/var/tmp")
    ws = workspace.rstrip("/")
    inside = cwd == ws or cwd.startswith(ws + "/")
    if not inside and any(cwd == h or cwd.startswith(h + "/") for h in hidden):
        cwd = workspace
    if opts.shell is not None:
        request = ExecRequest.from_shell(
            opts.shell,
            cwd=cwd,
            capture=capture,
            agent_session=opts.agent_session,
            shell=opts.shell_program or "/bin/sh",
        )
    else:
        request = ExecRequest.from_argv(
            opts.argv, cwd=cwd, capture=capture, agent_session=opts.agent_session
        )
    if stdin_inherit:
        request = request.replace(stdin_mode="inherit")
    if not opts.no_tty:
        request = request.replace(output_tty=True)  # used only where output goes to a terminal
    return request


def execute_options(
    opts: RunOptions,
    *,
    resolved: ResolvedSettings | None = None,
    preview: Preview | None = None,
    caller: Caller | None = None,
    relay: SignalRelay | None = None,
    launchers: LauncherPool | None = None,
    prestage: bool = True,
) -> int:
    """Resolve settings (unless *resolved*), run, report, audit; return the exit status.

    With *preview* the command runs against that preview (``corral preview``).
    *caller* defaults to this process, *relay* to one nobody feeds. With
    *launchers* (the server) a run with limits takes a ready cgroup from the
    pool (when it has one); with *prestage*, as root, the run's group is
    prepared at once (see :class:`corral.pipeline._cgroups.Prestage`).
    """
    from ...pipeline._request import new_sandbox_id

    caller = caller or Caller.here()
    relay = relay or SignalRelay()
    sandbox_id = new_sandbox_id()
    stage: Prestage | None = None
    if prestage and os.geteuid() == 0:
        from ...pipeline._cgroups import Prestage

        # The first cgroup move is slow (an RCU grace period); start it right away
        # so that it overlaps with loading settings and starting bubblewrap.
        stage = Prestage(f"corral-{os.getpid()}-{sandbox_id}")
    try:
        return _execute(opts, sandbox_id, caller, relay, stage, launchers, resolved, preview)
    finally:
        if stage is not None:
            stage.discard()  # a no-op when the run took the group
            stage.finish()


def _execute(
    opts: RunOptions,
    sandbox_id: str,
    caller: Caller,
    relay: SignalRelay,
    stage: Prestage | None,
    launchers: LauncherPool | None,
    resolved: ResolvedSettings | None,
    preview: Preview | None,
) -> int:
    from ...pipeline._runner import launch, prepare
    from ...policy import policy_digest

    environ = caller.environ
    if resolved is None:
        resolved = resolve(opts, environ, caller=caller)
    policy = resolved.policy
    request = build_request(opts, resolved.workspace, cwd=caller.cwd).replace(sandbox_id=sandbox_id)
    prepared = prepare(request, policy, environ=environ, preview=preview)
    cgroup: Cgroup | None = None
    if prepared.plan.cgroup is not None:
        if launchers is not None:
            cgroup = launchers.take()
        if cgroup is None and stage is not None:
            cgroup = stage.take()
    try:
        outcome = launch(
            prepared, request, on_start=relay.started, cgroup=cgroup, streams=caller.streams
        )
    finally:
        if cgroup is not None:
            cgroup.remove()  # a no-op when the engine removed it; else frees it (and a launcher)
    extra: dict[str, object] | None = {"preview": preview.id} if preview is not None else None
    outcome = _conclude(
        opts, caller, outcome, request, policy_digest(policy), prepared.plan.timeout, extra
    )
    return outcome.returncode


def _conclude(
    opts: RunOptions,
    caller: Caller,
    outcome: Outcome,
    request: ExecRequest,
    digest: str,
    timeout: float | None,
    extra: dict[str, object] | None = None,
) -> Outcome:
    """What every run does once its command ended, however it ran (fresh, kept, warm):
    the policy digest on the outcome, corral's lines to the caller, the audit record
    (*extra* in it), ``--json``. Returns the outcome with its digest."""
    from ..._state import state_dir
    from ...pipeline._runner import audit_outcome

    outcome = outcome.replace(policy_digest=digest)
    report(outcome, policy_timeout=timeout, caller=caller)
    problem = audit_outcome(outcome, request, state_dir=state_dir(caller.environ), extra=extra)
    if problem is not None:
        caller.error(problem)
    if opts.json_out:
        _write_json(caller, opts.json_out, outcome)
    return outcome


def report(outcome: Outcome, *, policy_timeout: float | None, caller: Caller | None = None) -> None:
    """Print what corral has to say about the run to the caller's stderr (one line each)."""
    lines: list[str] = []
    seen: set[str] = set()
    described = []
    for violation in outcome.violations:
        text = violation.describe()
        if text not in seen:
            seen.add(text)
            described.append(text)
    lines += described[:_MAX_VIOLATION_LINES]
    if len(described) > _MAX_VIOLATION_LINES:
        lines.append(
            f"... and {len(described) - _MAX_VIOLATION_LINES} more blocked operations "
            "(see 'corral audit')"
        )
    if outcome.exec_error:
        program = outcome.exec_error.partition(": ")[0]
        lines.append(
            f"{program}: command not found" if outcome.exit_code == 127 else outcome.exec_error
        )
    if outcome.timed_out:
        lines.append(
            f"timed out after {_seconds(policy_timeout)}; the command and everything it started "
            "were stopped"
        )
    if outcome.oom_killed:
        lines.append("the memory limit (resources.memory) killed the command")
    if outcome.output_dropped:
        lines.append(
            f"output limit (resources.output) reached; dropped {outcome.output_dropped} bytes"
        )
    for rule in outcome.degraded:
        lines.append(f"warning: {rule} was not enforced (allowed by allowDegraded)")
    if outcome.unsandboxed:
        lines.append("warning: ran without a sandbox (backend 'none')")
    if lines:
        _write_fd(
            (caller.stderr if caller is not None else 2),
            "".join(f"corral: {line}\n" for line in lines),
        )


def _seconds(value: float | None) -> str:
    if value is None:
        return "the timeout"
    return f"{value:g}s"


_CALLER_STREAMS = {"-": "stdout", "/dev/stdout": "stdout", "/dev/stderr": "stderr"}


def _write_json(caller: Caller, path: str, outcome: Outcome) -> None:
    """Write the Outcome to *path*; ``-``/``/dev/stdout``/``/dev/stderr`` are the caller's.

    Those names mean the caller's own streams, also in the corral server,
    whose ``/dev/stdout`` is not the client's.
    """
    from ..._jsonfast import dumps

    text = dumps(outcome.to_json()) + "\n"
    stream = _CALLER_STREAMS.get(path)
    if stream is not None:
        _write_fd(caller.stdout if stream == "stdout" else caller.stderr, text)
        return
    try:
        with open(caller.path(path), "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        caller.error(f"could not write --json-out {path}: {exc.strerror}")


def _write_fd(fd: int, text: str) -> None:
    """Write all of *text* (UTF-8; undecodable path bytes as escapes) to *fd*."""
    import sys

    stream = sys.stderr if fd == 2 else sys.stdout if fd == 1 else None
    if stream is not None:
        try:
            stream.flush()  # keep the order with anything written through sys.stderr/stdout
        except (OSError, ValueError):
            pass
    data = memoryview(text.encode("utf-8", "backslashreplace"))
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except BlockingIOError:
            import select

            select.select([], [fd], [], 1.0)
            continue
        except OSError:
            return  # the reader went away: nothing more to say
        data = data[n:]
