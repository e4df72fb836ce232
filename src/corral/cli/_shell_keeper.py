"""``corral shell --keep NAME``: an interactive shell whose sandbox outlives the terminal.

A **keeper** process holds the shell: it runs it in a fresh sandbox exactly as
``corral shell`` does (same plan, same private pty as the sandbox's
controlling terminal, same audit record when it ends), keeps the pty's master
side, and serves a unix socket, ``<state dir>/shells/NAME.sock``. A client
(``corral shell --keep NAME`` at the user's terminal) attaches to it and relays
bytes between its terminal and the pty; detaching (Ctrl-], the terminal
closing, SIGHUP/SIGTERM to the client) leaves the shell and everything it
started running - processes, its ``/tmp``, its working directory. The next
``corral shell --keep NAME`` re-attaches; ``corral shell --stop NAME`` stops
the sandbox as a timeout would (TERM to every process, KILL after the grace).
A keeper left detached for ``--idle`` seconds (default :data:`DEFAULT_IDLE`)
stops its sandbox itself.

Keying: the keeper records the digest of its policy and its workspace; a
client whose own policy (settings, flags, rules) or workspace differs is
refused (exit 125) - a changed policy never silently reuses the old sandbox.

Fail closed: the sandbox runs with ``--die-with-parent`` (bubblewrap), so a
keeper that dies takes its sandbox with it; its socket then refuses
connections and the next ``--keep NAME`` starts a new keeper and a new
sandbox. A shell is never run outside a sandbox.

Who may attach: the socket is 0600 in the state directory (0700, hidden from
every sandbox), and every connection must pass the corral server's security
peer checks (:func:`corral.server._peers.check_peer`: same uid, namespaces,
credentials, seccomp filters): a sandboxed process can never type into a
kept shell, whose policy may be weaker than its own.

The wire: frames of one kind byte, a 4-byte big-endian length, the payload.
Client to keeper: ``H`` hello (JSON ``{"digest", "workspace"}``) or ``S``
stop, first; then ``D`` input bytes and ``W`` window size (``struct
winsize``). Keeper to client: ``A`` accepted, ``R`` refused (the reason),
``D`` output, ``T`` taken over by another client, ``X`` the shell ended
(its exit status as decimal text).
"""

from __future__ import annotations

import _socket
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..pipeline._runner import SignalRelay

__all__ = [
    "DEFAULT_IDLE",
    "DETACH_KEY",
    "Keeper",
    "attach",
    "check_name",
    "shell_paths",
    "stop",
]

#: seconds a kept shell may stay detached before its sandbox is stopped
DEFAULT_IDLE = 3600.0
#: the key that detaches the client (Ctrl-], as in telnet and virsh console)
DETACH_KEY = 0x1D
_MAX_FRAME = 1 << 20
_REPLAY = 64 * 1024  # the last output kept for a client that re-attaches
_MAX_PENDING_INPUT = 256 * 1024
_SEND_TIMEOUT = 10.0  # a client that takes no output for this long is detached
_HELLO_TIMEOUT = 5.0
_START_TIMEOUT = 60.0


def check_name(name: str) -> str:
    """*name* when it is a valid kept-shell name (letters, digits, ``._-``, 1-64, no leading dot).

    Raises:
        UsageError: it is not.
    """
    from .._exceptions import UsageError

    ok = 0 < len(name) <= 64 and name[0] != "." and name[0] != "-"
    if ok:
        ok = all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    if not ok:
        raise UsageError(
            f"invalid kept shell name {name!r}",
            hint="use 1-64 letters, digits, '.', '_' or '-', not starting with '.' or '-'",
        )
    return name


def shell_paths(state: str, name: str) -> tuple[str, str, str]:
    """``(directory, socket, lock)`` of kept shell *name* in state directory *state*."""
    directory = os.path.join(state, "shells")
    return (
        directory,
        os.path.join(directory, name + ".sock"),
        os.path.join(directory, name + ".lock"),
    )


def _private_directory(directory: str) -> None:
    """Create *directory* (0700) or check that the existing one is ours and private."""
    from .._exceptions import LaunchFailed
    from .._state import ensure_dir

    ensure_dir(os.path.dirname(directory))
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise LaunchFailed(
            f"Failed to use {directory}: it must be a directory owned by uid {os.getuid()} "
            "with mode 0700",
            hint=f"remove it (rm -rf {directory}) and start again",
        )


# ---------------------------------------------------------------- frames
def _frame(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


class _Frames:
    """Splits a byte stream into ``(kind, payload)`` frames."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Add *data*; the frames now complete. Raises ValueError on an oversized frame."""
        self._buf += data
        frames = []
        while len(self._buf) >= 5:
            size = int.from_bytes(self._buf[1:5], "big")
            if size > _MAX_FRAME:
                raise ValueError(f"frame of {size} bytes")
            if len(self._buf) < 5 + size:
                break
            frames.append((bytes(self._buf[:1]), bytes(self._buf[5 : 5 + size])))
            del self._buf[: 5 + size]
        return frames


def _recv_frames(sock: _socket.socket, frames: _Frames) -> list[tuple[bytes, bytes]]:
    """The next frames from a blocking *sock* (at least one), or ``[]`` at its end."""
    while True:
        data = sock.recv(65536)
        if not data:
            return []
        got = frames.feed(data)
        if got:
            return got


def _window_size(fd: int) -> bytes | None:
    import fcntl
    import termios

    try:
        return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
    except OSError:
        return None


# ---------------------------------------------------------------- the client
def _connect(path: str) -> _socket.socket | None:
    """A connection to the keeper at *path*, or None when no keeper listens there."""
    from ..server._wire import connect_unix

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        connect_unix(sock, path)
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    cred = sock.getsockopt(_socket.SOL_SOCKET, 17, 12)  # SO_PEERCRED
    if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
        sock.close()
        from .._exceptions import LaunchFailed

        raise LaunchFailed(f"Failed to trust {path}: it belongs to another user")
    return sock


def stop(state: str, name: str) -> bool:
    """Stop kept shell *name* and wait until its keeper is gone; False when none runs."""
    _directory, path, _lock = shell_paths(state, name)
    sock = _connect(path)
    if sock is None:
        return False
    cred = sock.getsockopt(_socket.SOL_SOCKET, 17, 12)  # SO_PEERCRED: the keeper's pid
    try:
        pidfd = os.pidfd_open(int.from_bytes(cred[0:4], sys.byteorder, signed=True))
    except OSError:
        pidfd = -1  # it is exiting already
    try:
        sock.sendall(_frame(b"S"))
        sock.settimeout(_START_TIMEOUT)
        while sock.recv(65536):  # the keeper closes once its sandbox has ended
            pass
    except OSError:
        pass  # it went away: stopped
    finally:
        sock.close()
    if pidfd >= 0:
        import select

        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll(_START_TIMEOUT * 1000)  # until the keeper has exited
        finally:
            os.close(pidfd)
    return True


def attach(
    state: str,
    name: str,
    *,
    digest: str,
    workspace: str,
    start: Callable[[int, int], int],
) -> int:
    """Attach this process's terminal to kept shell *name*, starting its keeper if none runs.

    *start(ready_fd, lock_fd)* spawns a keeper and returns its pid; the keeper
    writes ``ok`` to *ready_fd* once it listens (else an error line and exits).

    Returns the shell's exit status when it ends while attached, 0 when this
    client detaches, 125 when the keeper refuses (another policy or workspace)
    or cannot start.

    Raises:
        CorralError: the keeper could not be started (its message).
    """
    import fcntl

    from .._exceptions import LaunchFailed

    directory, path, lock = shell_paths(state, name)
    deadline = time.monotonic() + _START_TIMEOUT
    started = False
    while True:
        sock = _connect(path)
        if sock is not None:
            return _session(sock, name, digest=digest, workspace=workspace, fresh=started)
        if time.monotonic() > deadline:
            raise LaunchFailed(f"Failed to start the kept shell {name}: its keeper did not answer")
        _private_directory(directory)
        lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.05)  # another client is starting it: connect again
                continue
            _start_keeper(path, lock_fd, start, name)
            started = True
        finally:
            os.close(lock_fd)  # the keeper holds the lock (the same open file) from here on


def _start_keeper(path: str, lock_fd: int, start: Callable[[int, int], int], name: str) -> None:
    from .._exceptions import LaunchFailed

    try:
        os.unlink(path)  # we hold the lock: a socket left here is a dead keeper's
    except FileNotFoundError:
        pass
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = start(ready_w, lock_fd)
        os.close(ready_w)
        ready_w = -1
        answer = b""
        import select

        poller = select.poll()
        poller.register(ready_r, select.POLLIN)
        deadline = time.monotonic() + _START_TIMEOUT
        while poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            chunk = os.read(ready_r, 65536)
            if not chunk:
                break
            answer += chunk
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    if answer.startswith(b"ok"):
        return
    message, _, hint = answer.decode(errors="replace").partition("\n")
    raise LaunchFailed(
        message or f"Failed to start the kept shell {name}: its keeper exited",
        hint=hint.strip() or None,
    )


def _session(sock: _socket.socket, name: str, *, digest: str, workspace: str, fresh: bool) -> int:
    """Say hello, then relay the terminal until the shell ends or the client detaches."""
    from .._jsonfast import dumps
    from . import print_error

    frames = _Frames()
    try:
        sock.sendall(_frame(b"H", dumps({"digest": digest, "workspace": workspace}).encode()))
        sock.settimeout(_HELLO_TIMEOUT * 2)
        replies = _recv_frames(sock, frames)
        sock.settimeout(None)
    except (OSError, ValueError) as exc:
        sock.close()
        print_error(f"Failed to attach to the kept shell {name}: {exc}")
        return 125
    if not replies or replies[0][0] != b"A":
        sock.close()
        reason = replies[0][1].decode(errors="replace") if replies else "the keeper went away"
        print_error(
            f"Failed to attach to the kept shell {name}: {reason}",
            f"corral shell --stop {name} ends it; then corral shell --keep {name} starts a new one",
        )
        return 125
    verb = "started" if fresh else "attached to"
    greeting = f"corral: {verb} the kept shell {name} (Ctrl-] detaches)\r\n".encode()
    try:
        return _relay_terminal(sock, frames, name, greeting, replies[1:])
    finally:
        sock.close()


def _relay_terminal(
    sock: _socket.socket,
    frames: _Frames,
    name: str,
    greeting: bytes,
    early: list[tuple[bytes, bytes]],
) -> int:
    """Relay until the shell ends (its status), the client detaches (0) or the keeper is lost.

    *greeting* is shown once the terminal is raw (keys typed from then on
    reach the shell; what was typed ahead is kept, not flushed); *early* are
    frames that arrived with the keeper's acceptance. The terminal's mode is
    restored on every way out.
    """
    import select
    import signal
    import termios
    import tty

    on_terminal = os.isatty(0)
    saved = termios.tcgetattr(0) if on_terminal else None
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    handled = (signal.SIGWINCH, signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in handled}
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    status: int | None = None
    note = ""
    try:
        if on_terminal:
            tty.setraw(0, termios.TCSANOW)
            size = _window_size(0)
            if size is not None:
                sock.sendall(_frame(b"W", size))
        os.write(2, greeting)
        fds = [sock.fileno(), wake_r, 0]
        while True:
            while early and status is None:
                kind, payload = early.pop(0)
                if kind == b"D":
                    _write_all(1, payload)
                elif kind == b"X":
                    status = int(payload or b"125")
                elif kind == b"T":
                    status, note = 0, "taken"
            if status is not None:
                break
            try:
                readable, _, _ = select.select(fds, [], [])
            except InterruptedError:
                continue
            if wake_r in readable:
                signals = os.read(wake_r, 256)
                if any(sig in signals for sig in handled[1:]):  # HUP, TERM, INT: detach
                    status, note = 0, "detached"
                    break
                if signal.SIGWINCH in signals and on_terminal:
                    size = _window_size(0)
                    if size is not None:
                        sock.sendall(_frame(b"W", size))
            if 0 in readable:
                try:
                    data = os.read(0, 65536)
                except OSError:  # EIO: the terminal hung up
                    data = b""
                if not data:
                    status, note = 0, "detached"  # stdin ended: leave the shell running
                    break
                cut = data.find(DETACH_KEY)
                if cut >= 0:
                    if cut:
                        sock.sendall(_frame(b"D", data[:cut]))
                    status, note = 0, "detached"
                    break
                sock.sendall(_frame(b"D", data))
            if sock.fileno() in readable:
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    status, note = 125, "lost"
                    break
                early += frames.feed(data)
    except OSError as exc:
        status, note = 125, f"lost: {exc}"
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, saved)
        os.close(wake_r)
        os.close(wake_w)
    if note == "detached":
        os.write(
            2,
            f"\ncorral: detached from the kept shell {name}; 'corral shell --keep {name}' "
            f"re-attaches, 'corral shell --stop {name}' ends it\n".encode(),
        )
    elif note == "taken":
        os.write(2, f"\ncorral: the kept shell {name} was attached elsewhere\n".encode())
    elif note.startswith("lost"):
        os.write(
            2,
            f"\ncorral: the keeper of the kept shell {name} went away"
            f"{note[4:]}; the shell was stopped with it\n".encode(),
        )
    return status


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# ---------------------------------------------------------------- the keeper
class Keeper:
    """The process that holds kept shell *name*: its socket, its pty, its sandbox's relay.

    Example::

        keeper = Keeper(state, name, digest=d, workspace=w, idle=3600.0)
        keeper.listen()                 # raises CorralError (reported to the client)
        master, slave = keeper.master, keeper.slave
        relay = SignalRelay()
        keeper.serve_in_background(relay)
        outcome = launch(..., on_start=relay.started, stdio=(slave, slave, slave))
        keeper.finish(outcome.returncode)
    """

    def __init__(self, state: str, name: str, *, digest: str, workspace: str, idle: float) -> None:
        self.name = name
        self.digest = digest
        self.workspace = workspace
        self.idle = idle
        self._directory, self.path, self._lock_path = shell_paths(state, name)
        self.master, self.slave = os.openpty()
        os.set_blocking(self.master, False)
        self._listener: _socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._status: int | None = None
        self._thread: object = None
        self._stoppers: list[_socket.socket] = []
        self._socket_ino = 0
        from ..server._peers import process_context

        self._own = process_context()

    def listen(self) -> None:
        """Bind the socket (0600) at the kept shell's path; the caller holds the lock."""
        from .._exceptions import LaunchFailed
        from ..server._wire import bind_unix

        _private_directory(self._directory)
        listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        previous = os.umask(0o177)
        try:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            bind_unix(listener, self.path)
        except OSError as exc:
            listener.close()
            raise LaunchFailed(f"Failed to listen on {self.path}: {exc.strerror}") from exc
        finally:
            os.umask(previous)
        self._socket_ino = os.lstat(self.path).st_ino
        listener.listen(8)
        self._listener = listener

    def serve_in_background(self, relay: SignalRelay) -> None:
        """Relay between the pty and whichever client is attached, in a daemon thread."""
        import threading

        thread = threading.Thread(target=self._serve_or_stop, args=(relay,), daemon=True)
        thread.start()
        self._thread = thread

    def finish(self, status: int) -> None:
        """The shell ended with *status*: pass its last output and the status on, then close."""
        os.close(self.slave)  # the master now reads EIO once the output is drained
        self._status = status
        os.write(self._wake_w, b"x")
        thread = self._thread
        if thread is not None:
            thread.join(_SEND_TIMEOUT + 5.0)  # type: ignore[attr-defined]
        if self._listener is not None:
            try:
                if os.lstat(self.path).st_ino == self._socket_ino:
                    os.unlink(self.path)  # ours (a new keeper may have replaced it since)
            except OSError:
                pass
            self._listener.close()

    # ---------------------------------------------------------------- the relay thread
    def _serve_or_stop(self, relay: SignalRelay) -> None:
        """:meth:`_serve`; should it fail, nobody could reach the shell again: it is stopped."""
        try:
            self._serve(relay)
        except BaseException:
            relay.kill()
            raise

    def _serve(self, relay: SignalRelay) -> None:
        import select

        assert self._listener is not None
        listener = self._listener.fileno()
        client: _socket.socket | None = None
        frames = _Frames()
        replay = bytearray()
        pending = bytearray()  # input the shell has not taken yet
        master_open = True
        detached_since = time.monotonic()
        stopping = False
        while True:
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            poller.register(listener, select.POLLIN)
            if master_open:
                poller.register(self.master, select.POLLIN | (select.POLLOUT if pending else 0))
            if client is not None and len(pending) < _MAX_PENDING_INPUT:
                poller.register(client.fileno(), select.POLLIN)
            timeout = None
            if client is None and not stopping:
                timeout = max(0.0, detached_since + self.idle - time.monotonic()) * 1000
            events = dict(poller.poll(timeout))
            if not events and client is None and not stopping:
                stopping = True
                relay.stop()  # detached too long: the sandbox ends as a timeout would
                continue
            if master_open and events.get(self.master, 0) & select.POLLOUT and pending:
                try:
                    del pending[: os.write(self.master, pending)]
                except BlockingIOError:
                    pass
                except OSError:
                    pending.clear()
            if master_open and events.get(self.master, 0) & (
                select.POLLIN | select.POLLHUP | select.POLLERR
            ):
                master_open, client = self._pump(client, replay, drain=False)
            if self._wake_r in events:
                if master_open:
                    self._pump(client, replay, drain=True)
                if client is not None:
                    self._send(client, _frame(b"X", str(self._status).encode()))
                    client.close()
                for conn in self._stoppers:
                    conn.close()
                return
            if listener in events:
                taken = self._accept(relay, client, replay)
                if taken is not client:  # another client attached: the previous one is told
                    if client is not None:
                        self._send(client, _frame(b"T"))
                        client.close()
                    frames = _Frames()
                    client = taken
                stopping = stopping or bool(relay.stopped)
            if client is not None and client.fileno() in events:
                try:
                    data = client.recv(65536)
                    got = frames.feed(data) if data else None
                except (OSError, ValueError):
                    got = None
                if got is None:
                    client.close()  # detached
                    client = None
                    detached_since = time.monotonic()
                    continue
                for kind, payload in got:
                    if kind == b"D":
                        pending += payload
                    elif kind == b"W" and len(payload) == 8:
                        import fcntl
                        import termios

                        try:
                            fcntl.ioctl(self.master, termios.TIOCSWINSZ, payload)
                        except OSError:
                            pass

    def _pump(
        self, client: _socket.socket | None, replay: bytearray, *, drain: bool
    ) -> tuple[bool, _socket.socket | None]:
        """Read the pty's output to *client* (and the replay buffer).

        Returns ``(master still open, client still attached)``.
        """
        while True:
            try:
                data = os.read(self.master, 65536)
            except BlockingIOError:
                return True, client
            except OSError:  # EIO: no process holds the pty any more
                return False, client
            if not data:
                return False, client
            replay += data
            del replay[: max(0, len(replay) - _REPLAY)]
            if client is not None and not self._send(client, _frame(b"D", data)):
                client.close()
                client = None
            if not drain:
                return True, client

    @staticmethod
    def _send(client: _socket.socket, frame: bytes) -> bool:
        try:
            client.settimeout(_SEND_TIMEOUT)
            client.sendall(frame)
            return True
        except OSError:
            return False

    def _accept(
        self, relay: SignalRelay, current: _socket.socket | None, replay: bytearray
    ) -> _socket.socket | None:
        """A new connection: a hello that becomes the attached client, or a stop request.

        Returns the new client, or *current* when the connection was refused or stopped us.
        """
        from .._jsonfast import JSONError, loads
        from ..server._peers import PeerRefused, check_peer

        assert self._listener is not None
        try:
            fd, _addr = self._listener._accept()  # type: ignore[attr-defined]
        except OSError:
            return current
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, fileno=fd)
        try:
            _pid, pidfd = check_peer(conn, self._own)
            os.close(pidfd)
        except PeerRefused as exc:
            if exc.security:
                self._send(conn, _frame(b"R", f"not a client it may serve: {exc.reason}".encode()))
                conn.close()
                return current
        except OSError:
            conn.close()
            return current
        try:
            conn.settimeout(_HELLO_TIMEOUT)
            first = _recv_frames(conn, _Frames())
        except (OSError, ValueError):
            first = []
        if len(first) != 1:  # nothing, or more than the first message before the answer
            conn.close()
            return current
        kind, payload = first[0]
        if kind == b"S":
            relay.stop()
            self._stoppers.append(conn)  # closed once the sandbox has ended
            return current
        try:
            hello = loads(payload) if kind == b"H" else None
        except JSONError:
            hello = None
        if not isinstance(hello, dict):
            conn.close()
            return current
        reason = ""
        if hello.get("workspace") != self.workspace:
            reason = f"it runs for the workspace {self.workspace}, not {hello.get('workspace')}"
        elif hello.get("digest") != self.digest:
            reason = (
                "it runs under another policy (a setting, flag or rule changed since it started)"
            )
        if reason:
            self._send(conn, _frame(b"R", reason.encode()))
            conn.close()
            return current
        if not self._send(conn, _frame(b"A") + (_frame(b"D", bytes(replay)) if replay else b"")):
            conn.close()
            return current
        conn.settimeout(None)
        return conn
