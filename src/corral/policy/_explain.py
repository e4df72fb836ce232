"""``corral policy --explain`` and ``corral policy --json``: the effective settings.

:func:`explain` renders every key with the layer it came from (list entries
and map entries each with their own; a built-in row of :mod:`._defaults` with
its reason), then the warnings, the layers that were considered (trusted or
not) and the policy digest::

    resources.memory = 8G                  (defaults: a runaway allocation cannot take ...)
    filesystem.allowWrite = ["/data"]      (project /p/.corral/settings.json)
    filesystem.denyRead =
        "/home/me/.ssh"                    (defaults: SSH private keys, agent sockets ...)
        "/data/secrets"                    (user /home/me/.config/corral/settings.json)

:func:`effective_settings_json` returns the same values in the settings-JSON
shape (sizes in bytes, durations in seconds), which loads back as a settings
file. ``rules`` and ``profiles`` are left out: they are already applied.

Both are cold paths (never on ``corral run``), so :mod:`json` is fine here.
"""

from __future__ import annotations

from . import _keys as k
from ._digest import policy_digest
from ._units import format_duration, format_size
from ._validate import REMOVE, Rule

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._settings import ResolvedSettings

__all__ = [
    "effective_settings_json",
    "entry_json",
    "explain",
    "format_scalar",
    "layer_to_json",
    "to_json",
]

_INLINE_WIDTH = 72  # a list whose entries share one source is printed inline up to this width
_MAX_KEY_COLUMN = 56


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, value in flat.items():
        node = nested
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def entry_json(row: k.Key, item: Any, table: k.KeyTable) -> Any:
    """One list entry (a string, a Credential or a Rule) as settings JSON."""
    if row.kind == k.CREDENTIALS:
        data = {"name": item.name, "from": item.source, "commands": list(item.commands)}
        if item.hosts:
            data["hosts"] = list(item.hosts)
        data["mode"] = item.mode
        return data
    if isinstance(item, Rule):
        return {"match": item.match, **layer_to_json(item.values, table)}
    return item


def layer_to_json(values: dict[str, Any], table: k.KeyTable = k.KEYS) -> dict[str, Any]:
    """Turn validated layer values (as in a Rule or profile) back into settings JSON."""
    flat: dict[str, Any] = {}
    for path, value in values.items():
        row = table.get(path)
        assert row is not None, path
        if row.merge == k.CONCAT:
            flat[path] = [
                "!" + item if op == REMOVE else entry_json(row, item, table) for op, item in value
            ]
        elif row.kind == k.PROFILES:
            flat[path] = {
                name: None if v is None else layer_to_json(v, table) for name, v in value.items()
            }
        else:
            flat[path] = dict(value) if isinstance(value, dict) else value
    return _nest(flat)


def effective_settings_json(resolved: ResolvedSettings) -> dict[str, Any]:
    """Return the effective settings as a settings-JSON object (for ``corral policy --json``).

    Example::

        effective_settings_json(load_settings())["resources"]["memory"]  # 8589934592
    """
    table = resolved.keys
    flat: dict[str, Any] = {}
    for row in table.rows:
        if row.kind in (k.RULES, k.PROFILES):
            continue
        value = resolved.values[row.path]
        if row.merge == k.CONCAT:
            value = [entry_json(row, item, table) for item in value]
        elif row.merge == k.PER_KEY:
            value = dict(value)
        flat[row.path] = value
    return _nest(flat)


def to_json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def format_scalar(row: k.Key, value: Any) -> str:
    """A scalar as explain and the docs show it: sizes as ``8G``, durations as ``1h``."""
    if value is None:
        return "null (no limit)" if row.nullable and row.path.startswith("resources.") else "null"
    if row.kind == k.SIZE:
        return format_size(value)
    if row.kind == k.DURATION:
        return format_duration(value)
    return to_json(value)


def _default_reasons() -> dict[str, list[tuple[str, str]]]:
    """Key path -> ``(item, reason)`` rows of the built-in tables (:mod:`._defaults`)."""
    from ._defaults import DEFAULT_RESOURCES, ENV_PASS, PROTECTED_PATTERNS, SECRET_PATHS

    reasons: dict[str, list[tuple[str, str]]] = {
        "filesystem.denyRead": list(SECRET_PATHS),
        "filesystem.protect": list(PROTECTED_PATTERNS),
        "env.pass": list(ENV_PASS),
    }
    for name, _value, reason in DEFAULT_RESOURCES:
        reasons[f"resources.{name}"] = [("", reason)]
    return reasons


def _with_reason(source: str, path: str, item: object) -> str:
    """*source*, with the built-in row's reason when the value is corral's default.

    A home-relative row (``~/.ssh``) matches the expanded entry by its suffix:
    only entries that came from the defaults are looked up, and those are the
    table's own rows with the home put in front.
    """
    if source != "defaults":
        return source
    best = ""
    found = None
    for raw, reason in _default_reasons().get(path, ()):
        if item is None:
            found = reason
            break
        if not isinstance(item, str):
            continue
        if raw.startswith("~/"):
            suffix = raw[1:]
            if item.endswith(suffix) and len(suffix) > len(best):
                best, found = suffix, reason
        elif item == raw:
            found = reason
            break
    return source if found is None else f"{source}: {found}"


def explain(resolved: ResolvedSettings) -> str:
    """Return the effective settings with the source of every value, as text.

    Example::

        print(explain(load_settings(command="pytest -q")))
    """
    table = resolved.keys
    values = resolved.values
    provenance = resolved.provenance
    lines: list[tuple[str, str | None]] = []  # (text, source)
    for row in table.rows:
        value = values[row.path]
        source = provenance[row.path]
        if row.merge == k.CONCAT:
            entries = [to_json(entry_json(row, item, table)) for item in value]
            sources = [
                _with_reason(provenance[f"{row.path}[{i}]"], row.path, item)
                for i, item in enumerate(value)
            ]
            inline = f"{row.path} = [{', '.join(entries)}]"
            if not entries:
                lines.append((f"{row.path} = []", source))
            elif len(set(sources)) == 1 and len(inline) <= _INLINE_WIDTH:
                lines.append((inline, sources[0]))
            else:
                lines.append((f"{row.path} =", None))
                lines.extend(
                    (f"    {entry}", src) for entry, src in zip(entries, sources, strict=True)
                )
        elif row.merge == k.PER_KEY:
            if not value:
                lines.append((f"{row.path} = {{}}", source))
            for name, item in value.items():
                shown = layer_to_json(item, table) if row.kind == k.PROFILES else item
                lines.append(
                    (f"{row.path}.{name} = {to_json(shown)}", provenance[f"{row.path}.{name}"])
                )
        else:
            source = _with_reason(source, row.path, None)
            lines.append((f"{row.path} = {format_scalar(row, value)}", source))
    width = min(_MAX_KEY_COLUMN, max(len(text) for text, source in lines if source is not None))
    out = [
        text if source is None else f"{text.ljust(width)}    ({source})" for text, source in lines
    ]

    out.append("")
    out.append(f"profile: {resolved.profile or '(none)'}")
    rules = ", ".join(to_json(match) for match in resolved.matched_rules)
    out.append(f"matched rules: {rules or '(none)'}")
    if resolved.warnings:
        out.append("warnings:")
        out.extend(f"    {warning}" for warning in resolved.warnings)
    out.append("layers:")
    for layer in resolved.layers:
        text = f"    {layer.label}"
        if layer.path is not None and not layer.found:
            text += "    (not found)"
        elif not layer.trusted:
            text += (
                "    (untrusted: only tightening values applied; run 'corral trust' to accept it)"
            )
        elif layer.name in ("project", "local"):
            text += "    (trusted)"
        out.append(text)
    out.append(f"policy digest: sha256:{policy_digest(resolved.policy)}")
    return "\n".join(out) + "\n"
