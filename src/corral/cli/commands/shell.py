"""``corral shell``: an interactive shell in the sandbox.

The shell runs on a private pseudo-terminal that corral relays to the real
one, never on the user's terminal itself: the sandbox's controlling terminal
is the pty, so ``TIOCSTI`` and friends can only inject input into the sandbox.
Job control works. The wall-clock timeout does not apply unless ``--timeout``
is given (a human is at the keyboard).

``--keep NAME`` keeps the shell and its sandbox after the terminal detaches
(Ctrl-]); ``--keep NAME`` again re-attaches, ``--stop NAME`` ends it (see
:mod:`corral.cli._shell_keeper`).
"""

from __future__ import annotations

import os
import sys

from ..._exceptions import CorralError, UsageError
from .. import EXIT_USAGE, print_error
from .._options import RunOptions, parse_run_options, run_options_help

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...pipeline._outcome import Outcome
    from ...pipeline._request import ExecRequest
    from ...pipeline._runner import Prepared
    from ...policy import ResolvedSettings

__all__ = ["main"]

SUMMARY = (
    "Start an interactive shell ($SHELL, else /bin/bash) in the sandbox, or run COMMAND "
    "on a terminal."
)

EXTRA = {"--keep": "value", "--stop": "value", "--idle": "value"}
EXTRA_HELP = (
    (
        "--keep NAME",
        "keep the shell's sandbox as NAME: Ctrl-] (or a closed terminal) detaches and leaves its "
        "processes, /tmp and working directory; --keep NAME again re-attaches (refused when the "
        "policy or workspace changed)",
    ),
    ("--stop NAME", "stop the kept shell NAME and its whole sandbox"),
    (
        "--idle SECONDS",
        "with --keep: stop the kept shell once it has been detached this long (default 3600)",
    ),
)
_KEEPER = "--keeper"  # internal: the kept shell's keeper process (see _shell_keeper)


def main(args: list[str]) -> int:
    """Entry point."""
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(run_options_help("shell", SUMMARY, EXTRA_HELP))
        return 0
    if args[:1] == [_KEEPER] and len(args) > 1:
        return _keeper(args[1], args[2:])
    try:
        opts = _options(args)
        stop = opts.extra.get("--stop")
        if stop is not None:
            if len(args) > (1 if args[0].startswith("--stop=") else 2):
                raise UsageError("--stop NAME takes no other options or command")
            return _stop(stop)
        keep = opts.extra.get("--keep")
        if keep is not None:
            return _kept(opts, keep, args)
        if "--idle" in opts.extra:
            raise UsageError("--idle applies to a kept shell: add --keep NAME")
        return _interactive(opts)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE


def _options(args: list[str]) -> RunOptions:
    """The command line's options, with the shell's defaults (its program, no timeout)."""
    opts = parse_run_options(args, extra=EXTRA, command_required=False)
    if opts.no_tty:
        raise UsageError(
            "--no-tty does not apply to corral shell: it always runs on a private pty",
            hint="corral run --no-tty ... runs a command without one",
        )
    if opts.shell is None and not opts.argv:
        opts.argv = [os.environ.get("SHELL") or "/bin/bash", "-i"]
    if "timeout" not in opts.flags.get("resources", {}):
        opts.flags.setdefault("resources", {})["timeout"] = None
    return opts


def _idle(value: object) -> float:
    """``--idle``'s seconds (default :data:`~corral.cli._shell_keeper.DEFAULT_IDLE`)."""
    from .._shell_keeper import DEFAULT_IDLE

    if value is None:
        return DEFAULT_IDLE
    try:
        idle = float(str(value))
    except ValueError:
        idle = -1.0
    if not idle > 0 or idle == float("inf"):
        raise UsageError(f"--idle {value!r}: expected a positive number of seconds")
    return idle


def _prepare(opts: RunOptions) -> tuple[ResolvedSettings, ExecRequest, Prepared]:
    """The shell's settings, request (on a pty) and prepared plan; its output is never capped."""
    from ...pipeline._runner import prepare
    from .run import build_request, resolve

    resolved = resolve(opts, os.environ)
    request = build_request(opts, resolved.workspace, stdin_inherit=False).replace(tty=True)
    prepared = prepare(
        request,
        resolved.policy.replace(resources=resolved.policy.resources.replace(output=None)),
        environ=os.environ,
    )
    return resolved, request, prepared


def _finish(
    outcome: Outcome,
    resolved: ResolvedSettings,
    request: ExecRequest,
    prepared: Prepared,
    extra: dict[str, object] | None = None,
) -> int:
    """Report the shell's end to stderr and append its audit record; its exit status."""
    from ..._state import state_dir
    from ...pipeline._runner import audit_outcome
    from ...policy import policy_digest
    from .run import report

    outcome = outcome.replace(policy_digest=policy_digest(resolved.policy))
    report(outcome, policy_timeout=prepared.plan.timeout)
    problem = audit_outcome(outcome, request, state_dir=state_dir(), extra=extra)
    if problem is not None:
        print_error(problem)
    return outcome.returncode


def _stop(name: str) -> int:
    from ..._state import state_dir
    from .._shell_keeper import check_name, stop

    if stop(state_dir(), check_name(name)):
        sys.stdout.write(f"stopped the kept shell {name}\n")
    else:
        sys.stdout.write(f"no kept shell {name}\n")
    return 0


def _kept(opts: RunOptions, name: str, args: list[str]) -> int:
    """Attach to kept shell *name*, starting its keeper (``corral shell --keeper``) if none runs."""
    import subprocess

    from ..._state import state_dir
    from ...policy import policy_digest
    from .._shell_keeper import attach, check_name
    from .run import resolve

    check_name(name)
    _idle(opts.extra.get("--idle"))
    resolved = resolve(opts, os.environ)

    def start(ready_fd: int, lock_fd: int) -> int:
        argv = [sys.executable, "-P", "-m", "corral", "shell", _KEEPER, f"{ready_fd},{lock_fd}"]
        return subprocess.Popen(
            [*argv, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(ready_fd, lock_fd),
            start_new_session=True,
        ).pid

    return attach(
        state_dir(),
        name,
        digest=policy_digest(resolved.policy),
        workspace=resolved.workspace,
        start=start,
    )


def _keeper(fds: str, args: list[str]) -> int:
    """The keeper of a kept shell: prepare, listen, say ``ok`` on the ready fd, run the shell.

    Errors before the shell starts go to the ready fd (the starting client
    prints them); corral's lines about the run go to the pty (the attached
    terminal).
    """
    from ..._state import state_dir
    from ...pipeline._runner import SignalRelay, launch
    from ...policy import policy_digest
    from .._shell_keeper import Keeper, check_name

    ready_fd, _, lock_fd = fds.partition(",")
    ready, lock = int(ready_fd), int(lock_fd)  # the lock stays held until this process exits
    os.set_inheritable(ready, False)
    os.set_inheritable(lock, False)
    try:
        opts = _options(args)
        name = check_name(str(opts.extra.get("--keep")))
        idle = _idle(opts.extra.get("--idle"))
        resolved, request, prepared = _prepare(opts)
        keeper = Keeper(
            state_dir(),
            name,
            digest=policy_digest(resolved.policy),
            workspace=resolved.workspace,
            idle=idle,
        )
        keeper.listen()
    except CorralError as exc:
        os.write(ready, f"{exc.message}\n{exc.hint or ''}".encode(errors="replace"))
        return EXIT_USAGE
    os.dup2(keeper.slave, 2)  # corral's messages about the run reach the attached terminal
    relay = SignalRelay()
    keeper.serve_in_background(relay)
    try:
        os.write(ready, b"ok")
    except OSError:
        pass  # the starting client is gone: the shell starts detached (--idle ends it)
    os.close(ready)
    slave = keeper.slave
    try:
        outcome = launch(prepared, request, on_start=relay.started, stdio=(slave, slave, slave))
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        status = EXIT_USAGE
    else:
        status = _finish(outcome, resolved, request, prepared, {"kept_shell": name})
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    keeper.finish(status)
    return status


def _interactive(opts: RunOptions) -> int:
    import fcntl
    import select
    import signal
    import termios
    import threading
    import tty

    from ...pipeline._runner import launch

    resolved, request, prepared = _prepare(opts)
    master, slave = os.openpty()
    on_terminal = os.isatty(0)

    def sync_size(*_args: object) -> None:
        if on_terminal:
            size = fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(master, termios.TIOCSWINSZ, size)

    sync_size()
    saved = termios.tcgetattr(0) if on_terminal else None
    stop_r, stop_w = os.pipe()

    def relay() -> None:
        fds = [master, stop_r] + ([0] if not os.isatty(0) or on_terminal else [])
        while True:
            readable, _, _ = select.select(fds, [], [])
            if stop_r in readable:
                return
            if master in readable:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    return
                if not data:
                    return
                os.write(1, data)
            if 0 in readable:
                data = os.read(0, 65536)
                if not data:
                    fds.remove(0)
                    continue
                os.write(master, data)

    previous = signal.signal(signal.SIGWINCH, sync_size)
    if on_terminal:
        tty.setraw(0)
    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    try:
        outcome = launch(prepared, request, stdio=(slave, slave, slave))
    finally:
        os.write(stop_w, b"x")
        thread.join(1.0)
        if saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
        for fd in (master, slave, stop_r, stop_w):
            os.close(fd)
    return _finish(outcome, resolved, request, prepared)
