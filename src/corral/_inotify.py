"""One inotify instance shared by several watchers of one process (the corral server's).

The per-user limit on inotify *instances* is small (often 128) while the limit
on *watches* is large, so the server's watch on its own code
(:mod:`corral.server._codewatch`) and its settings cache
(:mod:`corral.policy._watched`) add their watches to one instance. Each watch
has a handler; :meth:`Inotify.drain` reads every queued event and hands it to
the handler of its watch, under a lock, so an event is never read by one
thread and missed by another that asks whether anything changed.

Linux only: on other systems, or when the user's inotify quota is spent,
:class:`Inotify` raises :class:`OSError` and the callers fall back.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CHANGES", "IN_DONT_FOLLOW", "IN_IGNORED", "IN_Q_OVERFLOW", "Inotify"]

#: modify, attrib, close_write, moved_from, moved_to, create, delete, delete_self, move_self
CHANGES = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
IN_DONT_FOLLOW = 0x02000000
IN_MASK_ADD = 0x20000000
IN_IGNORED = 0x8000
IN_Q_OVERFLOW = 0x4000


class Inotify:
    """An inotify instance whose events go to one handler per watch."""

    def __init__(self) -> None:
        """Open the instance (non-blocking, close-on-exec).

        Raises:
            OSError: no inotify here, or the user's quota is spent.
        """
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        self._ctypes = ctypes
        fd = self._libc.inotify_init1(0o4000 | 0o2000000)  # IN_NONBLOCK | IN_CLOEXEC
        if fd < 0:
            raise self._error()
        self.fd: int = int(fd)
        self._handlers: dict[int, list[Callable[[int, int, bytes], None]]] = {}
        self._lock = _thread.allocate_lock()

    def _error(self, path: str | None = None) -> OSError:
        err = self._ctypes.get_errno()
        return OSError(err, os.strerror(err), path)

    def add_watch(
        self, path: str | bytes, mask: int, handler: Callable[[int, int, bytes], None]
    ) -> int:
        """Watch *path* for *mask*; its events go to *handler*. Returns the watch descriptor.

        ``handler(wd, mask, name)`` runs inside :meth:`drain`, under its lock
        (it must not wait for another thread that drains); *wd* is -1 when the
        kernel's queue overflowed (events were lost: every handler is told).

        A second watch of the same inode (by this or another watcher) returns
        the same descriptor: the masks add up and each handler gets its events.

        Raises:
            OSError: the path cannot be watched (missing, no permission, quota).
        """
        with self._lock:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask | IN_MASK_ADD)
            if wd < 0:
                raise self._error(os.fsdecode(path))
            handlers = self._handlers.setdefault(int(wd), [])
            if handler not in handlers:
                handlers.append(handler)
            return int(wd)

    def remove_watch(self, wd: int, handler: Callable[[int, int, bytes], None]) -> None:
        """Stop giving *handler* the events of *wd*; the watch ends with its last handler."""
        with self._lock:
            handlers = self._handlers.get(wd)
            if handlers is None or handler not in handlers:
                return
            handlers.remove(handler)
            if not handlers:
                del self._handlers[wd]
                self._libc.inotify_rm_watch(self.fd, wd)

    def drain(self) -> None:
        """Read every queued event and call its watch's handler (under the lock)."""
        with self._lock:
            while True:
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    return
                offset = 0
                while offset + 16 <= len(data):
                    wd = int.from_bytes(data[offset : offset + 4], sys.byteorder, signed=True)
                    mask = int.from_bytes(data[offset + 4 : offset + 8], sys.byteorder)
                    length = int.from_bytes(data[offset + 12 : offset + 16], sys.byteorder)
                    name = data[offset + 16 : offset + 16 + length].rstrip(b"\0")
                    offset += 16 + length
                    if mask & IN_Q_OVERFLOW:
                        everyone = {h for hs in self._handlers.values() for h in hs}
                        for handler in everyone:
                            handler(-1, mask, b"")
                        continue
                    for handler in self._handlers.get(wd, ()):
                        handler(wd, mask, name)
                    if mask & IN_IGNORED:
                        self._handlers.pop(wd, None)

    def close(self) -> None:
        os.close(self.fd)
