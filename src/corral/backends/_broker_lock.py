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
broker holds ``flock`` locks on directories every broker of the same roots
locks too: ``LOCK_EX`` on each supervised root, and ``LOCK_SH`` on each of
its ancestors (same filesystem, same owner as the root, never ``/``), so a
broker whose root lies *above* another broker's root (a sandbox started in
``/p`` beside one started in ``/p/sub``) excludes it, while brokers of
sibling roots (``/p/a``, ``/p/b``) do not wait for each other. A flock lives
on the inode and is shared by every process, user and mount namespace (bind
mounts, a podman container's broker) on the host; it needs no lock files.
Locks are taken in one global order - by ``(st_dev, st_ino)`` - so brokers
with overlapping sets cannot deadlock.

Limit. Anyone who can open such a directory can hold its lock (a sandbox
its own workspace root): a broker never waits longer than
:data:`LOCK_BOUND` for it, then fails that operation (``EAGAIN``) and keeps
serving, so the holder only delays, boundedly, writes it could not make.
"""

from __future__ import annotations

import errno
import os
import time
from fcntl import LOCK_EX, LOCK_NB, LOCK_SH, LOCK_UN, flock

__all__ = ["LOCK_BOUND", "RootLocks"]

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
        self._fds: dict[tuple[int, int], tuple[int, int]] = {}  # (dev, ino) -> (fd, op)
        self._order: list[tuple[int, int]] = []  # (fd, op), by (dev, ino)

    def add_root(self, root_fd: int) -> None:
        """Lock the directory *root_fd* (any fd of it, ``O_PATH`` too) and its ancestors.

        The ancestors are found through ``..`` from the root itself (not its
        path text), as this process's mount namespace shows them; the walk
        stops at a mount boundary, at a directory owned by another user than
        the root's, at ``/``, or where a directory cannot be opened.
        """
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)
        root = os.fstat(fd)
        self._put(root, fd, LOCK_EX)
        current, st = fd, root
        for _ in range(_MAX_ANCESTORS):
            try:
                parent = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=current)
            except OSError:
                return
            up = os.fstat(parent)
            if (
                up.st_dev != st.st_dev
                or up.st_uid != root.st_uid
                or (up.st_dev, up.st_ino) == (st.st_dev, st.st_ino)
                or _is_top(parent, up)
            ):
                os.close(parent)
                return
            self._put(up, parent, LOCK_SH)
            current, st = parent, up

    def _put(self, st: os.stat_result, fd: int, op: int) -> None:
        key = (st.st_dev, st.st_ino)
        had = self._fds.get(key)
        if had is not None:
            # one fd per directory; exclusive wins (a root that is another root's ancestor)
            os.close(fd)
            fd, op = had[0], (LOCK_EX if LOCK_EX in (op, had[1]) else LOCK_SH)
        self._fds[key] = (fd, op)
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
