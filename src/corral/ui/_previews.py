"""The Previews page's data: each pending preview's change set, rendered for review.

The diff lines are those of ``corral diff`` (:func:`corral.preview._render.unified_diff`:
control characters escaped, binary and very large files summarised by size
and sha256); here they are highlighted with Pygments' diff lexer, whose HTML
formatter escapes everything, so a file the sandboxed command wrote cannot
inject markup into the reviewer's page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from markupsafe import Markup

if TYPE_CHECKING:
    from ..preview import Change, Preview

__all__ = ["FileDiff", "PreviewView", "view"]


@dataclass(frozen=True, slots=True)
class FileDiff:
    """One changed path as the page shows it."""

    kind: str  # added, modified, deleted, renamed, unsupported
    path: str
    old_path: str | None
    header: tuple[str, ...]
    body: Markup | None  # highlighted unified diff, or None
    summary: tuple[str, ...]  # binary / large file / symlink lines shown as text
    protected: str | None  # the protection rule, when the path is protected
    conflict: str | None  # why it conflicts, when the real file changed since


@dataclass(frozen=True, slots=True)
class PreviewView:
    """A preview with its reviewed changes."""

    id: str
    workspace: str
    mechanism: str
    created: float
    runs: int
    counts: dict[str, int]
    files: tuple[FileDiff, ...]
    conflicts: tuple[tuple[str, str], ...]
    protected: tuple[tuple[str, str], ...]


def _highlight(lines: list[str]) -> Markup:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import DiffLexer

    formatter = HtmlFormatter(nowrap=True)
    return Markup(highlight("\n".join(lines) + "\n", DiffLexer(), formatter))  # noqa: S704


def _file(
    change: Change, workspace: str, protected: dict[str, str], conflicts: dict[str, str]
) -> FileDiff:
    from ..preview._render import _header, escape, unified_diff

    body = unified_diff(change, workspace, color=False)
    diff_lines = [line for line in body if not line.startswith(("binary file", "large file"))]
    summary = tuple(line for line in body if line.startswith(("binary file", "large file")))
    is_text_diff = any(line.startswith("@@") for line in diff_lines)
    if not is_text_diff:
        summary = summary + tuple(diff_lines)
    return FileDiff(
        kind="type changed" if change.kind == "modified" and change.type_changed else change.kind,
        path=escape(change.path),
        old_path=escape(change.old_path) if change.old_path else None,
        header=tuple(_header(change)),
        body=_highlight(diff_lines) if is_text_diff else None,
        summary=summary,
        protected=protected.get(change.path),
        conflict=conflicts.get(change.path),
    )


def view(preview: Preview, *, with_diffs: bool = True) -> PreviewView:
    """Review *preview*: its changes, conflicts and protected paths as ``corral apply`` judges them."""
    from ..cli.commands.apply import settings_protections

    changes = preview.changes()
    protected = preview.protected(changes, protect=settings_protections(preview.workspace))
    conflicts = preview.conflicts(changes)
    files = (
        tuple(_file(c, changes.workspace, dict(protected), dict(conflicts)) for c in changes)
        if with_diffs
        else ()
    )
    return PreviewView(
        id=preview.id,
        workspace=preview.workspace,
        mechanism=preview.mechanism,
        created=preview.created,
        runs=preview.runs,
        counts=changes.counts(),
        files=files,
        conflicts=tuple(conflicts),
        protected=tuple(protected),
    )
