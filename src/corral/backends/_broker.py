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
   time, and holds its roots' locks (:mod:`._broker_lock`) from the
   resolution of a notification's names to the end of the operation it
   approved, so no name operation - of this sandbox, or of another sandbox's
   broker on the same roots - can interleave between a check and its act.
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
import struct

from ..pipeline._outcome import Violation
from ..policy._glob import PathPattern, compiled
from ._broker_abi import (
    _ADDFD_FLAG_SEND,
    _CLONE_FS,
    _IOCTL_ADDFD,
    _IOCTL_RECV,
    _IOCTL_SEND,
    _METADATA_CALLS,
    _NOTIF_SIZE,
    _RESP_FLAG_CONTINUE,
    _SYS_CAPGET,
    _SYS_CAPSET,
    _SYS_SETFSGID,
    _SYS_SETFSUID,
    _SYS_UNSHARE,
    _Continue,
    _Denied,
    _exited,
    _FdResult,
    _hung_up,
    _Root,
)
from ._broker_emulate import _Emulator
from ._broker_lock import RootLocks
from ._gitcheck import Journal
from ._plan import BrokerSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes

__all__ = ["Broker"]

#: Notifications answered without acting on a supervised root's names, so without its
#: locks: ``connect`` (a named socket; no name changes) and ``ioctl`` (``TIOCGPTPEER``).
_UNLOCKED = frozenset({"connect", "ioctl"})


#: Compiled rows by the spec's pattern rows; see :func:`_compiled_rows`.
_ROWS: dict[
    tuple[tuple[str, str], ...],
    tuple[tuple[tuple[PathPattern, str], ...], frozenset[str]],
] = {}


def _compiled_rows(
    patterns: tuple[tuple[str, str], ...],
) -> tuple[tuple[tuple[PathPattern, str], ...], frozenset[str]]:
    """The broker's compiled ``(pattern, label)`` rows and its git rows, once per *patterns*.

    Both are pure functions of the rows' text (no host state enters them), so
    the rows compiled for an earlier sandbox of the same policy are exactly
    this one's (docs/design.md, "What a fresh run computes once"). The git
    rows are the ``filesystem.protect`` labels about git's administrative
    files: a repository the run created is its own to write (the git check
    validates it afterwards).
    """
    patterns = tuple((p, label) for p, label in patterns)  # hashable whatever built it
    cached = _ROWS.get(patterns)
    if cached is None:
        rows = tuple((compiled(p), label) for p, label in patterns)
        git_rows = frozenset(
            label
            for p, label in patterns
            if label.startswith("filesystem.protect:")
            and any(part in (".git", ".gitmodules") for part in p.split("/"))
        )
        if len(_ROWS) >= 64:
            _ROWS.clear()
        cached = _ROWS[patterns] = (rows, git_rows)
    return cached


class Broker(_Emulator):
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
        rows, self._git_rows = _compiled_rows(spec.patterns)
        self._patterns = list(rows)  # a copy: the broker adds a root's own rows to it
        self._reach = {}  # the rows reaching into each root from above it (_reaching_into)
        self._code_rows_pending = True  # _protect_other_hook_paths, before the first act
        self.journal = Journal()
        self._names = dict(spec.syscall_names)
        self._roots: list[_Root] = []
        self._locks = RootLocks()
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
        self._caps: ctypes.Array[ctypes.c_uint32] | None = None
        self._tracing = False
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
        self._load_named_sockets()
        self._done.acquire()
        self._started = True
        _thread.start_new_thread(self._main, ())

    def _open_roots(self, prefix: str) -> None:
        for sandbox_path, host_path in self._spec.roots:
            fd = os.open(prefix + host_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            self._roots.append(_Root(sandbox_path, fd))
            self._locks.add_root(fd)
        # Longest sandbox path first, so nested roots win.
        self._roots.sort(key=lambda r: len(r.sandbox_path), reverse=True)
        for root in self._roots:
            if root.sandbox_path not in self._spec.open_roots:
                self._protect_trusted_hook_paths(root)

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
                self._locks.close()
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
        self._locks.close()
        self._mem_fds.clear()

    def checkpoint(self) -> None:
        """End one command of a resident sandbox: run its git check, start a new journal.

        Only while no process of the sandbox but its init exists (the init
        writes nothing): the journal is then complete and nothing changes it
        meanwhile. Its findings join :attr:`violations`. The next command
        starts with an empty journal, exactly as in a fresh sandbox: what an
        earlier command made counts as already there (protected, checked as
        the user's), never as the next command's own.
        """
        if self._started and not self._stopping:
            self._check_git()
            self.journal = Journal()

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
        """Give this thread its own umask and no effective capabilities
        (and, with ``through_idmap``, the fsuid/fsgid the idmapped layers map to root).

        SAFETY: these calls affect only the calling thread. After them, an
        emulated operation gets the same permission checks the sandboxed
        process would (same uid, no capabilities), and os.umask here does not
        change the umask of corral's other threads.
        """
        import ctypes

        libc = self._libc
        assert libc is not None
        if libc.syscall(_SYS_UNSHARE[self._arch], _CLONE_FS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_FS) for the broker thread")
        if self._spec.through_idmap and self._spec.idmapped_id is not None:
            # the idmapped layers store this id as root's. setfsuid/setfsgid are
            # per thread, need CAP_SETUID (so before the capset below), report the
            # previous value and never fail: read them back
            wanted = self._spec.idmapped_id
            for call in (_SYS_SETFSGID, _SYS_SETFSUID):
                libc.syscall(call[self._arch], wanted)
                if libc.syscall(call[self._arch], -1) != wanted:
                    raise OSError(errno.EPERM, "setfsuid/setfsgid for the broker thread")
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
        data = (ctypes.c_uint32 * 6)()
        if libc.syscall(_SYS_CAPGET[self._arch], header, data) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        data[0] = data[3] = 0  # effective, both 32-bit words
        self._caps = data
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
                if name in _UNLOCKED:
                    result = self._dispatch(name, pid, notif_id, args)
                else:
                    self._lock_roots(name, pid)
                    try:
                        if self._code_rows_pending:
                            # once, before the first operation that can act, under the roots'
                            # locks: no other broker of these roots moves a repository while
                            # they are walked and their configs read (a lock held past its
                            # bound fails this operation, EAGAIN, and the next one tries again)
                            self._protect_other_hook_paths()
                            self._code_rows_pending = False
                        result = self._dispatch(name, pid, notif_id, args)
                    finally:
                        self._locks.release()
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

    def _lock_roots(self, name: str, pid: int) -> None:
        """Take the roots' locks for one operation (:class:`~._broker_lock.RootLocks`);
        a lock held elsewhere past the bound fails the operation (EAGAIN), reported."""
        try:
            self._locks.acquire()
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                self.violations.append(
                    Violation(
                        kind="fs-write",
                        target=", ".join(r.sandbox_path for r in self._roots),
                        rule=f"broker: {exc.strerror}",
                        operation=name,
                        pid=pid,
                    )
                )
            raise

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
