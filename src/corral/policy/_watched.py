"""An exact cache of what is computed from settings files, kept while inotify reports no change.

The corral server answers every Claude Code hook call; reading and merging the
settings layers and Claude Code's permission files again each time costs more
than the rest of the decision. The cache
(:class:`~corral.policy._watchcache.WatchedCache`, loaded by the server only)
keeps a result together with everything it depended on, recorded here while
it was computed:

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
call returns, and each reuse first reads the queue (non-blocking): an edit
that completed before the call is always seen.

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
  ``MAX_WATCHES`` (1024) watches held;
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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TypeVar

    from .._inotify import Inotify
    from ._watchcache import WatchedCache

    T = TypeVar("T")

__all__ = [
    "cached",
    "depends_on",
    "depends_on_listing",
    "install",
    "installed",
    "observed",
]

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


_cache: WatchedCache | None = None


def install(inotify: Inotify) -> WatchedCache:
    """Make :func:`cached` use a cache on *inotify* in this process (the corral server)."""
    from ._watchcache import WatchedCache

    global _cache
    _cache = WatchedCache(inotify)
    return _cache


def installed() -> WatchedCache | None:
    """The process's cache, if :func:`install` was called."""
    return _cache


def cached(kind: str, cwd: str, environ: Mapping[str, str], compute: Callable[..., T]) -> T:
    """``compute(environ)`` through the process's cache, or directly when there is none.

    A result is reused for the same *kind* and *cwd* when the environment
    variables it read are unchanged and nothing it recorded changed on disk:
    *kind* must therefore name every other input of *compute* (flags, a
    command line, a profile: ``"settings"`` for the hook's plain load; a run
    path would use e.g. its flags' JSON in it).

    Inside another cached computation it computes directly, so that what it
    reads is recorded for the outer one.
    """
    cache = _cache
    if cache is None or getattr(_local, "recorder", None) is not None:
        return compute(environ)
    return cache.get(kind, cwd, environ, compute)
