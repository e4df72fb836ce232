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
* :class:`CodePaths` - every path that the configs of the repositories holding
  a directory (:func:`enclosing_work_trees`), of those nested below a root
  (:func:`nested_work_trees`) and the user's global ones name as code. Git
  finds a work tree's repositories above it, so where a writable root begins
  must not decide which of them are read: a nested repository a run makes at
  ``tools/`` is the next run's workspace, and ``tools/githooks`` is still the
  enclosing repository's hooks (docs/threat-model.md, "A root never hides a
  protection above it").

Pointers are read without following a symbolic link at the last component,
only from regular files; configs are read by git where they lie, with their
includes, within a size and a time bound. What is read only ever *adds*
protection, so a config an earlier sandbox planted can make more paths
read-only, never fewer; and what cannot be read or found is no answer
(:class:`CodePathsUnknown`): every caller refuses then.
"""

from __future__ import annotations

import os
import posixpath
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ._broker_lock import RootLocks

__all__ = [
    "CONFIG_MAX",
    "CONFIG_NAMES",
    "NESTED_SCAN_LIMIT",
    "SHAPE_CONFIG",
    "SHAPE_HOOK",
    "SHAPE_NAMES",
    "CodePaths",
    "CodePathsUnknown",
    "enclosing_work_trees",
    "exists_at",
    "git_shaped",
    "global_git_configs",
    "nested_scan_limit",
    "nested_work_trees",
    "read_config_file",
    "read_regular_file",
    "roots_held",
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


class CodePathsUnknown(Exception):
    """What a trusted git config runs as code could not be told: a config over
    :data:`CONFIG_MAX`, git failing on it (an include cycle, a broken file), the reader's
    deadline passed, or a walk for nested repositories without an answer. Every caller
    refuses then (the broker every write below the root, the hook the tool call, apply the
    change set): what a sandbox can make large or slow never turns a protection off."""


#: the largest config git is asked to read (git reads a config, and its includes, whole)
CONFIG_MAX = 1 << 20
#: seconds one git may take on one config
_GIT_BOUND = 5.0


class CodePaths:
    """One reading of what trusted git configs run as code (``core.hooksPath``, a
    ``core.fsmonitor`` program), within *deadline* (monotonic seconds; None: unbounded).

    Each config is read by git where it lies, with its ``include`` and ``includeIf``
    files, in the work tree it serves - so a condition (``gitdir:``, ``onbranch:``) is
    judged for that repository, never for the reader's own directory (ATK20) - and a
    value is taken as git takes it: ``~/`` is the user's home, a relative value is
    relative to the work tree, an fsmonitor command line runs its first word. One config
    is read once per git directory (a thousand ``.git`` files leading to one gitdir cost
    one git run). Raises :class:`CodePathsUnknown` rather than answer less.
    """

    def __init__(self, *, deadline: float | None = None) -> None:
        self.deadline = deadline
        self._values: dict[tuple[str, str], tuple[str, ...]] = {}

    # ------------------------------------------------------------ reading
    def values(self, config: str, *, cwd: str, key: str) -> tuple[str, ...]:
        """The code values *config* holds, read by git in *cwd*; ``key`` names what a
        condition of its includes depends on there (the git directory)."""
        cached = self._values.get((config, key))
        if cached is None:
            cached = self._values[(config, key)] = tuple(self._read(config, cwd))
        return cached

    def _read(self, config: str, cwd: str) -> list[str]:
        data = read_config_file(config)
        low = data.lower()
        if b"hookspath" not in low and b"fsmonitor" not in low and b"include" not in low:
            return []  # nothing to ask git (the run path imports no subprocess for this)
        import subprocess
        import time

        try:
            size = os.stat(config).st_size
        except OSError:
            return []
        if size > CONFIG_MAX:
            raise CodePathsUnknown(f"the git config {config} is larger than {CONFIG_MAX} bytes")
        git = _git()
        if git is None:
            raise CodePathsUnknown("git is not installed: its configs cannot be read")
        bound = _GIT_BOUND
        if self.deadline is not None:
            bound = min(bound, self.deadline - time.monotonic())
            if bound <= 0:
                raise CodePathsUnknown("the git configs could not be read in time")
        env = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
        env["PATH"] = "/usr/bin:/bin"
        home = os.path.expanduser("~")
        if home.startswith("/"):
            env["HOME"] = home  # where git's "~/" in a path or an include leads
        try:
            proc = subprocess.run(
                [
                    git,
                    "config",
                    "--file",
                    config,
                    "--includes",
                    "--null",
                    "--get-regexp",
                    r"^core\.(hookspath|fsmonitor)$",
                ],
                cwd=cwd if os.path.isdir(cwd) else "/",
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=env,
                check=False,
                timeout=bound,
            )
        except subprocess.TimeoutExpired:
            raise CodePathsUnknown(f"git took too long reading {config}") from None
        if proc.returncode not in (0, 1):  # 1: no such key
            detail = proc.stderr.decode("utf-8", "replace").strip()[:200]
            raise CodePathsUnknown(f"git cannot read the config {config}: {detail}")
        return _code_values(proc.stdout, home)

    # ------------------------------------------------------------ work trees
    def tree(self, tree: str) -> list[str]:
        """The absolute paths the configs of the work tree at *tree* name as code."""
        gitdir, configs = work_tree_config_files(tree)
        found: list[str] = []
        for config in configs:
            for value in self.values(config, cwd=tree, key=gitdir):
                found.append(posixpath.normpath(posixpath.join(tree, value)))
        return found

    def enclosing(self, directory: str, *, own_fd: int | None = None) -> list[str]:
        """The code paths of the repositories whose work tree holds the absolute
        *directory* (every directory from it up to ``/`` with a ``.git``, a directory or a
        file); *own_fd*, when given, is how *directory* itself is looked at (the broker's
        view of its root, e.g. a preview's overlay)."""
        return [
            path
            for tree in enclosing_work_trees(directory, own_fd=own_fd)
            for path in self.tree(tree)
        ]

    def global_patterns(
        self, configs: Sequence[str], *, trees: Sequence[str] = ()
    ) -> list[tuple[str, str]]:
        """``(pattern, label)`` rows of what the user's global git *configs* run as code, read
        in each of *trees* (a condition of an include may hold in one repository and not in
        another) and outside any: a relative value applies in every work tree (``**/VALUE``
        and below), an absolute one is itself and what is below it. Escaped, never globs."""
        from ..policy._glob import escape

        places = [("/", "")]
        places += [(tree, work_tree_config_files(tree)[0]) for tree in dict.fromkeys(trees)]
        rows: list[tuple[str, str]] = []
        for config in configs:
            label = f"git: a path the user's global git config ({config}) runs code from"
            seen: set[str] = set()
            for cwd, gitdir in places:
                for value in self.values(config, cwd=cwd, key=gitdir):
                    if value in seen:
                        continue
                    seen.add(value)
                    if value.startswith("/"):
                        text = escape(posixpath.normpath(value))
                    else:
                        relative = posixpath.normpath(value)
                        if relative.startswith(".."):
                            continue  # above every work tree: outside the roots as far as known
                        text = f"**/{escape(relative)}"
                    rows += [(text, label), (text + "/**", label)]
        return rows


def _git() -> str | None:
    import shutil

    return shutil.which("git", path="/usr/bin:/bin:/usr/local/bin")


def _code_values(output: bytes, home: str) -> list[str]:
    """The values of ``git config --null --get-regexp`` *output*: booleans dropped, ``~/``
    expanded, and an fsmonitor command line's first word added to it."""
    from ._gitcheck import GIT_BOOLEANS

    values: list[str] = []
    for entry in output.split(b"\0"):
        name, _, value_b = entry.partition(b"\n")
        value = os.fsdecode(value_b).strip()
        if not value or value.lower() in GIT_BOOLEANS:
            continue
        found = [value]
        if name.lower() == b"core.fsmonitor" and any(c.isspace() for c in value):
            import shlex

            try:
                words = shlex.split(value)
            except ValueError:
                words = value.split()
            found += words[:1]
        for each in found:
            if each == "~" or each.startswith("~/"):
                each = home + each[1:]
            values.append(each)
    return list(dict.fromkeys(values))


class roots_held:
    """Hold the write brokers' locks of *roots* (:class:`~._broker_lock.RootLocks`): no
    sandbox's broker renames, creates or removes a name below them meanwhile, so a walk of
    them is one picture (ATK20 renamed a directory back and forth while the hook walked,
    and the walk passed a nested repository by). Entering raises :class:`CodePathsUnknown`
    when they cannot be had (another holds them for :data:`~._broker_lock.LOCK_BOUND` s).
    A plain class, not :mod:`contextlib` (this module is on the run path)."""

    def __init__(self, roots: Sequence[str]) -> None:
        self._roots = tuple(roots)
        self._locks: RootLocks | None = None

    def __enter__(self) -> None:
        from .._exceptions import CorralError
        from ._broker_lock import RootLocks

        locks = RootLocks()
        try:
            for root in self._roots:
                try:
                    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    locks.add_root(fd)
                finally:
                    os.close(fd)
            locks.acquire()
        except (OSError, CorralError) as exc:
            locks.close()
            where = ", ".join(self._roots)
            raise CodePathsUnknown(f"the brokers' locks of {where} cannot be had: {exc}") from None
        self._locks = locks

    def __exit__(self, *_exc: object) -> None:
        locks, self._locks = self._locks, None
        if locks is not None:
            locks.release()
            locks.close()


def enclosing_work_trees(directory: str, *, own_fd: int | None = None) -> list[str]:
    """Every directory from the absolute *directory* up to ``/`` that holds a ``.git``."""
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
                if exists_at(fd, ".git"):
                    found.append(current)
            except PermissionError:
                pass  # not searchable by this uid: its git cannot work there either
            finally:
                if opened:
                    os.close(fd)
        if current == "/":
            return found
        current = posixpath.dirname(current)
        first = False


def work_tree_config_files(tree: str) -> tuple[str, list[str]]:
    """The git directory of the work tree at the absolute path *tree* and the config
    files its git reads: the ``config`` of its ``.git`` (through a ``.git`` file: of the
    gitdir's common dir) and the gitdir's ``config.worktree``. The ``.git`` file is read
    without following a link; ``("", [])`` when it names no gitdir."""
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
                return "", []
            target = os.fsdecode(line[len(b"gitdir:") :].strip())
            gitdir = posixpath.normpath(posixpath.join(tree, target))
    common = gitdir
    pointer = read_config_file(f"{gitdir}/commondir")[:_POINTER_MAX].strip()
    if pointer:
        common = posixpath.normpath(posixpath.join(gitdir, os.fsdecode(pointer)))
    return os.path.realpath(gitdir), [f"{common}/config", f"{gitdir}/config.worktree"]


def nested_work_trees(
    root: str, *, root_fd: int | None = None, limit: int | None = None
) -> list[str]:
    """The absolute paths of the directories below the absolute *root* that hold a
    ``.git``; raises :class:`CodePathsUnknown` when they cannot all be found.

    A walk of at most *limit* directories (default :func:`nested_scan_limit`), from
    *root_fd* when given (the broker's view of the root) else from *root*; never through
    a symbolic link, never into a ``.git``. A walk that reaches its limit is no answer,
    never a partial one: what a sandbox can fill must not turn a protection off
    (ATK19 made 100,000 directories listed before a nested repository, and the walk never
    reached it), and so is a walk that met a directory of this uid it could not read
    (:func:`_nested_work_trees`). Its callers refuse instead. A sandbox renaming
    directories during the walk (ATK20) is the callers' to exclude: the broker walks
    between two of its own operations, the hook and apply hold the brokers' locks.
    """
    base = posixpath.normpath(root).rstrip("/")
    limit = nested_scan_limit() if limit is None else limit
    trees: list[str] | None = None  # none found yet: no answer
    if root_fd is not None:
        trees = _nested_work_trees(root_fd, limit)
    else:
        try:
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return []  # nothing there (an allowWrite path not made yet)
        except OSError:
            fd = -1  # a root it cannot read: no answer
        if fd >= 0:
            try:
                trees = _nested_work_trees(fd, limit)
            finally:
                os.close(fd)
    if trees is None:
        raise CodePathsUnknown(
            f"more than {limit} directories below {root}, or one of them unreadable: corral "
            "cannot find every repository whose config could run what is written there "
            "(a smaller workspace, or CORRAL_NESTED_SCAN_LIMIT)"
        )
    return [f"{base}/{rel}" for rel in trees]


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
