"""The write broker: protected paths at any depth, existing or not.

Problem. Mount tricks can only protect files that exist when the sandbox
starts: bind-mounting ``.git/hooks`` read-only does nothing for a
``vendor/lib/.git/hooks/pre-commit`` created later, nor for a new
``sub/.bashrc``. Name-based rules at any depth need a decision per operation.

Design (docs/design.md, "The write broker"):

1. Every *supervised root* (the workspace, and any writable path the
   protection patterns apply to) is mounted **read-only** inside the sandbox.
   The kernel therefore refuses every write there by itself; this is the
   backstop that makes the rest safe.
2. The exec helper installs a seccomp filter (:data:`BROKER_RULES`) that
   hands every name-changing syscall (open for writing, creat, mkdir, mknod,
   symlink, link, rename, unlink, rmdir, chmod, chown, truncate, utimes,
   xattrs) to this broker through ``SECCOMP_RET_USER_NOTIF``.
3. For each notification the broker reads the path arguments *once* from the
   target's memory, resolves them in the target's view (its root, cwd and
   fds, ``RESOLVE_IN_ROOT``), and checks whether the result lies in a
   supervised root.

   * If not (``/tmp``, ``/dev/stdout``, a path that does not resolve), it
     lets the syscall **continue**. A malicious thread could change the path
     in memory after the check, but whatever the kernel then resolves is
     subject to the read-only mount: the worst case is ``EROFS``.
   * If yes, it checks ``filesystem.protect`` and ``denyWrite`` against the
     workspace-relative path, and either refuses (``EPERM``, recorded as a
     violation) or **performs the operation itself** on the host's writable
     view of the same directory (verified to be the same inode), using the
     path it checked. The result (a file descriptor for opens, injected with
     ``SECCOMP_IOCTL_NOTIF_ADDFD``) is returned to the target.

4. One broker thread serves one sandbox and handles notifications one at a
   time, so no name operation of the sandbox can interleave between a check
   and the operation it approved.
5. Every operation it performs is journaled (:class:`~._gitcheck.Journal`):
   a repository the run created is exempt from the ``protect`` rows about
   git, and when the run is over (:meth:`Broker.stop`) the git check
   validates what git would discover where the run wrote (see
   :mod:`corral.backends._gitcheck`).

SAFETY: the broker thread runs with the same uid as the sandboxed processes
and with its effective capabilities dropped (``capset`` is per thread), and
its own ``umask`` (``unshare(CLONE_FS)``) set to the target's before each
create, so an emulated operation is allowed exactly when the kernel would
allow it to the target, minus the read-only mount. Set-user-ID bits are
refused by the deny filter before they reach the broker.
"""

from __future__ import annotations

import _thread
import errno
import os
import stat
import struct

from ..pipeline._outcome import Violation
from ..policy._glob import PathPattern
from ._gitcheck import Journal
from ._plan import BrokerSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes

__all__ = ["Broker"]

# ------------------------------------------------------------------ kernel ABI
_NOTIF_SIZE = 80  # struct seccomp_notif: id u64, pid u32, flags u32, seccomp_data (64)
_RESP_SIZE = 24  # struct seccomp_notif_resp: id u64, val s64, error s32, flags u32
_ADDFD_SIZE = (
    24  # struct seccomp_notif_addfd: id u64, flags u32, srcfd u32, newfd u32, newfd_flags u32
)


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("!") << 8) | nr


def _iow(nr: int, size: int) -> int:
    return (1 << 30) | (size << 16) | (ord("!") << 8) | nr


_IOCTL_RECV = _iowr(0, _NOTIF_SIZE)
_IOCTL_SEND = _iowr(1, _RESP_SIZE)
_IOCTL_ID_VALID = _iow(2, 8)
_IOCTL_ADDFD = _iow(3, _ADDFD_SIZE)
_RESP_FLAG_CONTINUE = 1
_ADDFD_FLAG_SEND = 1 << 1

_AT_FDCWD = -100
_AT_SYMLINK_NOFOLLOW = 0x100
_AT_REMOVEDIR = 0x200
_AT_SYMLINK_FOLLOW = 0x400
_AT_EMPTY_PATH = 0x1000
_O_TMPFILE = 0o20000000 | os.O_DIRECTORY
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _RENAME_WHITEOUT = 1, 2, 4
_RESOLVE_NO_XDEV, _RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS = 0x01, 0x02, 0x04
_RESOLVE_BENEATH, _RESOLVE_IN_ROOT = 0x08, 0x10
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}
_SYS_CAPGET = {"x86_64": 125, "aarch64": 90}
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_SYS_UNSHARE = {"x86_64": 272, "aarch64": 97}
_SYS_UTIMENSAT = {"x86_64": 280, "aarch64": 88}
_SYS_PIDFD_GETFD = {"x86_64": 438, "aarch64": 438}
#: Calls that change metadata rather than names. Landlock does not govern
#: them, so with ``confine_metadata`` they are refused outside the roots.
_FD_METADATA_CALLS = frozenset({"fchmod", "fchown", "fsetxattr", "fremovexattr"})
_METADATA_CALLS = _FD_METADATA_CALLS | frozenset(
    {
        "chmod",
        "fchmodat",
        "fchmodat2",
        "chown",
        "lchown",
        "fchownat",
        "utime",
        "utimes",
        "futimesat",
        "utimensat",
        "setxattr",
        "lsetxattr",
        "removexattr",
        "lremovexattr",
        "truncate",
        "setxattrat",
        "removexattrat",
        "file_setattr",
    }
)
_CLONE_FS = 0x00000200
_MAX_PATH = 4096
_MAX_XATTR = 65536
_MAX_SYMLINK_HOPS = 40
_RENAME_WALK_LIMIT = 200_000
_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2


class _Denied(Exception):
    """A policy refusal: respond EPERM and record the violation."""

    def __init__(self, target: str, rule: str) -> None:
        super().__init__(target)
        self.target = target
        self.rule = rule


class _Continue(Exception):
    """Not ours to decide: let the kernel run the syscall (the read-only mount still holds)."""


class _Root:
    """A supervised root: where the sandbox sees it, and our writable fd to it."""

    __slots__ = ("host_fd", "sandbox_path")

    def __init__(self, sandbox_path: str, host_fd: int) -> None:
        self.sandbox_path = sandbox_path.rstrip("/") or "/"
        self.host_fd = host_fd


class _Resolved:
    """A name in a supervised root: our fd for its parent dir, and its paths."""

    __slots__ = ("name", "parent_fd", "rel", "root", "sandbox_path")

    def __init__(self, root: _Root, parent_fd: int, name: str, rel: str) -> None:
        self.root = root
        self.parent_fd = parent_fd
        self.name = name
        self.rel = rel
        self.sandbox_path = root.sandbox_path.rstrip("/") + "/" + rel if rel else root.sandbox_path


class Broker:
    """Serve one sandbox's seccomp notifications on a background thread.

    Usage::

        broker = Broker(spec)
        broker.start()                       # thread starts, loads ctypes, waits
        broker.attach(listener_fd)           # takes ownership; serving begins
        ...                                  # the sandbox runs
        broker.stop()                        # after the sandbox exited
        broker.violations                    # what was refused
        broker.error                         # an internal failure, if any

    If the broker fails internally it closes the listener; the kernel then
    fails every further supervised syscall with ``ENOSYS`` (fail closed) and
    :attr:`error` holds the cause.
    """

    def __init__(self, spec: BrokerSpec) -> None:
        self._spec = spec
        self._listener = -1
        self._attached = _thread.allocate_lock()
        self._attached.acquire()
        self._patterns = [(PathPattern(p), label) for p, label in spec.patterns]
        # protect rows about git's administrative files: a repository the run
        # created is its own to write (the git check validates it afterwards)
        self._git_rows = {
            label
            for p, label in spec.patterns
            if label.startswith("filesystem.protect:")
            and any(part in (".git", ".gitmodules") for part in p.split("/"))
        }
        self.journal = Journal()
        self._names = dict(spec.syscall_names)
        self._roots: list[_Root] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        # _thread, not threading: the import alone would cost ~3 ms of start-up
        self._done = _thread.allocate_lock()
        self._started = False
        self._mem_fds: dict[int, int] = {}
        self.violations: list[Violation] = []
        self.error: BaseException | None = None
        self.handled = 0
        self._arch = os.uname().machine
        self._libc: ctypes.CDLL | None = None
        self._stopping = False

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Open the supervised roots and start the thread (it waits for :meth:`attach`).

        With ``spec.launcher_ns`` the roots are opened in :meth:`attach`
        instead: they are mounted (a preview's overlay) only once the
        launched process has set up its mount namespace.
        """
        if not self._spec.launcher_ns:
            self._open_roots("")
        self._done.acquire()
        self._started = True
        _thread.start_new_thread(self._main, ())

    def _open_roots(self, prefix: str) -> None:
        for sandbox_path, host_path in self._spec.roots:
            fd = os.open(prefix + host_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            self._roots.append(_Root(sandbox_path, fd))
        # Longest sandbox path first, so nested roots win.
        self._roots.sort(key=lambda r: len(r.sandbox_path), reverse=True)
        for root in self._roots:
            if root.sandbox_path not in self._spec.open_roots:
                self._protect_trusted_hook_paths(root)

    def _protect_trusted_hook_paths(self, root: _Root) -> None:
        """Protect what the root's own repository config names as code (``core.hooksPath``,
        a ``core.fsmonitor`` program) when it lies inside the root (``.githooks``, husky's
        directory): the user's trusted config runs whatever is planted there.

        Only the repository at the root is read (its ``.git/config``, never through a
        symlink); git parses it only when one of the two keys is spelled in it.
        """
        from ._gitcheck import trusted_code_paths

        try:
            git_fd = os.open(
                ".git",
                os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=root.host_fd,
            )
        except OSError:
            return
        try:
            fd = os.open(
                "config", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=git_fd
            )
        except OSError:
            return
        finally:
            os.close(git_fd)
        try:
            data = os.read(fd, 1 << 20) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
        for rel in trusted_code_paths(data, root.sandbox_path):
            label = f"git: a path the repository's config runs code from: {rel}"
            try:
                self._patterns += [(PathPattern(rel), label), (PathPattern(rel + "/**"), label)]
            except ValueError:
                continue

    def attach(self, listener_fd: int, *, launcher_pid: int = -1) -> None:
        """Hand over the seccomp listener; the thread starts serving it.

        *launcher_pid* is the launched process (bubblewrap's monitor), whose
        mount namespace holds the roots when ``spec.launcher_ns`` is set: the
        roots are opened through ``/proc/<launcher_pid>/root``. If that fails
        the listener is closed (supervised syscalls fail with ``ENOSYS``) and
        :attr:`error` says why - unless the launcher has exited already (a
        short command can be over before its listener arrives): then nothing
        is left to supervise.
        """
        self._listener = listener_fd
        if self._spec.launcher_ns:
            problem = self._open_launcher_roots(launcher_pid)
            if problem is not None:
                self.error = problem
            if problem is not None or not self._roots:
                self._close_listener()
        self._attached.release()

    def _open_launcher_roots(self, pid: int) -> OSError | None:
        """Open the roots through the launcher's root; ``None`` if done or if the sandbox is over.

        A launcher that is exiting loses its root (ENOENT) well before it
        becomes a zombie (its mount namespace is torn down in between). It
        exits only after the sandbox did, and then every task using the
        filter is gone: the listener reports a hang-up. So a failure counts
        only while the listener is alive and the launcher is not a zombie.
        """
        import time

        if pid <= 0:
            return OSError(errno.ESRCH, "no launcher pid for a launcher-namespace root")
        deadline = time.monotonic() + 0.5
        while True:
            try:
                self._open_roots(f"/proc/{pid}/root")
                return None
            except OSError as exc:
                for root in self._roots:
                    os.close(root.host_fd)
                self._roots = []
                if _exited(pid) or _hung_up(self._listener):
                    return None  # the sandbox is over: nothing left to supervise
                if time.monotonic() > deadline:
                    return exc
                time.sleep(0.002)

    def _main(self) -> None:
        try:
            self._run()
        finally:
            self._done.release()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and release every fd (idempotent)."""
        self._stopping = True
        if self._listener < 0 and self._attached.locked():
            self._attached.release()  # never attached: let the thread exit
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._started and self._done.acquire(True, timeout):
            self._done.release()
            self._check_git()
        for fd in [
            self._listener,
            self._wake_r,
            self._wake_w,
            *(r.host_fd for r in self._roots),
            *self._mem_fds.values(),
        ]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._listener = self._wake_r = self._wake_w = -1
        self._roots = []
        self._mem_fds.clear()

    def _check_git(self) -> None:
        """Run the git check over what this run touched (all its processes are gone)."""
        from ._gitcheck import check_root

        others = tuple(r.sandbox_path for r in self._roots) + tuple(self._spec.open_roots)
        for root in self._roots:
            if root.sandbox_path in self._spec.open_roots:
                continue
            if root.sandbox_path not in self.journal.roots():
                continue
            try:
                findings = check_root(
                    root.host_fd,
                    root.sandbox_path,
                    self.journal,
                    tuple(o for o in others if o != root.sandbox_path),
                )
            except Exception as exc:  # never lose the run's result; report the failure
                self.error = self.error or exc
                continue
            self.violations.extend(
                Violation(
                    kind="fs-write",
                    target=f.path,
                    rule=f"git: {f.reason}; quarantined as {f.quarantined_as}",
                    operation="git-check",
                )
                for f in findings
            )

    # ------------------------------------------------------------ thread body
    def _run(self) -> None:
        import fcntl
        import select

        self._attached.acquire()
        if self._stopping or self._listener < 0:
            self._close_listener()
            return
        poller = select.poll()
        poller.register(self._listener, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        notif = bytearray(_NOTIF_SIZE)
        try:
            while not self._stopping:
                events = poller.poll()
                for fd, mask in events:
                    if fd == self._wake_r:
                        return
                    if mask & select.POLLIN:
                        if self._libc is None:
                            # ctypes is loaded on the first notification only: runs
                            # that never write the workspace do not pay for it
                            self._load_native()
                        notif[:] = bytes(_NOTIF_SIZE)
                        try:
                            fcntl.ioctl(self._listener, _IOCTL_RECV, notif, True)
                        except OSError as exc:
                            if exc.errno in (errno.ENOENT, errno.EINTR):
                                continue  # the target died before we read it
                            raise
                        self._handle(bytes(notif), fcntl)
                    elif mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        return  # every task that used the filter is gone
        except BaseException as exc:
            self.error = exc
        finally:
            self._close_listener()

    def _load_native(self) -> None:
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._isolate_thread()

    def _close_listener(self) -> None:
        if self._listener >= 0:
            try:
                os.close(self._listener)
            except OSError:
                pass
            self._listener = -1

    def _isolate_thread(self) -> None:
        """Give this thread its own umask and no effective capabilities.

        SAFETY: both calls affect only the calling thread. After them, an
        emulated operation gets the same permission checks the sandboxed
        process would (same uid, no capabilities), and os.umask here does not
        change the umask of corral's other threads.
        """
        import ctypes

        libc = self._libc
        assert libc is not None
        if libc.syscall(_SYS_UNSHARE[self._arch], _CLONE_FS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_FS) for the broker thread")
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
        data = (ctypes.c_uint32 * 6)()
        if libc.syscall(_SYS_CAPGET[self._arch], header, data) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        data[0] = data[3] = 0  # effective, both 32-bit words
        if libc.syscall(_SYS_CAPSET[self._arch], header, data) != 0:
            raise OSError(ctypes.get_errno(), "capset (drop effective capabilities)")

    # ------------------------------------------------------------ one notification
    def _handle(self, raw: bytes, fcntl: object) -> None:
        notif_id, pid, _flags, nr, _arch, _ip = struct.unpack_from("<QIIiIQ", raw, 0)
        args = struct.unpack_from("<6Q", raw, 32)
        self.handled += 1
        name = self._names.get(nr, "")
        try:
            try:
                result = self._dispatch(name, pid, notif_id, args)
            except _Continue:
                if not (self._spec.confine_metadata and name in _METADATA_CALLS):
                    raise
                # No read-only mount backs this backend up: a metadata change
                # outside the supervised roots is refused, never continued.
                raise _Denied(
                    self._describe_target(pid, notif_id, name, args),
                    "filesystem: outside the writable areas",
                ) from None
        except _Continue:
            self._respond(notif_id, 0, 0, _RESP_FLAG_CONTINUE)
            return
        except _Denied as denied:
            self.violations.append(
                Violation(
                    kind="fs-write",
                    target=denied.target,
                    rule=denied.rule,
                    operation=name or str(nr),
                    pid=pid,
                )
            )
            self._respond(notif_id, 0, -errno.EPERM, 0)
            return
        except OSError as exc:
            code = exc.errno or errno.EIO
            if code == errno.ESRCH or not self._id_valid(notif_id):
                return  # the target is gone; nothing to answer
            self._respond(notif_id, 0, -code, 0)
            return
        if isinstance(result, _FdResult):
            self._send_fd(notif_id, result)
        else:
            self._respond(notif_id, result, 0, 0)

    def _respond(self, notif_id: int, val: int, error: int, flags: int) -> None:
        import fcntl

        resp = bytearray(struct.pack("<QqiI", notif_id, val, error, flags))
        try:
            fcntl.ioctl(self._listener, _IOCTL_SEND, resp, True)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the target died meanwhile
                raise

    def _send_fd(self, notif_id: int, result: _FdResult) -> None:
        import fcntl

        addfd = bytearray(
            struct.pack(
                "<QIIII",
                notif_id,
                _ADDFD_FLAG_SEND,
                result.fd,
                0,
                os.O_CLOEXEC if result.cloexec else 0,
            )
        )
        try:
            fcntl.ioctl(self._listener, _IOCTL_ADDFD, addfd, True)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                # Could not install the fd (e.g. EMFILE): report that errno.
                self._respond(notif_id, 0, -(exc.errno or errno.EIO), 0)
        finally:
            os.close(result.fd)

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
            fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
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
            return self._syscall(
                "pidfd_getfd", ctypes.c_int(pidfd), ctypes.c_int(fd), ctypes.c_uint(0)
            )
        finally:
            os.close(pidfd)

    def _resolve(
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

    # ------------------------------------------------------------ policy
    def _check(self, resolved: _Resolved) -> None:
        """Refuse if the resolved name is protected or write-denied."""
        if resolved.root.sandbox_path in self._spec.open_roots:
            return
        label = self._denied_by(resolved.rel, resolved.sandbox_path, resolved)
        if label is not None:
            raise _Denied(resolved.sandbox_path, label)

    def _denied_by(
        self, rel: str, sandbox_path: str, resolved: _Resolved | None = None
    ) -> str | None:
        """The label of the first row that refuses *rel*; with *resolved*, a repository
        the run created is exempt from the git rows (see :meth:`_own_repository`)."""
        for pattern, label in self._patterns:
            if pattern.matches(sandbox_path if pattern.absolute else rel):
                if (
                    resolved is not None
                    and label in self._git_rows
                    and self._own_repository(resolved)
                ):
                    continue
                return label
        return None

    def _own_repository(self, r: _Resolved) -> bool:
        """Whether *r* belongs to a repository this run created (its own to write).

        * the ``.git`` entry itself: when it does not exist yet or was created
          in this run (deleting or replacing a pre-existing one is refused: that
          also keeps a later run's workspace root where it was);
        * a name inside a ``.git`` directory: when its parent directory is new
          (the ``.git`` directory, or e.g. ``.git/modules/<name>``, was created
          in this run);
        * a name beside it (``.gitmodules``): when that ``.git`` is new.

        The git check validates what such a repository holds after the run.
        """
        root = r.root.sandbox_path
        parts = r.rel.split("/")
        parent = "/".join(parts[:-1])
        if parts[-1] == ".git":
            if self.journal.is_new(root, r.rel):
                return True
            try:
                os.stat(r.name, dir_fd=r.parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                return True
            return False
        if ".git" in parts[:-1]:
            return self.journal.is_new(root, parent)
        return self.journal.is_new(root, (parent + "/" if parent else "") + ".git")

    def _check_single_link(self, r: _Resolved, st: os.stat_result | None = None) -> None:
        """Refuse to change a file that has other hard links.

        A hard link is another name for the same inode; a name in the workspace
        can belong to a file whose other names lie outside it (a package
        store, or a link planted before the run). Writing, truncating or
        changing the metadata of such a file would change it everywhere.
        Names themselves (unlink, rename) stay free to change.
        """
        if st is None:
            try:
                st = os.stat(r.name, dir_fd=r.parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                return
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise _Denied(
                r.sandbox_path,
                "filesystem: the file has other hard links, possibly outside the writable area",
            )

    def _check_subtree_move(self, src: _Resolved, dst: _Resolved) -> None:
        """Moving a directory must not change whether anything below it is protected."""
        try:
            st = os.stat(src.name, dir_fd=src.parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode) or src.root.sandbox_path in self._spec.open_roots:
            return
        if not any(
            p.could_match_below(src.sandbox_path if p.absolute else src.rel)
            or p.could_match_below(dst.sandbox_path if p.absolute else dst.rel)
            for p, _ in self._patterns
        ):
            return
        top = f"/proc/self/fd/{src.parent_fd}/{src.name}"
        seen = 0
        for dirpath, dirnames, filenames in os.walk(top):
            sub = dirpath[len(top) :].strip("/")
            for entry in (*dirnames, *filenames):
                seen += 1
                if seen > _RENAME_WALK_LIMIT:
                    raise _Denied(
                        src.sandbox_path, "directory too large to check for protected paths"
                    )
                tail = f"{sub}/{entry}" if sub else entry
                before = self._denied_by(f"{src.rel}/{tail}", f"{src.sandbox_path}/{tail}")
                after = self._denied_by(f"{dst.rel}/{tail}", f"{dst.sandbox_path}/{tail}")
                if before != after:
                    raise _Denied(f"{src.sandbox_path}/{tail}", before or after or "")

    def _describe_target(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> str:
        """Best-effort text of what a refused metadata call aimed at (for the violation)."""
        try:
            if name in _FD_METADATA_CALLS:
                return os.readlink(f"/proc/{pid}/fd/{_signed_fd(a[0])}")
            index = (
                0
                if name
                in (
                    "chmod",
                    "chown",
                    "lchown",
                    "utime",
                    "utimes",
                    "truncate",
                    "setxattr",
                    "lsetxattr",
                    "removexattr",
                    "lremovexattr",
                )
                else 1
            )
            return self._read_string(pid, nid, a[index]) if a[index] else f"fd {_signed_fd(a[0])}"
        except (OSError, _Continue):
            return "?"

    # ------------------------------------------------------------ fd-based metadata
    def _on_open_file(self, pid: int, fd_arg: int, act: object) -> int:
        """Run *act(fd)* on the target's open file *fd_arg* if it lies in a supervised root.

        Used for fchmod/fchown/fsetxattr/fremovexattr/futimens and the
        ``AT_EMPTY_PATH`` forms, only with ``confine_metadata`` (otherwise the
        kernel decides: the read-only mount holds).

        SAFETY: the broker takes a duplicate of the target's *open file*
        (``pidfd_getfd``), checks where that file lives (its path, verified by
        device and inode against the supervised root) and acts on the
        duplicate, so the target cannot swap the file between check and use.
        """
        import ctypes

        if not self._spec.confine_metadata:
            raise _Continue
        pidfd = os.pidfd_open(pid)
        try:
            ours = self._syscall(
                "pidfd_getfd",
                ctypes.c_int(pidfd),
                ctypes.c_int(_signed_fd(fd_arg)),
                ctypes.c_uint(0),
            )
        finally:
            os.close(pidfd)
        outside = "filesystem: outside the writable areas"
        try:
            path = os.readlink(f"/proc/self/fd/{ours}")
            root = self._root_for(path) if path.startswith("/") else None
            if root is None:
                raise _Denied(path, outside)
            rel = path[len(root.sandbox_path) :].strip("/")
            try:
                check_fd = self._openat2(
                    root.host_fd,
                    rel or ".",
                    os.O_PATH,
                    _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
                )
            except OSError:
                raise _Denied(path, outside) from None
            try:
                mine, theirs = os.fstat(ours), os.fstat(check_fd)
            finally:
                os.close(check_fd)
            if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
                raise _Denied(path, outside)
            label = (
                None if root.sandbox_path in self._spec.open_roots else self._denied_by(rel, path)
            )
            if label is not None:
                raise _Denied(path, label)
            act(ours)  # type: ignore[operator]
            return 0
        finally:
            os.close(ours)

    # ------------------------------------------------------------ emulation
    def _dispatch(self, name: str, pid: int, nid: int, a: tuple[int, ...]) -> int | _FdResult:
        def s(addr: int) -> str:
            return self._read_string(pid, nid, addr)

        sfd = _signed_fd
        if name == "open":
            return self._open(pid, nid, _AT_FDCWD, s(a[0]), a[1], a[2])
        if name == "openat":
            return self._open(pid, nid, sfd(a[0]), s(a[1]), a[2], a[3])
        if name == "creat":
            return self._open(
                pid, nid, _AT_FDCWD, s(a[0]), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, a[1]
            )
        if name in ("mkdir", "mkdirat"):
            dirfd, path, mode = (
                (_AT_FDCWD, s(a[0]), a[1]) if name == "mkdir" else (sfd(a[0]), s(a[1]), a[2])
            )
            r = self._resolve(pid, nid, dirfd, path, follow=False)
            return self._with(
                r,
                lambda: self._as_target(
                    pid, lambda: os.mkdir(r.name, mode & 0o7777, dir_fd=r.parent_fd)
                ),
                creates=True,
            )
        if name in ("mknod", "mknodat"):
            dirfd, path, mode, dev = (
                (_AT_FDCWD, s(a[0]), a[1], a[2])
                if name == "mknod"
                else (sfd(a[0]), s(a[1]), a[2], a[3])
            )
            kind = stat.S_IFMT(mode) or stat.S_IFREG
            if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK):
                raise OSError(errno.EPERM, "device nodes are not allowed")
            r = self._resolve(pid, nid, dirfd, path, follow=False)
            return self._with(
                r,
                lambda: self._as_target(
                    pid, lambda: os.mknod(r.name, kind | (mode & 0o7777), dev, dir_fd=r.parent_fd)
                ),
                creates=True,
            )
        if name in ("symlink", "symlinkat"):
            target = s(a[0])
            dirfd, path = (_AT_FDCWD, s(a[1])) if name == "symlink" else (sfd(a[1]), s(a[2]))
            r = self._resolve(pid, nid, dirfd, path, follow=False)
            return self._with(
                r, lambda: os.symlink(target, r.name, dir_fd=r.parent_fd), creates=True
            )
        if name in ("link", "linkat"):
            return self._link(pid, nid, name, a)
        if name in ("rename", "renameat", "renameat2"):
            return self._rename(pid, nid, name, a)
        if name in ("unlink", "unlinkat", "rmdir"):
            if name == "unlinkat":
                dirfd, path, flags = sfd(a[0]), s(a[1]), a[2]
            else:
                dirfd, path, flags = _AT_FDCWD, s(a[0]), (_AT_REMOVEDIR if name == "rmdir" else 0)
            r = self._resolve(pid, nid, dirfd, path, follow=False)
            if flags & _AT_REMOVEDIR:
                return self._with(r, lambda: os.rmdir(r.name, dir_fd=r.parent_fd))
            return self._with(r, lambda: os.unlink(r.name, dir_fd=r.parent_fd))
        if name in ("chmod", "fchmodat", "fchmodat2"):
            if name == "chmod":
                dirfd, path, mode, flags = _AT_FDCWD, s(a[0]), a[1], 0
            else:
                dirfd, path, mode = sfd(a[0]), s(a[1]), a[2]
                flags = a[3] if name == "fchmodat2" else 0
            if flags & _AT_EMPTY_PATH:
                return self._on_open_file(pid, a[0], lambda fd: os.chmod(fd, mode & 0o7777))
            r = self._resolve(pid, nid, dirfd, path, follow=not flags & _AT_SYMLINK_NOFOLLOW)
            return self._with(
                r,
                lambda: os.chmod(r.name, mode & 0o7777, dir_fd=r.parent_fd, follow_symlinks=False),
                changes_inode=True,
            )
        if name in ("chown", "lchown", "fchownat"):
            if name == "fchownat":
                dirfd, path, uid, gid, flags = sfd(a[0]), s(a[1]), a[2], a[3], a[4]
            else:
                dirfd, path, uid, gid = _AT_FDCWD, s(a[0]), a[1], a[2]
                flags = _AT_SYMLINK_NOFOLLOW if name == "lchown" else 0
            host_uid = self._map_id(pid, "uid_map", uid)
            host_gid = self._map_id(pid, "gid_map", gid)
            if flags & _AT_EMPTY_PATH:
                return self._on_open_file(pid, a[0], lambda fd: os.chown(fd, host_uid, host_gid))
            r = self._resolve(pid, nid, dirfd, path, follow=not flags & _AT_SYMLINK_NOFOLLOW)
            return self._with(
                r,
                lambda: os.chown(
                    r.name, host_uid, host_gid, dir_fd=r.parent_fd, follow_symlinks=False
                ),
                changes_inode=True,
            )
        if name == "truncate":
            path, length = s(a[0]), _signed64(a[1])
            r = self._resolve(pid, nid, _AT_FDCWD, path, follow=True)

            def truncate() -> None:
                fd = os.open(
                    r.name,
                    os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    dir_fd=r.parent_fd,
                )
                try:
                    os.ftruncate(fd, length)
                finally:
                    os.close(fd)

            return self._with(r, truncate, changes_inode=True)
        if name in ("utime", "utimes", "futimesat", "utimensat"):
            return self._utimes(pid, nid, name, a)
        if name in ("fchmod", "fchown", "fsetxattr", "fremovexattr"):
            return self._fd_call(pid, nid, name, a)
        if name in ("setxattr", "lsetxattr", "removexattr", "lremovexattr"):
            path, attr = s(a[0]), s(a[1])
            if attr.startswith(("security.", "trusted.")):
                raise OSError(errno.EPERM, "privileged extended attribute")
            follow = not name.startswith("l")
            r = self._resolve(pid, nid, _AT_FDCWD, path, follow=follow)
            target = f"/proc/self/fd/{r.parent_fd}/{r.name}"
            if name.endswith("setxattr"):
                size = a[3]
                if size > _MAX_XATTR:
                    raise OSError(errno.E2BIG, "attribute value too large")
                value = self._read_bytes(pid, nid, a[2], size)
                flags = a[4]
                return self._with(
                    r,
                    lambda: os.setxattr(target, attr, value, flags, follow_symlinks=False),
                    changes_inode=True,
                )
            return self._with(
                r, lambda: os.removexattr(target, attr, follow_symlinks=False), changes_inode=True
            )
        raise _Continue

    def _fd_call(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> int:
        """The plain fd-based metadata calls (trapped only with ``confine_metadata``)."""
        if name == "fchmod":
            return self._on_open_file(pid, a[0], lambda fd: os.chmod(fd, a[1] & 0o7777))
        if name == "fchown":
            uid, gid = self._map_id(pid, "uid_map", a[1]), self._map_id(pid, "gid_map", a[2])
            return self._on_open_file(pid, a[0], lambda fd: os.chown(fd, uid, gid))
        attr = self._read_string(pid, nid, a[1])
        if attr.startswith(("security.", "trusted.")):
            raise OSError(errno.EPERM, "privileged extended attribute")
        if name == "fsetxattr":
            if a[3] > _MAX_XATTR:
                raise OSError(errno.E2BIG, "attribute value too large")
            value, flags = self._read_bytes(pid, nid, a[2], a[3]), a[4]
            return self._on_open_file(pid, a[0], lambda fd: os.setxattr(fd, attr, value, flags))
        return self._on_open_file(pid, a[0], lambda fd: os.removexattr(fd, attr))

    def _with(
        self, r: _Resolved, action: object, *, changes_inode: bool = False, creates: bool = False
    ) -> int:
        """Check *r* against the policy, then run *action* (a callable); return 0.

        ``changes_inode``: the operation changes the file itself (mode, owner,
        times, size, attributes), not just a name - refused for hard-linked files.
        ``creates``: the operation makes the name (journaled as created).
        """
        try:
            if creates:
                _refuse_existing(r)
            self._check(r)
            if changes_inode:
                self._check_single_link(r)
            action()  # type: ignore[operator]
        finally:
            os.close(r.parent_fd)
        if creates:
            self.journal.create(r.root.sandbox_path, r.rel)
        elif changes_inode:
            self.journal.change(r.root.sandbox_path, r.rel)
        return 0

    def _as_target(self, pid: int, action: object) -> None:
        """Run *action* with the target's umask (this thread has its own fs_struct)."""
        mask = self._umask_of(pid)
        previous = os.umask(mask)
        try:
            action()  # type: ignore[operator]
        finally:
            os.umask(previous)

    @staticmethod
    def _umask_of(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Umask:"):
                        return int(line.split()[1], 8)
        except (OSError, ValueError):
            pass
        return 0o022

    @staticmethod
    def _map_id(pid: int, map_name: str, value: int) -> int:
        """Map a uid/gid from the target's user namespace to ours (-1 stays -1)."""
        value &= 0xFFFFFFFF
        if value == 0xFFFFFFFF:
            return -1
        with open(f"/proc/{pid}/{map_name}", "rb") as f:
            for line in f:
                inside, outside, count = (int(x) for x in line.split())
                if inside <= value < inside + count:
                    return outside + (value - inside)
        raise OSError(errno.EINVAL, "id not mapped in the sandbox")

    def _open(
        self, pid: int, nid: int, dirfd: int, path: str, flags: int, mode: int
    ) -> int | _FdResult:
        flags &= 0xFFFFFFFF
        if flags & _O_TMPFILE == _O_TMPFILE:
            r = self._resolve_dir(pid, nid, dirfd, path)
            fd = self._open_checked(pid, r, ".", flags, mode, check=False)
            return _FdResult(fd, bool(flags & os.O_CLOEXEC))
        follow = not flags & os.O_NOFOLLOW
        r = self._resolve(pid, nid, dirfd, path, follow=follow)
        fd = self._open_checked(pid, r, r.name, flags, mode, check=True)
        return _FdResult(fd, bool(flags & os.O_CLOEXEC))

    def _resolve_dir(self, pid: int, nid: int, dirfd: int, path: str) -> _Resolved:
        """Resolve a directory itself (for O_TMPFILE): returns its fd with name '.'."""
        r = self._resolve(pid, nid, dirfd, path, follow=True)
        try:
            fd = self._openat2(
                r.parent_fd,
                r.name,
                os.O_PATH | os.O_DIRECTORY,
                _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
            )
        except OSError as exc:
            raise _Continue from exc
        finally:
            os.close(r.parent_fd)
        return _Resolved(r.root, fd, ".", r.rel)

    def _open_checked(
        self, pid: int, r: _Resolved, name: str, flags: int, mode: int, *, check: bool
    ) -> int:
        try:
            if check:
                self._check(r)
            try:
                existing = os.stat(name, dir_fd=r.parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            if existing is not None and not (
                stat.S_ISREG(existing.st_mode) or stat.S_ISDIR(existing.st_mode)
            ):
                if stat.S_ISLNK(existing.st_mode) and flags & os.O_NOFOLLOW:
                    raise OSError(errno.ELOOP, "symbolic link with O_NOFOLLOW")
                raise _Continue  # FIFOs, devices, sockets: the kernel decides on the sandbox's mount
            if existing is not None:
                self._check_single_link(r, existing)
            open_flags = (flags | os.O_NOFOLLOW | os.O_CLOEXEC) & ~os.O_NOCTTY
            holder: list[int] = []
            self._as_target(
                pid,
                lambda: holder.append(os.open(name, open_flags, mode & 0o7777, dir_fd=r.parent_fd)),
            )
            if existing is None and flags & os.O_CREAT:
                self.journal.create(r.root.sandbox_path, r.rel)
            elif flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC) and name != ".":
                self.journal.change(r.root.sandbox_path, r.rel)
            return holder[0]
        finally:
            os.close(r.parent_fd)

    def _link(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> int:
        def s(addr: int) -> str:
            return self._read_string(pid, nid, addr)

        if name == "link":
            olddir, old, newdir, new, flags = _AT_FDCWD, s(a[0]), _AT_FDCWD, s(a[1]), 0
        else:
            olddir, newdir, flags = _signed_fd(a[0]), _signed_fd(a[2]), a[4]
            old = s(a[1]) if a[1] else ""
            new = s(a[3])
        fd_path = _own_fd_number(old) if flags & _AT_SYMLINK_FOLLOW else None
        if fd_path is not None:
            # linkat("/proc/self/fd/N", ..., AT_SYMLINK_FOLLOW): the documented way to
            # give an O_TMPFILE file a name; "self" is the target, so this is its fd N.
            olddir, old, flags = fd_path, "", flags | _AT_EMPTY_PATH
        dst = self._resolve(pid, nid, newdir, new, follow=False)
        try:
            _refuse_existing(dst)
            self._check(dst)
            if flags & _AT_EMPTY_PATH and not old:
                # Linking an open file (O_TMPFILE): the classic /proc/self/fd route.
                src_fd = os.open(f"/proc/{pid}/fd/{olddir}", os.O_PATH | os.O_CLOEXEC)
                try:
                    os.link(
                        f"/proc/self/fd/{src_fd}",
                        dst.name,
                        dst_dir_fd=dst.parent_fd,
                        follow_symlinks=True,
                    )
                finally:
                    os.close(src_fd)
                self.journal.create(dst.root.sandbox_path, dst.rel)
                return 0
            src = self._resolve(pid, nid, olddir, old, follow=bool(flags & _AT_SYMLINK_FOLLOW))
            try:
                self._check(src)
                if src.root is not dst.root:
                    raise OSError(errno.EXDEV, "cross-device link")
                os.link(
                    src.name,
                    dst.name,
                    src_dir_fd=src.parent_fd,
                    dst_dir_fd=dst.parent_fd,
                    follow_symlinks=False,
                )
                self.journal.create(dst.root.sandbox_path, dst.rel)
            finally:
                os.close(src.parent_fd)
        finally:
            os.close(dst.parent_fd)
        return 0

    def _rename(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> int:
        import ctypes

        def s(addr: int) -> str:
            return self._read_string(pid, nid, addr)

        if name == "rename":
            olddir, old, newdir, new, flags = _AT_FDCWD, s(a[0]), _AT_FDCWD, s(a[1]), 0
        else:
            olddir, old, newdir, new = _signed_fd(a[0]), s(a[1]), _signed_fd(a[2]), s(a[3])
            flags = a[4] if name == "renameat2" else 0
        if flags & _RENAME_WHITEOUT:
            raise OSError(errno.EPERM, "RENAME_WHITEOUT needs privileges")
        src = self._resolve(pid, nid, olddir, old, follow=False)
        try:
            try:
                dst = self._resolve(pid, nid, newdir, new, follow=False)
            except _Continue:
                raise OSError(errno.EXDEV, "rename across mounts") from None
            try:
                if src.root is not dst.root:
                    raise OSError(errno.EXDEV, "rename across mounts")
                self._check(src)
                self._check(dst)
                self._check_subtree_move(src, dst)
                if flags & _RENAME_EXCHANGE:
                    self._check_subtree_move(dst, src)
                self._syscall(
                    "renameat2",
                    ctypes.c_int(src.parent_fd),
                    os.fsencode(src.name),
                    ctypes.c_int(dst.parent_fd),
                    os.fsencode(dst.name),
                    ctypes.c_uint(flags),
                )
                self.journal.move(dst.root.sandbox_path, dst.rel)
                if flags & _RENAME_EXCHANGE:
                    self.journal.move(src.root.sandbox_path, src.rel)
            finally:
                os.close(dst.parent_fd)
        finally:
            os.close(src.parent_fd)
        return 0

    def _utimes(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> int:
        import ctypes

        def s(addr: int) -> str:
            return self._read_string(pid, nid, addr)

        flags = 0
        path: str | None
        if name == "utimensat":
            dirfd, path, times_addr, flags = (
                _signed_fd(a[0]),
                (s(a[1]) if a[1] else None),
                a[2],
                a[3],
            )
            times = self._read_bytes(pid, nid, times_addr, 32) if times_addr else None
        else:
            if name == "futimesat":
                dirfd, path, times_addr = _signed_fd(a[0]), s(a[1]), a[2]
            else:
                dirfd, path, times_addr = _AT_FDCWD, s(a[0]), a[1]
            times = None
            if times_addr:
                if name == "utime":  # struct utimbuf: two time_t seconds
                    at, mt = struct.unpack("<qq", self._read_bytes(pid, nid, times_addr, 16))
                    times = struct.pack("<qqqq", at, 0, mt, 0)
                else:  # two struct timeval
                    a_s, a_us, m_s, m_us = struct.unpack(
                        "<qqqq", self._read_bytes(pid, nid, times_addr, 32)
                    )
                    times = struct.pack("<qqqq", a_s, a_us * 1000, m_s, m_us * 1000)
        buf = ctypes.create_string_buffer(times, 32) if times is not None else None
        if flags & _AT_EMPTY_PATH or path is None:

            def touch_fd(fd: int) -> None:
                self._syscall("utimensat", ctypes.c_int(fd), None, buf, ctypes.c_int(0))

            return self._on_open_file(pid, dirfd, touch_fd)
        r = self._resolve(pid, nid, dirfd, path, follow=not flags & _AT_SYMLINK_NOFOLLOW)

        def touch() -> None:
            self._syscall(
                "utimensat",
                ctypes.c_int(r.parent_fd),
                os.fsencode(r.name),
                buf,
                ctypes.c_int(_AT_SYMLINK_NOFOLLOW),
            )

        return self._with(r, touch, changes_inode=True)


def _refuse_existing(r: _Resolved) -> None:
    """EEXIST for a create of a name that exists, as the kernel answers before any
    permission check (``mkdir -p`` over a protected directory is no violation)."""
    try:
        os.stat(r.name, dir_fd=r.parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    raise OSError(errno.EEXIST, "file exists")


def _other_file(sandbox_dir_fd: int, host_dir_fd: int, name: str) -> bool:
    """Whether *name* is a different file in the sandbox's view than in the host's.

    The two directory fds are the same directory (checked by the caller); a
    difference below them is a mount on *name* in the sandbox only.
    """
    try:
        seen = os.stat(name, dir_fd=sandbox_dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    try:
        real = os.stat(name, dir_fd=host_dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    return (seen.st_dev, seen.st_ino) != (real.st_dev, real.st_ino)


def _hung_up(fd: int) -> bool:
    """Whether the seccomp listener *fd* reports that no task uses its filter anymore."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return any(mask & (select.POLLHUP | select.POLLERR) for _fd, mask in poller.poll(0))


def _exited(pid: int) -> bool:
    """Whether *pid* (corral's unreaped child) has exited: gone, or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return True
    return stat_line[stat_line.rfind(b")") + 2 :][:1] in (b"Z", b"X")


class _FdResult:
    __slots__ = ("cloexec", "fd")

    def __init__(self, fd: int, cloexec: bool) -> None:
        self.fd = fd
        self.cloexec = cloexec


def _own_fd_number(path: str) -> int | None:
    """N for ``/proc/self/fd/N``, ``/proc/thread-self/fd/N`` or ``/dev/fd/N``, else None."""
    for prefix in ("/proc/self/fd/", "/proc/thread-self/fd/", "/dev/fd/"):
        if path.startswith(prefix):
            rest = path[len(prefix) :]
            return int(rest) if rest.isdigit() else None
    return None


def _signed_fd(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value & (1 << 63) else value
