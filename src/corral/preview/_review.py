"""What an apply may land: protected paths, the git check, allowed and conflicting paths."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from ..policy._model import Policy
    from ._changes import Change

__all__: list[str] = []

#: set-user-ID and set-group-ID mode bits (never landed without the user's word).
_SETID = 0o6000


def _overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _quote(path: str) -> str:
    import shlex

    return shlex.quote(path)


def _touched(changes: Iterable[Change]) -> list[str]:
    paths: list[str] = []
    for change in changes:
        paths.append(change.path)
        if change.old_path is not None:
            paths.append(change.old_path)
    return paths


def _policy_patterns(policy: Policy, workspace: str) -> list[tuple[str, str]]:
    """The rows the write broker would apply in *workspace* under *policy*
    (:func:`~corral.backends.base.broker_patterns`: ``protect``; ``denyWrite``, an
    absolute path covering itself and what is below it; the ``denyRead`` paths inside the
    workspace), those that can concern it."""
    from ..backends.base import broker_patterns

    return [
        (p, label)
        for p, label in broker_patterns(policy.filesystem, [workspace])
        if not p.startswith("/") or _overlaps(p.rstrip("/*") or "/", workspace)
    ]


def _code_path_patterns(workspace: str) -> list[tuple[str, str]]:
    """Rows of what a trusted git config runs as code in *workspace*, taken at apply time
    as the write broker takes them for a run: the configs of the repositories holding it
    and nested in it (walked holding the brokers' locks: no sandbox moves a repository
    meanwhile), and the user's global ones read in each of them
    (``backends/_gitlayout.py``). When that cannot be told - past the walk's bound, a
    config too large or unreadable, :data:`_APPLY_BOUND` seconds gone - one row refuses
    every change."""
    import time

    from ..backends._gitlayout import (
        CodePaths,
        CodePathsUnknown,
        enclosing_work_trees,
        global_git_configs,
        nested_work_trees,
        roots_held,
    )
    from ..policy._glob import escape

    base = workspace.rstrip("/")
    reader = CodePaths(deadline=time.monotonic() + _APPLY_BOUND)
    rows: list[tuple[str, str]] = []
    try:
        with roots_held([workspace]):  # the walk and every read: no sandbox moves a repo
            nested = nested_work_trees(workspace)
            trees = list(dict.fromkeys([*enclosing_work_trees(workspace), *nested]))
            found = [p for tree in trees for p in reader.tree(tree)]
            home = os.environ.get("HOME") or os.path.expanduser("~")
            globals_ = reader.global_patterns(global_git_configs(os.environ, home), trees=trees)
        for path in dict.fromkeys(found):
            if path == base or path.startswith(base + "/"):
                label = f"git: a path a trusted repository's config runs code from: {path}"
                rows += [(escape(path), label), (escape(path) + "/**", label)]
        rows += globals_
    except CodePathsUnknown as exc:
        return [("**", f"git: {exc}")]
    return rows


#: seconds apply may spend reading trusted git configs (past it: the change set is refused)
_APPLY_BOUND = 60.0


def _protected(
    changes: Iterable[Change], patterns: list[tuple[str, str]], workspace: str
) -> list[tuple[str, str]]:
    from ..policy._glob import PathPattern

    compiled = []
    for pattern, label in patterns:
        # as the write broker's rows (backends.base.broker_patterns): DIR/** also covers
        # DIR itself - a file or a symlink to a payload directory would stand in for it
        dir_row = [pattern[:-3]] if pattern.endswith("/**") and len(pattern) > 3 else []
        for text, is_dir_row in ((pattern, False), *((d, True) for d in dir_row)):
            try:
                compiled.append((PathPattern(text), label, is_dir_row))
            except ValueError:
                continue
    found: list[tuple[str, str]] = []
    for change in changes:
        if change.kind == "unsupported":
            continue
        for rel in (change.path, change.old_path):
            if rel is None:
                continue
            for compiled_pattern, label, is_dir_row in compiled:
                if is_dir_row and _new_directory(change, rel):
                    continue  # a directory made (or kept) there: what it holds is judged
                if compiled_pattern.matches(
                    f"{workspace}/{rel}" if compiled_pattern.absolute else rel
                ):
                    if _new_repository_dir(change, rel):
                        continue  # what lands inside it is judged by the rows inside .git
                    found.append((rel, label))
                    break
                # a row reaching into the workspace from above it matches the whole path,
                # as the write broker's does (PathPattern.reaches_into); no exemption there
                if compiled_pattern.reaches_into(workspace) and compiled_pattern.matches(
                    f"{workspace}/{rel}"
                ):
                    found.append((rel, label))
                    break
        if change.new_mode is not None and change.new_mode & _SETID and change.new_type == "file":
            found.append((change.path, "a set-user-ID or set-group-ID bit"))
    return found


def _git_check(
    workspace: str, landed: tuple[str, ...], allow_protected: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """Run the git check over what an apply landed (each landed path counts as changed).

    The runs in the preview were checked already; this holds for a change set
    however it was made. Every landed path is listed on its own, so each is
    journaled exactly (not as a prefix): paths the user allowed by name
    (``allow_protected``) are theirs and stay unchecked, even below a new
    directory.
    """
    from ..backends._gitcheck import Journal, check_root

    journal = Journal()
    for rel in landed:
        if not _allowed(rel, allow_protected, workspace):
            journal.change(workspace, rel)
    if not journal.roots():
        return ()
    fd = os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        findings = check_root(fd, workspace, journal)
    finally:
        os.close(fd)
    return tuple((f.path, f"{f.reason}; quarantined as {f.quarantined_as}") for f in findings)


def _new_directory(change: Change, rel: str) -> bool:
    """Whether *change* makes a directory at *rel*, or keeps one there (never a file or a
    symlink standing in for a protected directory, nor its removal or move)."""
    return (
        rel == change.path
        and change.kind in ("added", "modified")
        and change.new_type == "dir"
        and change.old_type in (None, "dir")
    )


def _new_repository_dir(change: Change, rel: str) -> bool:
    """Whether *change* makes (or only touches the metadata of) a ``.git`` directory at *rel*.

    The ``**/.git`` row refuses replacing, renaming or deleting a repository's
    ``.git``; a new ``.git`` directory is a new repository, whose
    administrative files the rows for ``.git/config``, ``.git/hooks`` ... judge.
    """
    return (
        rel == change.path
        and rel.rpartition("/")[2] == ".git"
        and change.kind in ("added", "modified")
        and change.new_type == "dir"
        and change.old_type in (None, "dir")
    )


def _allowed(rel: str, allowed: Iterable[str], workspace: str) -> bool:
    for entry in allowed:
        name = entry
        if name.startswith("/"):
            if not _overlaps(name, workspace) or len(name.rstrip("/")) <= len(workspace):
                continue
            name = name[len(workspace) :]
        name = name.strip("/")
        while name.startswith("./"):
            name = name[2:]
        if name and (rel == name or rel.startswith(name + "/")):
            return True
    return False


def _without(
    changes: list[Change], conflicts: tuple[str, ...]
) -> tuple[list[Change], tuple[str, ...]]:
    """Drop changes touching *conflicts*, and deletions of directories above them."""
    blocked = set(conflicts)
    kept: list[Change] = []
    skipped: list[str] = []
    for change in changes:
        paths = [change.path] + ([change.old_path] if change.old_path else [])
        hit = any(p in blocked for p in paths)
        if not hit and change.old_type == "dir" and change.new_type != "dir":
            hit = any(c.startswith(change.path + "/") for c in blocked)
        if hit:
            skipped.append(change.path)
        else:
            kept.append(change)
    return kept, tuple(skipped)
