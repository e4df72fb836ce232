"""The write broker's kernel ABI and small types (see :mod:`corral.backends._broker`).

``seccomp`` user-notification structures and ioctls, syscall numbers per
architecture, the broker's internal exceptions and records, and the helpers
that need no broker state.
"""

from __future__ import annotations

import errno
import os

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
#: CAP_DAC_OVERRIDE | CAP_DAC_READ_SEARCH | CAP_SYS_PTRACE (see _Resolver._as_tracer)
_TRACER_CAPS = (1 << 1) | (1 << 2) | (1 << 19)
_SYS_SETFSUID = {"x86_64": 122, "aarch64": 151}
_SYS_SETFSGID = {"x86_64": 123, "aarch64": 152}
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
