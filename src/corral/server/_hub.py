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
only names the state directory. A spawned server's environment is its first
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
import hashlib
import os
import sys

from ._peers import PeerRefused, check_peer, process_context
from ._requests import _MSG_CMSG_CLOEXEC, _fds_of
from ._wire import PROTOCOL, FrameReader, WireError, bind_unix, code_stamp, encode, socket_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["MAX_DIRECTORIES", "Front", "bind_hub", "configuration", "hand_over", "take_lock"]

#: state directories one server serves at most (two descriptors each)
MAX_DIRECTORIES = 256
_TIMEOUT = 10.0


def configuration(environ: Mapping[str, str], idle: float) -> str:
    """The configuration a server's state directories share (see the module docstring)."""
    names = sorted(f"{k}={v}" for k, v in environ.items() if k != "XDG_STATE_HOME")
    text = "\0".join([code_stamp(), str(os.getuid()), repr(idle), *names])
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32]


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


def hand_over(state_dir: str, lock_fd: int, config: str) -> tuple[int, str]:
    """Ask the running server of *config* to serve *state_dir*, whose lock *lock_fd* holds.

    Returns ``(pid, "")`` when it took the directory (the caller closes its
    copy of the lock and exits), else ``(0, why not)``: no such server, it
    failed the peer checks, or it declined.
    """
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(_TIMEOUT)
        try:
            sock.connect(_address(config))
        except OSError:
            return 0, "no server of this configuration runs"
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
    finally:
        sock.close()
    if reply.get("adopted") is True and reply.get("pid") == pid:
        return pid, ""
    return 0, str(reply.get("refused", "no answer"))


def _reply(sock: _socket.socket) -> dict[str, object]:
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
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
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
        self.listener = _listen_at(self.path)
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
        try:
            if os.lstat(self.path).st_ino == self.socket_ino:
                os.unlink(self.path)
        except OSError:
            pass
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # releases the flock
            self.lock_fd = -1


def _listen_at(path: str) -> _socket.socket:
    """A non-blocking listener on the unix socket *path* (mode 0600), replacing a dead one.

    The caller holds the directory's lock; the umask is not touched (other
    threads run): the socket is 0600 at once after ``bind``, and until then
    it lies in the 0700 ``server/`` directory.
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
