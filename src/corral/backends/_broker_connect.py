"""The broker's ``connect()``: named unix sockets, judged by inode (see :mod:`._broker`).

With ``network.allowUnixSockets`` as a list, every ``connect()`` of the
sandbox is handed to the broker (:data:`~._seccomp_rules.CONNECT_BROKER_RULES`).

Rule: a ``connect()`` to a pathname unix socket succeeds only when the path,
resolved in the sandbox's view (its root and cwd, symlinks followed inside
that root, no magic links), is one of the named sockets' inodes. The mounts
that hide every other socket corral can list (docs/egress.md) stay as a
second layer; they cannot be complete on their own, because
``/proc/net/unix`` names a socket by the path it was bound with, which may be
relative, renamed or in another mount namespace.

Why it is complete: the broker never lets a ``connect()`` continue (the
kernel would read the address again, after the check, from memory the
sandbox controls). It reads the address once, takes the target's socket
(``pidfd_getfd``: the same open socket, not a copy) and connects it itself:

* to a pathname unix address: through an ``O_PATH`` descriptor of the inode
  it checked (``/proc/self/fd/N``), so the socket reached is the one judged;
* to anything else (abstract unix names, IPv4, IPv6, ...): to the same bytes.
  The socket keeps its own network namespace, so an abstract name or an
  address means what it means to the sandbox (none of the host's).

Datagram unix sockets, which reach a path by ``sendto()`` without a
``connect()``, are denied by the deny filter in this mode
(:func:`~._seccomp_rules.unix_datagram_rule`). A refused socket is answered
``ECONNREFUSED`` (as for a socket covered by a mount) and recorded as a
``network`` violation.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from ..pipeline._outcome import Violation
from ._broker_abi import (
    _RESOLVE_IN_ROOT,
    _RESOLVE_NO_MAGICLINKS,
    _SYS_SETFSGID,
    _SYS_SETFSUID,
    _signed_fd,
)
from ._broker_policy import _Policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes
    from collections.abc import Callable

__all__: list[str] = []

_AF_UNIX = 1
#: ``sizeof(struct sockaddr_storage)``: a longer address is EINVAL for the kernel too.
_MAX_ADDRESS = 128
#: setgroups(2), setresuid(2), setresgid(2), called raw: this thread only (glibc's
#: wrappers change every thread of the process).
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}
_SYS_SETRESUID = {"x86_64": 117, "aarch64": 147}
_SYS_SETRESGID = {"x86_64": 119, "aarch64": 149}
_CAP_SETGID, _CAP_SETUID = 6, 7


class _Connector(_Policy):
    """``connect()`` performed by the broker (named unix sockets)."""

    _allowed_sockets: frozenset[tuple[int, int]]

    def _load_named_sockets(self) -> None:
        """The inodes of ``spec.unix_sockets`` (a missing one allows nothing)."""
        found = set()
        for path in self._spec.unix_sockets:
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                found.add((st.st_dev, st.st_ino))
        self._allowed_sockets = frozenset(found)

    def _connect(self, pid: int, nid: int, args: tuple[int, ...]) -> int:
        """Judge and perform the target's ``connect(fd, addr, len)``; 0, or raises OSError."""
        length = args[2] & 0xFFFFFFFF
        if length < 2 or length > _MAX_ADDRESS:
            raise OSError(errno.EINVAL, "bad address length")
        raw = self._read_bytes(pid, nid, args[1], length)
        (family,) = struct.unpack_from("=H", raw)
        sock = self._dup_target_fd(pid, _signed_fd(args[0]))
        try:
            if family == _AF_UNIX and length > 2 and raw[2] != 0:
                name = raw[2:].split(b"\0", 1)[0]
                inode = self._socket_in_view(pid, nid, os.fsdecode(name))
                try:
                    self._as_sandbox_identity(
                        lambda: self._connect_fd(sock, b"/proc/self/fd/%d" % inode)
                    )
                finally:
                    os.close(inode)
            else:
                self._connect_raw(sock, raw)
        finally:
            os.close(sock)
        return 0

    def _socket_in_view(self, pid: int, nid: int, path: str) -> int:
        """An ``O_PATH`` fd of the named socket *path* resolves to in the target's view.

        Raises:
            OSError: ``ECONNREFUSED`` (recorded) for any other socket; the
                resolution's own error (``ENOENT``...) for a path that does
                not resolve in the sandbox's view.
        """

        def resolve() -> int:
            root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                if not self._id_valid(nid):
                    raise OSError(errno.ESRCH, "target went away")
                base = "/" if path.startswith("/") else self._cwd_of(pid)
                full = path if path.startswith("/") else base.rstrip("/") + "/" + path
                return self._openat2(
                    root_fd,
                    full.lstrip("/") or ".",
                    os.O_PATH,
                    _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS,
                )
            finally:
                os.close(root_fd)

        fd = self._as_tracer(resolve)  # ENOENT, ENOTDIR, ELOOP ...: as the kernel says them
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) not in self._allowed_sockets:
            os.close(fd)
            self._refused(pid, path)
        return fd

    def _as_sandbox_identity(self, action: Callable[[], None]) -> None:
        """Run *action* (the connect) with the identity the sandbox's processes have.

        A non-root caller's sandbox has this thread's uid, gid and groups
        (and this thread no effective capabilities): nothing to change. A
        root caller's runs as ``idmapped_id`` with no supplementary groups
        (docs/threat-model.md, "Never the host's root identity"). For the
        connect this thread takes the same effective uid and gid (so the
        socket's permission bits are checked as for the sandbox, and the
        server's ``SO_PEERCRED`` names that uid, not root) and no groups,
        then its own back. The raw system calls change this thread only.

        Raises:
            RuntimeError: this thread's identity could not be restored (the
                broker then fails, closed).
        """
        wanted = self._spec.idmapped_id
        if wanted is None:
            action()
            return
        import ctypes

        libc = self._libc
        assert libc is not None
        arch = self._arch

        def call(table: dict[str, int], *args: object) -> int:
            return int(libc.syscall(table[arch], *args))

        def set_effective(bits: int) -> None:
            try:
                self._set_effective(bits)
            except OSError as exc:  # never go on in a half-switched identity: fail closed
                raise RuntimeError(f"capset for the broker thread: {exc}") from exc

        own_fsuid, own_fsgid = call(_SYS_SETFSUID, -1), call(_SYS_SETFSGID, -1)
        own_egid = os.getegid()
        groups = os.getgroups()
        set_effective((1 << _CAP_SETUID) | (1 << _CAP_SETGID))
        try:
            if (
                call(_SYS_SETGROUPS, 0, None) != 0
                or call(_SYS_SETRESGID, -1, wanted, -1) != 0
                # the effective uid last: it clears this thread's effective capabilities
                or call(_SYS_SETRESUID, -1, wanted, -1) != 0
            ):
                raise OSError(ctypes.get_errno(), "the sandbox's identity for connect()")
            action()
        finally:
            # back to uid 0 (real and saved stayed 0): its effective set becomes the permitted
            set_effective((1 << _CAP_SETUID) | (1 << _CAP_SETGID))
            array = (ctypes.c_uint32 * max(1, len(groups)))(*groups)
            restored = (
                call(_SYS_SETRESUID, -1, 0, -1) == 0
                and call(_SYS_SETRESGID, -1, own_egid, -1) == 0
                and call(_SYS_SETGROUPS, len(groups), array) == 0
            )
            call(_SYS_SETFSGID, own_fsgid)
            call(_SYS_SETFSUID, own_fsuid)
            restored = (
                restored
                and call(_SYS_SETFSUID, -1) == own_fsuid
                and call(_SYS_SETFSGID, -1) == own_fsgid
            )
            set_effective(0)
            if not restored:
                raise RuntimeError("the broker thread's identity could not be restored")

    @staticmethod
    def _cwd_of(pid: int) -> str:
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError as exc:
            raise OSError(errno.ESRCH, "target went away") from exc
        if not cwd.startswith("/") or cwd.endswith(" (deleted)"):
            raise OSError(errno.ENOENT, "the working directory is gone")
        return cwd

    def _refused(self, pid: int, path: str) -> None:
        self.violations.append(
            Violation(
                kind="network",
                target=f"unix:{path}",
                rule="network.allowUnixSockets",
                operation="connect",
                pid=pid,
            )
        )
        raise OSError(errno.ECONNREFUSED, "not a named socket")

    def _connect_fd(self, sock: int, path: bytes) -> None:
        address = struct.pack("=H", _AF_UNIX) + path + b"\0"
        self._connect_raw(sock, address)

    def _connect_raw(self, sock: int, address: bytes) -> None:
        import ctypes

        libc: ctypes.CDLL | None = self._libc
        assert libc is not None
        buffer = ctypes.create_string_buffer(address, len(address))
        if libc.connect(ctypes.c_int(sock), buffer, ctypes.c_uint(len(address))) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
