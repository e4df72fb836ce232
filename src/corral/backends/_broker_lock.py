"""The supervised roots' lock: the brokers of concurrent sandboxes on one workspace act as one.

Problem. One broker serves one sandbox, one notification at a time, so no
name operation of that sandbox slips between a check and the operation it
approved. Two sandboxes on one workspace (a background command beside a
foreground one) have two brokers - threads of one corral server or separate
processes - and the other broker's operations could: its shaping of a
directory between this broker's "not shaped" check and its create of
``config`` left the sandbox a writable descriptor to a live config
(docs/threat-model.md, "Shapes under other names, while the run lasts").

Design. Around the whole handling of a notification that can act - the
resolution of its names, every check and the operation they approve - a
broker holds ``flock`` locks that every broker of the same directories takes
too: ``LOCK_EX`` for each supervised root, and ``LOCK_SH`` for each of its
ancestors (same filesystem, same owner as the root, never ``/``), so a
broker whose root lies *above* another broker's root (a sandbox started in
``/p`` beside one started in ``/p/sub``) excludes it, while brokers of
sibling roots (``/p/a``, ``/p/b``) do not wait for each other. Locks are
taken in one global order - by the directory's ``(st_dev, st_ino)`` - so
brokers with overlapping sets cannot deadlock.

The lock of a directory is not taken on the directory itself (anyone who
can read it could hold that - another local user on a world-readable
workspace or home, stalling every write of this user's sandboxes) but on a
file named after its ``(st_dev, st_ino)`` in the user's private lock
directory, ``~/.cache/corral/locks`` of the user's *passwd* home (0700,
owned by the user, never reached through a link; the same for every corral
process of the user, whatever its environment). A regular file opened
read-write also takes ``flock`` on NFS. Only for a user without a home (the
passwd home missing - uid 65534's is ``/nonexistent`` - or not the user's
own) is the lock ``flock`` on the directory itself: brokers still exclude
each other everywhere, but then anyone who can read the directory can hold
its lock (the limit below, for that user only). A user with a home whose
lock directory cannot be had (a part of it another user's, a link, a mode
that denies access - a sandbox whose workspace holds ``~/.cache`` can
``chmod`` it, ATK13) gets every run refused (``BrokerFailed``): falling
back would lock other objects than the user's running corral processes
lock, and brokers would no longer exclude each other.

No sandbox reaches the lock directory: every plan hides it and makes it
read-only where it lies in a writable area (:func:`lock_directory`; a
process that could open a lock file could hold it - ``flock`` needs only a
read-only descriptor - and one that could replace it would split the
brokers). Should a lock be held anyway (the fallback's directory flock), a
broker never waits longer than :data:`LOCK_BOUND`, then fails that operation
(``EAGAIN``) and keeps serving: the holder only delays, boundedly, writes.
Lock files are never removed: removing one another broker holds would let
the next broker lock a new file beside it.
"""

from __future__ import annotations

import _thread
import errno
import os
import stat
import time
from fcntl import LOCK_EX, LOCK_NB, LOCK_SH, LOCK_UN, flock

__all__ = ["LOCK_BOUND", "RootLocks", "lock_directory"]

#: How long a broker waits for its roots' locks before failing the operation with EAGAIN.
#: Brokers hold them for one operation (well under a millisecond: the longest, a shape
#: judge or a config landed at a rename, reads and writes at most a few MiB); only a
#: process that took a lock itself (a sandbox flocking its own workspace root) holds one
#: longer, and must not stall a broker - which serves the sandbox's every write - for ever.
LOCK_BOUND = 10.0

#: Ancestors of one root locked at most (a path deeper than this is not a workspace).
_MAX_ANCESTORS = 64

#: First and longest pause between two tries of a held lock (seconds).
_FIRST_PAUSE, _LONGEST_PAUSE = 0.0002, 0.005


class RootLocks:
    """The lock set of one broker: its roots (exclusive) and their ancestors (shared).

    :meth:`add_root` once per supervised root, then :meth:`acquire` /
    :meth:`release` around each operation (from one thread), :meth:`close`
    at the end.
    """

    __slots__ = ("_fds", "_order")

    def __init__(self) -> None:
        # (dev, ino) -> (the fd to flock for it: _lock_file; op)
        self._fds: dict[tuple[int, int], tuple[int, int]] = {}
        self._order: list[tuple[int, int]] = []  # by (dev, ino)

    def add_root(self, root_fd: int) -> None:
        """Lock the directory *root_fd* (any fd of it, ``O_PATH`` too) and its ancestors.

        The ancestors are found through ``..`` from the root itself (not its
        path text), as this process's mount namespace shows them; the walk
        stops at a mount boundary, at a directory owned by another user than
        the root's, at ``/``, or where a directory cannot be opened.
        """
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        current = os.open(".", flags, dir_fd=root_fd)
        root = st = os.fstat(current)
        self._put(root, LOCK_EX, current)
        try:
            for _ in range(_MAX_ANCESTORS):
                try:
                    parent = os.open("..", flags, dir_fd=current)
                except OSError:
                    return
                os.close(current)
                current = parent
                up = os.fstat(parent)
                if (
                    up.st_dev != st.st_dev
                    or up.st_uid != root.st_uid
                    or (up.st_dev, up.st_ino) == (st.st_dev, st.st_ino)
                    or _is_top(parent, up)
                ):
                    return
                self._put(up, LOCK_SH, parent)
                st = up
        finally:
            os.close(current)

    def _put(self, st: os.stat_result, op: int, directory: int) -> None:
        """Lock the directory *st* (open as *directory*) with *op* around each operation."""
        key = (st.st_dev, st.st_ino)
        had = self._fds.get(key)
        if had is not None:  # exclusive wins (a root that is another root's ancestor)
            self._fds[key] = (had[0], LOCK_EX if LOCK_EX in (op, had[1]) else LOCK_SH)
        else:
            self._fds[key] = (_lock_file(key, directory), op)
        self._order = [self._fds[k] for k in sorted(self._fds)]

    @property
    def count(self) -> int:
        """How many directories are locked around each operation."""
        return len(self._order)

    def acquire(self, bound: float = LOCK_BOUND) -> None:
        """Take every lock, in order.

        Raises:
            OSError: ``EAGAIN`` if one stayed held by someone else for *bound*
                seconds (then none is held), or flock's own error.
        """
        deadline = 0.0
        pause = _FIRST_PAUSE
        for taken, (fd, op) in enumerate(self._order):
            while True:
                try:
                    flock(fd, op | LOCK_NB)
                    break
                except BlockingIOError:
                    now = time.monotonic()
                    if not deadline:
                        deadline = now + bound
                    elif now >= deadline:
                        self._release(taken)
                        raise OSError(
                            errno.EAGAIN,
                            f"a supervised root stayed locked by another process for {bound:g} s",
                        ) from None
                    time.sleep(pause)
                    pause = min(pause * 2, _LONGEST_PAUSE)
                except BaseException:
                    self._release(taken)
                    raise

    def release(self) -> None:
        """Drop every lock (after :meth:`acquire`)."""
        self._release(len(self._order))

    def _release(self, count: int) -> None:
        for fd, _op in reversed(self._order[:count]):
            flock(fd, LOCK_UN)

    def close(self) -> None:
        """Close every fd (idempotent); a lock still held goes with it."""
        for fd, _op in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        self._order = []


def _is_top(fd: int, st: os.stat_result) -> bool:
    """Whether the directory *fd* is ``/`` of this mount namespace (its ``..`` is itself)."""
    try:
        up = os.stat("..", dir_fd=fd)
    except OSError:
        return True
    return (up.st_dev, up.st_ino) == (st.st_dev, st.st_ino)


_GUARD = _thread.allocate_lock()
#: The private lock directory's fd and path (``None``: none could be had; unset: not
#: looked for yet).
_DIRECTORY: list[tuple[int, str] | None] = []


def lock_directory() -> str | None:
    """The path of this user's private lock directory (made where it is missing), or
    ``None`` where the user has no home to keep one in.

    Every plan hides it from the sandbox, and makes it read-only where it lies in a
    writable area (:func:`corral.pipeline._runner.prepare`): a sandboxed process that
    could open a lock file could hold it, and one that could replace it would split the
    brokers that lock through it.

    Raises:
        BrokerFailed: the user has a home but the directory cannot be had there (a
            part of it not this user's own directory, a link, no access): every run
            is refused rather than locked another way than the user's other corral
            processes lock (a sandbox whose workspace holds ``~/.cache`` could have
            changed its mode; ATK13).
    """
    found = _private_directory()
    return None if found is None else found[1]


def _lock_directory() -> int | None:
    found = _private_directory()
    return None if found is None else found[0]


def _private_directory() -> tuple[int, str] | None:
    """An fd and the path of ``~/.cache/corral/locks`` of this user's passwd home, made
    0700 where it is missing; ``None`` when that home is missing or not the user's own
    (uid 65534's ``/nonexistent``): only then do brokers lock the directories themselves.
    A failure for any other reason raises (:func:`lock_directory`) and is not kept."""
    if _DIRECTORY:
        return _DIRECTORY[0]
    import pwd

    from .._exceptions import BrokerFailed

    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
        st = os.stat(home)
        homeless = not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
    except (OSError, KeyError):
        homeless = True
    found: tuple[int, str] | None = None
    if not homeless:
        path = os.path.realpath(os.path.join(home, ".cache/corral/locks"))
        fd = -1
        try:
            fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            for name in (".cache", "corral", "locks"):
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                below = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                )
                os.close(fd)
                fd = below
                st = os.fstat(fd)
                if st.st_uid != os.getuid() or (name == "locks" and st.st_mode & 0o077):
                    raise PermissionError(
                        errno.EPERM, f"{name} is not this user's private directory"
                    )
            found, fd = (fd, path), -1
        except OSError as exc:
            raise BrokerFailed(
                f"Failed to open the write brokers' private lock directory {path}: "
                f"{exc.strerror or exc}",
                hint="it must be a directory of yours, mode 0700, reached without a link, "
                "below directories you can search (a sandbox that could write ~/.cache "
                "may have changed one: check the modes of ~/.cache and ~/.cache/corral)",
            ) from None
        finally:
            if fd >= 0:
                os.close(fd)
    with _GUARD:
        if not _DIRECTORY:
            _DIRECTORY.append(found)
        elif found is not None:
            os.close(found[0])
    return _DIRECTORY[0]


def _lock_file(key: tuple[int, int], directory: int) -> int:
    """An fd to ``flock`` for the directory *key* (open as *directory*): its private lock
    file, opened read-write (a regular file of this user's, never a link); a new fd of the
    directory itself only for a user without a home (:func:`_private_directory`).

    Raises:
        OSError: the lock file cannot be had (the broker does not start: never a lock
            other than the one the user's other brokers take).
        BrokerFailed: the private directory cannot be had.
    """
    private = _lock_directory()
    if private is None:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=directory)
    fd = os.open(
        f"{key[0]:x}-{key[1]:x}",
        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
        0o600,
        dir_fd=private,
    )
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(errno.EPERM, f"lock file {key[0]:x}-{key[1]:x} is not this user's")
    return fd
