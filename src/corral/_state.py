"""Where corral keeps its files, and a small cache of host probes.

* settings: ``$XDG_CONFIG_HOME/corral`` (default ``~/.config/corral``)
* state: ``$XDG_STATE_HOME/corral`` (default ``~/.local/state/corral``):
  the audit log, trust records, previews, sessions and the probe cache.

Both directories are hidden from every sandbox (see ``SECRET_PATHS``), so a
sandboxed command can neither read nor tamper with them.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["cache_get", "cache_put", "config_dir", "ensure_dir", "state_dir"]

_CACHE_NAME = "probe-cache.json"
_loaded: dict[str, Any] | None = None  # the cache as read by this process
#: entries kept per key family (the text before a key's first ``:``): keys name
#: versions (a binary's inode and mtime, corral's source files' mtimes), so every
#: upgrade or edit adds one; the oldest go, or the file - read by every
#: in-process run - grows without bound (65 seccomp entries made it 1 MB and
#: its read 130 ms)
CACHE_PER_FAMILY = 4


def _home(environ: Mapping[str, str]) -> str:
    return environ.get("HOME") or os.path.expanduser("~")


def config_dir(environ: Mapping[str, str] | None = None) -> str:
    """corral's settings directory for the user."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or os.path.join(_home(env), ".config")
    return os.path.join(base, "corral")


def state_dir(environ: Mapping[str, str] | None = None) -> str:
    """corral's state directory for the user (audit log, trust, previews)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_STATE_HOME") or os.path.join(_home(env), ".local", "state")
    return os.path.join(base, "corral")


def ensure_dir(path: str) -> str:
    """Create *path* (mode 0700) and its parents if needed; return it."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except FileExistsError:
        pass
    return path


def cache_get(key: str) -> Any:
    """The cached value for *key*, or None (the file is read once per process)."""
    global _loaded
    if _loaded is None:
        from ._jsonfast import JSONError, loads

        try:
            with open(os.path.join(state_dir(), _CACHE_NAME), "rb") as f:
                data = loads(f.read())
        except (OSError, JSONError):
            data = {}
        _loaded = data if isinstance(data, dict) else {}
    return _loaded.get(key)


def cache_put(key: str, value: Any) -> None:
    """Store *value* under *key* (best effort: a cache that cannot be written is skipped).

    The newest :data:`CACHE_PER_FAMILY` keys of *key*'s family are kept, the
    older ones dropped (a key stored again counts as new).
    """
    from ._jsonfast import JSONError, dumps, loads

    directory = state_dir()
    path = os.path.join(directory, _CACHE_NAME)
    try:
        ensure_dir(directory)
        try:
            with open(path, "rb") as f:
                data = loads(f.read())
            if not isinstance(data, dict):
                data = {}
        except (OSError, JSONError):
            data = {}
        data.pop(key, None)
        data[key] = value  # last in the file's order: the newest
        family = key.split(":", 1)[0] + ":"
        same = [k for k in data if k.startswith(family) or k == family[:-1]]
        for old in same[:-CACHE_PER_FAMILY]:
            del data[old]
        global _loaded
        _loaded = data
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass
