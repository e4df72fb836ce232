"""Show a change set to a person: a summary, ``--stat`` lines and unified diffs.

Everything shown comes from the sandboxed command (names, contents, symlink
targets) and may try to attack the reviewer's terminal: control characters
are shown escaped (``\\x1b``), never written raw, in names and in diff lines
alike. Text is UTF-8 without NUL bytes; anything else is shown as binary
(size and sha256). Very large files are summarised instead of diffed.

Example::

    for line in render_diff(preview.changes(), color=False):
        print(line)
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

    from ._changes import Change, ChangeSet

__all__ = ["escape", "render_diff", "render_stat", "unified_diff"]

#: files larger than this are summarised, not diffed
MAX_DIFF_BYTES = 2 << 20

_COLORS = {
    "add": "\033[32m",
    "del": "\033[31m",
    "hunk": "\033[36m",
    "head": "\033[1m",
    "off": "\033[0m",
}
_MARK = {"added": "A", "deleted": "D", "modified": "M", "renamed": "R", "unsupported": "?"}


def escape(text: str) -> str:
    """*text* with C0/C1 control characters (except tab) and DEL shown as ``\\xNN``."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\t" or (ch.isprintable() and not 0x80 <= code < 0xA0):
            out.append(ch)
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out)


def _paint(text: str, what: str, color: bool) -> str:
    return f"{_COLORS[what]}{text}{_COLORS['off']}" if color else text


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        total = 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_DIFF_BYTES:
                return None
        return b"".join(chunks)
    finally:
        os.close(fd)


def _text(data: bytes | None) -> list[str] | None:
    """The lines of *data* if it is text, else ``None``."""
    if data is None or b"\0" in data:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def _describe_binary(path: str, size: int | None) -> str:
    from ._changes import file_digest

    try:
        digest = file_digest(path)
    except OSError:
        digest = "unreadable"
    return f"{size if size is not None else '?'} bytes, sha256 {digest}"


def _old_path(change: Change, workspace: str) -> str:
    return f"{workspace}/{change.old_path or change.path}"


def unified_diff(change: Change, workspace: str, *, color: bool = False) -> list[str]:
    """The body of one file's diff: unified diff lines, or a binary/size summary."""
    import difflib

    lines: list[str] = []
    old_is_file = change.old_type == "file" and change.kind != "added"
    new_is_file = change.new_type == "file" and change.kind != "deleted"
    if change.kind == "renamed" or not (old_is_file or new_is_file):
        if change.old_target is not None or change.new_target is not None:
            if change.old_target is not None:
                lines.append(_paint(f"-> {escape(change.old_target)}", "del", color))
            if change.new_target is not None:
                lines.append(_paint(f"+> {escape(change.new_target)}", "add", color))
        return lines
    if change.kind == "modified" and not change.content_changed:
        return lines
    old = _read(_old_path(change, workspace)) if old_is_file else b""
    new = _read(change.source) if new_is_file else b""
    old_lines, new_lines = _text(old), _text(new)
    if old_lines is None or new_lines is None:
        large = (old_is_file and old is None) or (new_is_file and new is None)
        what = "large" if large else "binary"
        if old_is_file:
            lines.append(
                f"{what} file, old: "
                + _describe_binary(_old_path(change, workspace), change.old_size)
            )
        if new_is_file:
            lines.append(f"{what} file, new: " + _describe_binary(change.source, change.new_size))
        return lines
    for line in difflib.unified_diff(old_lines, new_lines, n=3, lineterm=""):
        if line.startswith(("---", "+++")):
            continue
        body = line.rstrip("\n")
        no_newline = not line.endswith("\n") and not line.startswith("@@")
        if line.startswith("@@"):
            lines.append(_paint(body, "hunk", color))
            continue
        what = "add" if line.startswith("+") else "del" if line.startswith("-") else ""
        text = escape(body)
        lines.append(_paint(text, what, color) if what else text)
        if no_newline:
            lines.append("\\ No newline at end of file")
    return lines


def _header(change: Change) -> list[str]:
    path = escape(change.path)
    if change.kind == "renamed":
        head = [f"renamed {escape(change.old_path or '')} -> {path}"]
    elif change.kind == "added":
        head = [f"added {change.new_type} {path}"]
    elif change.kind == "deleted":
        head = [f"deleted {change.old_type} {path}"]
    elif change.kind == "unsupported":
        head = [f"unsupported {path}: a FIFO, socket or device node (never applied)"]
    elif change.type_changed:
        head = [f"changed {path}: {change.old_type} -> {change.new_type}"]
    else:
        head = [f"modified {path}"]
    if change.mode_changed:
        head.append(f"mode {change.old_mode:04o} -> {change.new_mode:04o}")
    elif change.kind == "added" and change.new_mode is not None and change.new_type != "symlink":
        head.append(f"mode {change.new_mode:04o}")
    return head


def render_diff(changes: ChangeSet, *, color: bool = False) -> Iterator[str]:
    """Every change: a header (what happened, modes) and its diff body."""
    for change in changes:
        head = _header(change)
        yield _paint(f"=== {head[0]}", "head", color)
        yield from head[1:]
        yield from unified_diff(change, changes.workspace, color=color)


def _counts(change: Change, workspace: str) -> tuple[int, int] | None:
    """(insertions, deletions) of a text change, or ``None`` for binary/large/non-files."""
    if change.kind in ("renamed", "unsupported") or not change.content_changed:
        return (0, 0) if change.kind == "renamed" else None
    old_is_file = change.old_type == "file" and change.kind != "added"
    new_is_file = change.new_type == "file" and change.kind != "deleted"
    if not (old_is_file or new_is_file):
        return None
    old = _text(_read(_old_path(change, workspace)) if old_is_file else b"")
    new = _text(_read(change.source) if new_is_file else b"")
    if old is None or new is None:
        return None
    import difflib

    plus = minus = 0
    for line in difflib.unified_diff(old, new, n=0, lineterm=""):
        if line.startswith("+") and not line.startswith("+++"):
            plus += 1
        elif line.startswith("-") and not line.startswith("---"):
            minus += 1
    return plus, minus


def render_stat(changes: ChangeSet, *, color: bool = False) -> Iterator[str]:
    """One line per change (``M path | +3 -1``), then a summary line."""
    total_plus = total_minus = 0
    for change in changes:
        mark = _MARK.get(change.kind, "?")
        if change.kind == "modified" and change.type_changed:
            mark = "T"
        name = escape(change.path)
        if change.kind == "renamed":
            name = f"{escape(change.old_path or '')} -> {name}"
        if change.new_type == "dir" or (change.old_type == "dir" and change.kind == "deleted"):
            name += "/"
        counts = _counts(change, changes.workspace)
        detail = ""
        if counts is not None and change.kind != "renamed":
            plus, minus = counts
            total_plus += plus
            total_minus += minus
            detail = f" | {_paint(f'+{plus}', 'add', color)} {_paint(f'-{minus}', 'del', color)}"
        elif change.new_type == "file" and change.content_changed and change.kind != "renamed":
            detail = " | binary"
        if change.mode_changed:
            detail += f" (mode {change.old_mode:04o} -> {change.new_mode:04o})"
        paint = "add" if change.kind == "added" else "del" if change.kind == "deleted" else ""
        yield f" {_paint(mark, paint, color) if paint else mark} {name}{detail}"
    yield (
        f" {changes.summary()}; {total_plus} line(s) added, {total_minus} removed"
        if changes
        else " no changes"
    )
