"""One look at the host: each path's ``lstat`` and each link's target read at most once.

The checks made before a run (links that could steer a rule, other users who
could re-point a path, what an entry resolves to, and, before each command
of a kept sandbox, the kind, device, inode and times of every path a plan
looks at) walk the same few directories many times over: ``~``,
``~/.config``, ``~/.local/share``. A :class:`HostView` is shared by all the
checks of *one* look, so each path is asked of the kernel once per look, as
if every check had been made at the same moment. It is never kept from one
look to the next: every look starts from an empty view and asks the kernel
again (docs/threat-model.md, "The host the mounts were decided from").

What it answers is what the kernel would answer at that moment, not a guess:

* the ``lstat`` of a path is the kernel's own, made the first time it is asked;
* a path below one whose ``lstat`` failed, or below a file that is neither a
  directory nor a link, cannot be looked up either (the kernel walks the
  parent first): it is answered "missing" without asking;
* a link's target is read (``readlink``) only when its ``lstat`` showed a link;
* :meth:`HostView.realpath` resolves links as :func:`os.path.realpath` does
  (a missing component ends nothing, a loop keeps the rest as written) from
  those same answers.
"""

from __future__ import annotations

import os
import posixpath
import stat

__all__ = ["HostView", "child"]

_UNSEEN = object()


def child(done: str, name: str) -> str:
    """The path of *name* in the directory *done* (absolute, normal): ``posixpath.join``
    for one plain component, without its generality (walks call it per component)."""
    return done + name if done.endswith("/") else f"{done}/{name}"


class HostView:
    """The host's paths as one look sees them (see the module docstring)."""

    __slots__ = ("_links", "_stats", "plain")

    def __init__(self) -> None:
        self._stats: dict[str, os.stat_result | None] = {}
        self._links: dict[str, str] = {}
        #: Paths (``/a/b``: no empty, ``.`` or ``..`` component) a walk found no link on:
        #: each component answered "not a link" (or missing) by this view. A walk to a path
        #: below one of them follows no link before it reaches its last component.
        self.plain: set[str] = set()

    def lstat(self, path: str) -> os.stat_result | None:
        """``os.lstat(path)``, or ``None`` where it fails; the first answer for *path*."""
        stats = self._stats
        try:
            return stats[path]
        except KeyError:
            pass
        parent, _, name = path.rpartition("/")
        if parent and name and name != "." and name != "..":
            above = stats.get(parent, _UNSEEN)
            if above is None or (
                isinstance(above, os.stat_result)
                and not stat.S_ISDIR(above.st_mode)
                and not stat.S_ISLNK(above.st_mode)
            ):
                stats[path] = None  # the kernel could not walk through *parent* either
                return None
        try:
            found: os.stat_result | None = os.lstat(path)
        except OSError:
            found = None
        stats[path] = found
        return found

    def stat(self, path: str) -> os.stat_result | None:
        """``os.stat(path)`` (a final link followed), or ``None`` where it fails."""
        found = self.lstat(path)
        if found is None or not stat.S_ISLNK(found.st_mode):
            return found
        try:
            return os.stat(path)
        except OSError:
            return None

    def readlink(self, path: str) -> str | None:
        """The target of the link *path*; ``None`` when *path* is no link (or missing).

        Raises:
            OSError: the link was gone by the time its target was read (as
                ``os.readlink`` raises).
        """
        found = self.lstat(path)
        if found is None or not stat.S_ISLNK(found.st_mode):
            return None
        links = self._links
        target = links.get(path)
        if target is None:
            target = links[path] = os.readlink(path)
        return target

    def realpath(self, path: str) -> str:
        """``os.path.realpath(path)`` from this view's answers (relative *path*: asked anew)."""
        if not path.startswith("/"):
            return os.path.realpath(path)
        resolved, _ = self._resolve("/", path, {})
        return posixpath.normpath(resolved)

    def _resolve(self, done: str, rest: str, seen: dict[str, str | None]) -> tuple[str, bool]:
        """*rest* resolved below the link-free *done*: ``(path, False)`` when a loop stopped it.

        *seen* maps each link being (``None``) or already resolved to where it led, as
        :func:`os.path.realpath` keeps it to stop at a loop.
        """
        if rest.startswith("/"):
            done, rest = "/", rest[1:]
        while rest:
            name, _, rest = rest.partition("/")
            if not name or name == ".":
                continue
            if name == "..":
                done = posixpath.dirname(done)
                continue
            here = child(done, name)
            target = self.readlink(here)
            if target is None:  # no link (or missing: what follows is kept as written)
                done = here
                continue
            if here in seen:
                led = seen[here]
                if led is None:  # a loop
                    return posixpath.join(here, rest), False
                done = led
                continue
            seen[here] = None
            done, ended = self._resolve(done, target, seen)
            if not ended:
                return posixpath.join(done, rest), False
            seen[here] = done
        return done, True
