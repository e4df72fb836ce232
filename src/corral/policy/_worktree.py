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
    outside the workspace, the shared directory is what ``G/commondir`` names
    (relative to ``G``), a git directory (``objects``, ``refs``) of which ``G`` is
    ``<common>/worktrees/NAME`` (git's own layout), and ``G`` *vouches* for the workspace: its
    ``gitdir`` file (written by ``git worktree add``, absolute or relative to
    ``G``) names this ``.git`` file. Returns the resolved shared directory,
    else None: an unusual layout (``--separate-git-dir``, where no file
    vouches) is left alone, and git fails in the sandbox as it does without
    this.

    Why the vouching: the ``.git`` file is in the workspace, where an earlier
    sandbox could have written it (a repository the run creates is its own),
    naming any repository of the user's. The back-pointer lies in the shared
    directory, which a sandbox can write only if it could already write that
    directory - so a planted ``.git`` file never makes a git directory
    writable that its planter could not write (docs/threat-model.md, "Git").
    That holds only because the shared directory is ``G``'s grandparent: a
    sandbox of a linked worktree can write the shared directory, and with any
    ancestor of ``G`` allowed its ``G/commondir`` chose one it cannot write
    (ATK13: ``repo/.git/objects/zz/G`` with ``commondir`` ``../../../..`` made
    the main working tree writable for a run while the planting run lasted;
    the git check quarantines it only afterwards). ``<common>/worktrees/*/commondir``
    is a ``protect`` row, so no sandbox makes a ``commondir`` there; and the
    shared directory must have ``objects`` and ``refs``, which a sandbox makes
    only where it can write.
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
    if common_line is None:
        return None  # no shared directory named (--separate-git-dir): nothing vouches
    common = posixpath.join(gitdir, common_line)
    depends_on(common)
    common = os.path.realpath(common)
    if posixpath.dirname(gitdir) != posixpath.join(common, "worktrees"):
        return None  # git's own layout only: G is <common>/worktrees/NAME (see above)
    for name in ("objects", "refs"):
        depends_on(posixpath.join(common, name))
        if not os.path.isdir(posixpath.join(common, name)):
            return None  # not a git directory
    if _inside(real_workspace, common) or common == "/":
        return None  # a workspace inside its own git directory: not a worktree layout
    back = _read_pointer(posixpath.join(gitdir, "gitdir"))
    if back is None:
        return None
    back = posixpath.join(gitdir, back)
    depends_on(back)
    if os.path.realpath(back) != posixpath.join(real_workspace, ".git"):
        return None  # the git directory does not know this worktree: a planted .git file
    return common


def _inside(path: str, area: str) -> bool:
    return path == area or path.startswith(area.rstrip("/") + "/")
