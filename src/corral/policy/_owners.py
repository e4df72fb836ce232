"""Who can change what a path names: the rule behind refusing paths another user steers.

What a path resolves to changes only when a directory entry on the way
changes (a rename, an unlink, a new link), which needs write access to that
directory - or, in a sticky directory (``/tmp``), owning the entry. So when
every directory looked up on the way to a path (each link's target walked in
turn) is owned by root or the caller and writable by no one else (no group or
other write bit: an ACL granting write shows in the group bits), or is sticky
with the looked-up entry root's or the caller's, nobody else can re-point the
path, before a run or while it starts. The final component's own owner does
not matter: replacing it needs write access to its parent. See
docs/threat-model.md ("Never the host's root identity"; "secrets on disk").
"""

from __future__ import annotations

import os
import posixpath
import stat

from ._hostview import HostView, child

__all__ = ["describe", "is_host_root", "redirectable_by"]


def describe(who: int) -> str:
    """*who* of :func:`redirectable_by` in words."""
    return "its group or other users" if who < 0 else f"uid {who}"


def redirectable_by(
    path: str, uid: int = 0, view: HostView | None = None
) -> tuple[str, int] | None:
    """``(directory, who)`` of the first step on the way to *path* another user controls.

    "Another user" is anyone but root and *uid* (the caller); *who* is the
    uid that owns the directory (or the entry, in a sticky one), or -1 when
    the directory is writable by its group or everyone. Links are
    followed as the kernel follows them (relative and absolute targets, links
    in targets; at most 40). None when only root and *uid* can change what
    *path* resolves to, also by creating a component that is missing now.
    The host is seen through *view* (one look's answers, shared with its other
    checks; a new one if not given).
    """
    if view is None:
        view = HostView()
    done, pending, hops = "/", [p for p in path.split("/") if p], 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = posixpath.dirname(done)  # *done* holds no link: this is the kernel's ".."
            continue
        here = child(done, part)
        parent = view.stat(done)
        if parent is None:
            return None
        entry = view.lstat(here)  # None: missing, whoever may create it decides what it will be
        if parent.st_uid not in (0, uid):
            return done, parent.st_uid
        if parent.st_mode & 0o022:
            if not parent.st_mode & stat.S_ISVTX:
                return done, -1
            if entry is None:  # sticky: anyone may create it
                return here, -1
            if entry.st_uid not in (0, uid):  # sticky: its owner may rename the entry
                return here, entry.st_uid
        if entry is None:
            return None  # only root or the caller can create it
        if stat.S_ISLNK(entry.st_mode):
            hops += 1
            if hops > 40:
                return None  # the kernel refuses it too (ELOOP)
            target = view.readlink(here) or ""  # a link: it has a target
            if target.startswith("/"):
                done = "/"
            pending[:0] = [p for p in target.split("/") if p]
            continue
        done = here
    return None


def is_host_root() -> bool:
    """Whether this process is root in the initial user namespace (as the exec helper asks).

    ``/proc/self/uid_map`` reads ``0 0 4294967295`` there only. The uid 0 of
    another user namespace (a sandbox's, a rootless container's) sees the
    host's directories owned by the overflow uid and is not the root the
    ``--as-user`` stage sheds (the helper does not idmap for it either).
    """
    try:
        with open("/proc/self/uid_map") as f:
            mapping = f.read().split()
    except OSError:
        return False
    return os.geteuid() == 0 and mapping == ["0", "0", "4294967295"]
