"""Preview: a persistent, copy-on-write view of a workspace, and its life cycle.

State layout (in corral's state dir, which every sandbox has hidden)::

    previews/<id>/preview.json   metadata: workspace, base time, mechanism, runs,
                                 protection patterns seen by the runs, applied flag
    previews/<id>/base.json      conflict records of touched paths (see _base)
    previews/<id>/lock           flock: held by a run, an apply or a discard
    previews/<id>/upper, work    the overlay's layers        (overlay mechanisms)
    previews/<id>/tree           the copy, manifest.json      (copy mechanism)
    apply-journals/<id>.json     an apply in progress (see _apply)

A preview lives until it is applied (then it is removed, unless kept) or
discarded. The real workspace is never written before apply.
"""

from __future__ import annotations

import os

from .._exceptions import ApplyConflict, PreviewError
from ._apply import ApplyResult
from ._mechanism import remove_tree
from ._recovery import recover_interrupted
from ._review import (
    _allowed,
    _git_check,
    _overlaps,
    _protected,
    _quote,
    _touched,
    _without,
)
from ._review import (
    _policy_patterns as _policy_patterns,  # re-exported: the CLI's apply and preview use it
)
from ._store import (
    _BASE,
    _ID_PREFIX,
    _LOCK,
    _MANIFEST,
    _META,
    _Lock,
    _previews_dir,
    _read_json,
    _valid_id,
    _write_json,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins
    from collections.abc import Iterable
    from typing import Any

    from ..backends._plan import PreviewSpec
    from ..policy._model import Policy
    from ._changes import Change, ChangeSet
    from ._layers import Layer

__all__ = ["Preview"]


class Preview:
    """A copy-on-write view of a workspace that sandboxed commands run against.

    Example::

        preview = Preview.create("/src/app", state_dir=corral._state.state_dir())
        outcome = corral.pipeline._runner.execute(request, policy, environ=os.environ, preview=preview)
        print(preview.changes().summary())
        preview.apply()          # or preview.discard()

    Attributes:
        id: ``"pv-"`` and 12 hex digits.
        workspace: the real workspace (the read-only lower layer).
        mechanism: ``"overlay"``, ``"fuse-overlayfs"`` or ``"copy"``.
        created: creation time (seconds since the epoch).
        path: the preview's directory in the state dir.
    """

    __slots__ = ("_meta", "base_ns", "created", "id", "mechanism", "path", "state_dir", "workspace")

    def __init__(self, state_dir: str, meta: dict[str, Any]) -> None:
        self.state_dir = state_dir
        self.id: str = meta["id"]
        self.workspace: str = meta["workspace"]
        self.mechanism: str = meta["mechanism"]
        self.created: float = meta["created"]
        self.base_ns: int = meta["base_ns"]
        self.path = os.path.join(_previews_dir(state_dir), self.id)
        self._meta = meta

    def __repr__(self) -> str:
        return f"<Preview {self.id} of {self.workspace} ({self.mechanism})>"

    # ------------------------------------------------------------ life cycle
    @classmethod
    def create(cls, workspace: str, *, state_dir: str, mechanism: str = "auto") -> Preview:
        """Start a preview of *workspace* (nothing is mounted until a command runs).

        *mechanism* ``"auto"`` honours ``CORRAL_PREVIEW_MECHANISM`` and then
        picks the first that works of overlay, fuse-overlayfs, copy.

        Raises:
            PreviewError: the workspace is not a directory, overlaps the state
                dir, or the requested mechanism does not work here.
        """
        import time

        from ._base import base_time_ns
        from ._mechanism import choose_mechanism, copy_tree, find_fuse_overlayfs

        recover_interrupted(state_dir)
        ws = os.path.realpath(workspace)
        if not os.path.isdir(ws):
            raise PreviewError(
                f"Failed to create a preview of {workspace}: not an existing directory"
            )
        state = os.path.realpath(state_dir)
        if _overlaps(ws, state):
            raise PreviewError(
                f"Failed to create a preview of {ws}: corral's state directory {state} overlaps it",
                hint="set XDG_STATE_HOME to a directory outside the workspace",
            )
        previews = _previews_dir(state_dir)
        os.makedirs(previews, mode=0o700, exist_ok=True)
        if mechanism == "auto":
            mechanism = os.environ.get("CORRAL_PREVIEW_MECHANISM", "auto") or "auto"
        chosen = choose_mechanism(mechanism, previews)
        fuse_binary = ""
        if chosen == "fuse-overlayfs":
            fuse_binary = find_fuse_overlayfs() or ""
            if any(c in p for p in (ws, previews) for c in ",:"):
                raise PreviewError(
                    f"Failed to create a preview of {ws} with fuse-overlayfs: "
                    "its paths must not contain ',' or ':'",
                    hint="CORRAL_PREVIEW_MECHANISM=copy works with any path",
                )
        preview_id = _ID_PREFIX + os.urandom(6).hex()
        path = os.path.join(previews, preview_id)
        os.mkdir(path, 0o700)
        try:
            base_ns = base_time_ns()
            if chosen == "copy":
                try:
                    manifest = copy_tree(ws, os.path.join(path, "tree"))
                except OSError as exc:
                    raise PreviewError(
                        f"Failed to copy the workspace for a preview: {exc}"
                    ) from exc
                _write_json(
                    os.path.join(path, _MANIFEST), {k: list(v) for k, v in manifest.items()}
                )
            else:
                os.mkdir(os.path.join(path, "upper"), 0o755)
                os.mkdir(os.path.join(path, "work"), 0o700)
            meta = {
                "version": 1,
                "id": preview_id,
                "workspace": ws,
                "mechanism": chosen,
                "created": time.time(),
                "base_ns": base_ns,
                "runs": 0,
                "patterns": [],
                "fuse_binary": fuse_binary,
                "applied": False,
            }
            _write_json(os.path.join(path, _META), meta, durable=True)
        except BaseException:
            remove_tree(path)
            raise
        return cls(state_dir, meta)

    @classmethod
    def open(cls, preview_id: str, *, state_dir: str) -> Preview:
        """The preview called *preview_id*.

        Raises:
            PreviewError: no such preview (or it was applied or discarded).
        """
        recover_interrupted(state_dir)
        preview = cls._load(preview_id, state_dir)
        if preview is None:
            raise PreviewError(
                f"Failed to find preview {preview_id!r}",
                hint="'corral previews' lists the previews that exist",
            )
        return preview

    @classmethod
    def list(cls, *, state_dir: str, workspace: str | None = None) -> builtins.list[Preview]:
        """Every preview (of *workspace*, if given), oldest first."""
        recover_interrupted(state_dir)
        previews = _previews_dir(state_dir)
        try:
            names = os.listdir(previews)
        except FileNotFoundError:
            return []
        found = []
        ws = os.path.realpath(workspace) if workspace is not None else None
        for name in names:
            if name.startswith(".discarded-"):
                remove_tree(os.path.join(previews, name))  # an interrupted discard
                continue
            if not _valid_id(name):
                continue
            preview = cls._load(name, state_dir)
            if preview is not None and (ws is None or preview.workspace == ws):
                found.append(preview)
        found.sort(key=lambda p: (p.created, p.id))
        return found

    @classmethod
    def _load(cls, preview_id: str, state_dir: str) -> Preview | None:
        from .._jsonfast import JSONError

        if not _valid_id(preview_id):
            return None
        path = os.path.join(_previews_dir(state_dir), preview_id)
        try:
            meta = _read_json(os.path.join(path, _META))
        except (OSError, JSONError):
            return None
        if not isinstance(meta, dict) or meta.get("id") != preview_id:
            return None
        preview = cls(state_dir, meta)
        if meta.get("applied"):
            # applied, then interrupted before the removal finished
            lock = _Lock(os.path.join(path, _LOCK), f"preview {preview_id}")
            if lock.acquire(wait=False):
                try:
                    preview._remove()
                finally:
                    lock.release()
            return None
        return preview

    def discard(self) -> None:
        """Drop the preview and everything it holds; the real workspace is untouched.

        Raises:
            PreviewError: a command is running in it or it is being applied.
        """
        with self.hold():
            self._remove()

    def _remove(self) -> None:
        trash = os.path.join(
            _previews_dir(self.state_dir), f".discarded-{self.id}-{os.urandom(3).hex()}"
        )
        try:
            os.rename(self.path, trash)
        except FileNotFoundError:
            return
        remove_tree(trash)

    def hold(self) -> _Lock:
        """An exclusive hold on the preview for one run or apply (a context manager).

        Raises (on entry):
            PreviewError: another corral command holds it.
        """
        if not os.path.isdir(self.path):
            raise PreviewError(f"Failed to use preview {self.id}: it was applied or discarded")
        return _Lock(os.path.join(self.path, _LOCK), f"preview {self.id}")

    # ------------------------------------------------------------ running in it
    def spec(self) -> PreviewSpec:
        """The pure description a backend's ``plan`` needs (see ``PreviewSpec``)."""
        from ..backends._plan import PreviewSpec

        return PreviewSpec(
            id=self.id,
            mechanism=self.mechanism,
            workspace=self.workspace,
            upper=os.path.join(self.path, "upper") if self.mechanism != "copy" else "",
            work=os.path.join(self.path, "work") if self.mechanism != "copy" else "",
            tree=os.path.join(self.path, "tree") if self.mechanism == "copy" else "",
            fuse_binary=str(self._meta.get("fuse_binary") or ""),
        )

    def record_run(self, policy: Policy | None = None) -> None:
        """After a run: remember what the change set touches and the run's protections.

        Called (with the hold taken) by :mod:`corral.pipeline._runner` after every run
        in the preview. Costs one ``lstat`` per touched path (no reading).
        """
        from ._base import observe
        from ._changes import compute_changes

        # the touched paths only: no content comparison, no rename pairing
        touched = compute_changes(
            self._layer(),
            self.workspace,
            preview_id=self.id,
            detect_renames=False,
            compare_content=False,
        )
        meta = self._reload_meta()
        meta["runs"] = int(meta.get("runs", 0)) + 1
        if policy is not None:
            known = {tuple(p) for p in meta.get("patterns", [])}
            for pattern, label in _policy_patterns(policy, self.workspace):
                if (pattern, label) not in known:
                    meta.setdefault("patterns", []).append([pattern, label])
                    known.add((pattern, label))
        if self.mechanism != "copy":
            records = self._own_records()
            before = len(records)
            for rel in _touched(touched):
                if rel not in records:
                    records[rel] = observe(self.workspace, rel, self.base_ns, records)
            if len(records) != before:
                _write_json(os.path.join(self.path, _BASE), records)
        _write_json(os.path.join(self.path, _META), meta)
        self._meta = meta

    # ------------------------------------------------------------ reviewing
    def changes(self) -> ChangeSet:
        """The change set: what :meth:`apply` would do to the real workspace now."""
        from ._changes import compute_changes

        return compute_changes(self._layer(), self.workspace, preview_id=self.id)

    def _layer(self) -> Layer:
        from ._layers import Layer

        if not os.path.isdir(self.path):
            raise PreviewError(f"Failed to read preview {self.id}: it was applied or discarded")
        if self.mechanism == "copy":
            manifest = self._manifest()
            return Layer(
                os.path.join(self.path, "tree"),
                "copy",
                {k: (str(v[0]), int(v[1]), int(v[2])) for k, v in manifest.items()},
            )
        return Layer(os.path.join(self.path, "upper"), self.mechanism)

    def conflicts(self, changes: ChangeSet | None = None) -> builtins.list[tuple[str, str]]:
        """``(path, why)`` for the changes whose real file changed since the preview began."""
        from ._base import find_conflicts

        changes = self.changes() if changes is None else changes
        return find_conflicts(self.workspace, _touched(changes), self._records(), self.base_ns)

    def protected(
        self, changes: ChangeSet | None = None, *, protect: Iterable[tuple[str, str]] = ()
    ) -> builtins.list[tuple[str, str]]:
        """``(path, rule)`` for the changes that touch protected paths or set-id bits."""
        changes = self.changes() if changes is None else changes
        patterns = self._patterns(protect)
        return _protected(changes, patterns, self.workspace)

    @property
    def runs(self) -> int:
        """How many commands ran in this preview."""
        return int(self._meta.get("runs", 0))

    def to_json(self) -> dict[str, object]:
        """``{"id", "workspace", "mechanism", "created", "runs"}``."""
        return {
            "id": self.id,
            "workspace": self.workspace,
            "mechanism": self.mechanism,
            "created": self.created,
            "runs": self.runs,
        }

    # ------------------------------------------------------------ applying
    def apply(
        self,
        *,
        allow_protected: tuple[str, ...] = (),
        force: bool = False,
        skip_conflicts: bool = False,
        protect: Iterable[tuple[str, str]] = (),
        keep: bool = False,
    ) -> ApplyResult:
        """Land the change set in the real workspace.

        Args:
            allow_protected: workspace-relative paths (a directory covers what
                is below it) whose protected changes the user reviewed and
                accepts; other protected changes make the apply fail.
            force: overwrite files that changed in the real workspace since
                the preview began.
            skip_conflicts: apply everything else and leave those out (they
                stay in the preview, which is then kept).
            protect: extra ``(pattern, rule label)`` protections, e.g. from
                the current settings; corral's built-in protections (DESIGN
                §1) and those of every run in the preview always apply.
            keep: keep the preview after applying (to run more commands in it).

        Raises:
            PreviewError: protected paths are changed and not allowed, or the
                preview is in use, applied or discarded.
            ApplyConflict: files changed in the real workspace meanwhile
                (``.paths`` lists them) and neither *force* nor
                *skip_conflicts* was given.
        """
        with self.hold(), self._workspace_lock():
            self._finish_pending()
            if not os.path.isdir(self.path):
                raise PreviewError(f"Failed to apply preview {self.id}: it was applied meanwhile")
            changes = self.changes()
            refused = [
                (p, r)
                for p, r in _protected(changes, self._patterns(protect), self.workspace)
                if not _allowed(p, allow_protected, self.workspace)
            ]
            if refused:
                listing = "; ".join(f"{p} ({r})" for p, r in refused[:10])
                more = f" and {len(refused) - 10} more" if len(refused) > 10 else ""
                raise PreviewError(
                    f"Failed to apply preview {self.id}: it changes protected paths: "
                    f"{listing}{more}",
                    hint="review them with 'corral diff', then allow each by name: "
                    + " ".join(f"--allow-protected {_quote(p)}" for p, _ in refused[:5])
                    + "; or discard the preview",
                )
            conflicts = [] if force else self.conflicts(changes)
            skipped: tuple[str, ...] = ()
            selected = list(changes)
            if conflicts:
                paths = tuple(p for p, _ in conflicts)
                if not skip_conflicts:
                    listing = "; ".join(f"{p} ({why})" for p, why in conflicts[:10])
                    more = f" and {len(conflicts) - 10} more" if len(conflicts) > 10 else ""
                    raise ApplyConflict(
                        f"Failed to apply preview {self.id}: {len(conflicts)} path(s) changed "
                        f"in the real workspace since the preview began: {listing}{more}",
                        paths=paths,
                        hint="--force overwrites them with the preview's version; "
                        "--skip-conflicts applies everything else and keeps the preview",
                    )
                selected, skipped = _without(selected, paths)
            result = self._land(selected, skipped, keep=keep or bool(skipped))
            quarantined = _git_check(self.workspace, result.applied, allow_protected)
            return result.replace(quarantined=quarantined) if quarantined else result

    def _land(
        self, selected: builtins.list[Change], skipped: tuple[str, ...], *, keep: bool
    ) -> ApplyResult:
        from ._apply import plan_operations, write_journal

        unsupported = tuple(c.path for c in selected if c.kind == "unsupported")
        ops = plan_operations(selected)
        applied = tuple(sorted({str(op[1]) for op in ops}))
        journal: dict[str, object] = {
            "version": 1,
            "preview": self.id,
            "workspace": self.workspace,
            "ops": ops,
            "then": "keep" if keep else "discard",
        }
        if ops:
            write_journal(self.state_dir, journal)
            failures = self._complete(journal)
        else:
            failures = []
            if journal["then"] == "discard":
                self._remove()
        return ApplyResult(
            preview_id=self.id,
            applied=applied,
            skipped_conflicts=skipped,
            skipped_unsupported=unsupported,
            failed=tuple(failures),
            preview_removed=not os.path.isdir(self.path),
        )

    def _complete(self, journal: dict[str, Any]) -> builtins.list[tuple[str, str]]:
        """Roll *journal* forward, then finish: record what landed, or remove the preview."""
        from ._apply import journal_dir, remove_journal, roll_forward
        from ._base import exact

        failures = roll_forward(journal)
        path = os.path.join(journal_dir(self.state_dir), f"{self.id}.json")
        if os.path.isdir(self.path):
            if journal.get("then") == "discard" and not failures:
                meta = self._reload_meta()
                meta["applied"] = True
                _write_json(os.path.join(self.path, _META), meta, durable=True)
                remove_journal(path)
                self._remove()
                return failures
            records = self._own_records()
            for op in journal["ops"]:
                rel = str(op[1])
                records[rel] = exact(self.workspace, rel)
                parent = rel.rpartition("/")[0]
                records[parent] = exact(self.workspace, parent)
            _write_json(os.path.join(self.path, _BASE), records, durable=True)
        remove_journal(path)
        return failures

    def _finish_pending(self) -> None:
        """Complete this preview's interrupted apply, if any (hold and workspace lock taken)."""
        from .._jsonfast import JSONError
        from ._apply import journal_dir

        path = os.path.join(journal_dir(self.state_dir), f"{self.id}.json")
        try:
            journal = _read_json(path)
        except FileNotFoundError:
            return
        except (OSError, JSONError) as exc:
            raise PreviewError(f"Failed to read the apply journal {path}: {exc}") from exc
        self._complete(journal)

    def _workspace_lock(self) -> _Lock:
        """One apply at a time (per state dir): applies to one workspace must not interleave."""
        lock = _Lock(os.path.join(_previews_dir(self.state_dir), ".apply.lock"), "the apply lock")
        lock.acquire(wait=True)
        return lock

    # ------------------------------------------------------------ records
    def _reload_meta(self) -> dict[str, Any]:
        meta = _read_json(os.path.join(self.path, _META))
        assert isinstance(meta, dict)
        return meta

    def _own_records(self) -> dict[str, str]:
        from .._jsonfast import JSONError

        try:
            data = _read_json(os.path.join(self.path, _BASE))
        except (FileNotFoundError, JSONError):
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def _manifest(self) -> dict[str, builtins.list[Any]]:
        data = _read_json(os.path.join(self.path, _MANIFEST))
        assert isinstance(data, dict)
        return data

    def _records(self) -> dict[str, str]:
        records: dict[str, str] = {}
        if self.mechanism == "copy":
            from ._base import ABSENT

            manifest = self._manifest()
            records = {rel: f"present:{v[0]}" for rel, v in manifest.items()}
            records = _DefaultAbsent(records, ABSENT)
        records.update(self._own_records())
        return records

    def _patterns(self, extra: Iterable[tuple[str, str]]) -> builtins.list[tuple[str, str]]:
        from ..policy import PROTECTED_PATTERNS
        from ._review import _code_path_patterns

        patterns = [(p, f"filesystem.protect: {p}") for p, _reason in PROTECTED_PATTERNS]
        code = _code_path_patterns(self.workspace)  # what the host's git runs now
        for p, label in [*self._meta.get("patterns", []), *extra, *code]:
            if (str(p), str(label)) not in patterns:
                patterns.append((str(p), str(label)))
        return patterns


class _DefaultAbsent(dict[str, str]):
    """Records where an unknown path is ``absent`` (the copy's manifest lists every present one)."""

    def __init__(self, data: dict[str, str], default: str) -> None:
        super().__init__(data)
        self._default = default

    def get(self, key: str, default: str | None = None) -> str | None:  # type: ignore[override]
        value = super().get(key)
        return self._default if value is None else value
