"""Expand ``filesystem.denyRead`` globs into the host paths they match, at start-up.

Every backend hides literal paths (bubblewrap masks, Landlock's read split,
container and gVisor mounts, Seatbelt rules). A glob entry
(``/srv/certs/**/*.pem``, ``**/.env``) is turned into the paths that match it
*when the command starts*, before the host is inspected, so every backend
enforces it with the mechanism it already has and ``plan()`` stays pure.

The walk is bounded and never follows links:

* it starts at the glob's longest literal directory prefix and descends only
  into directories below which the glob could still match;
* a matching directory is hidden whole (nothing below it is visited);
* a matching link hides the link's target as well, when it exists (reading
  through the link would read the target);
* more than :data:`MAX_VISITED` directory entries looked at, or more than
  :data:`MAX_MATCHES` matches, refuses the run (exit 125) with the glob named:
  a glob that cannot be expanded cannot be enforced.

Links among the hidden paths are resolved the same way: a ``denyRead`` (or
``allowRead``) entry reached through a symbolic link (``~/.aws`` managed by a
dotfiles tool as a link to ``~/dotfiles/aws``) is replaced by the path it
resolves to. Hiding the link's own name would leave the target readable under
its real path, and a mount cannot be placed on a link at all.

A link the sandboxed command can re-point never steers a rule: an entry (or a
glob's literal directory) whose resolution follows a link lying below the
workspace, an ``allowWrite`` path or a cache refuses the run (exit 125). The
command could aim it elsewhere between two runs, so an ``allowRead`` would
re-expose whatever it names (``~/.ssh``) and a ``denyRead`` would stop hiding
what it hid. (A link a glob *matches* is harmless: it and its target are
hidden, and its old target was hidden when it was planted.) Nor does another
host user: an ``allowRead`` entry on whose way a directory is writable by
someone but root and the caller refuses the run (exit 125,
:mod:`corral.policy._owners`), as she could link it to what the policy hides.

What the glob matches is fixed at start-up: a file the *host* creates under a
matching name while the command runs is not hidden (docs/threat-model.md).
A file the command itself creates it wrote, so it has nothing to learn.
"""

from __future__ import annotations

import os
import posixpath
import stat

from .._exceptions import UsageError
from ._glob import compiled
from ._hostview import HostView, child
from ._owners import describe, is_host_root, redirectable_by

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._model import Policy

__all__ = ["MAX_MATCHES", "MAX_VISITED", "expand_deny_read", "expand_glob", "is_glob"]

#: Directory entries one glob may look at before the run is refused.
MAX_VISITED = 50_000
#: Paths one glob may match before the run is refused (each becomes a mount or a rule).
MAX_MATCHES = 512


def is_glob(path: str) -> bool:
    """Whether *path* holds glob syntax (``*``, ``?``, ``[``)."""
    return "*" in path or "?" in path or "[" in path


def _literal_prefix(pattern: str) -> str:
    """The longest directory of *pattern* (absolute) that holds no glob syntax."""
    parts = pattern.split("/")
    literal: list[str] = []
    for part in parts[:-1]:
        if is_glob(part):
            break
        literal.append(part)
    return "/".join(literal) or "/"


def _refuse(pattern: str, why: str) -> UsageError:
    return UsageError(
        f"Failed to enforce filesystem.denyRead {pattern}: {why}",
        hint="narrow the glob (a longer literal directory before the first *), or list the "
        "paths themselves",
    )


def expand_glob(pattern: str, view: HostView | None = None) -> list[str]:
    """The existing host paths the absolute glob *pattern* matches (see the module docstring).

    A matching link's target is resolved through *view* (a new one if not given).

    Raises:
        UsageError: the walk or the matches exceed their bounds.
    """
    glob = compiled(pattern)
    if view is None:
        view = HostView()
    start = _literal_prefix(pattern)
    matches: list[str] = []
    visited = 0
    stack = [start]
    while stack:
        directory = stack.pop()
        try:
            entries = os.scandir(directory)
        except OSError:
            continue  # unreadable or gone: the sandbox cannot read it either
        with entries:
            for entry in entries:
                visited += 1
                if visited > MAX_VISITED:
                    raise _refuse(
                        pattern, f"it looks at more than {MAX_VISITED} entries under {start}"
                    )
                path = entry.path if directory != "/" else "/" + entry.name
                try:
                    mode = entry.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                if glob.matches(path):
                    matches.append(path)
                    if stat.S_ISLNK(mode):
                        target = view.realpath(path)
                        if view.lstat(target) is not None:
                            matches.append(target)
                    if len(matches) > MAX_MATCHES:
                        raise _refuse(pattern, f"it matches more than {MAX_MATCHES} paths")
                    continue  # a hidden directory hides everything below it
                if stat.S_ISDIR(mode) and glob.could_match_below(path):
                    stack.append(path)
    return sorted(set(matches))


def _steerable_link(path: str, writable: Sequence[str], view: HostView) -> str | None:
    """The first link resolving *path* follows that lies below a *writable* root, if any.

    Links are followed as the kernel would (relative and absolute targets,
    links in targets); a loop stops the walk after 40 links, as it stops
    ``realpath``. *view* answers each component (one ``lstat``, and one
    ``readlink`` for a link, for all the entries of the same look: they share
    parents, ``~``, ``~/.config``), as if every entry had been walked at the
    same moment. A path whose parent an earlier walk of the look found no link
    on (:attr:`HostView.plain`) has only its last component left to look at.
    """
    plain = view.plain
    parent, _, name = path.rpartition("/")
    below_plain = name not in ("", ".", "..") and (not parent or parent in plain)
    if below_plain and _target(path, view) is None:
        plain.add(path)
        return None
    done, pending, hops = "/", [p for p in path.split("/") if p], 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = posixpath.dirname(done)
            continue
        here = child(done, part)
        target = _target(here, view)
        if target is None:  # not a link, or missing: nothing to follow
            plain.add(here)  # *done* holds no link: nor does *here*
            done = here
            continue
        if any(here.startswith(root.rstrip("/") + "/") for root in writable):
            return here
        hops += 1
        if hops > 40:
            return None
        if target.startswith("/"):
            done = "/"
        pending[:0] = [p for p in target.split("/") if p]
    return None


def _target(path: str, view: HostView) -> str | None:
    """Where the link *path* leads; ``None`` when it is no link (or no longer one)."""
    try:
        return view.readlink(path)
    except OSError:
        return None


def _refuse_steerable(key: str, entry: str, writable: Sequence[str], view: HostView) -> None:
    link = _steerable_link(entry, writable, view)
    if link is not None:
        raise UsageError(
            f"Failed to enforce filesystem.{key} {entry}: it is reached through the link "
            f"{link}, which the sandboxed command can re-point (it lies where the sandbox "
            "writes)",
            hint="name the path the link points to instead",
        )


def _refuse_other_users(key: str, entry: str, view: HostView) -> None:
    """Refuse an entry another host user can re-point (see :mod:`corral.policy._owners`).

    A re-exposed path that lies below another user's directory would re-expose
    whatever she links it to - the caller's ``~/.ssh`` the defaults hide. The
    uid 0 of a user namespace cannot tell owners apart (host directories show
    the overflow uid) and is not checked.
    """
    uid = os.geteuid()
    if uid == 0 and not is_host_root():
        return
    found = redirectable_by(entry, uid, view)
    if found is not None:
        where, owner = found
        raise UsageError(
            f"Failed to enforce filesystem.{key} {entry}: {describe(owner)} can change {where} on "
            "the way to it, and could point it at a path the policy hides",
            hint="name a path only you and root can change",
        )


def _resolved(path: str, view: HostView) -> str:
    """*path* with its links resolved, when it exists; else *path* itself."""
    if view.lstat(path) is None:
        return path
    real = view.realpath(path)
    return real if real == path or view.lstat(real) is not None else path


def expand_deny_read(policy: Policy, view: HostView | None = None) -> Policy:
    """*policy* with each ``denyRead`` glob replaced by the host paths it matches now.

    Literal entries are kept; a glob that matches nothing adds nothing. Every
    ``denyRead`` and ``allowRead`` entry that exists is replaced by its path
    with links resolved (see the module docstring). Returns *policy* itself
    when nothing changes. The host is seen through *view*: one look's
    answers, shared with the caller's other checks of the same look (a new
    one if not given; never one kept from an earlier look).

    Raises:
        UsageError: a glob cannot be expanded within the bounds, or an entry is
            reached through a link the sandbox can re-point (exit 125).
    """
    fs = policy.filesystem
    # what the sandbox may have written, in this run or an earlier one
    writable = (fs.workspace, *fs.allow_write, *(path for _name, path in policy.caches))
    if view is None:
        view = HostView()
    for entry in fs.allow_read:
        _refuse_steerable("allowRead", entry, writable, view)
        _refuse_other_users("allowRead", entry, view)
    expanded: list[str] = []
    for entry in fs.deny_read:
        if not is_glob(entry):
            _refuse_steerable("denyRead", entry, writable, view)
            expanded.append(entry)
            continue
        if not entry.startswith("/"):
            raise _refuse(entry, "a glob must be absolute once the settings are resolved")
        _refuse_steerable("denyRead", _literal_prefix(entry), writable, view)
        expanded += [posixpath.normpath(p) for p in expand_glob(entry, view)]
    deny_read = tuple(dict.fromkeys(_resolved(p, view) for p in expanded))
    allow_read = tuple(dict.fromkeys(_resolved(p, view) for p in fs.allow_read))
    if deny_read == fs.deny_read and allow_read == fs.allow_read:
        return policy
    return policy.replace(filesystem=fs.replace(deny_read=deny_read, allow_read=allow_read))
