"""``corral install claude-code``: merge corral's hook into a Claude Code settings.json.

The merge keeps every existing key and hook; it only adds (or updates) one
``PreToolUse`` matcher group whose single command hook is
``<corral> hook claude-code || exit 2`` (so that even a corral that cannot
start - exit 126/127, which Claude Code would treat as a non-blocking error -
blocks the tool call). Installing twice changes nothing; uninstalling
removes exactly that hook, and the ``PreToolUse`` list and ``hooks`` object
when they end up empty. Files are rewritten atomically (write, fsync,
rename) with their mode kept, so a crash never leaves half a settings file.

A settings file that is not valid JSON, not an object, or whose ``hooks`` is
malformed is refused with the reason; nothing is changed.
"""

from __future__ import annotations

import os

from .._exceptions import UsageError
from ._jsonfile import load_object, save
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


def install_hook(path: str, command: str) -> bool:
    """Add corral's PreToolUse hook to the settings file *path*; return whether it changed.

    An existing corral hook (another path, an older matcher) is replaced in place.

    Raises:
        UsageError: the file is unreadable or malformed (nothing is changed).
    """
    data = _load(path)
    group = {
        "matcher": MATCHER,
        "hooks": [{"type": "command", "command": command, "timeout": TIMEOUT}],
    }
    hooks = data.setdefault("hooks", {})
    groups: list[Any] = hooks.setdefault("PreToolUse", [])
    ours = [i for i, g in enumerate(groups) if _ours(g)]
    if ours:
        if [groups[i] for i in ours] == [group]:
            return False
        first = ours[0]
        groups[first] = group
        for i in reversed(ours[1:]):
            del groups[i]
    else:
        groups.append(group)
    save(path, data)
    return True


def uninstall_hook(path: str) -> bool:
    """Remove corral's hook from *path*; return whether it changed (missing file: no change).

    Raises:
        UsageError: the file is unreadable or malformed (nothing is changed).
    """
    if not os.path.exists(path):
        return False
    data = _load(path)
    hooks = data.get("hooks")
    if not isinstance(hooks, dict) or not isinstance(hooks.get("PreToolUse"), list):
        return False
    groups = hooks["PreToolUse"]
    kept = []
    changed = False
    for group in groups:
        if _ours(group):
            changed = True
            rest = [h for h in group["hooks"] if not is_corral_hook(h)]
            if rest:
                kept.append({**group, "hooks": rest})
        else:
            kept.append(group)
    if not changed:
        return False
    if kept:
        hooks["PreToolUse"] = kept
    else:
        del hooks["PreToolUse"]
        if not hooks:
            del data["hooks"]
    save(path, data)
    return True
