"""Validate one settings layer against the key table and normalise its values.

:func:`validate_layer` turns the parsed JSON of one layer (a file, the
environment, the flags) into a flat ``{key path: value}`` dict, or raises
:class:`~corral.SettingsError` naming the source, the dotted key path
(``credentials[1].from``) and the fix. Values come out normalised:

* sizes in bytes, durations in seconds, host names in lower case;
* paths absolute: ``~/x`` is expanded against the home directory, relative
  paths are joined to the workspace (``filesystem.workspace`` itself: to the
  current directory); path *globs* that are relative stay relative;
* list values as ``[(ADD | REMOVE, item), ...]`` (``"!x"`` is a removal);
* map values as ``{name: value or None}`` (``None`` removes the name);
* ``credentials`` items as :class:`~corral.policy.Credential`, ``rules`` items
  as :class:`Rule`, ``profiles`` values as flat dicts like the layer's own.

A top-level ``"$schema"`` string (how editors find the JSON Schema) is
accepted and ignored.

Nothing here reads files or the environment.
"""

from __future__ import annotations

import posixpath

from .._exceptions import SettingsError
from .._frozen import Record
from .._jsonfast import JSONError, dumps, loads
from . import _keys as k
from ._defaults import expand_home
from ._glob import validate_pattern
from ._hosts import broad_pattern_problem, parse_pattern
from ._model import Credential
from ._units import parse_duration, parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, NoReturn

__all__ = [
    "ADD",
    "REMOVE",
    "Context",
    "Rule",
    "check_project_workspace",
    "did_you_mean",
    "parse_settings",
    "validate_layer",
    "validate_workspace",
]

#: List operations in a validated layer.
ADD = "+"
REMOVE = "-"

_CREDENTIAL_FIELDS = ("name", "from", "commands", "hosts", "mode", "headers", "query")
_REQUEST_RULE_KEYS = ("network.allowRequests", "network.denyRequests")
#: The characters of an HTTP token (RFC 9110), e.g. a header name.
_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
_CREDENTIAL_MODES = ("env", "mask")
_MAX_INT = (1 << 31) - 1


class Context(Record):
    """What relative values are resolved against.

    Attributes:
        workspace: absolute workspace path (relative paths are joined to it).
        home: the user's home directory (``~/`` is expanded against it).
        cwd: the current directory (a relative ``filesystem.workspace`` is
            joined to it).
    """

    workspace: str
    home: str
    cwd: str


class Rule(Record):
    """One validated ``rules`` entry.

    Attributes:
        match: the command-line glob (see :func:`~corral.policy.match_word`).
        values: the rule's overrides as a flat ``{key path: value}`` dict.
    """

    match: str
    values: dict[str, Any]


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """Return ``' (did you mean "x"?)'`` for the closest of *options*, or ``""``.

    Imports :mod:`difflib` lazily: this only runs on the error path.
    """
    import difflib

    matches = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f' (did you mean "{matches[0]}"?)' if matches else ""


def describe(value: object) -> str:
    """Return a short JSON-flavoured description of *value* for an error message."""
    if isinstance(value, str):
        text = value if len(value) <= 60 else value[:57] + "..."
        return dumps(text)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "an array"
    return "an object"


def _show(name: str) -> str:
    """A key name as it can appear in a message (quoted when it is not plain)."""
    return name if name and name.isprintable() and "." not in name else dumps(name)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def parse_settings(data: bytes, *, source: str) -> Any:
    """Parse the bytes of a settings file as strict JSON.

    Raises:
        SettingsError: malformed JSON (with line and column), duplicate keys,
            NaN/Infinity, invalid UTF-8.
    """
    try:
        return loads(data)
    except JSONError as exc:
        raise SettingsError(
            f"malformed JSON at line {exc.line} column {exc.column}: {exc.reason}",
            source=source,
            hint="settings files are strict JSON: no comments, no trailing commas",
        ) from None


def validate_layer(
    raw: object, *, source: str, ctx: Context, table: k.KeyTable = k.KEYS
) -> dict[str, Any]:
    """Validate the parsed JSON *raw* of one layer; return its flat, normalised values.

    Args:
        raw: the parsed document (must be a JSON object).
        source: names the layer in errors, e.g. ``"/p/.corral/settings.json"``.
        ctx: what relative paths are resolved against.
        table: the key table (see :meth:`~corral.policy._keys.KeyTable.extended`).

    Raises:
        SettingsError: on any unknown key or invalid value.

    Example::

        validate_layer({"resources": {"memory": "1G"}}, source="flags", ctx=ctx)
        # {"resources.memory": 1073741824}
    """
    checker = _Checker(source, ctx, table)
    if not isinstance(raw, dict):
        checker.fail(None, f"expected a JSON object at the top level, got {describe(raw)}")
    schema = raw.get("$schema")
    if schema is not None:
        checker.text(schema, "$schema", what="the URL or path of the settings JSON Schema")
    out: dict[str, Any] = {}
    checker.walk(raw, "", "", out, None, extra=("$schema",))
    return out


def validate_workspace(raw: object, *, source: str, ctx: Context) -> str | None:
    """Return the absolute ``filesystem.workspace`` of a not yet validated layer, if any.

    The workspace must be known before the rest of a layer can be resolved (and
    before the project files can be found); this reads just that key.
    """
    if not isinstance(raw, dict):
        return None
    section = raw.get("filesystem")
    if not isinstance(section, dict) or section.get("workspace") is None:
        return None
    row = k.KEYS.get("filesystem.workspace")
    assert row is not None
    return _Checker(source, ctx, k.KEYS).path(section["workspace"], row.path, ctx.cwd)


def check_project_workspace(values: dict[str, Any], *, source: str, workspace: str) -> None:
    """Refuse a trusted project file that sets a different ``filesystem.workspace``.

    Project files are found through the workspace, so they cannot move it.
    (From an *untrusted* file the key is ignored with a warning instead, like
    every loosening value.)
    """
    value = values.get("filesystem.workspace")
    if value is not None and value != workspace:
        raise SettingsError(
            f"a project settings file cannot move the workspace (to {value})",
            source=source,
            key="filesystem.workspace",
            hint="remove the key, or pass --workspace DIR / set it in the user settings",
        )


class _Checker:
    """Validation of one layer; every failure names ``source`` and the key path."""

    __slots__ = ("ctx", "source", "table")

    def __init__(self, source: str, ctx: Context, table: k.KeyTable) -> None:
        self.source = source
        self.ctx = ctx
        self.table = table

    def fail(self, key: str | None, message: str, hint: str | None = None) -> NoReturn:
        raise SettingsError(message, source=self.source, key=key, hint=hint)

    # ------------------------------------------------------------ objects
    def walk(
        self,
        raw: dict[str, Any],
        node: str,
        shown: str,
        out: dict[str, Any],
        inside: str | None,
        extra: tuple[str, ...] = (),
    ) -> None:
        """Validate the object *raw* at table node *node* into *out*.

        *inside* is ``"rule"`` or ``"profile"`` for override objects, whose
        keys must be overridable; *extra* names keys the caller handles.
        """
        names = self.table.children(node) or ()
        for name, value in raw.items():
            if name in extra:
                continue
            path = _join(node, name)
            key = _join(shown, _show(name))
            if name not in names:
                choices = [n for n in names if not inside or self._overridable(_join(node, n))]
                choices += extra
                where = f"in {node}" if node else "at the top level"
                self.fail(
                    key,
                    "unknown key" + did_you_mean(name, choices),
                    hint=f"valid keys {where}: {', '.join(choices)}"
                    if choices
                    else "no keys are defined here yet",
                )
            row = self.table.get(path)
            if row is None:
                if not isinstance(value, dict):
                    self.fail(key, f"expected an object, got {describe(value)}")
                self.walk(value, path, key, out, inside)
                continue
            if inside and not row.override:
                self.fail(key, f"cannot be set in a {inside}")
            out[path] = self.value(row, value, key)

    def _overridable(self, path: str) -> bool:
        row = self.table.get(path)
        return row is None or row.override

    def value(self, row: k.Key, raw: object, key: str) -> Any:
        if raw is None and row.nullable:
            return None
        if row.kind in k.LIST_KINDS:
            return self.list_ops(row, raw, key)
        if row.kind in k.MAP_KINDS:
            return self.map_entries(row, raw, key)
        return self.scalar(row, raw, key)

    # ------------------------------------------------------------ scalars
    def scalar(self, row: k.Key, raw: object, key: str) -> Any:
        kind = row.kind
        if kind == k.BOOL:
            if not isinstance(raw, bool):
                self.fail(key, f"expected true or false, got {describe(raw)}")
            return raw
        if kind == k.UNIX_SOCKETS:
            return self.unix_sockets(raw, key)
        if kind == k.ENUM:
            return self.enum(row, raw, key)
        if kind in (k.SIZE, k.DURATION):
            try:
                return parse_size(raw) if kind == k.SIZE else parse_duration(raw)
            except ValueError as exc:
                hint = "use null for no limit" if row.nullable else None
                self.fail(key, str(exc), hint=hint)
        if kind == k.INT:
            return self.integer(raw, key)
        if kind == k.NUMBER:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                self.fail(key, f"expected a number, got {describe(raw)}")
            if not raw > 0:
                self.fail(key, f"must be greater than zero, got {describe(raw)}")
            return float(raw)
        if kind == k.PATH:
            base = self.ctx.cwd if row.path == "filesystem.workspace" else self.ctx.workspace
            return self.path(raw, key, base)
        assert kind == k.STRING, kind
        return self.text(raw, key)

    def text(self, raw: object, key: str, *, what: str = "a string", empty: bool = False) -> str:
        if not isinstance(raw, str):
            self.fail(key, f"expected {what}, got {describe(raw)}")
        if not raw and not empty:
            self.fail(key, f"expected {what}, got an empty string")
        if "\x00" in raw:
            self.fail(key, "contains a NUL byte")
        return raw

    def enum(self, row: k.Key, raw: object, key: str) -> str:
        text = self.text(raw, key, what="one of: " + ", ".join(row.choices))
        if text not in row.choices:
            noun = "backend" if row.path == "backend" else "value"
            self.fail(
                key,
                f"unknown {noun} {describe(text)}" + did_you_mean(text, row.choices),
                hint="valid values: " + ", ".join(row.choices),
            )
        return text

    def integer(self, raw: object, key: str) -> int:
        if isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int):
            self.fail(key, f"expected a whole number, got {describe(raw)}")
        if raw <= 0:
            self.fail(key, f"must be greater than zero, got {raw}", hint="use null for no limit")
        if raw > _MAX_INT:
            self.fail(key, f"{raw} is too large (at most {_MAX_INT})")
        return raw

    def unix_sockets(self, raw: object, key: str) -> bool | tuple[str, ...]:
        """``network.allowUnixSockets``: a boolean, or the host socket paths to reach."""
        if isinstance(raw, bool):
            return raw
        if not isinstance(raw, list):
            self.fail(key, f"expected true, false or a list of socket paths, got {describe(raw)}")
        if not raw:
            self.fail(key, "expected at least one socket path", hint="use false for none")
        paths: list[str] = []
        for i, item in enumerate(raw):
            where = f"{key}[{i}]"
            text = self.expand_tilde(self.text(item, where, what="a socket path"), where)
            if not text.startswith("/"):
                self.fail(where, f"{describe(text)} is not an absolute path")
            text = "/" + posixpath.normpath(text).lstrip("/")
            if text == "/":
                self.fail(where, '"/" is not a socket')
            if text not in paths:
                paths.append(text)
        return tuple(paths)

    def expand_tilde(self, text: str, key: str) -> str:
        """Expand a leading ``~`` or ``~/``; refuse ``~user``."""
        if text.startswith("~") and text != "~" and not text.startswith("~/"):
            self.fail(key, f'{describe(text)}: only "~/" is expanded, not "~user/"')
        return expand_home(text, self.ctx.home)

    def path(self, raw: object, key: str, base: str) -> str:
        text = self.expand_tilde(self.text(raw, key, what="a path"), key)
        if not text.startswith("/"):
            text = posixpath.join(base, text)
        text = posixpath.normpath(text)
        return "/" + text.lstrip("/")  # normpath keeps a leading "//"

    # ------------------------------------------------------------ lists
    _LIST_NOUNS = {
        k.STRINGS: "strings",
        k.PATHS: "paths",
        k.PATH_PATTERNS: "path globs",
        k.ENV_PATTERNS: "variable names or globs",
        k.COMMAND_PATTERNS: "command globs",
        k.HOSTS: "hosts",
        k.KEY_PATHS: "key names",
        k.CREDENTIALS: "credentials",
        k.RULES: "rules",
    }

    def list_ops(self, row: k.Key, raw: object, key: str) -> list[tuple[str, Any]]:
        if not isinstance(raw, (list, tuple)):
            hint = f"write [{describe(raw)}]" if isinstance(raw, str) else None
            self.fail(
                key,
                f"expected an array of {self._LIST_NOUNS[row.kind]}, got {describe(raw)}",
                hint=hint,
            )
        out: list[tuple[str, Any]] = []
        for index, item in enumerate(raw):
            item_key = f"{key}[{index}]"
            if isinstance(item, str) and item.startswith("!"):
                if len(item) == 1:
                    self.fail(item_key, '"!" must be followed by the entry to remove')
                out.append((REMOVE, self.item(row, item[1:], item_key, removal=True)))
            else:
                out.append((ADD, self.item(row, item, item_key, removal=False)))
        return out

    def item(self, row: k.Key, raw: object, key: str, *, removal: bool) -> Any:
        kind = row.kind
        if kind == k.PATHS:
            return self.path(raw, key, self.ctx.workspace)
        if kind == k.PATH_PATTERNS:
            pattern = self.path_pattern(raw, key)
            if row.path == "filesystem.protect" and pattern.startswith("/") and not removal:
                # the broker matches protect patterns against workspace-relative names:
                # an absolute one would never match (a rule accepted and not enforced)
                self.fail(
                    key,
                    f"{describe(pattern)}: protect patterns are relative to the workspace "
                    "and hold at any depth (**/name)",
                    hint="use filesystem.denyWrite for a path outside the workspace",
                )
            return pattern
        if kind == k.ENV_PATTERNS:
            return self.env_name(raw, key, glob=True)
        if kind == k.COMMAND_PATTERNS:
            return self.pattern(raw, key)
        if kind == k.HOSTS:
            return self.host(raw, key, opening=row.tighten == k.REMOVALS and not removal)
        if kind == k.KEY_PATHS:
            return self.key_path(raw, key)
        if kind == k.CREDENTIALS:
            return self.env_name(raw, key) if removal else self.credential(raw, key)
        if kind == k.RULES:
            return self.pattern(raw, key) if removal else self.rule(raw, key)
        assert kind == k.STRINGS, kind
        if row.path in _REQUEST_RULE_KEYS:
            return self.request_rule(raw, key)
        return self.text(raw, key)

    def request_rule(self, raw: object, key: str) -> str:
        """A ``"METHOD host/path"`` request rule, in canonical form."""
        from ._requests import parse_rule

        text = self.text(raw, key, what='a request rule "METHOD host/path"')
        try:
            return parse_rule(text).text
        except ValueError as exc:
            self.fail(
                key,
                f"invalid request rule {describe(text)}: {exc}",
                hint='e.g. "POST */git-receive-pack" or "GET github.com/*"',
            )

    def pattern(self, raw: object, key: str) -> str:
        text = self.text(raw, key, what="a glob")
        problem = validate_pattern(text)
        if problem is not None:
            self.fail(key, f"invalid glob {describe(text)}: {problem}")
        return text

    def path_pattern(self, raw: object, key: str) -> str:
        text = self.expand_tilde(self.pattern(raw, key), key)
        segments = [s for s in text.split("/") if s not in ("", ".")]
        if ".." in segments:
            self.fail(key, f'{describe(text)}: ".." is not allowed in a path glob')
        if not segments:
            self.fail(key, f"{describe(text)} names no path")
        joined = "/".join(segments)
        return "/" + joined if text.startswith("/") else joined

    def env_name(self, raw: object, key: str, *, glob: bool = False) -> str:
        text = self.pattern(raw, key) if glob else self.text(raw, key, what="a variable name")
        if "=" in text:
            self.fail(key, f'{describe(text)}: a variable name cannot contain "="')
        return text

    def host(self, raw: object, key: str, *, opening: bool) -> str:
        """A host pattern in canonical form; *opening* (allow lists) refuses over-broad ones."""
        text = self.text(raw, key, what="a host")
        try:
            pattern = parse_pattern(text)
        except ValueError as exc:
            self.fail(
                key,
                f"{describe(text)} is not a valid host pattern: {exc}",
                hint='use host, *.host, host:port, an IP address or a CIDR, e.g. "pypi.org"',
            )
        problem = broad_pattern_problem(pattern) if opening else None
        if problem is not None:
            self.fail(
                key,
                f"{describe(text)} is too broad: {problem}",
                hint='list the hosts the sandbox needs, e.g. "pypi.org", "*.pythonhosted.org"',
            )
        return pattern.text

    def key_path(self, raw: object, key: str) -> str:
        text = self.text(raw, key, what="a key name")
        paths = self.table.restriction_paths()
        if text not in paths:
            self.fail(
                key,
                f"unknown key {describe(text)}" + did_you_mean(text, paths),
                hint='name a rule or limit, e.g. "resources.memory"',
            )
        return text

    def credential(self, raw: object, key: str) -> Credential:
        if not isinstance(raw, dict):
            self.fail(
                key,
                f'expected a credential {{"name": ..., "from": ...}} or "!NAME", '
                f"got {describe(raw)}",
            )
        for field in raw:
            if field not in _CREDENTIAL_FIELDS:
                self.fail(
                    f"{key}.{_show(field)}",
                    "unknown key" + did_you_mean(field, _CREDENTIAL_FIELDS),
                    hint="valid keys: " + ", ".join(_CREDENTIAL_FIELDS),
                )
        for field in ("name", "from", "commands"):
            if field not in raw:
                self.fail(
                    key,
                    f'a credential needs "{field}"',
                    hint='e.g. {"name": "NPM_TOKEN", "from": "env:NPM_TOKEN", '
                    '"commands": ["npm publish*"]}',
                )
        name = self.env_name(raw["name"], f"{key}.name")
        source = self.credential_source(raw["from"], f"{key}.from")
        commands = self.plain_list(raw["commands"], f"{key}.commands", self.pattern)
        if not commands:
            self.fail(
                f"{key}.commands",
                "must name at least one command glob",
                hint='use ["*"] to give it to every command',
            )
        hosts = self.plain_list(
            raw.get("hosts", []), f"{key}.hosts", lambda item, at: self.host(item, at, opening=True)
        )
        mode = self.text(raw.get("mode", "env"), f"{key}.mode", what='"env" or "mask"')
        if mode not in _CREDENTIAL_MODES:
            self.fail(
                f"{key}.mode",
                f"unknown mode {describe(mode)}" + did_you_mean(mode, _CREDENTIAL_MODES),
                hint='use "env" or "mask"',
            )
        headers = self.plain_list(raw.get("headers", []), f"{key}.headers", self.header_name)
        if mode == "mask" and not hosts:
            self.fail(
                f"{key}.hosts",
                "a masked credential needs the hosts its secret may be sent to",
                hint='e.g. "hosts": ["api.github.com"]',
            )
        if headers and mode != "mask":
            self.fail(f"{key}.headers", 'headers apply to "mode": "mask" only')
        query = raw.get("query", False)
        if not isinstance(query, bool):
            self.fail(f"{key}.query", f"expected true or false, got {describe(query)}")
        if query and mode != "mask":
            self.fail(f"{key}.query", 'query applies to "mode": "mask" only')
        return Credential(
            name=name,
            source=source,
            commands=commands,
            hosts=hosts,
            mode=mode,
            headers=headers,
            query=query,
        )

    def header_name(self, raw: object, key: str) -> str:
        """An HTTP header name (a token), in lower case."""
        text = self.text(raw, key, what="a header name")
        if not set(text) <= _TOKEN_CHARS:
            self.fail(key, f"{describe(text)} is not an HTTP header name")
        if text.lower() in ("host", "proxy-authorization", "content-length", "transfer-encoding"):
            self.fail(key, f"{describe(text)} cannot carry a credential")
        return text.lower()

    def credential_source(self, raw: object, key: str) -> str:
        text = self.text(raw, key, what='"env:NAME" or "file:/path"')
        scheme, sep, rest = text.partition(":")
        if sep and scheme == "env" and rest:
            return "env:" + self.env_name(rest, key)
        if sep and scheme == "file" and rest:
            if not (rest.startswith("/") or rest.startswith("~/")):
                self.fail(key, f"{describe(text)}: the file must be absolute or start with ~/")
            return "file:" + self.path(rest, key, "/")
        self.fail(key, f'expected "env:NAME" or "file:/path", got {describe(text)}')

    def plain_list(self, raw: object, key: str, check: Any) -> tuple[str, ...]:
        if not isinstance(raw, (list, tuple)):
            self.fail(key, f"expected an array, got {describe(raw)}")
        return tuple(dict.fromkeys(check(item, f"{key}[{i}]") for i, item in enumerate(raw)))

    def rule(self, raw: object, key: str) -> Rule:
        if not isinstance(raw, dict):
            self.fail(
                key, f'expected a rule {{"match": ..., ...}} or "!MATCH", got {describe(raw)}'
            )
        if "match" not in raw:
            self.fail(
                key,
                'a rule needs "match", a command glob',
                hint='e.g. {"match": "pytest*", "isolation": "vm"}',
            )
        match = self.pattern(raw["match"], f"{key}.match")
        values: dict[str, Any] = {}
        self.walk(raw, "", key, values, "rule", extra=("match",))
        return Rule(match=match, values=values)

    # ------------------------------------------------------------ maps
    def map_entries(self, row: k.Key, raw: object, key: str) -> dict[str, Any]:
        if not isinstance(raw, dict):
            self.fail(key, f"expected an object, got {describe(raw)}")
        out: dict[str, Any] = {}
        for name, value in raw.items():
            entry_key = f"{key}.{_show(name)}"
            if row.kind == k.ENV_MAP:
                self.env_name(name, entry_key)
            else:
                self.text(name, entry_key, what="a name")
                if row.kind == k.PATH_MAP and ("/" in name or name in (".", "..")):
                    self.fail(entry_key, 'a cache name cannot contain "/" or be "." or ".."')
            if value is None:
                out[name] = None
            elif row.kind == k.ENV_MAP:
                out[name] = self.text(value, entry_key, empty=True)
            elif row.kind == k.PATH_MAP:
                out[name] = self.path(value, entry_key, self.ctx.workspace)
            else:
                assert row.kind == k.PROFILES, row.kind
                if not isinstance(value, dict):
                    self.fail(entry_key, f"expected an object of overrides, got {describe(value)}")
                values: dict[str, Any] = {}
                self.walk(value, "", entry_key, values, "profile")
                out[name] = values
        return out
