"""The change set: what applying a preview would do to the real workspace.

A change set compares the tree the command saw (the real workspace seen
through the preview's layer) with the real workspace *now*, restricted to the
paths the layer touches, so computing it costs time proportional to the
changed files, not to the workspace. Paths are workspace-relative and
``/``-separated.

Kinds:

* ``added``: a file, directory or symlink that does not exist in the real workspace;
* ``deleted``: one that the command removed (each entry below a removed
  directory is listed too);
* ``modified``: content, mode, symlink target or type differ
  (``content_changed``, ``old_mode``/``new_mode``, ``old_type``/``new_type``);
* ``renamed``: a deleted and an added regular file with identical content
  (``old_path`` -> ``path``);
* ``unsupported``: a FIFO, socket or device node the command created: shown,
  never applied.

A copy-up that changed nothing but timestamps (``touch``, a rewrite with the
same bytes) is not a change.

Example::

    changes = compute_changes(layer, "/src/app", preview_id="pv-1")
    for change in changes:
        print(change.kind, change.path)
"""

from __future__ import annotations

import os
import stat

from .._frozen import Record
from ._layers import Layer, Node, kind_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Change", "ChangeSet", "compute_changes", "file_digest"]

_CHUNK = 1 << 20


class Change(Record):
    """One path that differs between the preview and the real workspace.

    Attributes:
        path: workspace-relative path (``/``-separated).
        kind: ``"added"``, ``"deleted"``, ``"modified"``, ``"renamed"`` or ``"unsupported"``.
        old_type, new_type: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"``
            (``None``: absent).
        old_mode, new_mode: permission bits (``st_mode & 0o7777``), or ``None``.
        old_size, new_size: sizes in bytes of regular files, or ``None``.
        old_target, new_target: symlink targets, or ``None``.
        old_path: the source of a rename.
        content_changed: the bytes (or the symlink target, or the type) differ.
        new_mtime_ns: modification time of the new version (kept by apply).
        source: where the new version is stored in corral's state dir (internal).
    """

    path: str
    kind: str
    old_type: str | None = None
    new_type: str | None = None
    old_mode: int | None = None
    new_mode: int | None = None
    old_size: int | None = None
    new_size: int | None = None
    old_target: str | None = None
    new_target: str | None = None
    old_path: str | None = None
    content_changed: bool = False
    new_mtime_ns: int = 0
    source: str = ""

    @property
    def mode_changed(self) -> bool:
        """The permission bits differ (both versions exist)."""
        return (
            self.old_mode is not None
            and self.new_mode is not None
            and self.old_mode != self.new_mode
        )

    @property
    def type_changed(self) -> bool:
        """A file became a directory, a symlink a file, and so on."""
        return (
            self.old_type is not None
            and self.new_type is not None
            and self.old_type != self.new_type
        )

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (without the internal ``source``; modes as octal strings)."""
        out: dict[str, object] = {"path": self.path, "kind": self.kind}
        for name in (
            "old_path",
            "old_type",
            "new_type",
            "old_size",
            "new_size",
            "old_target",
            "new_target",
        ):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        for name in ("old_mode", "new_mode"):
            value = getattr(self, name)
            if value is not None:
                out[name] = f"{value:04o}"
        out["content_changed"] = self.content_changed
        return out


class ChangeSet:
    """The changes of one preview, sorted by path; iterable, sized, JSON-able.

    Example::

        changes = preview.changes()
        if changes:
            print(changes.summary())   # "2 added, 1 modified"
        json_text = corral._jsonfast.dumps(changes.to_json())
    """

    __slots__ = ("changes", "preview_id", "workspace")

    def __init__(self, preview_id: str, workspace: str, changes: tuple[Change, ...]) -> None:
        self.preview_id = preview_id
        self.workspace = workspace
        self.changes = changes

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    def __bool__(self) -> bool:
        return bool(self.changes)

    def __repr__(self) -> str:
        return f"<ChangeSet {self.preview_id}: {self.summary()}>"

    def get(self, path: str) -> Change | None:
        """The change of *path*, or ``None``."""
        for change in self.changes:
            if change.path == path:
                return change
        return None

    def counts(self) -> dict[str, int]:
        """How many changes of each kind (only kinds that occur)."""
        counts: dict[str, int] = {}
        for change in self.changes:
            counts[change.kind] = counts.get(change.kind, 0) + 1
        return counts

    def summary(self) -> str:
        """``"2 added, 1 modified"``, or ``"no changes"``."""
        order = ("added", "modified", "renamed", "deleted", "unsupported")
        counts = self.counts()
        parts = [f"{counts[kind]} {kind}" for kind in order if kind in counts]
        return ", ".join(parts) if parts else "no changes"

    def to_json(self) -> dict[str, object]:
        """``{"preview": id, "workspace": ..., "summary": {...}, "changes": [...]}``."""
        return {
            "preview": self.preview_id,
            "workspace": self.workspace,
            "summary": self.counts(),
            "changes": [change.to_json() for change in self.changes],
        }


# ---------------------------------------------------------------- computing
def compute_changes(
    layer: Layer,
    workspace: str,
    *,
    preview_id: str,
    detect_renames: bool = True,
    compare_content: bool = True,
) -> ChangeSet:
    """Compare *layer* with the real *workspace* and return the change set.

    Cost: one ``lstat`` per layer entry, a listing of each opaque directory,
    and a byte comparison of files copied up with an unchanged size. With
    ``compare_content=False`` such files count as modified unread (a superset
    of the change set, for callers that only need the touched paths).
    """
    walker = _Walker(layer, workspace.rstrip("/") or "/", compare_content=compare_content)
    root_st = _lstat(walker.workspace)
    walker.directory("", layer.root, root_st is not None and stat.S_ISDIR(root_st.st_mode))
    changes = walker.out
    if detect_renames:
        changes = _pair_renames(changes, walker.workspace)
    changes.sort(key=lambda c: _path_key(c.path))
    return ChangeSet(preview_id, workspace, tuple(changes))


def _path_key(path: str) -> tuple[str, ...]:
    return tuple(path.split("/"))


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _perm(st: os.stat_result) -> int:
    return stat.S_IMODE(st.st_mode)


class _Walker:
    """Walk the layer top-down, comparing each touched entry with the real workspace."""

    def __init__(self, layer: Layer, workspace: str, *, compare_content: bool = True) -> None:
        self.layer = layer
        self.workspace = workspace
        self.compare_content = compare_content
        self.out: list[Change] = []

    def real_path(self, rel: str) -> str:
        return f"{self.workspace}/{rel}" if rel else self.workspace

    def directory(self, rel: str, host_dir: str, real_is_dir: bool) -> None:
        nodes, opaque = self.layer.children(rel, host_dir)
        names = set(nodes)
        if opaque and real_is_dir:
            try:
                names.update(os.listdir(self.real_path(rel)))
            except OSError:
                pass
        for name in sorted(names):
            child = f"{rel}/{name}" if rel else name
            real = _lstat(self.real_path(child)) if real_is_dir else None
            node = nodes.get(name)
            if node is None:
                # hidden by an opaque directory (or missing from the copy)
                if real is not None and self.layer.existed(child) is not False:
                    self.deleted(child, real)
                continue
            self.entry(child, node, real)

    def entry(self, rel: str, node: Node, real: os.stat_result | None) -> None:
        if self.layer.untouched(rel, node):
            if node.kind == "dir":
                self.directory(rel, node.host, real is not None and stat.S_ISDIR(real.st_mode))
            return
        if node.kind == "whiteout":
            if real is not None and self.layer.existed(rel) is not False:
                self.deleted(rel, real)
            return
        st = node.st
        assert st is not None
        if node.kind == "other":
            self.out.append(
                Change(
                    path=rel,
                    kind="unsupported",
                    new_type="other",
                    new_mode=_perm(st),
                    old_type=kind_of(real.st_mode) if real is not None else None,
                )
            )
            return
        new = self.describe_new(rel, node, st)
        if real is None:
            self.out.append(new.replace(kind="added", content_changed=True))
            if node.kind == "dir":
                self.directory(rel, node.host, False)
            return
        old_type = kind_of(real.st_mode)
        old = {"old_type": old_type, "old_mode": _perm(real)}
        if old_type == "file":
            old["old_size"] = real.st_size
        elif old_type == "symlink":
            old["old_target"] = os.readlink(self.real_path(rel))
        if old_type == "dir" and node.kind != "dir":
            # the command replaced a directory: everything below it is gone
            self.deleted_below(rel)
        if node.kind == "dir":
            if old_type != "dir" or _perm(real) != _perm(st):
                self.out.append(
                    new.replace(kind="modified", content_changed=old_type != "dir", **old)
                )
            self.directory(rel, node.host, old_type == "dir")
            return
        if old_type != node.kind:
            self.out.append(new.replace(kind="modified", content_changed=True, **old))
            return
        if node.kind == "symlink":
            changed = old["old_target"] != new.new_target
        elif not self.compare_content:
            changed = True
        else:
            changed = not _same_content(self.real_path(rel), node.host, real, st)
        if changed or _perm(real) != _perm(st):
            self.out.append(new.replace(kind="modified", content_changed=changed, **old))

    @staticmethod
    def describe_new(rel: str, node: Node, st: os.stat_result) -> Change:
        change = Change(
            path=rel,
            kind="added",
            new_type=node.kind,
            new_mode=_perm(st),
            new_mtime_ns=st.st_mtime_ns,
            source=node.host,
        )
        if node.kind == "file":
            return change.replace(new_size=st.st_size)
        if node.kind == "symlink":
            return change.replace(new_target=os.readlink(node.host))
        return change

    def deleted(self, rel: str, real: os.stat_result) -> None:
        old_type = kind_of(real.st_mode)
        if old_type == "dir":
            self.deleted_below(rel)
        change = Change(path=rel, kind="deleted", old_type=old_type, old_mode=_perm(real))
        if old_type == "file":
            change = change.replace(old_size=real.st_size)
        elif old_type == "symlink":
            change = change.replace(old_target=os.readlink(self.real_path(rel)))
        self.out.append(change)

    def deleted_below(self, rel: str) -> None:
        try:
            names = sorted(os.listdir(self.real_path(rel)))
        except OSError:
            return
        for name in names:
            child = f"{rel}/{name}"
            real = _lstat(self.real_path(child))
            if real is not None:
                self.deleted(child, real)


def _same_content(a: str, b: str, sa: os.stat_result, sb: os.stat_result) -> bool:
    if sa.st_size != sb.st_size:
        return False
    try:
        fa = os.open(a, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fb = os.open(b, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        os.close(fa)
        return False
    try:
        while True:
            ca = os.read(fa, _CHUNK)
            cb = os.read(fb, _CHUNK)
            if ca != cb:
                return False
            if not ca:
                return True
    finally:
        os.close(fa)
        os.close(fb)


def file_digest(path: str) -> str:
    """sha256 of the regular file at *path* (not following a final symlink)."""
    import hashlib

    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _pair_renames(changes: list[Change], workspace: str) -> list[Change]:
    """Pair deleted and added regular files with identical bytes into renames."""
    deleted = [c for c in changes if c.kind == "deleted" and c.old_type == "file"]
    added = [c for c in changes if c.kind == "added" and c.new_type == "file"]
    if not deleted or not added:
        return changes
    sizes = {c.old_size for c in deleted}
    candidates: dict[tuple[int | None, str], list[Change]] = {}
    for change in added:
        if change.new_size not in sizes:
            continue
        try:
            candidates.setdefault((change.new_size, file_digest(change.source)), []).append(change)
        except OSError:
            continue
    if not candidates:
        return changes
    used: set[int] = set()
    renames: list[Change] = []
    gone: set[int] = set()
    for old in deleted:
        sizes_match = [k for k in candidates if k[0] == old.old_size]
        if not sizes_match:
            continue
        try:
            key = (old.old_size, file_digest(f"{workspace}/{old.path}"))
        except OSError:
            continue
        options = [c for c in candidates.get(key, []) if id(c) not in used]
        if not options:
            continue
        base = old.path.rsplit("/", 1)[-1]
        options.sort(key=lambda c: c.path.rsplit("/", 1)[-1] != base)
        new = options[0]
        used.add(id(new))
        gone.add(id(old))
        renames.append(
            new.replace(
                kind="renamed",
                old_path=old.path,
                old_type="file",
                old_mode=old.old_mode,
                old_size=old.old_size,
                content_changed=False,
            )
        )
    return [c for c in changes if id(c) not in used and id(c) not in gone] + renames
