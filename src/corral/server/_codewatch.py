"""The server's watch on its own code: any change under corral's package directories retires it.

Two ways to notice a change, the same guarantee (a server never serves a
request after its code changed on disk):

* **inotify** (one watch per package directory, on the server's one
  :class:`~corral._inotify.Inotify` instance, which the settings cache of
  :mod:`corral.policy._watched` shares): a change wakes the server's poll
  loop right away;
* **stat check**, when the kernel has no inotify instance or watch left for
  this user (``EMFILE``/``ENOSPC``/``ENOMEM``: the per-user limit is often 128
  instances): the server compares the package's files and directories with a
  fingerprint taken at start - every file's inode, size, mtime and ctime and
  every directory's list of names, and the content of what changed just
  before - at every request (:meth:`CodeWatch.poll`,
  ~0.5 ms) and every :data:`POLL_INTERVAL` seconds while idle.

Either way ``__pycache__`` and the fast client's sidecar are not code.
"""

from __future__ import annotations

import _thread
import errno
import os
import time

from .._inotify import CHANGES, IN_Q_OVERFLOW, Inotify

__all__ = ["POLL_INTERVAL", "CodeWatch"]

#: seconds between two stat checks of an idle server without inotify
POLL_INTERVAL = 2.0
#: what inotify_init1 / inotify_add_watch fail with when the user's quota is spent
_OUT_OF_INOTIFY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.ENOMEM})
#: how long before a fingerprint a change may still share its timestamps (generous: ticks are ms)
_RACY_NS = 100_000_000


class CodeWatch:
    """Notices any change under corral's package directories (inotify, else stat checks)."""

    _MASK = CHANGES
    _IGNORED_NAMES = frozenset({b"__pycache__"})
    #: the fast client's sidecar (and its temporary files): a record, not code
    _IGNORED_PREFIXES = (b"corral-client.cli",)

    def __init__(self, root: str) -> None:
        """Watch *root*.

        Attributes:
            fd: the inotify descriptor to poll for input, or None (stat checks).
            inotify: the instance behind *fd* (other watchers may add watches to it).
            fallback: why inotify could not be used ("" when it is).

        Raises:
            OSError: neither way works (e.g. *root* cannot be read).
        """
        self.root = root
        self.changed = ""
        self.fallback = ""
        self.fd: int | None = None
        self.inotify: Inotify | None = None
        self._files: dict[bytes, tuple[int, int, int, int]] = {}
        self._dirs: dict[bytes, tuple[int, frozenset[bytes]]] = {}
        self._racy_files: dict[bytes, bytes] = {}
        self._racy_dirs: set[bytes] = set()
        self._checking = _thread.allocate_lock()
        try:
            self.inotify = self._inotify(root)
            self.fd = self.inotify.fd
        except OSError as exc:
            if exc.errno not in _OUT_OF_INOTIFY:
                raise
            self.fallback = f"no inotify ({exc.strerror}): checking the code's files by stat"
            self._fingerprint()

    def _inotify(self, root: str) -> Inotify:
        inotify = Inotify()
        try:
            for directory, dirs, _files in os.walk(root):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                inotify.add_watch(directory, self._MASK, self._event)
        except OSError:
            inotify.close()
            raise
        return inotify

    def _event(self, _wd: int, mask: int, name: bytes) -> None:
        if self.changed:
            return
        if mask & IN_Q_OVERFLOW:
            self.changed = "too many changes to follow"
        elif not self._ignored(name):
            self.changed = os.fsdecode(name) or "a package directory"

    def _ignored(self, name: bytes) -> bool:
        return name in self._IGNORED_NAMES or name.startswith(self._IGNORED_PREFIXES)

    def _names(self, directory: bytes) -> frozenset[bytes]:
        return frozenset(n for n in os.listdir(directory) if not self._ignored(n))

    def _fingerprint(self) -> None:
        """Record every directory's names and every file's identity under the root.

        File timestamps come from a coarse clock (one tick, a few ms): a file
        changed within the tick of the fingerprint keeps its size and times.
        Such "racy" entries (changed less than :data:`_RACY_NS` before the
        fingerprint began) are compared by content (files) or by listing
        (directories) at every check, as git does for its index.
        """
        began = time.time_ns() - _RACY_NS
        pending = [os.fsencode(self.root)]
        while pending:
            directory = pending.pop()
            st = os.stat(directory)
            self._dirs[directory] = (st.st_mtime_ns, self._names(directory))
            if max(st.st_mtime_ns, st.st_ctime_ns) >= began:
                self._racy_dirs.add(directory)
            for name in self._dirs[directory][1]:
                path = os.path.join(directory, name)
                st = os.stat(path, follow_symlinks=False)
                if os.path.isdir(path) and not os.path.islink(path):
                    pending.append(path)
                    continue
                self._files[path] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                if max(st.st_mtime_ns, st.st_ctime_ns) >= began:
                    self._racy_files[path] = self._content(path)

    @staticmethod
    def _content(path: bytes) -> bytes:
        if os.path.islink(path):
            return os.fsencode(os.readlink(path))
        with open(path, "rb") as f:
            return f.read()

    def _check(self) -> str:
        """What differs from the fingerprint ("" if nothing)."""
        for path, identity in self._files.items():
            try:
                st = os.stat(path, follow_symlinks=False)
                if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != identity or (
                    path in self._racy_files and self._content(path) != self._racy_files[path]
                ):
                    return os.fsdecode(os.path.basename(path))
            except OSError:
                return os.fsdecode(os.path.basename(path))
        for directory, (mtime, names) in self._dirs.items():
            try:
                now = os.stat(directory).st_mtime_ns
                if now == mtime and directory not in self._racy_dirs:
                    continue
                current = self._names(directory)  # e.g. only __pycache__ or the sidecar moved
            except OSError:
                return os.fsdecode(directory)
            if current != names:
                return os.fsdecode(next(iter(current ^ names)))
            self._dirs[directory] = (now, names)
        return ""

    def poll(self) -> str:
        """Read pending events (or check the files); return what changed ("" if nothing)."""
        if self.fd is None:
            with self._checking:  # the main loop and request threads both check
                if not self.changed:
                    self.changed = self._check()
            return self.changed
        assert self.inotify is not None
        self.inotify.drain()
        return self.changed

    def close(self) -> None:
        if self.inotify is not None:
            self.inotify.close()
