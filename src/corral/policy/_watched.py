"""An exact cache of what is computed from settings files, kept while inotify reports no change.

The corral server answers every Claude Code hook call; reading and merging the
settings layers and Claude Code's permission files again each time costs more
than the rest of the decision. :class:`WatchedCache` keeps a result together
with everything it depended on, recorded while it was computed:

* every **path** it looked up (:func:`depends_on`): a settings file, a
  directory it opened, a ``.git`` it looked for, a file that did not exist;
* every **directory listing** it read (:func:`depends_on_listing`);
* every **environment variable** it read, with its value or its absence
  (the environment is wrapped in a recording mapping; iterating it records
  the whole environment);
* every **other fact** it read (:func:`observed`: the user database's home
  directory), re-checked on each reuse.

When a result is stored, every path is already watched on the server's one
inotify instance (:mod:`corral._inotify`): each directory the kernel walks to
resolve the path - every component's parent, following each symbolic link
through its target's directories - with the names looked up in it, and the
object the path ends at itself. A result computed while some path was not yet
watched is returned but not stored: the watches are added, and the next call
computes again, this time with every watch in place *before* it read
anything. So an edit after the read queues an event before the edit's system
call returns, and :meth:`WatchedCache.get` reads the queue (non-blocking)
before each reuse: an edit that completed before the call is always seen.

Which events count: on a directory, one for a name the result looked up (the
file or directory was written, created, deleted, renamed over, had its
permissions changed) - or for any name, for a listing -; on the object
itself, or with no name, any event (written through another hard link,
deleted, moved, its directory's permissions changed); the kernel dropping a
watch (``IN_IGNORED``: the inode is gone or unmounted) or its queue
overflowing. Any such event empties the cache and removes every watch (they are
added again by the next compute). A change of the mount table (polled on
``/proc/self/mountinfo``: a mount over a watched directory sends no inotify
event) does the same. Timestamps are never used.

What makes it fall back to computing every time (never to a stale result):

* a path on a filesystem whose inotify events are not complete: only ext2/3/4,
  XFS, btrfs, tmpfs and F2FS are trusted (local: every change goes through
  this kernel); NFS, CIFS, FUSE, overlayfs and the rest may change underneath
  without an event, so a result that read one is not stored;
* more than 40 symbolic links on a path, or a watch the kernel refuses
  (no permission, the user's ``max_user_watches`` reached), or more than
  :data:`MAX_WATCHES` watches held;
* no inotify at all (the server's code watch fell back to stat checks, or
  another OS): :func:`install` is never called and :func:`cached` computes;
  no ``/proc/self/mountinfo``: every call counts as a change.

Not reported by inotify, and so not by this cache: writes through a shared
writable memory mapping of a file (``mmap``) after the writer's last
``close``. The cache then keeps what the file said at the last event - content
that writer could as well have left in place with a plain write, so a
sandboxed writer gains nothing; an editor or tool of the user writes with
``write`` or renames, which are seen.

A stored result is shared by every caller that reuses it: treat it as read-only.
"""

from __future__ import annotations

import _thread
import os
import posixpath
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, TypeVar

    from .._inotify import Inotify

    T = TypeVar("T")

__all__ = [
    "MAX_WATCHES",
    "WatchedCache",
    "cached",
    "depends_on",
    "depends_on_listing",
    "install",
    "installed",
    "observed",
]

#: the most watches the cache holds; past it, results are not stored
MAX_WATCHES = 1024
#: the filesystems whose inotify events are complete (statfs f_type): ext2/3/4, XFS,
#: btrfs, tmpfs, F2FS
LOCAL_FILESYSTEMS = frozenset({0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010})
#: how many symbolic links one path may pass (the kernel's own limit)
_MAX_LINKS = 40

_local = _thread._local()


class _Recorder:
    __slots__ = ("facts", "listings", "paths")

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.listings: set[str] = set()
        self.facts: list[tuple[Callable[[], object], object]] = []


def depends_on(path: str) -> None:
    """Record that what is being computed depends on what the lookup of *path* gives."""
    recorder: _Recorder | None = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.paths.add(path)


def depends_on_listing(path: str) -> None:
    """Record that what is being computed depends on the names in the directory *path*."""
    recorder: _Recorder | None = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.paths.add(path)
        recorder.listings.add(path)


def observed(read: Callable[[], T]) -> T:
    """``read()``, recorded so that a reuse calls it again and compares (a fact no file holds)."""
    value = read()
    recorder: _Recorder | None = getattr(_local, "recorder", None)
    if recorder is not None and (read, value) not in recorder.facts:
        recorder.facts.append((read, value))
    return value


_MISSING = object()


class _RecordingEnviron:
    """A read-only view of an environment that records what was read (a Mapping)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        self.read: dict[str, object] = {}
        self.whole = False

    def __getitem__(self, name: str) -> str:
        self.read[name] = self._environ.get(name, _MISSING)
        return self._environ[name]

    def get(self, name: str, default: Any = None) -> Any:
        self.read[name] = self._environ.get(name, _MISSING)
        return self._environ.get(name, default)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.read[name] = self._environ.get(name, _MISSING)
        return name in self._environ

    def __iter__(self) -> Iterator[str]:
        self.whole = True
        return iter(self._environ)

    def __len__(self) -> int:
        self.whole = True
        return len(self._environ)

    def keys(self) -> Any:
        self.whole = True
        return self._environ.keys()

    def items(self) -> Any:
        self.whole = True
        return self._environ.items()

    def values(self) -> Any:
        self.whole = True
        return self._environ.values()


class _Entry:
    __slots__ = ("environ", "facts", "value", "whole")

    def __init__(
        self,
        value: object,
        environ: dict[str, object],
        whole: dict[str, str] | None,
        facts: list[tuple[Callable[[], object], object]],
    ) -> None:
        self.value = value
        self.environ = environ
        self.whole = whole
        self.facts = facts

    def matches(self, environ: Mapping[str, str]) -> bool:
        if self.whole is not None and dict(environ) != self.whole:
            return False
        for name, value in self.environ.items():
            if environ.get(name, _MISSING) != value:
                return False
        for read, value in self.facts:
            try:
                if read() != value:
                    return False
            except Exception:
                return False
        return True


class WatchedCache:
    """Results keyed by ``(kind, cwd)``, kept while inotify reports no change to their inputs."""

    def __init__(self, inotify: Inotify) -> None:
        self._inotify = inotify
        self._lock = _thread.allocate_lock()
        #: bumped by the inotify handler (under the inotify lock) on every event that counts
        self._changes = 0
        self._seen = 0
        self._entries: dict[tuple[str, str], list[_Entry]] = {}
        #: path -> the install sequence number when it became watched
        self._paths: dict[str, int] = {}
        self._sequence = 0
        #: watch descriptor -> the names that count in it ("" for the object itself, "*" any)
        self._names: dict[int, set[bytes]] = {}
        self._unwatchable: set[str] = set()
        self._mounts: int | None = None
        self._mount_poll: Any = None
        try:
            self._mounts = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
            import select

            self._mount_poll = select.poll()
            self._mount_poll.register(self._mounts, select.POLLPRI)
        except OSError:
            pass
        self.stored = 0
        self.reused = 0

    def statistics(self) -> dict[str, int]:
        """Results stored and reused since start, and the watches held now."""
        return {"stored": self.stored, "reused": self.reused, "watches": len(self._names)}

    def close(self) -> None:
        if self._mounts is not None:
            os.close(self._mounts)
            self._mounts = None

    # ------------------------------------------------------------ events
    def _event(self, wd: int, mask: int, name: bytes) -> None:
        """The inotify handler (runs under the inotify lock; takes no lock of ours)."""
        names = self._names.get(wd)
        if wd == -1 or (names is not None and (not name or name in names or b"*" in names)):
            self._changes += 1

    def _mounts_changed(self) -> bool:
        """Whether the mount table changed since the last call (under our lock).

        Without ``/proc`` there is no way to know: every call counts as a change.
        """
        if self._mount_poll is None:
            return True
        return bool(self._mount_poll.poll(0))

    def _catch_up(self) -> None:
        """Read the queued events; on a change, forget every result and watch (under our lock)."""
        self._inotify.drain()
        if self._mounts_changed():
            self._changes += 1  # the inotify handler cannot run now: drain has returned
        if self._changes == self._seen:
            return
        self._seen = self._changes
        self._entries.clear()
        self._paths.clear()
        self._unwatchable.clear()
        for wd in list(self._names):
            self._inotify.remove_watch(wd, self._event)
        self._names.clear()

    # ------------------------------------------------------------ the cache
    def get(self, kind: str, cwd: str, environ: Mapping[str, str], compute: Callable[..., T]) -> T:
        """``compute(environ)``, or the stored result of an earlier call whose inputs are unchanged.

        *compute* must read its environment only through the mapping it is
        given, and every file through :func:`depends_on` /
        :func:`depends_on_listing`. Its exceptions are raised, never stored.
        """
        with self._lock:
            self._catch_up()
            for entry in self._entries.get((kind, cwd), ()):
                if entry.matches(environ):
                    self.reused += 1
                    return entry.value  # type: ignore[return-value]
            changes, sequence = self._changes, self._sequence
        recorder = _Recorder()
        recording = _RecordingEnviron(environ)
        outer = getattr(_local, "recorder", None)
        _local.recorder = recorder
        try:
            value = compute(recording)
        finally:
            _local.recorder = outer
        with self._lock:
            self._catch_up()
            if self._changes != changes:
                return value  # something changed while it was computed: not stored
            missing = [p for p in recorder.paths if self._paths.get(p, sequence + 1) > sequence]
            if missing:
                for path in missing:
                    if path not in self._paths and path not in self._unwatchable:
                        if self._watch(path, listing=path in recorder.listings):
                            self._sequence += 1
                            self._paths[path] = self._sequence
                        else:
                            self._unwatchable.add(path)
                return value  # stored by the next call, which reads with every watch in place
            whole = dict(environ) if recording.whole else None
            entries = self._entries.setdefault((kind, cwd), [])
            entries.append(_Entry(value, recording.read, whole, recorder.facts))
            del entries[:-8]  # a few environments per directory
            self.stored += 1
            return value

    # ------------------------------------------------------------ watches
    def _add(self, path: str, name: bytes) -> bool:
        """Watch the directory or file *path*; *name* counts in it. False: cannot."""
        if len(self._names) >= MAX_WATCHES or not _local_filesystem(path):
            return False
        try:
            wd = self._inotify.add_watch(path, _MASK, self._event)
        except OSError:
            return False
        self._names.setdefault(wd, set()).add(name)
        return True

    def _watch(self, path: str, *, listing: bool) -> bool:
        """Watch every directory the kernel walks to resolve *path*, and what it ends at.

        Each directory is watched *before* the entry in it is looked at, so a
        change after the look queues an event. A missing entry ends the walk:
        its directory's watch sees it appear.
        """
        pending = [p for p in reversed(path.split("/")) if p and p != "."]
        current = "/"
        links = 0
        while pending:
            name = pending.pop()
            if name == "..":
                if not self._add(current, b""):
                    return False
                current = posixpath.dirname(current)
                continue
            if not self._add(current, os.fsencode(name)):
                return False
            child = posixpath.join(current, name)
            try:
                mode = os.lstat(child).st_mode
            except OSError:
                return True  # missing or not searchable: the directory's watch sees it change
            if stat.S_ISLNK(mode):
                links += 1
                if links > _MAX_LINKS:
                    return False
                try:
                    target = os.readlink(child)
                except OSError:
                    return False
                if target.startswith("/"):
                    current = "/"
                pending.extend(p for p in reversed(target.split("/")) if p and p != ".")
                continue
            current = child
        return self._add(current, b"*" if listing else b"")


#: the changes, and IN_DONT_FOLLOW: the walk resolves links itself
_MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x02000000


def _local_filesystem(path: str) -> bool:
    """Whether *path* lies on a filesystem whose every change this kernel's inotify reports."""
    import ctypes

    buffer = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first field
    if _statfs(os.fsencode(path), buffer) != 0:
        return False
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF in LOCAL_FILESYSTEMS


def _statfs(path: bytes, buffer: Any) -> int:
    import ctypes

    libc = getattr(_statfs, "libc", None)
    if libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        _statfs.libc = libc  # type: ignore[attr-defined]
    return int(libc.statfs(path, buffer))


_cache: WatchedCache | None = None


def install(inotify: Inotify) -> WatchedCache:
    """Make :func:`cached` use a cache on *inotify* in this process (the corral server)."""
    global _cache
    _cache = WatchedCache(inotify)
    return _cache


def installed() -> WatchedCache | None:
    """The process's cache, if :func:`install` was called."""
    return _cache


def cached(kind: str, cwd: str, environ: Mapping[str, str], compute: Callable[..., T]) -> T:
    """``compute(environ)`` through the process's cache, or directly when there is none.

    Inside another cached computation it computes directly, so that what it
    reads is recorded for the outer one.
    """
    cache = _cache
    if cache is None or getattr(_local, "recorder", None) is not None:
        return compute(environ)
    return cache.get(kind, cwd, environ, compute)
