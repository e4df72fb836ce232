"""The Previews page's data: each pending preview's change set, rendered for review.

The diff lines are those of ``corral diff`` (:func:`corral.preview._render.unified_diff`:
control characters escaped, binary and very large files summarised by size
and sha256); here each line is highlighted with Pygments for the file's language and
marked inserted or deleted. Pygments' HTML formatter escapes everything, so a
file the sandboxed command wrote cannot inject markup into the reviewer's page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from markupsafe import Markup
from markupsafe import escape as escape_html

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
    changed: tuple[tuple[str, str], ...]  # (kind, path shown) of every change
    files: tuple[FileDiff, ...]
    conflicts: tuple[tuple[str, str], ...]
    protected: tuple[tuple[str, str], ...]


def _lexer(path: str) -> Any:
    from pygments.lexers import TextLexer, get_lexer_for_filename
    from pygments.util import ClassNotFound

    try:
        return get_lexer_for_filename(path, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return TextLexer(stripnl=False, ensurenl=False)


def _highlight(path: str, lines: list[str]) -> Markup:
    """Unified diff *lines* as HTML: each line's code highlighted for *path*'s language,
    inside a span marking it inserted (``gi``), deleted (``gd``), a hunk header (``gu``)
    or context. Pygments escapes the text; the markup around it is fixed."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter

    formatter = HtmlFormatter(nowrap=True)
    lexer = _lexer(path)
    out = []
    for line in lines:
        if line.startswith("@@"):
            out.append(f'<span class="gu">{escape_html(line)}</span>')
            continue
        mark, code = line[:1], line[1:]
        css = {"+": "gi", "-": "gd"}.get(mark, "ctx")
        body = highlight(code, lexer, formatter).rstrip("\n") if code else ""
        out.append(f'<span class="{css}">{escape_html(mark)}{body}</span>')
    return Markup("\n".join(out))  # noqa: S704 - every piece of text is escaped


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
        body=_highlight(change.path, diff_lines) if is_text_diff else None,
        summary=summary,
        protected=protected.get(change.path),
        conflict=conflicts.get(change.path),
    )


def _shown_path(change: Change) -> str:
    from ..preview._render import escape

    path = escape(change.path)
    return f"{escape(change.old_path)} -> {path}" if change.old_path else path


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
        changed=tuple((c.kind, _shown_path(c)) for c in changes),
        files=files,
        conflicts=tuple(conflicts),
        protected=tuple(protected),
    )
