"""Generate the settings JSON Schema and ``docs/policy-reference.md`` from the key table.

Both are generated artefacts, checked in and verified by CI::

    python -m corral.policy._schema --write   # regenerate
    python -m corral.policy._schema --check   # exit 1 if a checked-in file differs

Files (relative to the repository root, ``--root``):

* ``schema/corral-settings.schema.json`` (Draft 2020-12) for editors,
* ``src/corral/schema/corral-settings.schema.json``, the copy shipped in the
  package,
* ``docs/policy-reference.md``: every key (type, default, meaning, merging,
  what an untrusted project may do) and the built-in default tables with
  their reasons.

The schema is as strict as JSON Schema allows (``additionalProperties: false``
everywhere, enums, patterns for sizes and durations); the loader is the final
judge (it also checks globs, "~user" paths, zero after rounding ...).
"""

from __future__ import annotations

from . import _keys as k
from ._defaults import DEFAULT_RESOURCES, ENV_PASS, PROTECTED_PATTERNS, SECRET_PATHS, default_policy
from ._units import MAX_DURATION, MAX_SIZE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["SCHEMA_FILES", "generate_docs", "generate_schema", "main"]

#: Where the schema is written, relative to the repository root.
SCHEMA_FILES = (
    "schema/corral-settings.schema.json",
    "src/corral/schema/corral-settings.schema.json",
)
DOCS_FILE = "docs/policy-reference.md"

_NUMBER = r"[0-9]+(\.[0-9]+)?"
_NONZERO = "(?=[^1-9]*[1-9])"
SIZE_PATTERN = rf"^{_NONZERO}([0-9]+[bB]?|{_NUMBER}[kKmMgGtT]([iI]?[bB])?)$"
DURATION_PATTERN = (
    rf"^{_NONZERO}({_NUMBER}|({_NUMBER}[hH])?({_NUMBER}[mM])?({_NUMBER}[sS])?({_NUMBER}[mM][sS])?)$"
)
_NO_NUL = r"^[^\u0000]+$"
_ENV_NAME = r"^[^=\u0000]+$"
_MAX_INT = (1 << 31) - 1

_ITEM_DEFS = {
    k.STRINGS: "text",
    k.PATHS: "path",
    k.PATH_PATTERNS: "pathGlob",
    k.ENV_PATTERNS: "envPattern",
    k.COMMAND_PATTERNS: "commandGlob",
    k.HOSTS: "host",
}


def _definitions(table: k.KeyTable) -> dict[str, Any]:
    removal = {"type": "string", "pattern": "^!.+", "description": "Removes an earlier entry."}
    return {
        "size": {
            "description": (
                'Bytes: a positive integer, or a number with a binary unit such as "512M", '
                '"1.5G", "2GiB".'
            ),
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_SIZE},
                {"type": "string", "pattern": SIZE_PATTERN},
            ],
        },
        "duration": {
            "description": (
                'Seconds: a positive number, or parts such as "500ms", "30s", "10m", "1h30m".'
            ),
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DURATION},
                {"type": "string", "pattern": DURATION_PATTERN},
            ],
        },
        "text": {"type": "string", "minLength": 1, "pattern": _NO_NUL},
        "path": {
            "description": "An absolute path, ~/path, or a path relative to the workspace. "
            '"!path" removes an earlier entry.',
            "type": "string",
            "pattern": _NO_NUL,
            "not": {"const": "!"},
        },
        "pathGlob": {
            "description": "A path glob (*, ?, [a-z], ** for any number of directories); relative "
            'globs are relative to the workspace. "!glob" removes an earlier entry.',
            "type": "string",
            "pattern": _NO_NUL,
            "not": {"const": "!"},
        },
        "envPattern": {
            "description": (
                'A variable name or glob such as "LC_*". "!name" removes an earlier entry.'
            ),
            "type": "string",
            "pattern": _ENV_NAME,
            "not": {"const": "!"},
        },
        "commandGlob": {
            "description": 'A glob matched against the command line, e.g. "npm publish*".',
            "type": "string",
            "pattern": _NO_NUL,
        },
        "host": {
            "description": "host, *.host (subdomains), host:port, an IP address or a CIDR.",
            "type": "string",
            "pattern": r"^[^\s\u0000%@]+$",
            "not": {"const": "!"},
        },
        "allowedHost": {
            "description": (
                "A host pattern that opens access: like host, but not *, *.TLD or another "
                "public or multi-tenant suffix, nor a network wider than /8 (IPv4) or /16 (IPv6)."
            ),
            "allOf": [{"$ref": "#/$defs/host"}],
            "not": {"pattern": r"^!?\*(\.[^.:\[\]]+\.?)?(:[0-9]+)?$"},
        },
        "credential": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "from", "commands"],
            "properties": {
                "name": {
                    "description": "The variable name inside the sandbox.",
                    "type": "string",
                    "pattern": _ENV_NAME,
                },
                "from": {
                    "description": 'Where the secret comes from: "env:NAME" or "file:/path".',
                    "type": "string",
                    "pattern": r"^(env:[^=\u0000]+|file:(/|~/)[^\u0000]*)$",
                },
                "commands": {
                    "description": 'Command globs that receive it; ["*"] for all.',
                    "type": "array",
                    "minItems": 1,
                    "items": {"$ref": "#/$defs/commandGlob"},
                },
                "hosts": {
                    "description": (
                        "Hosts it is meant for: it is injected only while all of them are "
                        "reachable."
                    ),
                    "type": "array",
                    "items": {"$ref": "#/$defs/allowedHost"},
                },
                "mode": {
                    "description": (
                        '"env": a plain variable; "mask": the sandbox gets a per-run '
                        "placeholder, the egress proxy sends the secret in its place to `hosts` "
                        "only (needs hosts and allowlist mode on bubblewrap)."
                    ),
                    "enum": ["env", "mask"],
                },
                "query": {
                    "description": (
                        'For "mask": also replace the placeholder in the URL\'s query string.'
                    ),
                    "type": "boolean",
                },
                "headers": {
                    "description": (
                        'For "mask": request headers in which the placeholder is replaced '
                        '(default ["authorization"]; Basic credentials are decoded first).'
                    ),
                    "type": "array",
                    "items": {"type": "string", "pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"},
                },
            },
        },
        "removal": removal,
        "overrides": {
            "description": "Any settings key except rules, profiles and filesystem.workspace.",
            **_object(table, "", overrides=True),
        },
        "rule": _rule(table),
    }


def _rule(table: k.KeyTable) -> dict[str, Any]:
    schema = _object(table, "", overrides=True)
    schema["properties"] = {
        "match": {
            "description": 'A glob matched against the command line, e.g. "pytest*".',
            "$ref": "#/$defs/commandGlob",
        },
        **schema["properties"],
    }
    schema["required"] = ["match"]
    return schema


def _value(row: k.Key, table: k.KeyTable) -> dict[str, Any]:
    kind = row.kind
    schema: dict[str, Any]
    if kind == k.BOOL:
        schema = {"type": "boolean"}
    elif kind == k.UNIX_SOCKETS:
        paths = {"type": "string", "pattern": "^(/|~/)", "minLength": 2}
        schema = {
            "anyOf": [
                {"type": "boolean"},
                {"type": "array", "items": paths, "minItems": 1},
            ]
        }
    elif kind == k.ENUM:
        schema = {"enum": list(row.choices)}
    elif kind == k.INT:
        schema = {"type": "integer", "minimum": 1, "maximum": _MAX_INT}
    elif kind == k.NUMBER:
        schema = {"type": "number", "exclusiveMinimum": 0}
    elif kind in (k.SIZE, k.DURATION, k.PATH):
        schema = {"$ref": f"#/$defs/{kind}"}
    elif kind == k.STRING:
        schema = {"$ref": "#/$defs/text"}
    elif kind == k.HOSTS and row.tighten == k.REMOVALS:
        # an allow list: over-broad patterns are refused (removals "!x" never are)
        schema = {
            "type": "array",
            "items": {"anyOf": [{"$ref": "#/$defs/allowedHost"}, {"$ref": "#/$defs/removal"}]},
        }
    elif kind in _ITEM_DEFS:
        schema = {"type": "array", "items": {"$ref": f"#/$defs/{_ITEM_DEFS[kind]}"}}
    elif kind == k.KEY_PATHS:
        names = table.restriction_paths()
        schema = {"type": "array", "items": {"enum": [*names, *("!" + n for n in names)]}}
    elif kind in (k.CREDENTIALS, k.RULES):
        item = "credential" if kind == k.CREDENTIALS else "rule"
        schema = {
            "type": "array",
            "items": {"anyOf": [{"$ref": f"#/$defs/{item}"}, {"$ref": "#/$defs/removal"}]},
        }
    elif kind == k.ENV_MAP:
        schema = {
            "type": "object",
            "propertyNames": {"pattern": _ENV_NAME},
            "additionalProperties": {"type": ["string", "null"], "pattern": r"^[^\u0000]*$"},
        }
    elif kind == k.PATH_MAP:
        schema = {
            "type": "object",
            "propertyNames": {"pattern": r"^(?!\.\.?$)[^/\u0000]+$"},
            "additionalProperties": {"anyOf": [{"$ref": "#/$defs/path"}, {"type": "null"}]},
        }
    else:
        assert kind == k.PROFILES, kind
        schema = {
            "type": "object",
            "propertyNames": {"minLength": 1},
            "additionalProperties": {"anyOf": [{"$ref": "#/$defs/overrides"}, {"type": "null"}]},
        }
    if row.nullable:
        schema = {"anyOf": [schema, {"type": "null"}]}
    return {"description": row.description, **schema}


def _object(table: k.KeyTable, node: str, *, overrides: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for name in table.children(node) or ():
        path = f"{node}.{name}" if node else name
        row = table.get(path)
        if row is None:
            properties[name] = _object(table, path, overrides=overrides)
        elif row.override or not overrides:
            properties[name] = _value(row, table)
    return {"type": "object", "additionalProperties": False, "properties": properties}


def generate_schema(table: k.KeyTable = k.KEYS) -> dict[str, Any]:
    """Return the Draft 2020-12 JSON Schema of corral settings files."""
    top = _object(table, "", overrides=False)
    top["properties"] = {
        "$schema": {
            "description": "The URL or path of this schema (for editors).",
            "type": "string",
        },
        **top["properties"],
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "corral settings",
        "description": (
            "A corral settings file (~/.config/corral/settings.json, .corral/settings.json, "
            ".corral/settings.local.json, CORRAL_SETTINGS, --settings). See "
            "docs/policy-reference.md."
        ),
        **top,
        "$defs": _definitions(table),
    }


# ---------------------------------------------------------------- docs
_TYPE_TEXT = {
    k.STRING: "string",
    k.BOOL: "boolean",
    k.UNIX_SOCKETS: "boolean, or a list of absolute socket paths",
    k.INT: "positive integer",
    k.NUMBER: "positive number",
    k.SIZE: 'size: bytes, or a string such as `"512M"`, `"1.5G"`',
    k.DURATION: 'duration: seconds, or a string such as `"500ms"`, `"30s"`, `"1h30m"`',
    k.PATH: "path",
    k.STRINGS: "array of strings",
    k.PATHS: "array of paths",
    k.PATH_PATTERNS: "array of path globs",
    k.ENV_PATTERNS: "array of variable names or globs",
    k.COMMAND_PATTERNS: "array of command globs",
    k.HOSTS: "array of host patterns",
    k.KEY_PATHS: "array of key names",
    k.CREDENTIALS: "array of credential objects",
    k.RULES: "array of rule objects",
    k.ENV_MAP: "object: variable name → string",
    k.PATH_MAP: "object: name → path",
    k.PROFILES: "object: profile name → overrides",
}

_MERGE_TEXT = {
    k.REPLACE: "a later layer replaces it",
    k.CONCAT: 'entries accumulate across layers without duplicates; `"!x"` removes an earlier `x`',
    k.PER_KEY: "names accumulate; a later value for a name replaces it; `null` removes the name",
}


def _type_text(row: k.Key) -> str:
    text = (
        "one of " + ", ".join(f'`"{c}"`' for c in row.choices)
        if row.kind == k.ENUM
        else _TYPE_TEXT[row.kind]
    )
    if row.nullable:
        text += ", or `null`" + (" (no limit)" if row.path.startswith("resources.") else "")
    return text


def _untrusted_text(row: k.Key) -> str:
    direction = row.tighten
    if direction == k.HIGHER:
        return "may raise it (" + " < ".join(row.choices) + "); lowering it is ignored"
    if direction == k.LOWER:
        if row.choices:
            return "may lower it (" + " < ".join(row.choices) + "); raising it is ignored"
        if row.nullable:
            return "may lower it; raising it or `null` is ignored"
        return "may lower it; raising it is ignored"
    if direction == k.FALSE_TIGHTENS and row.kind == k.UNIX_SOCKETS:
        return "may set `false`, or a list narrower than the one in force; `true` is ignored"
    return {
        k.LOOSENS: "ignored (any change could loosen the policy)",
        k.TRUE_TIGHTENS: "may set `true`; `false` is ignored",
        k.FALSE_TIGHTENS: "may set `false`; `true` is ignored",
        k.BACKEND: (
            "may choose a backend at least as strong as both the current backend and "
            "`isolation` (`auto` counts as `isolation`); weaker ones are ignored"
        ),
        k.ADDITIONS: 'may add entries; `"!x"` removals are ignored',
        k.REMOVALS: 'may remove entries with `"!x"`; additions are ignored',
    }[direction]


#: The layers table of the docs: (layer, where, trusted).
_LAYERS: tuple[tuple[str, str, str], ...] = (
    ("defaults", "built in (the tables [below](#built-in-defaults))", "yes"),
    (
        "user",
        "`$XDG_CONFIG_HOME/corral/settings.json` (default `~/.config/corral/settings.json`)",
        "yes",
    ),
    ("project", "`<workspace>/.corral/settings.json`", "only after `corral trust`"),
    ("local", "`<workspace>/.corral/settings.local.json`", "only after `corral trust`"),
    (
        "environment",
        "the file named by `CORRAL_SETTINGS`, then `CORRAL_ISOLATION`, `CORRAL_BACKEND`",
        "yes",
    ),
    ("settings", "each `--settings FILE`, in order", "yes"),
    ("profile", "`profiles.<name>`, selected by `--profile` or `CORRAL_PROFILE`", "yes"),
    ("rules", "every `rules` entry whose `match` glob matches the command line", "yes"),
    ("flags", "command-line options (`--memory`, `--allow-host` ...)", "yes"),
)

_DEFAULT_TEXT = {
    "filesystem.workspace": (
        "the git top-level above the current directory, else the current directory"
    ),
    "filesystem.denyRead": f"the {len(SECRET_PATHS)} [secret paths](#secret-paths)",
    "filesystem.protect": f"the {len(PROTECTED_PATTERNS)} [protected paths](#protected-paths)",
    "env.pass": f"the {len(ENV_PASS)} [passed variables](#environment-pass-through)",
}


def _default_text(row: k.Key) -> str:
    from ._explain import entry_json, format_scalar, to_json

    if row.path in _DEFAULT_TEXT:
        return _DEFAULT_TEXT[row.path]
    policy = default_policy("<workspace>", home="~")
    if row.attr is not None:
        value: Any = policy
        for part in row.attr.split("."):
            value = getattr(value, part)
    else:
        value = row.default
    if row.merge == k.CONCAT:
        return "`" + to_json([entry_json(row, item, k.KEYS) for item in value or ()]) + "`"
    if row.merge == k.PER_KEY:
        return "`" + to_json(dict(value or ())) + "`"
    return "`" + format_scalar(row, value) + "`"


def _table_rows(header: tuple[str, str], rows: Sequence[tuple[str, str]]) -> list[str]:
    lines = [f"| {header[0]} | {header[1]} |", "| --- | --- |"]
    lines += [f"| `{item}` | {reason} |" for item, reason in rows]
    return lines


def generate_docs(table: k.KeyTable = k.KEYS) -> str:
    """Return the text of ``docs/policy-reference.md``."""
    out = [
        "# Policy reference",
        "",
        "<!-- Generated by `python -m corral.policy._schema --write` from",
        "     src/corral/policy/_keys.py and _defaults.py. Do not edit; CI runs --check. -->",
        "",
        "corral reads its policy from JSON settings files. They are strict JSON (no comments, no",
        "trailing commas, no duplicate keys) and strictly validated: an unknown key or a bad value",
        "is an error naming the file, the key and the fix, never a fallback to defaults. Editors",
        "can validate them with the JSON Schema in `schema/corral-settings.schema.json` (add",
        '`"$schema": "<path or URL of the schema>"` at the top of a file).',
        "",
        "## Layers",
        "",
        "Later layers win. `corral policy --explain` shows the layer every value came from.",
        "",
        "| # | layer | where | trusted |",
        "| --- | --- | --- | --- |",
        *(
            f"| {i} | {name} | {where} | {trusted} |"
            for i, (name, where, trusted) in enumerate(_LAYERS, start=1)
        ),
        "",
        "Missing user and project files are fine; a file named by `CORRAL_SETTINGS` or",
        "`--settings` must exist; an unreadable file is an error.",
        "",
        "The workspace is settled before the project files are read (they live in it):",
        "`--workspace`, else `filesystem.workspace` from the flags, `--settings` files,",
        "`CORRAL_SETTINGS` or the user file, else the nearest directory above the current one",
        "that contains `.git` (not counting the home directory or `/`), else the current",
        "directory.",
        "",
        "## Merging",
        "",
        "* Scalars: a later layer replaces the value.",
        '* Arrays: entries accumulate across layers without duplicates. An entry `"!x"`',
        "  removes an earlier `x`; that is how a layer drops a built-in row, e.g.",
        '  `"filesystem": {"denyRead": ["!~/.npmrc"]}`. A removal that matches nothing is',
        "  reported as a warning. A credential replaces an earlier one of the same `name`;",
        '  `"!NAME"` removes a credential, `"!GLOB"` the rules with that `match`.',
        "* Objects (`env.set`, `caches`, `profiles`): names accumulate, a later value for a name",
        "  replaces it, and `null` removes the name.",
        "",
        "## Untrusted project files",
        "",
        "A project file lives in the repository the agent works on, so until the user runs",
        "`corral trust` (which records the SHA-256 of each file's exact bytes in",
        "`$XDG_STATE_HOME/corral/trust.json`, default `~/.local/state/corral/trust.json`), it may",
        "only **tighten** the policy. Any loosening value is ignored with one warning per key:",
        "",
        "```",
        "corral: ignoring network.allow from untrusted /p/.corral/settings.json (it would loosen "
        "the policy); run 'corral trust' to accept it",
        "```",
        "",
        "Editing a trusted file makes it untrusted again. Profiles and rules from an untrusted",
        "file are ignored. A trusted project file may set anything except",
        "`filesystem.workspace`. Each key below says what an untrusted file may do with it.",
        "",
        "## Values",
        "",
        '* **Sizes**: bytes as an integer, or a number with a binary unit: `"100k"`, `"512M"`,',
        '  `"1.5G"`, `"1T"` (case-insensitive, optional `B`/`iB`; 1k = 1024). Zero is invalid;',
        "  `null` means no limit where allowed.",
        "* **Durations**: seconds as a number, or parts from the largest unit to the smallest:",
        '  `"500ms"`, `"30s"`, `"10m"`, `"1h30m"`. Zero is invalid.',
        "* **Paths**: absolute, `~/...` (the home directory), or relative to the workspace.",
        "* **Globs**: `*` and `?` within a path segment, `[a-z]` and `[!a-z]` classes, and `**`",
        "  as a whole segment for any number of directories. Relative `denyWrite` and `protect`",
        "  globs are matched against paths relative to each writable root (the workspace,",
        "  `allowWrite` directories); absolute ones against host paths. A glob that begins with",
        "  `**/` is also matched against the whole host path where a match can begin above the",
        "  root (`**/.config/fish/**` in a workspace at `~/.config`), unless the root itself lies",
        "  inside what it protects (a Claude Code worktree session under `**/.claude/**`).",
        "* **Hosts**: `host`, `*.host` (subdomains at any depth, not the apex), `host:port`, IP",
        "  addresses, CIDRs (`10.0.0.0/8`), and `[v6]:port` for IPv6 with a port. They are stored",
        "  canonically: lower case, no trailing dot, IDNA (`xn--`) for non-ASCII names, IPv4 in",
        "  dotted quad (`127.1` and `2130706433` are `127.0.0.1`), IPv6 compressed, IPv4-mapped",
        "  IPv6 as IPv4. NUL, CR/LF, spaces, `%` (zone ids), `@` and `/` outside a CIDR are",
        "  refused; so are, in allow lists, `*`, `*.TLD` and public or multi-tenant suffixes",
        "  (`*.co.uk`, `*.ngrok.io`, `*.s3.amazonaws.com` ...), and networks wider than /8 or /16.",
        "",
        "## Keys",
    ]
    section = None
    for row in table.rows:
        top = row.path.split(".")[0]
        if top != section and "." in row.path:
            out += ["", f"### `{top}`"]
        section = top
        out += [
            "",
            f"#### `{row.path}`",
            "",
            row.description,
            "",
            "| | |",
            "| --- | --- |",
            f"| type | {_type_text(row)} |",
            f"| default | {_default_text(row)} |",
            f"| layers | {_MERGE_TEXT[row.merge]} |",
            f"| untrusted project | {_untrusted_text(row)} |",
            f"| in rules and profiles | {'yes' if row.override else 'no'} |",
        ]
        if row.path == "allowDegraded":
            names = ", ".join(f"`{name}`" for name in table.restriction_paths())
            out += ["", f"Valid names: {names}."]
    if not any(row.path.startswith("integrations.") for row in table.rows):
        out += [
            "",
            "### `integrations`",
            "",
            "Reserved for settings of agent integrations; none are defined yet.",
        ]
    out += [
        "",
        "## Built-in defaults",
        "",
        "Every protection and opening corral applies without being asked, with its reason",
        "(from `src/corral/policy/_defaults.py`). `~` is the home directory.",
        "",
        "### Secret paths",
        "",
        "Unreadable inside the sandbox (`filesystem.denyRead`). If `XDG_CONFIG_HOME` or",
        "`XDG_STATE_HOME` point elsewhere, corral's own directories there are added; when they",
        "lie in a writable area they are also made read-only. Each `~` path is hidden under",
        "`$HOME` and under the user database's home when they differ (`sudo`,",
        "`HOME=/tmp/x corral run`); the `~/.config/...` and `~/.local/share/...` ones also under",
        "`XDG_CONFIG_HOME` and `XDG_DATA_HOME` when those are set.",
        "",
        *_table_rows(("path", "reason"), SECRET_PATHS),
        "",
        "### Protected paths",
        "",
        "May not be created, changed, renamed or deleted anywhere in the workspace",
        "(`filesystem.protect`).",
        "",
        *_table_rows(("glob", "reason"), PROTECTED_PATTERNS),
        "",
        "### Environment pass-through",
        "",
        "The only host variables the sandbox sees (`env.pass`).",
        "",
        *_table_rows(("name", "reason"), ENV_PASS),
        "",
        "### Resource limits",
        "",
        *_table_rows(
            ("key", "default and reason"),
            [
                (f"resources.{name}", f"{_default_text(_resource_row(table, name))}: {reason}")
                for name, _, reason in DEFAULT_RESOURCES
            ],
        ),
        "",
    ]
    return "\n".join(out)


def _resource_row(table: k.KeyTable, name: str) -> k.Key:
    for row in table.rows:
        if row.attr == f"resources.{name}":
            return row
    raise LookupError(name)  # pragma: no cover - a DEFAULT_RESOURCES row without a key


# ---------------------------------------------------------------- entry point
def _schema_text(table: k.KeyTable) -> str:
    import json

    return json.dumps(generate_schema(table), indent=2, ensure_ascii=False) + "\n"


def expected_files(table: k.KeyTable = k.KEYS) -> dict[str, str]:
    """Return ``{path relative to the repository root: content}`` of every generated file."""
    schema = _schema_text(table)
    files = dict.fromkeys(SCHEMA_FILES, schema)
    files[DOCS_FILE] = generate_docs(table)
    return files


def _default_root() -> str:
    """The source tree: beside this file in a checkout (``src/corral/policy``),
    else the current directory (an installed copy lives in site-packages)."""
    import os

    checkout = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    if os.path.exists(os.path.join(checkout, "pyproject.toml")):
        return checkout
    return os.getcwd()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``--write`` regenerates the files, ``--check`` verifies them."""
    import argparse
    import os
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m corral.policy._schema", description=__doc__.splitlines()[0]
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the files")
    mode.add_argument("--check", action="store_true", help="exit 1 if a file is out of date")
    parser.add_argument("--root", default=_default_root(), help="the repository root")
    args = parser.parse_args(argv)
    stale = []
    for relative, content in expected_files().items():
        path = os.path.join(args.root, relative)
        try:
            with open(path, encoding="utf-8") as file:
                current: str | None = file.read()
        except FileNotFoundError:
            current = None
        if current == content:
            continue
        if args.check:
            stale.append(relative)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            file.write(content)
        print(f"wrote {relative}")
    if stale:
        for relative in stale:
            print(
                f"corral: {relative} is out of date; run: python -m corral.policy._schema --write",
                file=sys.stderr,
            )
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through main()
    raise SystemExit(main())
