"""Where git takes code from in a directory tree: the write broker's and the hook's shared view.

Git runs code from a repository's ``config`` and ``config.worktree`` (programs
they name), from its ``hooks/``, and from what a trusted config names as code:
``core.hooksPath`` (the hooks live there instead) and a ``core.fsmonitor``
program. This module answers, for a host directory:

* :func:`git_shaped` - whether git would take the directory for a gitdir (it
  has ``objects`` and ``refs``, or ``commondir``), so its ``config`` and
  ``hooks/`` are code wherever a ``.git`` file leads to it;
* :func:`work_tree_config_files` - the configs a work tree's git reads (through its
  ``.git`` directory, or a ``.git`` file's gitdir and its common dir);
* :func:`enclosing_code_paths` - every path that the configs of the
  repositories whose work tree holds the directory name as code. Git finds
  those repositories above the directory, so where a writable root begins
  must not decide which of them are read: a nested repository a run makes at
  ``tools/`` is the next run's workspace, and ``tools/githooks`` is still the
  enclosing repository's hooks (docs/threat-model.md, "A root never hides a
  protection above it").

Everything is read without following a symbolic link at the last component,
only from regular files, with a size bound; what is read only ever *adds*
protection, so a config an earlier sandbox planted can make more paths
read-only, never fewer.
"""

from __future__ import annotations

import os
import posixpath
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "CONFIG_NAMES",
    "NESTED_SCAN_LIMIT",
    "SHAPE_CONFIG",
    "SHAPE_HOOK",
    "SHAPE_NAMES",
    "enclosing_code_paths",
    "exists_at",
    "git_shaped",
    "global_code_patterns",
    "global_git_configs",
    "nested_code_paths",
    "read_config_file",
    "read_regular_file",
    "work_tree_code_paths",
    "work_tree_config_files",
]

#: The files of a gitdir that git reads as its configuration.
CONFIG_NAMES = ("config", "config.worktree")
#: The names that make a directory shaped like a gitdir.
SHAPE_NAMES = ("objects", "refs", "commondir")
SHAPE_CONFIG = (
    "git: the config of a directory shaped like a repository is written only through "
    "config.lock, as git does"
)
SHAPE_HOOK = "git: a hook in a directory shaped like a repository"

_POINTER_MAX = 4096  # a .git file or commondir is one short line
#: directories a walk for nested repositories visits at most per root (past it: refused);
#: ``CORRAL_NESTED_SCAN_LIMIT`` in corral's environment sets another
NESTED_SCAN_LIMIT = 100_000


def nested_scan_limit() -> int:
    """:data:`NESTED_SCAN_LIMIT`, or ``CORRAL_NESTED_SCAN_LIMIT`` when it is a positive number."""
    value = os.environ.get("CORRAL_NESTED_SCAN_LIMIT", "")
    return int(value) if value.isdigit() and int(value) > 0 else NESTED_SCAN_LIMIT


def exists_at(dir_fd: int, name: str) -> bool:
    """Whether *name* exists in the directory *dir_fd* (a symlink counts as itself)."""
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def git_shaped(dir_fd: int, *, adding: str | None = None, up: bool = False) -> bool:
    """Whether the directory *dir_fd* (its parent with *up*) has ``objects`` and ``refs``,
    or ``commondir`` - counting *adding* as present."""
    prefix = "../" if up else ""
    have = {n for n in SHAPE_NAMES if n == adding or exists_at(dir_fd, prefix + n)}
    return "commondir" in have or {"objects", "refs"} <= have


def read_regular_file(dir_fd: int, name: str, limit: int = 1 << 20) -> bytes | None:
    """The bytes of the regular file *name* (never through a symlink); None otherwise."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
        return data if len(data) <= limit else None
    finally:
        os.close(fd)


def read_config_file(path: str) -> bytes:
    """A git config's bytes at the host *path* (b"" if absent or not a regular file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 1 << 20) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)


def global_git_configs(environ: Mapping[str, str], home: str) -> tuple[str, ...]:
    """The global git configs the git of a user with *environ* and *home* reads:
    ``GIT_CONFIG_GLOBAL``, else ``~/.gitconfig`` and the XDG one."""
    if environ.get("GIT_CONFIG_GLOBAL"):
        return (environ["GIT_CONFIG_GLOBAL"],)
    home = home.rstrip("/")
    xdg = environ.get("XDG_CONFIG_HOME") or f"{home}/.config"
    return (f"{home}/.gitconfig", f"{xdg.rstrip('/')}/git/config")


def global_code_patterns(environ: Mapping[str, str], home: str) -> list[tuple[str, str]]:
    """``(pattern, label)`` rows of what the global git configs of a user with *environ* and
    *home* run as code: a relative value applies in every work tree (``**/VALUE`` and
    below), an absolute one is itself and what is below it. Values are escaped, never
    read as globs."""
    from ..policy._glob import escape
    from ._gitcheck import trusted_code_paths

    rows: list[tuple[str, str]] = []
    for config in global_git_configs(environ, home):
        label = f"git: a path the user's global git config ({config}) runs code from"
        for found in trusted_code_paths(read_config_file(config), "/", "*", source=config):
            text = f"**/{escape(found[3:])}" if found.startswith("**/") else "/" + escape(found)
            rows += [(text, label), (text + "/**", label)]
    return rows


def enclosing_code_paths(directory: str, *, own_fd: int | None = None) -> list[str]:
    """The absolute paths that the configs of the repositories whose work tree holds the
    absolute *directory* name as code (``core.hooksPath``, a ``core.fsmonitor`` program).

    Every directory from *directory* up to ``/`` that holds a ``.git`` (a directory or a
    file) is such a work tree; *own_fd*, when given, is how *directory* itself is reached
    to see whether it holds one (the broker's descriptor of its root, which may be another
    view of it, e.g. a preview's overlay). Relative values are taken from the work tree
    that names them; each config is read by git where it lies, with its includes.
    """
    found: list[str] = []
    current = posixpath.normpath(directory)
    first = True
    while True:
        fd = own_fd if first and own_fd is not None else -1
        opened = False
        if fd < 0:
            try:
                fd = os.open(current, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                opened = True
            except OSError:
                fd = -1
        if fd >= 0:
            try:
                holds = exists_at(fd, ".git")
            finally:
                if opened:
                    os.close(fd)
            if holds:
                found += work_tree_code_paths(current)
        if current == "/":
            return list(dict.fromkeys(found))
        current = posixpath.dirname(current)
        first = False


def work_tree_config_files(tree: str) -> list[str]:
    """The config files the git of the work tree at the absolute path *tree* reads: its
    ``.git``'s ``config`` (through a ``.git`` file: the gitdir's common dir's) and the
    gitdir's ``config.worktree``. The ``.git`` file is read without following a link."""
    gitdir = f"{tree.rstrip('/')}/.git"
    try:
        fd = os.open(gitdir, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        fd = -1  # a directory (O_RDONLY works there too), a link, or nothing
    if fd >= 0:
        try:
            st = os.fstat(fd)
            text = os.read(fd, _POINTER_MAX) if stat.S_ISREG(st.st_mode) else None
        finally:
            os.close(fd)
        if text is not None:
            line = text.strip()
            if not line.startswith(b"gitdir:"):
                return []
            target = os.fsdecode(line[len(b"gitdir:") :].strip())
            gitdir = posixpath.normpath(posixpath.join(tree, target))
    common = gitdir
    pointer = read_config_file(f"{gitdir}/commondir")[:_POINTER_MAX].strip()
    if pointer:
        common = posixpath.normpath(posixpath.join(gitdir, os.fsdecode(pointer)))
    return [f"{common}/config", f"{gitdir}/config.worktree"]


def work_tree_code_paths(tree: str) -> list[str]:
    """The absolute paths the configs of the work tree at *tree* name as code."""
    from ._gitcheck import trusted_code_paths

    found: list[str] = []
    for config in work_tree_config_files(tree):
        data = read_config_file(config)
        if data:
            found += ["/" + p for p in trusted_code_paths(data, "/", tree, source=config)]
    return found


def nested_code_paths(
    root: str, *, root_fd: int | None = None, limit: int | None = None
) -> list[str] | None:
    """The absolute paths that the configs of the repositories nested below the absolute
    directory *root* name as code (``core.hooksPath``, a ``core.fsmonitor`` program),
    relative values taken from each one's work tree (``app/`` with ``../shared-hooks``
    names ``<root>/shared-hooks``); ``None`` when they cannot all be found.

    A walk of at most *limit* directories (default :func:`nested_scan_limit`), from
    *root_fd* when given (the broker's view of the root) else from *root*; never through
    a symbolic link, never into a ``.git``. A walk that reaches its limit is ``None``,
    never a partial answer: what a sandbox can fill must not turn a protection off
    (ATK19 made 100,000 directories listed before a nested repository, and the walk never
    reached it), and so is a walk that met a directory of this uid it could not read
    (:func:`_nested_work_trees`). Its callers refuse instead.
    """
    found: list[str] = []
    base = posixpath.normpath(root).rstrip("/")
    limit = nested_scan_limit() if limit is None else limit
    opened = -1
    if root_fd is None:
        try:
            opened = root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return []  # nothing there (an allowWrite path not made yet)
        except OSError:
            return None
    try:
        trees = _nested_work_trees(root_fd, limit)
    finally:
        if opened >= 0:
            os.close(opened)
    if trees is None:
        return None
    for rel in trees:
        found += work_tree_code_paths(f"{base}/{rel}")
    return list(dict.fromkeys(found))


def _nested_work_trees(root_fd: int, limit: int) -> list[str] | None:
    """The root-relative paths of the directories below *root_fd* that hold a ``.git``;
    ``None`` when they cannot all be found: past *limit* directories, or a directory of
    this uid the walk cannot read (a sandbox may ``chmod 000`` one of its uid's - root
    reads through it, so for a root caller this never happens). Another user's directory
    that cannot be read is passed by: this user's git cannot work there either. Never
    through a symbolic link, never into a ``.git``."""
    uid = os.geteuid()
    found: list[str] = []
    pending = [""]
    seen = 0
    while pending:
        rel = pending.pop()
        seen += 1
        if seen > limit:
            return None
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(rel or ".", flags, dir_fd=root_fd)
        except PermissionError:
            try:
                owner = os.stat(rel or ".", dir_fd=root_fd, follow_symlinks=False).st_uid
            except OSError:
                return None
            if owner == uid:
                return None
            continue
        except (FileNotFoundError, NotADirectoryError, OSError) as exc:
            if isinstance(exc, (FileNotFoundError, NotADirectoryError)) or exc.errno == 40:
                continue  # gone, or no longer a directory (ELOOP: a link now): nothing below
            return None
        try:
            with os.scandir(fd) as entries:
                names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        except OSError:
            return None
        finally:
            os.close(fd)
        if rel and any(name == ".git" for name, _ in names):
            found.append(rel)
        pending += [
            f"{rel}/{name}" if rel else name for name, is_dir in names if is_dir and name != ".git"
        ]
    return found
