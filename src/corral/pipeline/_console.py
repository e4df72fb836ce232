"""A command's terminal handed over a console socket (OCI ``process.terminal``; gVisor's runsc).

With ``process.terminal: true`` the runtime creates the command's pty itself:
the slave becomes the command's stdin, stdout and stderr, and the master is
sent (``SCM_RIGHTS``) over the unix socket named by ``--console-socket``. The
engine (:class:`corral.pipeline._engine.Running`) then

* listens on that socket in a private 0700 directory of its own
  (:class:`ConsoleSocket`) and takes exactly one pty master from the first
  connection, or fails the run (``LaunchFailed``, exit 125);
* reads the master like a pipe - the command's output, stdout and stderr
  merged by the one pty, counted against the output cap and digested as
  stdout - and gives it the user's window size (now and on every SIGWINCH);
* puts the user's terminal in raw mode while it relays and forwards the
  keystrokes into the master (:class:`ConsoleRelay`), so Ctrl-C and Ctrl-\\
  are the command's pty's to deliver to its foreground process group; Ctrl-Z
  still stops corral's job and the sandbox with it (:func:`set_raw`); the
  engine restores the terminal's mode when the run ends, whatever ended it,
  and while the job is stopped.

Nothing here is imported unless a run takes that path.
"""

from __future__ import annotations

import os
import sys

from .._exceptions import LaunchFailed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["ConsoleRelay", "ConsoleSocket", "set_raw"]

_POLLIN, _POLLOUT = 0x001, 0x004
_KEYS = 4096


class ConsoleSocket:
    """A unix socket listening in a fresh private directory (mode 0700) for one pty master.

    Only the directory's owner (the user running corral, who also runs the
    runtime) can reach the socket, so no other user can hand the engine a
    terminal of theirs.
    """

    def __init__(self) -> None:
        import socket
        import tempfile

        try:
            self.directory = tempfile.mkdtemp(prefix="corral-console-")  # mode 0700
        except OSError as exc:
            raise LaunchFailed(
                f"Failed to make a private directory for the command's terminal: {exc}",
                hint="check TMPDIR, or run with --no-tty to use pipes",
            ) from exc
        self.path = os.path.join(self.directory, "console.sock")
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.path)
            self._listener.listen(1)
            self._listener.setblocking(False)
        except OSError as exc:  # e.g. a TMPDIR whose path is too long for a unix socket
            self.close()
            raise LaunchFailed(
                f"Failed to listen for the command's terminal on {self.path}: {exc.strerror or exc}",
                hint="set TMPDIR to a short directory, or run with --no-tty to use pipes",
            ) from exc
        except BaseException:
            self.close()
            raise

    def receive(self, wait_readable: Callable[[int], None]) -> int:
        """Accept the runtime's connection and return the pty master it sends (close-on-exec).

        *wait_readable(fd)* returns once *fd* is readable and raises
        ``LaunchFailed`` when the run's set-up deadline passes or the runtime
        exits first. Raises ``LaunchFailed`` too when the connection carries
        anything but one terminal. The listener is closed and its directory
        removed before this returns, whatever the result.
        """
        import socket

        try:
            assert self._listener is not None
            while True:
                wait_readable(self._listener.fileno())
                try:
                    conn, _addr = self._listener.accept()
                except BlockingIOError:
                    continue
                break
            with conn:
                conn.setblocking(False)
                while True:
                    wait_readable(conn.fileno())
                    try:
                        # close-on-exec as they arrive: the corral server spawns other
                        # runs meanwhile, and none may inherit this run's terminal
                        _msg, ancdata, _flags, _addr = conn.recvmsg(
                            1024, socket.CMSG_SPACE(4 * 4), socket.MSG_CMSG_CLOEXEC
                        )
                    except BlockingIOError:
                        continue
                    break
        finally:
            self.close()
        fds = [
            int.from_bytes(data[i : i + 4], sys.byteorder, signed=True)
            for level, kind, data in ancdata
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
            for i in range(0, len(data) - len(data) % 4, 4)
        ]
        master = fds[0] if len(fds) == 1 else -1
        if master >= 0 and os.isatty(master):
            return master
        for fd in fds:
            os.close(fd)
        raise LaunchFailed(
            "Failed to start the sandbox: the runtime did not hand over the command's "
            f"terminal on the console socket (got {len(fds)} descriptor(s), expected one pty)",
            hint="run with --no-tty to use pipes instead",
        )

    def close(self) -> None:
        """Stop listening and remove the socket and its directory (idempotent)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for remove in (os.unlink, os.rmdir):
            try:
                remove(self.path if remove is os.unlink else self.directory)
            except FileNotFoundError:
                pass


class ConsoleRelay:
    """The user's keystrokes into the command's pty master, the terminal raw meanwhile.

    *keyboard* is the user's terminal (the run's inherited stdin, possibly a
    corral server client's fd). It is reopened as a file description of its
    own, non-blocking, so the user's shell never finds its terminal left
    non-blocking. The caller saved the terminal's mode before and restores it
    (:func:`corral.pipeline._terminal.restore_terminal`); this only sets it raw.
    Input waits while the command does not read (the pty's input queue is
    full), and while the job is stopped (:meth:`pause`: the shell reads the
    terminal then): the relay never blocks the engine's loop. All poller
    changes happen in the loop's thread (:meth:`register`, :meth:`sync`,
    :meth:`on_event`).
    """

    def __init__(self, master: int, keyboard: int) -> None:
        self._writer = os.dup(master)  # its own poll entry (POLLOUT) next to the reader's
        os.set_blocking(self._writer, False)
        try:
            self._keyboard = os.open(
                f"/proc/self/fd/{keyboard}", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC
            )
        except OSError:
            self._keyboard = os.dup(keyboard)  # /proc unavailable: reads only after poll says so
        else:
            os.set_blocking(self._keyboard, False)
        self._pending = b""
        self._paused = False
        self._hung_up = False
        self._listening = False
        self._poller: Any = None
        set_raw(keyboard)

    def register(self, poller: object) -> None:
        """Start watching the keyboard in the engine's *poller* (a ``select.poll``)."""
        self._poller = poller
        self.sync()

    def pause(self, paused: bool) -> None:
        """Stop (or resume) reading the keyboard; from any thread (then wake the loop)."""
        self._paused = paused

    def sync(self) -> None:
        """Watch the keyboard exactly when keys are wanted: none pending, not paused."""
        listen = not (self._paused or self._pending or self._hung_up)
        if self._poller is None or listen == self._listening:
            return
        if listen:
            self._poller.register(self._keyboard, _POLLIN)
        else:
            self._poller.unregister(self._keyboard)
        self._listening = listen

    def owns(self, fd: int) -> bool:
        """Whether *fd* (from the engine's poll) is one of the relay's."""
        return fd >= 0 and fd in (self._keyboard, self._writer)

    def on_event(self, fd: int) -> None:
        """Handle *fd*'s poll event: read keystrokes, or pass the pending ones on."""
        if fd == self._keyboard:
            if not self._listening:
                return
            try:
                keys = os.read(fd, _KEYS)
            except BlockingIOError:
                return
            except OSError:
                keys = b""  # the terminal hung up
            self._hung_up = not keys
            self._pending = keys
            self.sync()
            if keys:
                self._poller.register(self._writer, _POLLOUT)
            return
        try:
            written = os.write(self._writer, self._pending)
        except BlockingIOError:
            return
        except OSError:
            written = len(self._pending)  # the command's terminal is gone: the keys with it
        self._pending = self._pending[written:]
        if not self._pending:
            self._poller.unregister(self._writer)
            self.sync()

    def close(self) -> None:
        """Close the relay's own descriptors (not the master, not the terminal)."""
        for fd in (self._writer, self._keyboard):
            try:
                os.close(fd)
            except OSError:
                pass
        self._writer = self._keyboard = -1


def set_raw(fd: int) -> None:
    """Put terminal *fd* in raw mode, but for Ctrl-Z: the keys reach the command's pty as typed.

    No echo, no line editing, no output processing, and Ctrl-C and Ctrl-\\
    are plain bytes (the command's pty turns them into SIGINT/SIGQUIT for its
    foreground process group, or passes them to a program that reads them).
    The suspend key keeps its meaning at the user's terminal: it stops
    corral's job, which stops the sandbox, as for every other backend
    (``Running.send_signal``). SIGTTOU is blocked meanwhile (this thread
    only), as for the restore: a corral in a background job must not be
    stopped by it.
    """
    import signal
    import termios
    import tty

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        attrs = termios.tcgetattr(fd)
        tty.setraw(fd, termios.TCSANOW)
        raw = termios.tcgetattr(fd)
        raw[3] |= termios.ISIG
        raw[6][termios.VINTR] = raw[6][termios.VQUIT] = b"\0"  # disabled (_POSIX_VDISABLE)
        raw[6][termios.VSUSP] = attrs[6][termios.VSUSP]
        termios.tcsetattr(fd, termios.TCSANOW, raw)
    except termios.error:
        pass  # no terminal any more: nothing to relay either
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
