"""Judge host paths by the policy, for tools that act outside the sandbox.

Claude Code's ``Write``/``Edit``/``Read``/``Grep``/``Glob`` tools run in the
agent's own process, not in a sandbox; the hook lets them touch only what a
sandboxed command could (DESIGN §8). :class:`PathRules` applies the same
policy rows the backends enforce:

* writable: under a writable root (the workspace unless ``readOnly``, and
  ``filesystem.allowWrite``), and not matched by ``filesystem.protect`` or
  ``filesystem.denyWrite`` (relative patterns against the root-relative path,
  as the write broker does; absolute ones against the absolute path);
* readable: not under a ``filesystem.denyRead`` path, unless under an
  ``allowRead`` carve-out;
* searchable (Grep/Glob): readable, and no existing secret path lies below
  the search root.

Symlinks are judged both ways: the path as written and the path it resolves
to must both pass (a workspace link to ``~/.ssh/id_rsa`` is a secret; a link
to ``/etc`` is not writable). Resolution is the kernel's (:func:`resolve`):
``link/..`` is the parent of the link's target, not the link's directory.
Paths through per-process links (``/proc/self/cwd``, ``/proc/<pid>/root``,
``/dev/fd/N``) are refused: Claude Code opens them in its own process, where
they name something else than in the hook's. Glob patterns are judged by
every ``{a,b}`` expansion, and a ``{`` ends a pattern's literal prefix. Every
refusal names the rule, so the model can act on it.
"""

from __future__ import annotations

import os
import posixpath

from ..backends._gitlayout import CodePathsUnknown
from ..policy._glob import PathPattern

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..policy._model import Policy

__all__ = ["MagicPath", "PathRules", "expand_braces", "resolve"]

_GLOB_CHARS = "*?[{"


def _under(path: str, base: str) -> bool:
    base = base.rstrip("/") or "/"
    return path == base or path.startswith(base + "/") or base == "/"


def _has_glob(text: str) -> bool:
    return any(c in text for c in _GLOB_CHARS)


#: Paths whose meaning depends on the process that opens them: Claude Code's tools open
#: them in Claude Code's process, the hook would resolve them in its own (or the server's).
_MAGIC_DIRS = ("/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")
_MAX_LINKS = 40  # the kernel's limit on symlinks followed in one lookup


class MagicPath(ValueError):
    """The path goes through a per-process link (``/proc/self/cwd``, ``/dev/fd/3``, ...)."""


def _magic(path: str) -> bool:
    if path in _MAGIC_DIRS:
        return True
    if not path.startswith("/proc/"):
        return False
    pid = path.split("/", 3)[2]
    return pid in ("self", "thread-self") or pid.isdigit()


def resolve(path: str) -> str:
    """The object an absolute *path* names, found as the kernel's lookup finds it.

    Components are taken in order; each symlink is followed before the next
    component (so ``link/..`` is the parent of the link's *target*), up to
    40 links. A component that does not exist ends the following: the rest
    applies lexically (it names something yet to be created).

    Raises:
        MagicPath: the lookup enters ``/proc/<pid|self|thread-self>`` or
            ``/dev/fd`` - what those name depends on the opening process.
        ValueError: too many symlinks (the kernel's ELOOP).
    """
    remaining = list(reversed(path.split("/")))
    current = "/"
    links = 0
    exists = True
    while remaining:
        name = remaining.pop()
        if name in ("", "."):
            continue
        if name == "..":
            current = posixpath.dirname(current)
            continue
        candidate = posixpath.join(current, name)
        if _magic(candidate):
            raise MagicPath(candidate)
        if exists:
            try:
                target = os.readlink(candidate)
            except FileNotFoundError:
                exists = False
            except OSError:
                pass  # not a symlink
            else:
                links += 1
                if links > _MAX_LINKS:
                    raise ValueError(f"too many levels of symbolic links in {path}")
                remaining.extend(reversed(target.split("/")))
                if target.startswith("/"):
                    current = "/"
                continue
        current = candidate
    return current


def _variants(path: str) -> list[str]:
    """*path* as written (normalized) and as the kernel resolves it (:func:`resolve`)."""
    written = posixpath.normpath(path)
    resolved = resolve(path)
    return [written] if resolved == written else [written, resolved]


def _magic_denial(path: str) -> str | None:
    try:
        _variants(path)
    except MagicPath as exc:
        return (
            f"it goes through {exc}, which names a different object in Claude Code's process "
            "than here; use the plain path"
        )
    except ValueError as exc:
        return str(exc)
    return None


def expand_braces(pattern: str, limit: int = 256) -> list[str]:
    """*pattern* with its ``{a,b}`` alternatives expanded (nested ones too), as Glob does.

    Raises:
        ValueError: more than *limit* expansions.
    """
    start = -1
    depth = 0
    for i, c in enumerate(pattern):
        if c == "\\":
            continue
        if c == "{":
            if depth == 0:
                start = i
            depth += 1
        elif c == "}" and depth:
            depth -= 1
            if depth == 0:
                body = pattern[start + 1 : i]
                alternatives = _split_top(body)
                if len(alternatives) < 2:
                    continue
                out: list[str] = []
                for alternative in alternatives:
                    for rest in expand_braces(
                        pattern[:start] + alternative + pattern[i + 1 :], limit
                    ):
                        out.append(rest)
                        if len(out) > limit:
                            raise ValueError(f"the pattern has more than {limit} brace expansions")
                return out
    return [pattern]


def _split_top(body: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for c in body:
        if c == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        current.append(c)
    parts.append("".join(current))
    return parts


class PathRules:
    """The filesystem rules of one policy, applied to host paths.

    Example::

        rules = PathRules(policy)
        rules.write_denial("/src/app/.git/hooks/pre-commit")
        # "it is a protected persistence point (filesystem.protect: **/.git/hooks/**)"
    """

    def __init__(self, policy: Policy, *, environ: Mapping[str, str] | None = None) -> None:
        """*environ* (default :data:`os.environ`) says which global git configs the user's
        git reads (``GIT_CONFIG_GLOBAL``, ``HOME``, ``XDG_CONFIG_HOME``)."""
        fs = policy.filesystem
        import time

        env = os.environ if environ is None else environ
        self._environ = env
        #: when the git configs a write decision reads must have been read (DECISION_BOUND)
        self._deadline = time.monotonic() + DECISION_BOUND
        roots = [] if fs.read_only else [fs.workspace]
        roots += list(fs.allow_write)
        # (root as written, root resolved): a symlinked workspace is still the workspace
        self._roots = [(posixpath.normpath(r), os.path.realpath(r)) for r in roots]
        self._read_only = fs.read_only
        self._workspace = fs.workspace
        self._relative: list[tuple[PathPattern, str]] = [
            (PathPattern(p), f"it is a protected persistence point (filesystem.protect: {p})")
            for p in fs.protect
        ]
        self._absolute: list[tuple[PathPattern | str, str]] = []
        for p in fs.deny_write:
            label = f"it is write-protected (filesystem.denyWrite: {p})"
            if not p.startswith("/"):
                self._relative.append((PathPattern(p), label))
            elif _has_glob(p):
                self._absolute.append((PathPattern(p), label))
            else:
                self._absolute.append((posixpath.normpath(p), label))
        #: DIR of each relative row DIR/**: a file or a link made there stands in for it
        self._dir_rows = [
            (PathPattern(pattern.pattern[:-3]), label)
            for pattern, label in self._relative
            if pattern.pattern.endswith("/**") and len(pattern.pattern) > 3
        ]
        self._secrets = tuple(posixpath.normpath(p) for p in fs.deny_read)
        self._carved = tuple(posixpath.normpath(p) for p in fs.allow_read)

    # ------------------------------------------------------------ reads
    def _secret_of(self, path: str) -> str | None:
        for secret in self._secrets:
            if _under(path, secret) and not any(_under(path, c) for c in self._carved):
                return secret
        return None

    def read_denial(self, path: str) -> str | None:
        """Why *path* may not be read (``None``: it may)."""
        magic = _magic_denial(path)
        if magic is not None:
            return magic
        for variant in _variants(path):
            secret = self._secret_of(variant)
            if secret is not None:
                shown = (
                    "" if variant == posixpath.normpath(path) else f" (it resolves to {variant})"
                )
                return f"it is a secret path{shown} (filesystem.denyRead: {secret})"
        return None

    def search_denial(self, root: str, pattern: str | None = None) -> str | None:
        """Why a recursive search under *root* (with an optional glob *pattern*) may not run."""
        roots = [root]
        if pattern:
            # an absolute or ../ pattern (or brace alternative) moves the search: judge the
            # literal prefix of every expansion too
            try:
                expansions = expand_braces(pattern)
            except ValueError as exc:
                return str(exc)
            for expansion in expansions:
                literal = []
                for part in posixpath.join(root, expansion).split("/"):
                    if _has_glob(part):
                        break
                    literal.append(part)
                roots.append("/".join(literal) or "/")
        for candidate in roots:
            denial = self.read_denial(candidate)
            if denial is not None:
                return denial
            for variant in _variants(candidate):
                for secret in self._secrets:
                    if (
                        secret != variant
                        and _under(secret, variant)
                        and os.path.lexists(secret)
                        and not any(_under(secret, c) for c in self._carved)
                    ):
                        return (
                            f"the search under {variant} would reach the secret path {secret} "
                            "(filesystem.denyRead); search a directory that does not contain it"
                        )
        return None

    # ------------------------------------------------------------ writes
    def write_denial(self, path: str) -> str | None:
        """Why *path* may not be created or changed (``None``: a sandboxed command could)."""
        magic = _magic_denial(path)
        if magic is not None:
            return magic
        for variant in _variants(path):
            denial = self._write_denial_of(variant)
            if denial is not None:
                if variant != posixpath.normpath(path):
                    return f"{denial}; the path resolves to {variant}"
                return denial
        return None

    def _write_denial_of(self, path: str) -> str | None:
        secret = self._secret_of(path)
        if secret is not None:
            return f"it is a secret path (filesystem.denyRead: {secret})"
        for pattern, label in self._absolute:
            if isinstance(pattern, str):
                if _under(path, pattern):
                    return label
            elif pattern.matches(path):
                return label
        best: tuple[str, str] | None = None
        for written, resolved in self._roots:
            for root in (written, resolved):
                if _under(path, root) and (best is None or len(root) > len(best[0])):
                    best = (root, posixpath.relpath(path, root) if path != root else "")
        if best is None:
            where = (
                "the workspace is read-only (filesystem.readOnly)"
                if self._read_only
                else (
                    f"only the workspace {self._workspace} and filesystem.allowWrite are writable"
                )
            )
            return f"it is outside the areas the sandbox may write ({where})"
        root, rel = best
        denial = self._row_denial(path, root)
        if denial is not None:
            return denial
        return self._git_denial(path, root, rel)

    def _row_denial(self, path: str, root: str) -> str | None:
        """The relative ``protect``/``denyWrite`` row refusing *path* below *root*, or None."""
        rel = posixpath.relpath(path, root) if path != root else ""
        if not rel:
            return None
        for pattern, label in self._relative:
            if pattern.matches(rel):
                return label
        # a row reaching into the root from above it matches the whole path, as the write
        # broker's does (PathPattern.reaches_into)
        for pattern, label in self._relative:
            if pattern.reaches_into(root) and pattern.matches(path):
                return label
        # a row DIR/** covers DIR itself too, as in the broker (backends.base.broker_patterns)
        for pattern, label in self._dir_rows:
            if pattern.matches(rel) or (pattern.reaches_into(root) and pattern.matches(path)):
                return label
        return None

    def _git_denial(self, path: str, root: str, rel: str) -> str | None:
        """What the write broker refuses beyond the rows, for a tool writing *path*'s bytes
        on the host, making the directories on its way that are missing (Claude Code's
        Write does; each one is a ``mkdir`` the broker would judge). ATK17 and ATK18: each
        check of the broker the hook lacked was a Write-tool bypass. Refused: a file with
        other hard links; a directory made where a row protects it; the config or a hook of
        a directory shaped like a gitdir, or a name - file or directory - that would make a
        directory so shaped; and a path that a trusted git config runs as code (of a
        repository holding *path*, one nested in its writable *root*, or the user's global
        one). *rel* is *path* relative to *root*."""
        import stat

        from ..backends._gitlayout import (
            CONFIG_NAMES,
            SHAPE_CONFIG,
            SHAPE_HOOK,
            SHAPE_NAMES,
            exists_at,
            git_shaped,
        )

        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            return "the file has other hard links, possibly outside the writable area"
        # the deepest directory on the way that exists, and the names the tool makes below it
        existing, made = posixpath.dirname(path), [posixpath.basename(path)]
        while existing != "/" and not os.path.isdir(existing):
            existing, missing = posixpath.split(existing)
            made.insert(0, missing)
        for depth in range(1, len(made)):  # each directory made on the way: the rows
            directory = posixpath.join(existing, *made[:depth])
            denial = self._row_denial(directory, root)
            if denial is not None:
                return f"{denial} (a directory the tool would make: {directory})"
        try:
            existing_fd = os.open(existing, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return f"its directory {existing} cannot be examined"
        try:
            first, file_made_there = made[0], len(made) == 1
            if (
                first in SHAPE_NAMES
                and not exists_at(existing_fd, first)
                and not git_shaped(existing_fd)
                and git_shaped(existing_fd, adding=first)
            ):
                return f"git: {existing} would become a directory shaped like a repository"
            if file_made_there and first in CONFIG_NAMES and git_shaped(existing_fd):
                return SHAPE_CONFIG
            name = made[-1]
            if not name.endswith(".sample"):
                # a hook: in an existing hooks/ of a shaped directory, or in the hooks/ the
                # tool makes in one
                if file_made_there and posixpath.basename(existing) == "hooks":
                    if git_shaped(existing_fd, up=True):
                        return SHAPE_HOOK
                elif made[:-1] == ["hooks"] and git_shaped(existing_fd):
                    return SHAPE_HOOK
        finally:
            os.close(existing_fd)
        # a directory the tool makes holds only what it makes: commondir alone shapes it
        if len(made) > 1 and made[-1] == "commondir":
            return (
                f"git: {posixpath.dirname(path)} would become a directory shaped like a repository"
            )
        try:
            return self._code_denial(path, rel, existing)
        except CodePathsUnknown as exc:
            return f"git: {exc}"

    def _code_denial(self, path: str, rel: str, existing: str) -> str | None:
        """Why *path* may not be written as a path a trusted git config runs as code: of a
        repository holding it, of every writable root's repositories (holding it or nested
        in it: a path one names may lie in another root, e.g. an ``allowWrite`` directory),
        or the user's global configs read in each of those repositories.

        Raises:
            CodePathsUnknown: not every config could be read in time - the decision has
                :data:`DECISION_BOUND` seconds, well within Claude Code's hook timeout
                (ATK20: a hook Claude Code kills lets the tool call run).
        """
        from ..backends._gitlayout import (
            CodePaths,
            enclosing_work_trees,
            global_git_configs,
            roots_held,
        )

        reader = CodePaths(deadline=self._deadline)
        roots = list(dict.fromkeys(written for written, _resolved in self._roots))
        # the walk and every read under the brokers' locks of the roots: no sandbox moves a
        # repository meanwhile (ATK20 renamed one back and forth: a config read after the
        # walk found it was gone from its path)
        with roots_held(roots):
            trees = list(enclosing_work_trees(existing))
            for each in roots:
                trees += enclosing_work_trees(each)
                trees += _cached_nested_work_trees(each)
            trees = list(dict.fromkeys(trees))
            codes = [code for tree in trees for code in reader.tree(tree)]
            home = self._environ.get("HOME") or os.path.expanduser("~")
            configs = global_git_configs(self._environ, home)
            rows = reader.global_patterns(configs, trees=trees)
        for code in codes:
            if _under(path, code) and code != "/":
                return f"git: a path a trusted repository's config runs code from: {code}"
        for text, label in rows:
            try:
                pattern = PathPattern(text)
            except ValueError:
                continue
            if pattern.matches(rel) or pattern.matches(path):
                return label
        return None


#: seconds a file tool's decision may spend reading git configs, well within the timeout
#: corral installs for the hook (claude_settings.TIMEOUT: Claude Code kills a slower hook
#: and runs the tool call)
DECISION_BOUND = 10.0

#: the repositories nested in a root, by root: ``(taken at, [(work tree, its .git's
#: (device, inode))])``
_NESTED: dict[str, tuple[float, tuple[tuple[str, tuple[int, int]], ...]]] = {}
#: how long they are reused (the corral server answers many decisions in a row), each
#: still holding the very ``.git`` it held (a sandbox's broker may move a repository, and
#: leave another at its path); so this bounds only how late the user's own new repository
#: is seen
_NESTED_FOR = 2.0


def _cached_nested_work_trees(root: str) -> list[str]:
    """:func:`~corral.backends._gitlayout.nested_work_trees` of *root* (the caller holds
    the brokers' locks of *root*), reused for :data:`_NESTED_FOR` seconds while every one
    of them still holds the same ``.git``.

    Raises:
        CodePathsUnknown: not every repository below *root* could be found.
    """
    import time

    from ..backends._gitlayout import nested_work_trees

    now = time.monotonic()
    cached = _NESTED.get(root)
    if (
        cached is not None
        and now - cached[0] < _NESTED_FOR
        and all(_git_entry(tree) == key for tree, key in cached[1])
    ):
        return [tree for tree, _key in cached[1]]
    found = nested_work_trees(root)
    if len(_NESTED) >= 64:
        _NESTED.clear()
    _NESTED[root] = (now, tuple((tree, _git_entry(tree)) for tree in found))
    return found


def _git_entry(tree: str) -> tuple[int, int]:
    """The (device, inode) of *tree*'s ``.git`` entry, not followed; (-1, -1) when none."""
    try:
        st = os.lstat(f"{tree}/.git")
    except OSError:
        return (-1, -1)
    return (st.st_dev, st.st_ino)
