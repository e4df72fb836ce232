"""``corral shell``: an interactive shell in the sandbox.

The shell runs on a private pseudo-terminal that corral relays to the real
one, never on the user's terminal itself: the sandbox's controlling terminal
is the pty, so ``TIOCSTI`` and friends can only inject input into the sandbox.
Job control works. The wall-clock timeout does not apply unless ``--timeout``
is given (a human is at the keyboard).
"""

from __future__ import annotations

import os
import sys

from ..._exceptions import CorralError, UsageError
from .. import EXIT_USAGE, print_error
from .._options import parse_run_options, run_options_help

__all__ = ["main"]

SUMMARY = (
    "Start an interactive shell ($SHELL, else /bin/bash) in the sandbox, or run COMMAND "
    "on a terminal."
)


def main(args: list[str]) -> int:
    """Entry point."""
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(run_options_help("shell", SUMMARY))
        return 0
    try:
        opts = parse_run_options(args, command_required=False)
        if opts.no_tty:
            raise UsageError(
                "--no-tty does not apply to corral shell: it always runs on a private pty",
                hint="corral run --no-tty ... runs a command without one",
            )
        if opts.shell is None and not opts.argv:
            opts.argv = [os.environ.get("SHELL") or "/bin/bash", "-i"]
        if "timeout" not in opts.flags.get("resources", {}):
            opts.flags.setdefault("resources", {})["timeout"] = None
        return _interactive(opts)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE


def _interactive(opts: object) -> int:
    import fcntl
    import select
    import signal
    import termios
    import threading
    import tty

    from ..._state import state_dir
    from ...pipeline._runner import audit_outcome, launch, prepare
    from ...policy import policy_digest
    from .run import build_request, resolve

    resolved = resolve(opts, os.environ)  # type: ignore[arg-type]
    request = build_request(opts, resolved.workspace, stdin_inherit=False).replace(tty=True)  # type: ignore[arg-type]
    prepared = prepare(
        request,
        resolved.policy.replace(resources=resolved.policy.resources.replace(output=None)),
        environ=os.environ,
    )
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
    outcome = outcome.replace(policy_digest=policy_digest(resolved.policy))
    from .run import report

    report(outcome, policy_timeout=prepared.plan.timeout)
    problem = audit_outcome(outcome, request, state_dir=state_dir())
    if problem is not None:
        print_error(problem)
    return outcome.returncode
