"""One corral server for many state directories: the hand-over to a running server.

A state directory keeps its own lock (``server/lock``) and socket
(``server/server.sock``, in the 0700 ``server/`` directory), and clients
connect nowhere else. What no longer has to be one per directory is the
process behind the socket. The first server of a *configuration* also
listens on the abstract unix socket ``corral-hub/<uid>/<configuration>``
(:func:`bind_hub`). A ``corral server`` started later for another state
directory with the same configuration takes that directory's lock as
always, then hands the lock over to that server (:func:`hand_over`: the
descriptor travels with ``SCM_RIGHTS``; an ``flock`` belongs to the open
file, so the lock goes with it) and exits. The running server checks the
descriptor, listens on the directory's socket from then on
(:meth:`corral.server._server.Server.adopt`), and serves it like its first
directory: a test suite, a multi-tenant host or a cluster's workers with
hundreds of state directories run one server per user and configuration,
with one interpreter, launcher pool and inotify instance.

**Configuration** (:func:`configuration`): the code stamp, the uid, the idle
timeout and the server's whole environment except ``XDG_STATE_HOME``, which
only names the state directory, and what a shell sets per command (``_``,
``PWD``, ``OLDPWD``, ``SHLVL``), which a server does not read. A spawned server's environment is its first
client's; everything a server reads from its own environment (idle and
kept/warm bounds, the micro-VM pool, where the probe cache lies) is thus the
same as the new directory's own server would have read, and a run is served
as it would have been there. Runs themselves use each client's environment,
as they always did.

**Who is trusted.** An abstract socket name is open to every process of the
network namespace: any user may bind it first, or connect to it.

* The starting server checks the process behind the name with the very
  checks a server makes of its clients (:func:`~._peers.check_peer`: same
  uid, every namespace, per-thread credentials, capabilities,
  ``no_new_privs``, seccomp, and the process context). A squatter - another
  user, or a sandboxed process of this user - fails them; the new server
  then serves its directory itself, as before. Nothing is sent before the
  check.
* The running server checks whoever connects to the name the same way
  (:class:`~._connections.Connections`) and answers nothing but ``adopt``
  there; a process that passes is one of the user's unsandboxed host
  processes, which could open the directory's socket itself.

So the hand-over gives nobody a way in that the directory's own socket does
not; at worst a squatter makes each directory run its own server.
"""

from __future__ import annotations

import _socket
import os
import sys

from ._wire import PROTOCOL, FrameReader, WireError, bind_unix, code_stamp, encode, socket_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_IDLE",
    "MAX_DIRECTORIES",
    "Front",
    "bind_hub",
    "configuration",
    "hand_over",
    "join",
    "listen_at",
    "lock_directory",
    "prepare_directory",
    "server_idle",
    "take_lock",
    "unlink_ours",
]

#: what differs between two calls of one shell and no server reads: the state directory,
#: and what the shell sets per command (``_``: the command's path; ``PWD``, ``OLDPWD``,
#: ``SHLVL``: a server moves to ``/`` and runs each command with its client's environment)
_PER_CALL = frozenset({"XDG_STATE_HOME", "_", "PWD", "OLDPWD", "SHLVL"})
#: seconds a server waits without a client before it exits (``CORRAL_SERVER_IDLE``, ``--idle``)
DEFAULT_IDLE = 300.0
#: state directories one server serves at most (two descriptors each)
MAX_DIRECTORIES = 256


def server_idle(value: str | None) -> float:
    """A server's idle timeout from ``--idle`` / ``CORRAL_SERVER_IDLE`` (unset or empty: the default).

    Raises:
        ValueError: not a number of seconds above 0.
    """
    if not value:
        return DEFAULT_IDLE
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"not a number of seconds: {value!r}") from None
    if seconds <= 0:
        raise ValueError(f"must be more than 0 seconds: {value!r}")
    return seconds


def configuration(environ: Mapping[str, str], idle: float) -> str:
    """The configuration a server's state directories share (see the module docstring)."""
    try:  # not hashlib: it loads OpenSSL (~3 ms), and clients compute this too
        from _sha256 import sha256  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # Python 3.12+
        from _sha2 import sha256  # type: ignore[import-not-found,no-redef,unused-ignore]
    names = sorted(f"{k}={v}" for k, v in environ.items() if k not in _PER_CALL)
    text = "\0".join([code_stamp(), str(os.getuid()), repr(idle), *names])
    digest: str = sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    return digest[:32]


def prepare_directory(state_dir: str) -> str:
    """Create *state_dir*'s ``server/`` (mode 0700) if needed and check it; return its path.

    Raises:
        ServerError: it cannot be created, or is not a directory owned by this
            uid with mode 0700 (another user could reach the socket).
    """
    from .._exceptions import ServerError
    from .._state import ensure_dir

    directory = os.path.join(state_dir, "server")
    ensure_dir(state_dir)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ServerError(f"Failed to create {directory}: {exc.strerror}") from exc
    if not _private(os.lstat(directory)):
        raise ServerError(
            f"Failed to use {directory}: it must be a directory owned by uid "
            f"{os.getuid()} with mode 0700",
            hint=f"remove it (rm -rf {directory}) and start again",
        )
    return directory


def _private(st: os.stat_result) -> bool:
    """Whether *st* (an ``lstat``) is a directory owned by this uid that no one else may enter."""
    import stat

    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def lock_directory(directory: str) -> int:
    """A descriptor holding the ``flock`` of *directory*'s ``lock`` (close-on-exec); -1 when
    another process holds it (a server serves the directory, or is starting to)."""
    import fcntl

    fd = os.open(os.path.join(directory, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1
    return fd


def join(state_dir: str, environ: Mapping[str, str], idle: float) -> bool:
    """From a client: have the running server of its configuration serve *state_dir* now.

    What a server started for *state_dir* would do first (take the
    directory's lock, :func:`hand_over`), without starting one: the next
    request to the directory's socket is served. False when there is no such
    server (a failed connect to an abstract name: ~20 us, and nothing else
    is imported or touched), the directory is locked (a server is starting)
    or anything fails; the caller then goes on as before. A connection that
    comes to nothing (the lock is taken) is logged by the server as a bad
    request, and harms nothing.
    """
    sock = _connect(configuration(environ, idle), 5.0)  # a client's command is waiting
    if sock is None:
        return False  # no server of this configuration: the usual ~20 us
    from .._exceptions import ServerError

    try:
        try:
            fd = lock_directory(prepare_directory(state_dir))
        except (OSError, ServerError):
            return False
        if fd < 0:
            return False
        try:
            pid, _why = _hand_over_on(sock, state_dir, fd)
        finally:
            os.close(fd)
    finally:
        sock.close()
    return pid > 0


def _address(config: str) -> str:
    return f"\0corral-hub/{os.getuid()}/{config}"


def bind_hub(config: str) -> _socket.socket | None:
    """Listen (non-blocking) on the hub name of *config*; None when another process holds it."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.bind(_address(config))
        sock.listen(64)
    except OSError:
        sock.close()
        return None
    sock.setblocking(False)
    return sock


def hand_over(
    state_dir: str, lock_fd: int, config: str, *, timeout: float = 30.0
) -> tuple[int, str]:
    """Ask the running server of *config* to serve *state_dir*, whose lock *lock_fd* holds.

    *timeout* bounds the wait for its answer (a server still starting answers
    once its serve loop runs).

    Returns ``(pid, "")`` when it took the directory (the caller closes its
    copy of the lock and exits), else ``(0, why not)``: no such server, it
    failed the peer checks, or it declined.
    """
    sock = _connect(config, timeout)
    if sock is None:
        return 0, "no server of this configuration runs"
    try:
        return _hand_over_on(sock, state_dir, lock_fd)
    finally:
        sock.close()


def _connect(config: str, timeout: float) -> _socket.socket | None:
    """A socket connected to the hub name of *config*, or None when nothing listens there."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(_address(config))
    except OSError:
        sock.close()
        return None
    return sock


def _hand_over_on(sock: _socket.socket, state_dir: str, lock_fd: int) -> tuple[int, str]:
    """:func:`hand_over` on *sock*, connected to the hub name: check the peer, then ask."""
    from ._peers import PeerRefused, check_peer, process_context

    try:
        try:
            pid, pidfd = check_peer(sock, process_context())
        except (PeerRefused, OSError) as exc:
            return 0, f"the process on the hub name failed the peer checks: {exc}"
        os.close(pidfd)
        frame = encode(
            {"op": "adopt", "protocol": PROTOCOL, "code": code_stamp(), "state_dir": state_dir}
        )
        rights = lock_fd.to_bytes(4, sys.byteorder)
        sent = sock.sendmsg([frame], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
        if sent < len(frame):
            sock.sendall(frame[sent:])
        reply = _reply(sock)
    except (OSError, WireError) as exc:
        return 0, f"the hand-over failed: {exc}"
    if reply.get("adopted") is True and reply.get("pid") == pid:
        return pid, ""
    return 0, str(reply.get("refused", "no answer"))


def _reply(sock: _socket.socket) -> dict[str, object]:
    from ._requests import _MSG_CMSG_CLOEXEC, _fds_of

    reader = FrameReader()
    while True:
        data, ancdata, _flags, _addr = sock.recvmsg(65536, _socket.CMSG_SPACE(4), _MSG_CMSG_CLOEXEC)
        for fd in _fds_of(ancdata):
            os.close(fd)  # none is expected
        if not data:
            return {}
        messages = reader.feed(data)
        if messages:
            return messages[0]


def take_lock(state_dir: object, lock_fd: int) -> tuple[str, int] | str:
    """``(state_dir, a descriptor of its lock)`` for a hand-over, or why it is refused.

    *state_dir* must be an absolute, normal path whose ``server/`` is a
    directory owned by this uid with mode 0700 (what a starting server
    accepts), and *lock_fd* its ``server/lock`` file with the ``flock`` held
    through it (or free: it is taken then). The descriptor returned is a new
    one (close-on-exec), the caller's to keep or close.
    """
    import fcntl
    import stat

    if not isinstance(state_dir, str) or not state_dir.startswith("/"):
        return "the state directory must be an absolute path"
    if os.path.normpath(state_dir) != state_dir:
        return "the state directory must be a normal path"
    directory = os.path.join(state_dir, "server")
    try:
        st = os.lstat(directory)
        held = os.fstat(lock_fd)
        named = os.lstat(os.path.join(directory, "lock"))
    except OSError as exc:
        return f"cannot check {directory}: {exc.strerror}"
    if not _private(st):
        return f"{directory} must be a directory owned by uid {os.getuid()} with mode 0700"
    if not stat.S_ISREG(held.st_mode) or (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino):
        return "the descriptor is not the state directory's lock"
    fd = os.dup(lock_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held through this open file: a no-op
    except OSError:
        os.close(fd)
        return "another process holds the state directory's lock"
    return state_dir, fd


class Front:
    """A state directory the server serves: its lock, its socket and the listener on it."""

    __slots__ = ("directory", "listener", "lock_fd", "path", "socket_ino", "state_dir")

    def __init__(self, state_dir: str, lock_fd: int) -> None:
        """Listen on *state_dir*'s socket, whose lock *lock_fd* holds (owned from now on).

        Raises:
            OSError: the socket cannot be created (*lock_fd* is then the caller's still).
        """
        self.state_dir = state_dir
        self.directory = os.path.join(state_dir, "server")
        self.path = socket_path(state_dir)
        self.listener = listen_at(self.path)
        self.lock_fd = lock_fd
        self.socket_ino = os.lstat(self.path).st_ino

    def current(self) -> bool:
        """Whether the directory's ``server/lock`` is still the file this front holds (False:
        the state directory was removed, or removed and made again)."""
        try:
            named = os.lstat(os.path.join(self.directory, "lock"))
            held = os.fstat(self.lock_fd)
        except OSError:
            return False
        return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        """Give up the socket path (when it is still ours) and the lock (the server holds ``lock``)."""
        unlink_ours(self.path, self.socket_ino)
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # releases the flock
            self.lock_fd = -1


def unlink_ours(path: str, ino: int) -> None:
    """Remove the socket *path* if it is still the one bound with inode *ino* (the caller
    still holds its directory's lock); a socket another server made there stays."""
    try:
        if os.lstat(path).st_ino == ino:
            os.unlink(path)
    except OSError:
        pass


def listen_at(path: str) -> _socket.socket:
    """A non-blocking listener on the unix socket *path* (mode 0600), replacing a dead one.

    The caller holds the directory's lock. The umask is left to the caller
    (a running server has other threads): the socket is 0600 at once after
    ``bind``, and until then it lies in the 0700 ``server/`` directory.

    Raises:
        OSError: the socket cannot be made.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        bind_unix(listener, path)
        os.chmod(path, 0o600)
        listener.listen(64)
    except OSError:
        listener.close()
        raise
    listener.setblocking(False)
    return listener
