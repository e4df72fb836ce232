"""``corral install claude-code``: merge corral's hook into a Claude Code settings.json.

The merge keeps every existing key and hook; it only adds (or updates) one
``PreToolUse`` matcher group whose single command hook is
``<corral> hook claude-code || exit 2`` (so that even a corral that cannot
start - exit 126/127, which Claude Code would treat as a non-blocking error -
blocks the tool call). Installing twice changes nothing; a user's hook in the
same matcher group as corral's stays. Uninstalling restores the file byte
for byte when it is still what install wrote (the bytes from before are kept
in corral's state directory; a file install created is removed); otherwise
it removes exactly corral's hook, and the ``PreToolUse`` list and ``hooks``
object when they end up empty. A symlinked settings file is written through
the link. Files are rewritten atomically (write, fsync, rename) with their
mode kept, so a crash never leaves half a settings file.

A settings file that is not valid JSON, not an object, or whose ``hooks`` is
malformed is refused with the reason; nothing is changed.
"""

from __future__ import annotations

import copy
import os

from .._exceptions import UsageError
from ._jsonfile import load_object, save, write_text
from ._shell import join
from .claude_code_hook import MATCHER

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["MATCHER", "hook_command", "install_hook", "is_corral_hook", "uninstall_hook"]

#: Seconds Claude Code gives the hook (a decision takes milliseconds).
TIMEOUT = 30
_MARK = " hook claude-code"


def hook_command(corral: Sequence[str]) -> str:
    """The hook's command line for the corral started by *corral* (absolute path).

    ``|| exit 2``: whatever way corral fails (not found, cannot start,
    crashes), Claude Code sees exit 2 and blocks the call.
    """
    return join(list(corral)) + _MARK + " || exit 2"


def is_corral_hook(hook: object) -> bool:
    """Whether *hook* (one entry of a group's ``hooks``) is a corral hook, from any install."""
    if not isinstance(hook, dict) or hook.get("type") != "command":
        return False
    command = hook.get("command")
    return isinstance(command, str) and _MARK in command and "corral" in command


def _load(path: str) -> dict[str, Any]:
    data = load_object(path)
    hooks = data.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise UsageError(f"{path}: 'hooks' is not an object", hint="nothing was changed")
    if isinstance(hooks, dict) and not isinstance(hooks.get("PreToolUse", []), list):
        raise UsageError(f"{path}: 'hooks.PreToolUse' is not a list", hint="nothing was changed")
    return data


def _ours(group: object) -> bool:
    return isinstance(group, dict) and any(is_corral_hook(h) for h in group.get("hooks") or [])


def _without_corral(groups: list[Any]) -> tuple[list[Any], int | None]:
    """*groups* with every corral hook removed, and where corral's own group stood.

    A group that held only corral hooks goes; a group corral's hook shared with the
    user's hooks keeps them, and its matcher (it is theirs too).
    """
    kept: list[Any] = []
    position: int | None = None
    for group in groups:
        if not _ours(group):
            kept.append(group)
            continue
        rest = [h for h in group["hooks"] if not is_corral_hook(h)]
        if rest:
            kept.append({**group, "hooks": rest})
        elif position is None:
            position = len(kept)
    return kept, position


def _record_path(records: str, target: str) -> str:
    import hashlib

    return os.path.join(records, hashlib.sha256(target.encode()).hexdigest()[:32] + ".json")


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _digest(data: bytes | None) -> str:
    import hashlib

    return "" if data is None else hashlib.sha256(data).hexdigest()


def install_hook(path: str, command: str, *, records: str | None = None) -> bool:
    """Add corral's PreToolUse hook to the settings file *path*; return whether it changed.

    An existing corral hook (another path, an older matcher) is replaced; a user's
    hook that shared its matcher group stays. A symlinked *path* is written through
    the link. With *records* (a directory), the file's bytes before the first install
    are kept there, so :func:`uninstall_hook` can restore them exactly.

    Raises:
        UsageError: the file is unreadable or malformed (nothing is changed).
    """
    target = os.path.realpath(path)
    before = _read_bytes(target)
    data = _load(target)
    original = copy.deepcopy(data)
    group = {
        "matcher": MATCHER,
        "hooks": [{"type": "command", "command": command, "timeout": TIMEOUT}],
    }
    hooks = data.setdefault("hooks", {})
    groups, position = _without_corral(hooks.get("PreToolUse", []))
    groups.insert(len(groups) if position is None else position, group)
    hooks["PreToolUse"] = groups
    if data == original:
        return False
    text = save(target, data)
    if records is not None:
        _remember(records, target, before, had_ours=_has_corral(original), written=text)
    return True


def _has_corral(data: dict[str, Any]) -> bool:
    hooks = data.get("hooks")
    return isinstance(hooks, dict) and any(_ours(g) for g in hooks.get("PreToolUse", []))


def _remember(
    records: str, target: str, before: bytes | None, *, had_ours: bool, written: str
) -> None:
    """Keep *target*'s bytes from before corral's first install, and a digest of *written*.

    A re-install over a file the user changed since corral wrote it forgets the
    bytes from before: restoring them would lose the user's change.
    """
    record = _record_path(records, target)
    saved = load_object(record) if had_ours else {}
    if had_ours and saved.get("installed") != _digest(before):
        if os.path.exists(record):
            os.unlink(record)
        return
    if not saved:
        saved = {
            "path": target,
            "existed": before is not None,
            "original": None if before is None else before.decode("utf-8"),
        }
    saved["installed"] = _digest(written.encode("utf-8"))
    os.makedirs(records, mode=0o700, exist_ok=True)
    save(record, saved)


def uninstall_hook(path: str, *, records: str | None = None) -> bool:
    """Remove corral's hook from *path*; return whether it changed (missing file: no change).

    When the file is still exactly what the last install wrote and *records* holds
    what it was before, that is restored byte for byte (a file install created is
    removed). Otherwise corral's hook is taken out of the JSON, and the rest kept.

    Raises:
        UsageError: the file is unreadable or malformed (nothing is changed).
    """
    target = os.path.realpath(path)
    current = _read_bytes(target)
    if current is None:
        return False
    record = None if records is None else _record_path(records, target)
    if record is not None and os.path.exists(record):
        saved = load_object(record)
        os.unlink(record)
        if saved.get("installed") == _digest(current):
            if not saved.get("existed"):
                os.unlink(target)
            else:
                write_text(target, str(saved.get("original") or ""))
            return True
    data = _load(target)
    hooks = data.get("hooks")
    if not isinstance(hooks, dict) or not isinstance(hooks.get("PreToolUse"), list):
        return False
    kept, _ = _without_corral(hooks["PreToolUse"])
    if kept == hooks["PreToolUse"]:
        return False
    if kept:
        hooks["PreToolUse"] = kept
    else:
        del hooks["PreToolUse"]
        if not hooks:
            del data["hooks"]
    save(target, data)
    return True
