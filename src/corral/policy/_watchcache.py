"""The settings cache itself (see :mod:`corral.policy._watched` for its rule); loaded by the server only."""

from __future__ import annotations

import _thread
import os
import posixpath
import stat

from .._inotify import CHANGES, IN_DONT_FOLLOW
from ._watched import _local, _Recorder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any, TypeVar

    from .._inotify import Inotify

    T = TypeVar("T")

__all__ = ["LOCAL_FILESYSTEMS", "MAX_WATCHES", "WatchedCache"]

#: the most watches the cache holds; past it, results are not stored
MAX_WATCHES = 1024
#: the filesystems whose inotify events are complete (statfs f_type): ext2/3/4, XFS,
#: btrfs, tmpfs, F2FS
LOCAL_FILESYSTEMS = frozenset({0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010})
#: how many symbolic links one path may pass (the kernel's own limit)
_MAX_LINKS = 40

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
            # may race with the handler in another thread's drain: the count still moves
            self._changes += 1
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
_MASK = CHANGES | IN_DONT_FOLLOW


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
