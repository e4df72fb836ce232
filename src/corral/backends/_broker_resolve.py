"""The write broker's view of a target: its memory and its names (see :mod:`._broker`).

Reads path arguments from the target's memory (only while its notification
is still pending) and resolves ``(dirfd, path)`` exactly as the target would,
down to a supervised root and the broker's own writable fd for the parent
directory.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from ._broker_abi import (
    _AT_FDCWD,
    _IOCTL_ID_VALID,
    _MAX_PATH,
    _MAX_SYMLINK_HOPS,
    _RESOLVE_BENEATH,
    _RESOLVE_IN_ROOT,
    _RESOLVE_NO_MAGICLINKS,
    _RESOLVE_NO_SYMLINKS,
    _SYS_CAPSET,
    _SYS_OPENAT2,
    _SYS_PIDFD_GETFD,
    _SYS_RENAMEAT2,
    _SYS_UTIMENSAT,
    _TRACER_CAPS,
    _Continue,
    _other_file,
    _Resolved,
    _Root,
)
from ._plan import BrokerSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes
    from collections.abc import Callable
    from typing import TypeVar

    _T = TypeVar("_T")

__all__: list[str] = []


class _Resolver:
    """Target memory and name resolution; the state is set by :class:`~._broker.Broker`."""

    _spec: BrokerSpec
    _listener: int
    _mem_fds: dict[int, int]
    _libc: ctypes.CDLL | None
    _caps: ctypes.Array[ctypes.c_uint32] | None  # this thread's capabilities, effective 0
    _tracing: bool  # inside _as_tracer (capabilities raised)
    _arch: str
    _roots: list[_Root]

    def _as_tracer(self, fn: Callable[[], _T]) -> _T:
        """Call *fn* with the capabilities that reach into a sandbox of another uid.

        A root caller's sandbox runs as ``BrokerSpec.idmapped_id``: its
        ``/proc/<pid>/{mem,root,cwd,fd}`` are that uid's, and in its idmapped
        view root's directories are that uid's too. For looking (never for the
        operation itself, which runs with no capabilities) this thread raises
        CAP_SYS_PTRACE, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, then drops them.
        """
        if self._spec.idmapped_id is None or self._tracing:
            return fn()  # nested (resolution duplicates a dirfd): the outermost call drops
        self._set_effective(_TRACER_CAPS)
        self._tracing = True
        try:
            return fn()
        finally:
            self._tracing = False
            self._set_effective(0)

    def _set_effective(self, bits: int) -> None:
        """Make *bits* this thread's effective capabilities (from its permitted set).

        Raises:
            OSError: they could not be raised.
            RuntimeError: they could not be dropped (*bits* 0): never go on with
                capabilities raised - the broker fails, closed.
        """
        import ctypes

        libc, caps = self._libc, self._caps
        assert libc is not None
        assert caps is not None
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
        caps[0] = bits
        if libc.syscall(_SYS_CAPSET[self._arch], header, caps) != 0:
            if bits == 0:
                raise RuntimeError("capset (drop the effective capabilities) failed")
            raise OSError(ctypes.get_errno(), f"capset (raise the capabilities {bits:#x})")

    def _id_valid(self, notif_id: int) -> bool:
        import fcntl

        try:
            fcntl.ioctl(
                self._listener, _IOCTL_ID_VALID, bytearray(struct.pack("<Q", notif_id)), True
            )
        except OSError:
            return False
        return True

    # ------------------------------------------------------------ target memory
    def _mem_fd(self, pid: int, notif_id: int, *, fresh: bool = False) -> int:
        fd = self._mem_fds.get(pid)
        if fd is not None and fresh:
            os.close(self._mem_fds.pop(pid))
            fd = None
        if fd is None:
            if len(self._mem_fds) > 256:
                for old in self._mem_fds.values():
                    os.close(old)
                self._mem_fds.clear()
            fd = self._as_tracer(lambda: os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC))
            self._mem_fds[pid] = fd
        # The pid might have been reused between the notification and open():
        # only trust what we read if the notification is still pending.
        if not self._id_valid(notif_id):
            raise OSError(errno.ESRCH, "target went away")
        return fd

    def _pread(self, pid: int, notif_id: int, size: int, addr: int) -> bytes:
        """Read target memory; a cached /proc/<pid>/mem goes stale when the task execs
        (reads of a dead mm return nothing), so retry once with a fresh one."""
        for fresh in (False, True):
            fd = self._mem_fd(pid, notif_id, fresh=fresh)
            try:
                data = os.pread(fd, size, addr)
            except OSError:
                data = b""
            if data:
                return data
        raise OSError(errno.EFAULT, "unreadable argument")

    def _read_string(self, pid: int, notif_id: int, addr: int) -> str:
        if addr == 0:
            raise OSError(errno.EFAULT, "NULL path")
        chunks: list[bytes] = []
        total = 0
        while total <= _MAX_PATH:
            page_left = 4096 - (addr % 4096)
            data = self._pread(pid, notif_id, page_left, addr)
            if not data:
                raise OSError(errno.EFAULT, "unreadable path argument")
            cut = data.find(b"\x00")
            if cut >= 0:
                chunks.append(data[:cut])
                raw = b"".join(chunks)
                if len(raw) >= _MAX_PATH:
                    raise OSError(errno.ENAMETOOLONG, "path too long")
                return os.fsdecode(raw)
            chunks.append(data)
            total += len(data)
            addr += len(data)
        raise OSError(errno.ENAMETOOLONG, "path too long")

    def _read_bytes(self, pid: int, notif_id: int, addr: int, size: int) -> bytes:
        if size == 0:
            return b""
        if addr == 0:
            raise OSError(errno.EFAULT, "NULL buffer")
        data = self._pread(pid, notif_id, size, addr)
        if len(data) != size:
            raise OSError(errno.EFAULT, "short read of argument")
        return data

    # ------------------------------------------------------------ resolution
    def _syscall(self, name: str, *args: object) -> int:
        import ctypes

        libc = self._libc
        assert libc is not None
        table = {
            "openat2": _SYS_OPENAT2,
            "renameat2": _SYS_RENAMEAT2,
            "utimensat": _SYS_UTIMENSAT,
            "pidfd_getfd": _SYS_PIDFD_GETFD,
        }
        result = int(libc.syscall(table[name][self._arch], *args))
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return result

    def _openat2(self, dirfd: int, path: str, flags: int, resolve: int) -> int:
        import ctypes

        how = struct.pack("<QQQ", flags | os.O_CLOEXEC, 0, resolve)
        return self._syscall(
            "openat2", ctypes.c_int(dirfd), os.fsencode(path), how, ctypes.c_size_t(24)
        )

    def _base_path(self, pid: int, dirfd: int, path: str, root_fd: int) -> str:
        """The target's view of the directory *path* is relative to (or '/').

        A directory fd is known by its path text, so the text is checked
        against the open file itself: the broker takes a duplicate of the
        target's fd (``pidfd_getfd``) and requires the text, resolved in the
        target's root, to be that very directory. An fd the text does not
        name (received over ``SCM_RIGHTS`` from another mount namespace, or a
        directory moved meanwhile) is left to the kernel, which acts on the
        real file under the read-only mount (or Landlock) - never redirected
        to whatever the text names in a supervised root.
        """
        if path.startswith("/"):
            return "/"
        if dirfd == _AT_FDCWD or dirfd == (_AT_FDCWD & 0xFFFFFFFF):
            link = f"/proc/{pid}/cwd"
        else:
            link = f"/proc/{pid}/fd/{dirfd}"
        try:
            base = os.readlink(link)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise OSError(errno.EBADF, "bad directory fd") from exc
            raise
        if not base.startswith("/") or base.endswith(" (deleted)"):
            raise _Continue
        if link.endswith("/cwd"):
            return base
        theirs = self._dup_target_fd(pid, dirfd)
        try:
            try:
                named = self._openat2(
                    root_fd,
                    base.lstrip("/") or ".",
                    os.O_PATH | os.O_DIRECTORY,
                    _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS,
                )
            except OSError:
                raise _Continue from None
            try:
                a, b = os.fstat(theirs), os.fstat(named)
            finally:
                os.close(named)
        finally:
            os.close(theirs)
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
            raise _Continue
        return base

    def _dup_target_fd(self, pid: int, fd: int) -> int:
        """A duplicate of the target's open file *fd* (``pidfd_getfd``)."""
        import ctypes

        pidfd = os.pidfd_open(pid)
        try:
            return self._as_tracer(
                lambda: self._syscall(
                    "pidfd_getfd", ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0)
                )
            )
        finally:
            os.close(pidfd)

    def _resolve(
        self, pid: int, notif_id: int, dirfd: int, path: str, *, follow: bool
    ) -> _Resolved:
        """:meth:`_resolve_as_target`, with :meth:`_as_tracer`'s capabilities."""
        return self._as_tracer(
            lambda: self._resolve_as_target(pid, notif_id, dirfd, path, follow=follow)
        )

    def _resolve_as_target(
        self, pid: int, notif_id: int, dirfd: int, path: str, *, follow: bool
    ) -> _Resolved:
        """Resolve (dirfd, path) as the target would, down to a supervised root.

        Raises:
            _Continue: the name is not in a supervised root, or does not
                resolve; the kernel may handle it (read-only backstop).
        """
        if not path:
            raise _Continue
        root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if not self._id_valid(notif_id):
                raise OSError(errno.ESRCH, "target went away")
            current = (
                path
                if path.startswith("/")
                else self._base_path(pid, dirfd, path, root_fd).rstrip("/") + "/" + path
            )
            for _hop in range(_MAX_SYMLINK_HOPS):
                resolved = self._resolve_once(root_fd, current)
                if not follow:
                    return resolved
                try:
                    st = os.stat(resolved.name, dir_fd=resolved.parent_fd, follow_symlinks=False)
                except FileNotFoundError:
                    return resolved
                if not stat.S_ISLNK(st.st_mode):
                    return resolved
                target = os.readlink(resolved.name, dir_fd=resolved.parent_fd)
                parent = resolved.sandbox_path.rsplit("/", 1)[0] or "/"
                os.close(resolved.parent_fd)
                current = target if target.startswith("/") else parent.rstrip("/") + "/" + target
            raise OSError(errno.ELOOP, "too many levels of symbolic links")
        finally:
            os.close(root_fd)

    def _resolve_once(self, root_fd: int, sandbox_abs: str) -> _Resolved:
        parent, _, name = sandbox_abs.rstrip("/").rpartition("/")
        if name in ("", ".", ".."):
            raise _Continue
        try:
            sandbox_parent_fd = self._openat2(
                root_fd,
                parent.lstrip("/") or ".",
                os.O_PATH | os.O_DIRECTORY,
                _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS,
            )
        except OSError as exc:
            raise _Continue from exc
        try:
            parent_path = os.readlink(f"/proc/self/fd/{sandbox_parent_fd}")
            root = self._root_for(parent_path)
            if root is None:
                raise _Continue
            rel_parent = parent_path[len(root.sandbox_path) :].strip("/")
            try:
                host_parent_fd = self._openat2(
                    root.host_fd,
                    rel_parent or ".",
                    os.O_PATH | os.O_DIRECTORY,
                    _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
                )
            except OSError as exc:
                raise _Continue from exc
            a = os.fstat(sandbox_parent_fd)
            b = os.fstat(host_parent_fd)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                os.close(host_parent_fd)
                raise _Continue  # a mount inside the root (e.g. a masked path): kernel decides
            if _other_file(sandbox_parent_fd, host_parent_fd, name):
                os.close(host_parent_fd)
                # the sandbox sees another file under this name (a mask mounted over
                # a secret): never act on the host's file; the kernel acts on the mask
                raise _Continue
            rel = f"{rel_parent}/{name}" if rel_parent else name
            return _Resolved(root, host_parent_fd, name, rel)
        finally:
            os.close(sandbox_parent_fd)

    def _root_for(self, sandbox_path: str) -> _Root | None:
        for root in self._roots:
            base = root.sandbox_path
            if sandbox_path == base or sandbox_path.startswith(base.rstrip("/") + "/"):
                return root
        return None
