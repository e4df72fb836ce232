"""JSON files of other tools (Claude Code settings, plugin manifests): strict reads, atomic writes.

:func:`load_object` refuses anything but a JSON object with the reason (the
caller changes nothing then); :func:`save` writes the new content to a
temporary file in the same directory, fsyncs it and renames it over the old
one, keeping its mode, so a crash leaves either the old or the new file.
"""

from __future__ import annotations

import json
import os

from .._exceptions import UsageError
from .._jsonfast import JSONError, check_depth

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["load_document", "load_object", "save", "write_text"]


def load_object(path: str, *, missing_ok: bool = True) -> dict[str, Any]:
    """The JSON object in *path* (``{}`` for a missing or empty file when *missing_ok*).

    Raises:
        UsageError: unreadable, not JSON, or not an object; the hint says nothing changed.
    """
    data = load_document(path, missing_ok=missing_ok)
    if not isinstance(data, dict):
        raise UsageError(f"{path}: the file is not a JSON object", hint="nothing was changed")
    return data


def load_document(path: str, *, missing_ok: bool = True) -> dict[str, Any] | list[Any]:
    """The JSON object or array in *path* (``{}`` for a missing or empty file when *missing_ok*).

    Raises:
        UsageError: unreadable, not JSON, or neither an object nor an array; the hint
            says nothing changed.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise UsageError(f"{path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it: {exc.strerror}") from None
    if not text.strip():
        return {}
    try:
        check_depth(text)  # a plugin's file is untrusted: no RecursionError
    except JSONError as exc:
        raise UsageError(
            f"{path}: not valid JSON ({exc})", hint="fix the file first; nothing was changed"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            hint="fix the file first; nothing was changed",
        ) from None
    if not isinstance(data, (dict, list)):
        raise UsageError(
            f"{path}: the file is neither a JSON object nor an array", hint="nothing was changed"
        )
    return data


def save(path: str, data: dict[str, Any] | list[Any]) -> str:
    """Replace *path* with *data* as indented JSON, atomically, keeping the file's mode.

    Returns the text written.
    """
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    write_text(path, text)
    return text


def write_text(path: str, text: str) -> None:
    """Replace *path* with *text*, atomically (write, fsync, rename), keeping the file's mode."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    tmp = f"{path}.corral-{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
