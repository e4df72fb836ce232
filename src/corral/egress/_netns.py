"""A listening TCP socket inside a sandbox's network namespace, created from the host side.

The sandbox (``network.mode = "allowlist"``) has its own network namespace
with nothing but loopback. corral creates the proxy's listening socket *in
that namespace* and keeps the file descriptor: ``accept()`` works on it from
the host side, so the sandbox reaches the proxy at ``127.0.0.1:PORT`` on its
own loopback, with no helper binary inside and no host socket exposed to it.

A socket belongs to the namespace its creator was in when ``socket()`` was
called, so the creator must enter the sandbox's namespace first:

* with ``CAP_SYS_ADMIN`` over the namespace (root): a short-lived thread
  calls ``setns(CLONE_NEWNET)`` (namespaces are per thread), creates the
  socket and exits (:func:`_listen_from_thread`);
* otherwise the owner of the sandbox's user namespace must join that user
  namespace first, which the kernel allows only to a single-threaded
  process. A tiny spawned interpreter (``python -I -S``) joins the user and
  network namespaces, creates the socket and sends it back over
  ``SCM_RIGHTS`` (:func:`_listen_from_child`; ~10 ms, only for non-root).

Only light modules are imported (``_socket``, ``_thread``, ``os``): this runs
on the ``corral run`` path before the command is released.
"""

from __future__ import annotations

import os
import sys

from .._exceptions import ProxyStartFailed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    T = TypeVar("T")

__all__ = ["fresh_listener", "listen_in", "open_listener"]

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_NS_GET_USERNS = 0xB701  # ioctl: the user namespace owning a namespace
_IP_FREEBIND = 15
_SOL_IP = 0
_BACKLOG = 4096
_EPERM = 1
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

#: Run by ``python -I -S -c`` in the non-root case. fds: 3 reply socket,
#: 4 owning user namespace, 5 network namespace; argv[1]: the port.
_CHILD_CODE = r"""
import os, sys, _socket
reply = _socket.socket(fileno=3)
try:
    if hasattr(os, "setns"):
        setns = os.setns
    else:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        def setns(fd, kind):
            if libc.setns(fd, kind) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
    setns(4, 0x10000000)
    setns(5, 0x40000000)
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    s.setsockopt(0, 15, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen(4096)
    fd = s.fileno().to_bytes(4, sys.byteorder)
    reply.sendmsg([b"K"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fd)])
except OSError as exc:
    reply.send(("E" + str(exc)).encode())
"""


def _setns(fd: int, kind: int) -> None:
    setns = getattr(os, "setns", None)
    if setns is not None:  # Python 3.12+
        setns(fd, kind)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, kind) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _unshare_net() -> None:
    unshare = getattr(os, "unshare", None)
    if unshare is not None:  # Python 3.12+
        unshare(_CLONE_NEWNET)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _loopback_up() -> None:
    """Bring ``lo`` up in the calling thread's (new) network namespace."""
    import _socket
    import fcntl
    import struct

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))
    finally:
        sock.close()


def _bind_listener(port: int) -> int:
    """Create, bind and listen in the calling thread's network namespace; return the fd."""
    import _socket

    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    try:
        # bubblewrap brings loopback up itself; FREEBIND keeps a bind that
        # races with it from failing with EADDRNOTAVAIL.
        sock.setsockopt(_SOL_IP, _IP_FREEBIND, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    fd: int = sock.detach()
    os.set_inheritable(fd, False)
    return fd


def _in_thread(work: Callable[[], T], timeout: float, what: str) -> T:
    """Run *work* in a throw-away thread and return its result (or raise its error).

    For namespace changes that are per thread (``setns``/``unshare`` of
    ``CLONE_NEWNET``): the thread does nothing else and exits, so no other
    code ever runs in the namespace it entered. *what* names the step in the
    error when it does not finish within *timeout* seconds.
    """
    import _thread

    done = _thread.allocate_lock()
    done.acquire()
    result: list[T | BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # reported to the caller below
            result.append(exc)
        finally:
            done.release()

    _thread.start_new_thread(run, ())
    if not done.acquire(timeout=timeout):
        raise ProxyStartFailed(f"Failed to start the egress proxy: {what} timed out")
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _listen_from_thread(netns_fd: int, port: int, timeout: float) -> int:
    """Root path: a throw-away thread enters the namespace and creates the socket."""

    def work() -> int:
        _setns(netns_fd, _CLONE_NEWNET)
        return _bind_listener(port)

    return _in_thread(work, timeout, "entering the sandbox's network")


def _listen_from_child(netns_fd: int, pid: int, port: int, timeout: float) -> int:
    """Non-root path: a spawned single-threaded interpreter joins the namespaces."""
    import _socket
    import fcntl
    import select

    try:
        userns_fd = fcntl.ioctl(netns_fd, _NS_GET_USERNS)
    except OSError:
        userns_fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    # copies above 9 first, so that no source fd is the target of another dup2
    sources = [
        fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (theirs.fileno(), userns_fd, netns_fd)
    ]
    try:
        actions = [
            (os.POSIX_SPAWN_DUP2, fd, number) for fd, number in zip(sources, (3, 4, 5), strict=True)
        ]
        child = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", "-c", _CHILD_CODE, str(port)],
            {},
            file_actions=actions,
        )
    finally:
        for fd in sources:
            os.close(fd)
        theirs.close()
        os.close(userns_fd)
    try:
        poller = select.poll()
        poller.register(ours.fileno(), select.POLLIN)
        if not poller.poll(timeout * 1000):
            raise ProxyStartFailed(
                "Failed to start the egress proxy: the namespace helper did not answer"
            )
        message, ancdata, _flags, _addr = ours.recvmsg(4096, _socket.CMSG_SPACE(4))
        for level, kind, data in ancdata:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS and len(data) >= 4:
                fd = int.from_bytes(data[:4], sys.byteorder, signed=True)
                os.set_inheritable(fd, False)
                return fd
        text = message.decode("utf-8", "replace")[1:] or "it exited without an answer"
        raise ProxyStartFailed(
            f"Failed to start the egress proxy inside the sandbox's network: {text}"
        )
    finally:
        ours.close()
        try:
            os.waitpid(child, 0)
        except ChildProcessError:
            pass


def open_listener(pid: int, port: int, *, timeout: float = 10.0) -> int:
    """Listen on ``127.0.0.1:port`` inside the network namespace of *pid*; return the fd.

    Raises:
        ProxyStartFailed: the namespace is corral's own (the sandbox has no
            network of its own: listening there would expose the proxy on the
            host), or it could not be entered, or the port is taken.
    """
    try:
        netns_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ProxyStartFailed(
            "Failed to start the egress proxy: cannot open the sandbox's network namespace "
            f"({exc.strerror})"
        ) from exc
    try:
        theirs, ours = os.fstat(netns_fd), os.stat("/proc/thread-self/ns/net")
        if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
            raise ProxyStartFailed(
                "Failed to start the egress proxy: the sandbox shares corral's network namespace",
                hint="allowlist mode needs a backend that gives the sandbox its own network",
            )
        try:
            return _listen_from_thread(netns_fd, port, timeout)
        except PermissionError as exc:
            if exc.errno != _EPERM:
                raise
        return _listen_from_child(netns_fd, pid, port, timeout)
    except ProxyStartFailed:
        raise
    except OSError as exc:
        raise ProxyStartFailed(
            f"Failed to start the egress proxy on 127.0.0.1:{port} inside the sandbox: "
            f"{exc.strerror or exc}"
        ) from exc
    finally:
        os.close(netns_fd)


def fresh_listener(port: int, *, timeout: float = 10.0) -> tuple[int, int]:
    """A new, empty network namespace with the proxy's socket listening inside.

    For backends that cannot be given a namespace after they start (podman
    joins one by path, ``--network=ns:PATH``): a throw-away thread unshares
    a new network namespace, brings its loopback up, listens on
    ``127.0.0.1:port`` and opens the namespace. Root only (unsharing a
    network namespace needs ``CAP_SYS_ADMIN``).

    Returns:
        ``(netns_fd, listener_fd)``: the namespace lives while either is
        open; ``/proc/<corral's pid>/fd/<netns_fd>`` names it to others.

    Raises:
        ProxyStartFailed: the namespace or the socket could not be made.
    """

    def work() -> tuple[int, int]:
        _unshare_net()
        _loopback_up()
        listener = _bind_listener(port)
        try:
            return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC), listener
        except BaseException:
            os.close(listener)
            raise

    try:
        return _in_thread(work, timeout, "creating its network namespace")
    except PermissionError as exc:
        raise ProxyStartFailed(
            "Failed to start the egress proxy: creating a network namespace needs root",
            hint="use the bubblewrap backend for network.mode=allowlist",
        ) from exc
    except OSError as exc:
        raise ProxyStartFailed(
            f"Failed to start the egress proxy in a new network namespace: {exc.strerror or exc}"
        ) from exc


def listen_in(netns_fd: int, port: int, *, timeout: float = 10.0) -> int:
    """Listen on ``127.0.0.1:port`` in the namespace *netns_fd* (one :func:`fresh_listener` made).

    Root only, like :func:`fresh_listener`.

    Raises:
        ProxyStartFailed: the port is taken or the namespace cannot be entered.
    """
    try:
        return _listen_from_thread(netns_fd, port, timeout)
    except OSError as exc:
        raise ProxyStartFailed(
            f"Failed to forward 127.0.0.1:{port} into the sandbox: {exc.strerror or exc}"
        ) from exc
