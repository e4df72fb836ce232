"""The write broker's decisions: rows, repositories of the run, the git check (see :mod:`._broker`)."""

from __future__ import annotations

import os
import stat

from ..pipeline._outcome import Violation
from ..policy._glob import PathPattern, components, escape
from ._broker_abi import (
    _FD_METADATA_CALLS,
    _RENAME_WALK_LIMIT,
    _Continue,
    _Denied,
    _Resolved,
    _Root,
    _signed_fd,
)
from ._broker_resolve import _Resolver
from ._gitcheck import Journal
from ._gitlayout import (
    CONFIG_NAMES,
    SHAPE_CONFIG,
    SHAPE_HOOK,
    SHAPE_NAMES,
    exists_at,
    git_shaped,
    read_regular_file,
)

__all__: list[str] = []


class _Policy(_Resolver):
    """Checks against ``protect``/``denyWrite``/``denyRead`` rows, and the git check."""

    _patterns: list[tuple[PathPattern, str]]
    _git_rows: frozenset[str]
    _reach: dict[tuple[str, int], tuple[tuple[PathPattern, str], ...]]
    journal: Journal
    violations: list[Violation]
    error: BaseException | None

    # ------------------------------------------------------------ policy
    def _check(self, resolved: _Resolved, *, content: bool = False, symlink: bool = False) -> None:
        """Refuse if the resolved name is protected or write-denied.

        *content*: the operation writes the file's bytes (open for writing,
        truncate, a hard link onto the name); *symlink*: it makes a symlink.
        Both matter inside a repository the run created (see :meth:`_denied_by`).
        """
        if resolved.root.sandbox_path in self._spec.open_roots:
            return
        label = self._denied_by(
            resolved.rel, resolved.sandbox_path, resolved, content=content, symlink=symlink
        )
        if label is not None:
            raise _Denied(resolved.sandbox_path, label)

    def _denied_by(
        self,
        rel: str,
        sandbox_path: str,
        resolved: _Resolved | None = None,
        *,
        content: bool = False,
        symlink: bool = False,
    ) -> str | None:
        """The label of the first row that refuses *rel*.

        With *resolved*, a repository the run created is exempt from the git
        rows (see :meth:`_own_repository`), except for what would be code while
        the run lasts (a host process may run git there meanwhile): a hook
        that is not a ``*.sample``, and a ``config``/``config.worktree`` written
        directly or made a symlink (git writes them through ``config.lock``
        and a rename, which :meth:`~._broker_emulate._Emulator._rename` lands
        after validating the content).
        """
        # each row is tried in order, but only where its literal segments are all among the
        # path's components: a row that cannot match is skipped without running the matcher
        # (most names a run writes match none of the protect rows' literals)
        parts: dict[bool, frozenset[str]] = {}  # by pattern.absolute: each split once
        for pattern, label in self._patterns:
            path = sandbox_path if pattern.absolute else rel
            have = parts.get(pattern.absolute)
            if have is None:
                have = parts[pattern.absolute] = components(path)
            if not pattern.could_match_parts(have):
                continue
            if pattern.matches(path):
                if (
                    resolved is not None
                    and label in self._git_rows
                    and not _live_code(rel, content=content, symlink=symlink)
                    and self._own_repository(resolved)
                ):
                    continue
                return label
        # the rows that reach into this root from above it match the whole path, and a
        # repository the run created is no exemption there: it lies inside what they protect
        root = sandbox_path[: len(sandbox_path) - len(rel)].rstrip("/") if rel else sandbox_path
        reach = self._reaching_into(root or "/")
        if reach:
            whole = parts.get(True)
            if whole is None:
                whole = components(sandbox_path)
            for pattern, label in reach:
                if pattern.could_match_parts(whole) and pattern.matches(sandbox_path):
                    return label
        return None

    def _reaching_into(self, root: str) -> tuple[tuple[PathPattern, str], ...]:
        """The relative rows that protect names below *root* through its own components
        (:meth:`~corral.policy._glob.PathPattern.reaches_into`), e.g. ``**/.config/fish/**``
        in a root ``/home/u/.config``; none for most roots. Cached per root and row count
        (the broker adds rows before it serves: trusted hook paths)."""
        key = (root, len(self._patterns))
        found = self._reach.get(key)
        if found is None:
            found = tuple(
                (pattern, label)
                for pattern, label in self._patterns
                if not pattern.absolute and pattern.reaches_into(root)
            )
            self._reach[key] = found
        return found

    def _own_repository(self, r: _Resolved) -> bool:
        """Whether *r* belongs to a repository this run created (its own to write).

        * the ``.git`` entry itself: when it does not exist yet or was created
          in this run (deleting or replacing a pre-existing one is refused: that
          also keeps a later run's workspace root where it was);
        * a name inside a ``.git`` directory: when its parent directory is new
          (the ``.git`` directory, or e.g. ``.git/modules/<name>``, was created
          in this run);
        * a name beside it (``.gitmodules``): when that ``.git`` is new.

        The git check validates what such a repository holds after the run.
        """
        root = r.root.sandbox_path
        parts = r.rel.split("/")
        parent = "/".join(parts[:-1])
        if parts[-1] == ".git":
            if self.journal.is_new(root, r.rel):
                return True
            try:
                os.stat(r.name, dir_fd=r.parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                return True
            return False
        if ".git" in parts[:-1]:
            return self.journal.is_new(root, parent)
        return self.journal.is_new(root, (parent + "/" if parent else "") + ".git")

    def _git_config_row(self, r: _Resolved) -> str | None:
        """The git row protecting *r* if it is a repository's ``config`` or ``config.worktree``
        (in a ``.git``, or in a directory shaped like a gitdir: see :meth:`_check_git_shape`)."""
        parts = r.rel.split("/")
        if parts[-1] not in CONFIG_NAMES:
            return None
        if r.root.sandbox_path in self._spec.open_roots:
            return None
        if ".git" not in parts[:-1]:
            return SHAPE_CONFIG if git_shaped(r.parent_fd) else None
        label = self._denied_by(r.rel, r.sandbox_path)
        return label if label in self._git_rows else None

    def _check_git_shape(
        self,
        r: _Resolved,
        *,
        creates: bool = False,
        content: bool = False,
        symlink: bool = False,
        moved: bool = False,
    ) -> None:
        """Refuse the operation on *r* that would let git run code from a directory
        shaped like a gitdir under another name than ``.git`` (a bare-shaped ``evil/``
        a planted ``.git`` file leads to), while the run lasts.

        A directory is *shaped* when it has ``objects`` and ``refs``, or ``commondir``:
        git reads the config (``config``, ``config.worktree``) and hooks of a gitdir,
        or of a common dir, only there. *creates*: the operation makes the name;
        *content*: it writes the file's bytes; *symlink*: it makes a symlink;
        *moved*: a rename binds the name. The rule (docs/threat-model.md "Git"):

        * making the last of ``objects``/``refs``/``commondir`` judges the directory
          as the git check would a new repository - its configs must be regular
          files holding only keys git writes itself, ``hooks`` no symlink and
          holding ``*.sample`` files only - and lands the broker's own copies of
          the configs (the sandbox may hold a descriptor to the old ones);
        * in a shaped directory, a config is written only through a rename (git's
          ``config.lock``), validated by :meth:`_land_git_config`; never directly,
          as a symlink or by a hard link; ``hooks`` is not bound by a rename or a
          symlink; a hook that is not a ``*.sample`` is not made;
        * a ``.git`` is never made a symlink (git never does).

        Names inside a ``.git`` are the git rows' (:meth:`_denied_by`).
        """
        if r.root.sandbox_path in self._spec.open_roots:
            return
        parts = r.rel.split("/")
        name = parts[-1]
        if name == ".git" and symlink:
            raise _Denied(r.sandbox_path, "git: a .git made a symlink")
        if ".git" in parts[:-1] or not (creates or content or symlink or moved):
            return
        if name in CONFIG_NAMES:
            if (content or symlink or (creates and not moved)) and git_shaped(r.parent_fd):
                raise _Denied(r.sandbox_path, SHAPE_CONFIG)
        elif name == "hooks":
            if (symlink or moved) and git_shaped(r.parent_fd):
                raise _Denied(r.sandbox_path, SHAPE_HOOK)
        elif len(parts) >= 2 and parts[-2] == "hooks" and not name.endswith(".sample"):
            if git_shaped(r.parent_fd, up=True):
                raise _Denied(r.sandbox_path, SHAPE_HOOK)
        elif (
            name in SHAPE_NAMES
            and not exists_at(r.parent_fd, name)
            and not git_shaped(r.parent_fd)
            and git_shaped(r.parent_fd, adding=name)
        ):
            self._judge_git_shape(r)

    def _judge_git_shape(self, r: _Resolved) -> None:
        """The directory holding *r* becomes shaped like a gitdir: refuse (with the
        reason) unless its configs and hooks are inert; land own copies of the configs."""
        from ._gitcheck import config_problem

        where = r.sandbox_path.rpartition("/")[0]
        copies: list[tuple[str, bytes, int]] = []
        for config in CONFIG_NAMES:
            try:
                st = os.stat(config, dir_fd=r.parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            data = read_regular_file(r.parent_fd, config) if stat.S_ISREG(st.st_mode) else None
            problem = "no regular file" if data is None else config_problem(data)
            if problem is not None:
                raise _Denied(
                    r.sandbox_path,
                    f"git: {where} would become a repository whose {config} runs code ({problem})",
                )
            copies.append((config, data or b"", st.st_mode & 0o777))
        hooks: os.stat_result | None
        try:
            hooks = os.stat("hooks", dir_fd=r.parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            hooks = None
        if hooks is not None and stat.S_ISLNK(hooks.st_mode):
            raise _Denied(
                r.sandbox_path, f"git: {where} would become a repository with linked hooks"
            )
        if hooks is not None and stat.S_ISDIR(hooks.st_mode):
            fd = os.open(
                "hooks",
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=r.parent_fd,
            )
            try:
                names = os.listdir(fd)
            finally:
                os.close(fd)
            if any(not n.endswith(".sample") for n in names):
                raise _Denied(r.sandbox_path, f"git: {where} would become a repository with hooks")
        for config, data, mode in copies:
            _land_copy(r.parent_fd, config, data, mode)

    def _check_single_link(self, r: _Resolved, st: os.stat_result | None = None) -> None:
        """Refuse to change a file that has other hard links.

        A hard link is another name for the same inode; a name in the workspace
        can belong to a file whose other names lie outside it (a package
        store, or a link planted before the run). Writing, truncating or
        changing the metadata of such a file would change it everywhere.
        Names themselves (unlink, rename) stay free to change.
        """
        if st is None:
            try:
                st = os.stat(r.name, dir_fd=r.parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                return
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            raise _Denied(
                r.sandbox_path,
                "filesystem: the file has other hard links, possibly outside the writable area",
            )

    def _check_subtree_move(self, src: _Resolved, dst: _Resolved) -> None:
        """Moving a directory must not change whether anything below it is protected."""
        try:
            st = os.stat(src.name, dir_fd=src.parent_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode) or src.root.sandbox_path in self._spec.open_roots:
            return
        if not any(
            p.could_match_below(src.sandbox_path if p.absolute else src.rel)
            or p.could_match_below(dst.sandbox_path if p.absolute else dst.rel)
            for p, _ in self._patterns
        ) and not any(
            p.could_match_below(end.sandbox_path)
            for end in (src, dst)
            for p, _ in self._reaching_into(end.root.sandbox_path)
        ):
            return
        top = f"/proc/self/fd/{src.parent_fd}/{src.name}"
        seen = 0
        for dirpath, dirnames, filenames in os.walk(top):
            sub = dirpath[len(top) :].strip("/")
            for entry in (*dirnames, *filenames):
                seen += 1
                if seen > _RENAME_WALK_LIMIT:
                    raise _Denied(
                        src.sandbox_path, "directory too large to check for protected paths"
                    )
                tail = f"{sub}/{entry}" if sub else entry
                before = self._denied_by(f"{src.rel}/{tail}", f"{src.sandbox_path}/{tail}")
                after = self._denied_by(f"{dst.rel}/{tail}", f"{dst.sandbox_path}/{tail}")
                if before != after:
                    raise _Denied(f"{src.sandbox_path}/{tail}", before or after or "")

    def _describe_target(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> str:
        """Best-effort text of what a refused metadata call aimed at (for the violation)."""
        try:
            if name in _FD_METADATA_CALLS:
                return self._as_tracer(lambda: os.readlink(f"/proc/{pid}/fd/{_signed_fd(a[0])}"))
            index = (
                0
                if name
                in (
                    "chmod",
                    "chown",
                    "lchown",
                    "utime",
                    "utimes",
                    "truncate",
                    "setxattr",
                    "lsetxattr",
                    "removexattr",
                    "lremovexattr",
                )
                else 1
            )
            return self._read_string(pid, nid, a[index]) if a[index] else f"fd {_signed_fd(a[0])}"
        except (OSError, _Continue):
            return "?"

    def _protect_trusted_hook_paths(self, root: _Root) -> None:
        """Protect what the configs of the repositories holding the root name as code
        (``core.hooksPath``, a ``core.fsmonitor`` program) where it lies inside the root
        (``.githooks``, husky's directory): the user's trusted config runs whatever is
        planted there.

        Every repository whose work tree holds the root counts - the root's own (through
        a ``.git`` directory, or a linked worktree's or submodule's ``.git`` file) and each
        one above it (:meth:`~._gitlayout.CodePaths.enclosing`): where a root begins is no
        reason to forget them (ATK17: a nested repository a run made at ``tools/`` became
        the next run's workspace, and the enclosing repository's ``tools/githooks`` was
        writable there; a worktree's ``.git`` is a file, and its repository's hooks path
        was writable in one run). Git parses a config only when one of the two keys is
        spelled in it.
        """
        import time

        from ._gitlayout import CodePaths, CodePathsUnknown

        # absolute rows: a path in any supervised root is protected, whichever root's
        # repository names it (an allowWrite directory another root's config names)
        reader = CodePaths(deadline=time.monotonic() + _READ_BOUND)
        try:
            found = reader.enclosing(root.sandbox_path, own_fd=root.host_fd)
        except CodePathsUnknown as exc:
            self._refuse_root(root, str(exc))
            return
        inside = [path for path in found if self._in_a_root(path)]
        self._protect_code_paths([escape(p) for p in inside], "a trusted repository's")

    def _refuse_root(self, root: _Root, reason: str) -> None:
        """Refuse every write below *root*: what a trusted config runs as code there could
        not be told (:class:`~._gitlayout.CodePathsUnknown`), so nothing written there can
        be told not to be code."""
        base = escape(root.sandbox_path.rstrip("/"))
        label = f"git: {reason} (every write below {root.sandbox_path} is refused)"
        self._patterns += [(PathPattern(base), label), (PathPattern(base + "/**"), label)]

    def _in_a_root(self, path: str) -> bool:
        """Whether the absolute *path* is a supervised root or lies below one."""
        return any(
            path == r.sandbox_path or path.startswith(r.sandbox_path.rstrip("/") + "/")
            for r in self._roots
        )

    def _protect_code_paths(self, rels: list[str], whose: str) -> None:
        for rel in rels:
            label = f"git: a path {whose} config runs code from: {rel}"
            try:
                self._patterns += [(PathPattern(rel), label), (PathPattern(rel + "/**"), label)]
            except ValueError:
                continue

    def _protect_other_hook_paths(self) -> None:
        """Protect what the user's global git configs and the nested repositories'
        configs name as code (``core.hooksPath``, ``core.fsmonitor``) inside a root.

        Read once, before the broker's first operation that can act, under the
        roots' locks (runs that never write do not pay for the walk), which is
        the pre-run view: the
        configs of repositories that existed before the run are protected rows,
        and the ones the run makes hold only keys git writes itself (neither
        of these). A relative value of a global config applies in every work
        tree: it is protected at any depth (``**/VALUE``). The walk visits at
        most :data:`~._gitlayout.NESTED_SCAN_LIMIT` directories per root, never through a
        symlink, and not into ``.git`` directories.
        """
        import time

        from ._gitlayout import CodePaths, CodePathsUnknown, enclosing_work_trees, nested_work_trees

        reader = CodePaths(deadline=time.monotonic() + _READ_BOUND)
        trees: list[str] = []
        for root in self._roots:
            if root.sandbox_path in self._spec.open_roots:
                continue
            try:
                # the broker walks between two of its operations: no sandbox of this root
                # moves a name meanwhile (its every move is one of them, and the other
                # brokers of the root wait for this one's locks around each)
                nested = nested_work_trees(root.sandbox_path, root_fd=root.host_fd)
                found = [p for tree in nested for p in reader.tree(tree)]
            except CodePathsUnknown as exc:
                self._refuse_root(root, str(exc))
                continue
            trees += nested
            trees += enclosing_work_trees(root.sandbox_path, own_fd=root.host_fd)
            self._protect_code_paths(
                [escape(p) for p in found if self._in_a_root(p)], "a nested repository's"
            )
        try:
            rows = reader.global_patterns(self._spec.git_configs, trees=trees)
        except CodePathsUnknown as exc:
            for root in self._roots:
                if root.sandbox_path not in self._spec.open_roots:
                    self._refuse_root(root, str(exc))
            return
        for text, label in rows:
            try:
                self._patterns.append((PathPattern(text), label))
            except ValueError:
                continue

    def _check_git(self) -> None:
        """Run the git check over what this run touched (all its processes are gone)."""
        from ._gitcheck import check_root

        others = tuple(r.sandbox_path for r in self._roots) + tuple(self._spec.open_roots)
        for root in self._roots:
            if root.sandbox_path in self._spec.open_roots:
                continue
            if root.sandbox_path not in self.journal.roots():
                continue
            try:
                findings = check_root(
                    root.host_fd,
                    root.sandbox_path,
                    self.journal,
                    tuple(o for o in others if o != root.sandbox_path),
                )
            except Exception as exc:  # never lose the run's result; report the failure
                self.error = self.error or exc
                continue
            self.violations.extend(
                Violation(
                    kind="fs-write",
                    target=f.path,
                    rule=f"git: {f.reason}; quarantined as {f.quarantined_as}",
                    operation="git-check",
                )
                for f in findings
            )


#: Directories visited per root when looking for nested repositories' configs.


#: seconds the broker may spend reading trusted git configs at its start or its first
#: write (past it: every write below the root is refused)
_READ_BOUND = 20.0


def _land_copy(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Replace *name* by a new file holding *data*: no descriptor of the sandbox's
    reaches it, so the content cannot change after it was checked."""
    temp = f".corral-config-{os.urandom(6).hex()}"
    fd = os.open(
        temp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(temp, dir_fd=dir_fd)
        raise
    os.close(fd)
    os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _live_code(rel: str, *, content: bool, symlink: bool) -> bool:
    """Whether the operation on *rel* (inside a ``.git``) would leave code git runs."""
    parts = rel.split("/")
    if len(parts) >= 2 and parts[-2] == "hooks" and not parts[-1].endswith(".sample"):
        return True
    if parts[-1] == "hooks" and symlink:
        return True
    return parts[-1] in CONFIG_NAMES and (content or symlink)
