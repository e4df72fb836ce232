"""``corral run``: run one command in the sandbox (the hot path).

Imports are kept to what a run needs; see docs/design.md, "Start-up budget".
"""

from __future__ import annotations

import os
import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error
from .._options import RunOptions, parse_run_options, run_options_help

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..._cgroups import Prestage
    from ..._engine import Running
    from ..._outcome import Outcome
    from ..._request import ExecRequest
    from ...policy._settings import ResolvedSettings
    from ...preview import Preview

__all__ = ["execute_options", "main", "report", "resolve"]

SUMMARY = "Run COMMAND in the sandbox. The exit status is the command's own (124: timed out, 125: corral refused)."
_MAX_VIOLATION_LINES = 20
_FORWARDED_SIGNALS = (1, 2, 15)  # SIGHUP, SIGINT, SIGTERM


def main(args: list[str]) -> int:
    """``corral run [OPTIONS] -- COMMAND...``"""
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(run_options_help("run", SUMMARY))
        return 0
    try:
        opts = parse_run_options(args)
        return execute_options(opts)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE


def resolve(opts: RunOptions, environ: Mapping[str, str]) -> ResolvedSettings:
    """Load the settings layers with the command line's flags; print warnings."""
    from ..._exceptions import SettingsError, UsageError
    from ...policy import load_settings
    from .._options import option_for_key

    command = opts.shell if opts.shell is not None else (opts.argv or None)
    try:
        resolved = load_settings(
            environ=environ,
            flags=opts.flags,
            settings_files=tuple(opts.settings_files),
            profile=opts.profile,
            command=command,
        )
    except SettingsError as exc:
        option = option_for_key(exc.key or "") if exc.source == "flags" else None
        if option is None:
            raise
        raise UsageError(f"{option}: {exc.reason}", hint=exc.hint) from exc
    for warning in resolved.warnings:
        print_error(warning)
    return resolved


def build_request(
    opts: RunOptions, workspace: str, *, capture: bool = False, stdin_inherit: bool = True
) -> ExecRequest:
    """The ExecRequest for the parsed command line (cwd: here if visible, else the workspace)."""
    from ..._request import ExecRequest

    cwd = os.getcwd()
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
    return request


def execute_options(
    opts: RunOptions, *, resolved: ResolvedSettings | None = None, preview: Preview | None = None
) -> int:
    """Resolve settings (unless *resolved*), run, report, audit; return the exit status.

    With *preview* the command runs against that preview (``corral preview``).
    """
    from ..._cgroups import Prestage
    from ..._request import new_sandbox_id

    sandbox_id = new_sandbox_id()
    # The first cgroup move is slow (an RCU grace period); start it right away
    # so that it overlaps with loading settings and starting bubblewrap.
    stage = Prestage(f"corral-{os.getpid()}-{sandbox_id}") if os.geteuid() == 0 else None
    try:
        return _execute(opts, sandbox_id, stage, resolved, preview)
    finally:
        if stage is not None:
            stage.discard()  # a no-op when the run took the group
            stage.finish()


def _execute(
    opts: RunOptions,
    sandbox_id: str,
    stage: Prestage | None,
    resolved: ResolvedSettings | None = None,
    preview: Preview | None = None,
) -> int:
    from ..._runner import audit_outcome, launch, prepare
    from ..._state import state_dir
    from ...policy import policy_digest

    environ = os.environ
    if resolved is None:
        resolved = resolve(opts, environ)
    policy = resolved.policy
    request = build_request(opts, resolved.workspace).replace(sandbox_id=sandbox_id)
    prepared = prepare(request, policy, environ=environ, preview=preview)
    cgroup = stage.take() if stage is not None and prepared.plan.cgroup is not None else None

    running: list[Running] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if running:
            running[0].send_signal(signum)
        else:
            pending.append(signum)

    def started(handle: Running) -> None:
        running.append(handle)
        for signum in pending:
            handle.send_signal(signum)

    import _signal  # type: ignore[import-not-found]  # not signal: its enum wrappers import enum

    previous = {sig: _signal.signal(sig, forward) for sig in _FORWARDED_SIGNALS}
    try:
        outcome = launch(prepared, request, on_start=started, cgroup=cgroup)
    finally:
        for sig, handler in previous.items():
            _signal.signal(sig, handler)
    outcome = outcome.replace(policy_digest=policy_digest(policy))
    report(outcome, policy_timeout=prepared.plan.timeout)
    extra: dict[str, object] | None = {"preview": preview.id} if preview is not None else None
    problem = audit_outcome(outcome, request, state_dir=state_dir(environ), extra=extra)
    if problem is not None:
        print_error(problem)
    if opts.json_out:
        _write_json(opts.json_out, outcome)
    return outcome.returncode


def report(outcome: Outcome, *, policy_timeout: float | None) -> None:
    """Print what corral has to say about the run to stderr (one line each)."""
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
        sys.stderr.write("".join(f"corral: {line}\n" for line in lines))
        sys.stderr.flush()


def _seconds(value: float | None) -> str:
    if value is None:
        return "the timeout"
    return f"{value:g}s"


def _write_json(path: str, outcome: Outcome) -> None:
    from ..._jsonfast import dumps

    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(dumps(outcome.to_json()) + "\n")
    except OSError as exc:
        print_error(f"could not write --json-out {path}: {exc.strerror}")
