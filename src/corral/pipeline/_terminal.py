"""Where a run's first process starts: output ptys, a terminal's mode, its session, its directory."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def output_pty(terminal: int) -> tuple[int, int]:
    """A pseudo-terminal for output bound for *terminal*: ``(master, slave)``, both close-on-exec.

    The slave gets *terminal*'s window size, and no output processing (no
    ``\n`` -> ``\r\n``): the bytes read from the master - relayed, capped and
    digested like a pipe's - are the bytes the command wrote; the user's own
    terminal does the translation. Nothing is typed into it: the command's
    stdin stays what it was, so the slave is nobody's controlling terminal.
    """
    import termios

    master, slave = os.openpty()  # non-inheritable: posix_spawn's dup2 places the slave
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        copy_window_size(terminal, slave)
    except BaseException:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


def copy_window_size(terminal: int, pty: int) -> None:
    """Give *pty* the window size of *terminal* (none known, or either closed: left as it is)."""
    import fcntl
    import termios

    try:
        size = fcntl.ioctl(terminal, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(pty, termios.TIOCSWINSZ, size)
    except OSError:
        pass


def restore_terminal(fd: int, attrs: list[Any]) -> None:
    """Put *fd*'s terminal back in mode *attrs* if it changed (an engine CLI left it raw).

    SIGTTOU is blocked meanwhile: corral in a background job may still restore it.
    """
    import signal
    import termios

    try:
        if termios.tcgetattr(fd) == attrs:
            return
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    except (termios.error, OSError):
        pass  # no terminal any more (closed, hung up): nothing to restore


#: Backends whose first process is a container engine's CLI (their stdio is relayed by it).
ENGINE_CLI_BACKENDS = frozenset({"podman", "docker", "gvisor"})


def starts_a_session(argv: Sequence[str]) -> bool:
    """Whether the spawned program makes itself a session leader (the exec helper's ``--setsid``).

    Every other first process (bubblewrap, runsc, podman) gets a process group
    of its own: Ctrl-C at corral's terminal then signals corral's group only,
    and corral hands it to the command's group (:meth:`Running.send_signal`);
    bubblewrap left in the terminal's group would die of it and take the
    sandbox along, before the command's own handler could run. A process that
    leads a group can no longer ``setsid``, so the helper is left as it is.
    """
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--setsid" in options


#: ``env`` of coreutils (``--chdir`` since 8.28): how an engine CLI is started in another directory.
_ENV = "/usr/bin/env"


def in_directory(argv: Sequence[str], directory: str) -> tuple[str, ...]:
    """*argv* started in host *directory*: through ``env --chdir`` when it is not this one.

    ``posix_spawn`` cannot change directory (Python exposes no chdir action),
    and the engine CLIs' helpers write into their working directory (conmon
    leaves an ``oom`` file there after an OOM kill): they start in the plan's
    directory, not in the caller's (often the workspace). ``env`` execs the
    program in place (same pid, session and signal dispositions). Without
    ``env`` (not a coreutils system), for ``/`` (gVisor's runsc writes
    nothing there) or a directory that does not exist, *argv* is returned as
    is.
    """
    if directory in ("", "/") or not os.path.isdir(directory) or not os.access(_ENV, os.X_OK):
        return tuple(argv)
    try:
        if os.path.samefile(directory, "."):
            return tuple(argv)
    except OSError:
        pass  # the caller's directory is gone: not the plan's
    return (_ENV, f"--chdir={directory}", "--", *argv)
