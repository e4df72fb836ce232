"""A root caller's writable roots must be paths only root can re-point.

For a root caller, corral resolves the workspace, each ``allowWrite`` path,
each cache and the caller's home (read-only inside) *by path, with root's
rights*: the ``--as-user`` stage clones and idmaps them (the sandbox then owns
what root owns there), the write broker
opens them as its roots, Landlock, gVisor and the container engines bind or
allow them. If another host user can change a directory on the way to such a
path (``/home/alice/proj/out`` with ``/home/alice`` hers), she can replace a
component by a symbolic link to any root-owned directory (``/etc``), before
the run or in the instant between two of those steps, and the sandbox gets
that directory instead of hers. The policy named a path, not a directory, so
the only complete rule is about who can change what the path names:

every directory looked up on the way (each link's target included) must be
owned by root and writable by nobody else - its group and others have no write
bit (an ACL granting write shows in the group bits), or it is sticky (``/tmp``)
and the entry looked up in it is root's (only its owner may rename it).

Then nothing on the way can change except by root, before or during the run.
The final component's own owner does not matter: it is the directory the policy
granted, and replacing it needs write access to its parent. Checked on every
run (nothing is remembered); a path that does not exist yet is left to the
backend's own check (no one but root can create it under a root-only parent).
"""

from __future__ import annotations

import os
import posixpath
import stat

from .._exceptions import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy._model import Policy

__all__ = ["is_host_root", "redirectable_by", "refuse_redirectable_roots"]


def redirectable_by(path: str) -> tuple[str, int] | None:
    """``(directory, its owner)`` of the first step on the way to *path* another user controls.

    Links are followed as the kernel follows them (relative and absolute
    targets, links in targets; at most 40). None when only root can change
    what *path* resolves to (or when a component is missing).
    """
    done, pending, hops = "/", [p for p in path.split("/") if p], 0
    while pending:
        part = pending.pop(0)
        if part == ".":
            continue
        if part == "..":
            done = posixpath.dirname(done)  # *done* holds no link: this is the kernel's ".."
            continue
        here = posixpath.join(done, part)
        try:
            parent = os.stat(done)
            entry = os.lstat(here)
        except OSError:
            return None
        if parent.st_uid != 0:
            return done, parent.st_uid
        if parent.st_mode & 0o022:
            if not parent.st_mode & stat.S_ISVTX:
                return done, parent.st_uid
            if entry.st_uid != 0:  # a sticky directory: its owner may rename the entry
                return here, entry.st_uid
        if stat.S_ISLNK(entry.st_mode):
            hops += 1
            if hops > 40:
                return None  # the kernel refuses it too (ELOOP)
            target = os.readlink(here)
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


def refuse_redirectable_roots(policy: Policy, home: str) -> None:
    """Refuse (exit 125) a root caller's writable root that another user can re-point.

    *home* (the caller's ``$HOME``) is checked too: the stage idmaps it like
    the writable roots (read-only inside). Only for the host's root
    (:func:`is_host_root`).

    Raises:
        UsageError: naming the path, the setting and the directory another user controls.
    """
    if not is_host_root():
        return
    fs = policy.filesystem
    roots = [(fs.workspace, "filesystem.workspace")]
    roots += [(p, "filesystem.allowWrite") for p in fs.allow_write]
    roots += [(p, f"caches.{name}") for name, p in policy.caches]
    roots.append((home, "the home directory"))
    for path, key in roots:
        found = redirectable_by(path)
        if found is not None:
            where, owner = found
            raise UsageError(
                f"Failed to use {key} {path} for a root caller: uid {owner} can change "
                f"{where} on the way to it, and could point it at any of root's directories "
                "(docs/threat-model.md, 'Never the host's root identity')",
                hint="run corral as the user who owns that directory, or use a path "
                "only root can change",
            )
