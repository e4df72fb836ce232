"""The terminal signals ``corral run`` passes on to its command, and Ctrl-Z.

A terminal signals its foreground job: SIGINT (Ctrl-C), SIGQUIT, SIGHUP,
SIGWINCH, and SIGTSTP (Ctrl-Z). The sandboxed command runs in a session of
its own, so corral (the foreground job) passes each one on. For Ctrl-Z it
stops the whole sandbox (every process in it gets SIGSTOP, see
``Running.send_signal``) and then stops itself with SIGTSTP as the default
action would, so the shell's job control sees a stopped job; ``fg`` or
``bg`` send SIGCONT, which corral passes on to continue the sandbox.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["FORWARDED_SIGNALS", "SIGCONT", "SIGTSTP", "stop_like_a_job"]

SIGCONT = 18
SIGTSTP = 20
#: SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGCONT, SIGTSTP, SIGWINCH
FORWARDED_SIGNALS = (1, 2, 3, 15, SIGCONT, SIGTSTP, 28)


def stop_like_a_job(handler: Callable[[int, object], None]) -> None:
    """Stop this process as SIGTSTP's default action would; return once it is continued.

    *handler* is put back afterwards. The signal is sent to the calling
    thread, so it is delivered before this returns (a process-directed one
    could reach the re-installed handler first and never stop the process).
    """
    import _signal  # type: ignore[import-not-found]  # not signal: it imports enum
    import _thread

    _signal.signal(SIGTSTP, _signal.SIG_DFL)
    try:
        _signal.pthread_kill(_thread.get_ident(), SIGTSTP)
    finally:
        _signal.signal(SIGTSTP, handler)
