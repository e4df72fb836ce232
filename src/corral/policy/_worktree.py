"""A linked git worktree as the workspace: what its git directory needs in the sandbox.

``git worktree add`` (and Claude Code's worktree sessions, under
``repo/.claude/worktrees/NAME``) make a working tree whose ``.git`` is a file,
``gitdir: <repo>/.git/worktrees/NAME``; that admin directory names the shared
repository in its ``commondir``. Both usually lie outside the workspace (and
often under the private ``/tmp`` or a hidden directory), so git inside the
sandbox fails with "not a git repository".

:func:`linked_worktree_common_dir` finds the shared git directory of such a
workspace. The settings loader then makes it writable the way a workspace's
own ``.git`` is (objects, refs, logs, index and HEAD: ``status``, ``add`` and
``commit`` work) and protects in it exactly what ``filesystem.protect``
protects in a workspace's ``.git``: every ``**/.git/REST`` pattern becomes the
absolute ``denyWrite`` pattern ``<common dir>/REST`` (``config``, ``hooks/**``,
``commondir``, ``worktrees/*/config.worktree``, the submodules' ``config`` and
``hooks`` ...). So the sandbox can write what it could write in a repository
it works in, and nothing git later runs as code (docs/threat-model.md, "Git").
The worktree's ``.git`` file itself is protected by the ``**/.git`` pattern:
the command cannot point it elsewhere.
"""

from __future__ import annotations

import os
import posixpath

from ._watched import depends_on

__all__ = ["GIT_PATTERN_PREFIX", "linked_worktree_common_dir"]

#: The prefix of the ``filesystem.protect`` patterns that protect a ``.git`` directory.
GIT_PATTERN_PREFIX = "**/.git/"

_MAX_POINTER = 4096  # a .git file or commondir is one short line


def _read_pointer(path: str) -> str | None:
    """The first line of the regular file *path* (not followed if a symlink), or None."""
    depends_on(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _MAX_POINTER)
    except OSError:
        return None
    finally:
        os.close(fd)
    line = data.decode("utf-8", "surrogateescape").split("\n", 1)[0].rstrip("\r")
    return line or None


def linked_worktree_common_dir(workspace: str) -> str | None:
    """The shared git directory of *workspace* when it is a linked worktree, else None.

    *workspace* is a linked worktree when its ``.git`` is a regular file
    ``gitdir: G`` (absolute, or relative to the workspace) naming a directory
    outside the workspace; the shared directory is what ``G/commondir`` names
    (relative to ``G``), or ``G`` itself without one (``--separate-git-dir``).
    Returns the resolved shared directory when ``G`` lies inside it (the
    usual ``<common>/worktrees/NAME``), else None: an unusual layout is left
    alone (git fails in the sandbox as it does without this).
    """
    line = _read_pointer(posixpath.join(workspace, ".git"))
    if line is None or not line.startswith("gitdir:"):
        return None
    gitdir = posixpath.join(workspace, line[len("gitdir:") :].strip())
    depends_on(gitdir)
    gitdir = os.path.realpath(gitdir)
    if not os.path.isdir(gitdir):
        return None
    depends_on(workspace)
    real_workspace = os.path.realpath(workspace)
    if _inside(gitdir, real_workspace):
        return None  # already writable as part of the workspace
    common_line = _read_pointer(posixpath.join(gitdir, "commondir"))
    common = gitdir if common_line is None else posixpath.join(gitdir, common_line)
    depends_on(common)
    common = os.path.realpath(common)
    if not os.path.isdir(common) or not _inside(gitdir, common):
        return None
    if _inside(real_workspace, common) or common == "/":
        return None  # a workspace inside its own git directory: not a worktree layout
    return common


def _inside(path: str, area: str) -> bool:
    return path == area or path.startswith(area.rstrip("/") + "/")
