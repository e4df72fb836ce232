"""The broker's ``TIOCGPTPEER``: the other end of a pty the command created.

The landlock backend grants no part of ``/dev/pts``: every entry there is a
terminal of some user, and the caller's own uid owns the user's other
terminals (another ssh session, the terminal a kept shell was started from),
whose typed keys and screen a sandbox must not reach. Landlock checks every
open of a file, including the one the kernel performs for
``ioctl(master, TIOCGPTPEER)`` (glibc's ``openpty()``, Python's
``os.openpty()``, ``script``), so without help a command could create a pty
(``/dev/ptmx`` stays granted) but never open its other end.

Rule: that ioctl is handed to the broker
(:data:`~._seccomp_rules.PTY_PEER_BROKER_RULES`). The broker takes the
target's descriptor (``pidfd_getfd``: the same open file) and, when it is a
pty master (character device 5:2, ``/dev/ptmx`` or ``/dev/pts/ptmx``), issues
the ioctl itself and hands the new descriptor to the target
(``SECCOMP_IOCTL_NOTIF_ADDFD``).

Why it is complete: the peer opened is the one of the master the command
already holds (the ioctl names no path; the kernel follows the master to its
own slave), and holding a master is full control of that pty anyway. Any
other descriptor is left to the kernel as the target (``CONTINUE``: whatever
the descriptor number then names, the target's Landlock domain applies), so
the broker never runs this ioctl number on another kind of file, where it
would mean something else. The broker always adds ``O_NOCTTY`` (the pty
must not become the corral server's controlling terminal); a command that
wants the pty as its own controlling terminal uses ``TIOCSCTTY``, as
``login_tty()`` does.
"""

from __future__ import annotations

import os
import stat

from ._broker_abi import _Continue, _FdResult, _signed_fd
from ._broker_policy import _Policy
from ._seccomp_rules import TIOCGPTPEER

__all__: list[str] = []

#: The pty multiplexer's device number (``/dev/ptmx`` and every ``/dev/pts/ptmx``).
_PTMX_DEVICE = os.makedev(5, 2)
#: The open flags the peer may take from the request; the rest are ignored.
_PEER_FLAGS = os.O_ACCMODE | os.O_NONBLOCK | os.O_CLOEXEC


class _PtyPeer(_Policy):
    """``ioctl(master, TIOCGPTPEER, flags)`` performed by the broker."""

    def _pty_peer(self, pid: int, args: tuple[int, ...]) -> _FdResult:
        """The peer of the target's pty master ``args[0]``; raises OSError or :class:`_Continue`."""
        import fcntl

        if args[1] & 0xFFFFFFFF != TIOCGPTPEER:  # the kernel reads the request as 32 bits
            raise _Continue
        master = self._dup_target_fd(pid, _signed_fd(args[0]))
        try:
            st = os.fstat(master)
            if not stat.S_ISCHR(st.st_mode) or st.st_rdev != _PTMX_DEVICE:
                raise _Continue
            flags = (args[2] & _PEER_FLAGS) | os.O_NOCTTY
            peer = fcntl.ioctl(master, TIOCGPTPEER, flags | os.O_CLOEXEC)
        finally:
            os.close(master)
        return _FdResult(peer, cloexec=bool(flags & os.O_CLOEXEC))
