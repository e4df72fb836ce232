"""``corral wrap-plugin DIR``: run another Claude Code plugin's local commands in corral.

A community plugin's hooks and MCP servers run with the user's full rights
(DESIGN §1: they are untrusted). Wrapping rewrites them, in place, to start
under ``corral run`` with a restrictive profile:

* no network (``--net none``), unless hosts are allowed (``--allow-host``);
* the plugin directory read-only (``--deny-write DIR``);
* the workspace read-only (``--read-only``) unless allowed;
* the variables Claude Code gives plugins (``CLAUDE_PLUGIN_ROOT``,
  ``CLAUDE_PROJECT_DIR``, a server's own ``env``) passed through, nothing else;
* MCP servers without the wall-clock timeout and output cap (they are
  long-running and speak over stdout).

What is rewritten: everything Claude Code (2.1) starts from a plugin on the
host, wherever the manifest puts it (a file, an inline object, or an array of
either, plus the default file): every ``"type": "command"`` hook
(``hooks/hooks.json``, ``plugin.json`` ``hooks``), every server with a
``command`` (``.mcp.json`` / ``mcpServers``, ``.lsp.json`` / ``lspServers``)
and every monitor (``monitors/monitors.json`` / ``monitors``: a shell command
run for the whole session), and a status line command in the plugin's
settings (``settings.json`` / ``settings``: ``subagentStatusLine``). A hooks
*module* (``hooks.json`` ``modules``: JavaScript Claude Code loads itself)
cannot be sandboxed: it is reported NOT wrapped and wrapping refuses the
plugin. A server's ``env`` moves into ``--env NAME=VALUE`` options,
because Claude Code applies it to the process it starts, which is corral on
the host. A hook command becomes ``corral run ... --shell bash -c
'<original>'`` (quoted by :mod:`._shell`), so stdin (the hook JSON), stdout
(its decision) and the exit status (2 blocks) pass through unchanged; a
monitor the same, without the timeout and output cap. A manifest naming a
file outside the plugin is refused. Remote
servers (``url``) run nothing locally and are left alone.

Wrapped means parsed, not guessed (:func:`entry_problem`): this
installation's own corral (an absolute path), ``run``, and only the options
of the restrictive profile. A ``corral run --backend none``, ``--net open``,
a plugin's own ``bin/corral`` or shell syntax around the command are NOT
wrapped, so :func:`check_plugin` reports them and wrapping wraps them again
(they then run inside the sandbox). Wrapping twice changes nothing.
"""

from __future__ import annotations

import os
import posixpath

from .._exceptions import UsageError
from ._jsonfile import load_document, load_object, save
from ._shell import SAFE, join, quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = [
    "Finding",
    "WrapOptions",
    "check_plugin",
    "entry_problem",
    "profile_problem",
    "split_words",
    "trusted_launchers",
    "wrap_plugin",
]

#: Variables Claude Code sets for plugin hooks and servers, passed into the sandbox.
PLUGIN_ENV = ("CLAUDE_PLUGIN_ROOT", "CLAUDE_PROJECT_DIR")

#: What Claude Code runs from a plugin: ``(part, manifest field, default file)``.
#: Each field is a file path, an inline object (monitors: an array), or an array of
#: either; the default file is read as well (Claude Code 2.1 reads hooks/hooks.json
#: and .mcp.json in addition to the field; checking every place is never weaker).
PART_FIELDS = (
    ("hooks", "hooks", "hooks/hooks.json"),
    ("mcp", "mcpServers", ".mcp.json"),
    ("lsp", "lspServers", ".lsp.json"),
    ("monitors", "monitors", "monitors/monitors.json"),
    ("settings", "settings", "settings.json"),
)

#: The entry kind of each part (what :func:`profile_problem` checks).
ENTRY_KIND = {
    "hooks": "hook",
    "mcp": "mcp-server",
    "lsp": "lsp-server",
    "monitors": "monitor",
    "settings": "status-line",
}

#: Plugin settings that run a command (``{"type": "command", "command": ...}``).
STATUS_LINES = ("statusLine", "subagentStatusLine")

#: Entry kinds that are a shell command (``command`` run by a shell), not an argv.
SHELL_KINDS = ("hook", "monitor", "status-line")

#: Why a hooks module (``hooks.json`` ``modules``) is never wrapped.
MODULE_PROBLEM = (
    "a hooks module is JavaScript that Claude Code loads itself, not a command: "
    "corral cannot sandbox it"
)


class WrapOptions:
    """How wrapped hooks and servers run.

    Attributes:
        corral: how to start corral (the absolute path of the script).
        allow_hosts: hosts the plugin may reach (through corral's egress proxy).
        workspace_writable: let the plugin write the workspace.
    """

    __slots__ = ("allow_hosts", "corral", "workspace_writable")

    def __init__(
        self,
        *,
        corral: Sequence[str],
        allow_hosts: Sequence[str] = (),
        workspace_writable: bool = False,
    ) -> None:
        self.corral = tuple(corral)
        self.allow_hosts = tuple(allow_hosts)
        self.workspace_writable = workspace_writable

    def run_options(self, plugin_dir: str, env: Sequence[str] = ()) -> list[str]:
        """The ``corral run`` options of the restrictive profile.

        *env*: more ``--env`` values (``NAME`` passes the host's value, ``NAME=VALUE`` sets it).
        """
        options: list[str] = []
        if self.allow_hosts:
            for host in self.allow_hosts:
                options += ["--allow-host", host]
        else:
            options += ["--net", "none"]
        if not self.workspace_writable:
            options.append("--read-only")
        options += ["--deny-write", plugin_dir]
        for name in (*PLUGIN_ENV, *env):
            options += ["--env", name]
        return options


class Finding:
    """One hook or server of a plugin: where it is and whether it is wrapped (and if not, why)."""

    __slots__ = ("command", "kind", "location", "reason", "wrapped")

    def __init__(
        self, kind: str, location: str, command: str, wrapped: bool | None, reason: str = ""
    ) -> None:
        self.kind = kind  # "hook", "monitor", "status-line", "mcp-server", "lsp-server"...
        self.location = location  # e.g. "hooks/hooks.json: PreToolUse[0].hooks[1]"
        self.command = command
        self.wrapped = wrapped  # None: nothing runs locally (remote server)
        self.reason = reason  # why it is not wrapped

    def describe(self) -> str:
        """One line for ``--check``."""
        state = {True: "wrapped", False: "NOT wrapped", None: "remote (nothing runs locally)"}[
            self.wrapped
        ]
        why = f" ({self.reason})" if self.reason else ""
        return f"{state:<29} {self.kind:<10} {self.location}: {self.command}{why}"


def trusted_launchers(corral: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """The ways of starting *this* installation's corral that a wrapped entry may use.

    *corral* is how the running CLI starts itself again (an absolute path);
    also ``<this interpreter> -m corral`` and this installation's fast client.
    A ``corral`` found anywhere else (a plugin's own ``bin/corral``) is not
    trusted: it could be anything.
    """
    import sys

    from ..server._fastclient import client_path

    launchers = [tuple(corral), (os.path.abspath(sys.executable), "-m", "corral")]
    if os.path.exists(client_path()):
        launchers.append((client_path(),))
    return tuple(launchers)


def split_words(command: str) -> list[str] | None:
    """The words of a command written by :func:`._shell.join`, or ``None`` for anything else.

    A word is a run of safe characters, ``'...'`` segments and ``\\'``, as
    :func:`._shell.quote` writes them; words are separated by spaces. Any other
    shell syntax (``;``, ``&&``, ``$``, redirections, an assignment prefix
    read as a word) makes the command something this parser does not vouch for.
    """
    words: list[str] = []
    i, n = 0, len(command)
    while i < n:
        if command[i] == " ":
            i += 1
            continue
        word: list[str] = []
        while i < n and command[i] != " ":
            c = command[i]
            if c == "'":
                end = command.find("'", i + 1)
                if end < 0:
                    return None
                word.append(command[i + 1 : end])
                i = end + 1
            elif c == "\\" and command[i + 1 : i + 2] == "'":
                word.append("'")
                i += 2
            elif c in SAFE:
                word.append(c)
                i += 1
            else:
                return None
        words.append("".join(word))
    return words


def _env_name_ok(value: str) -> bool:
    name = value.partition("=")[0]
    return bool(name) and not name[0].isdigit() and all(c.isalnum() or c == "_" for c in name)


def profile_problem(
    argv: Sequence[str], *, kind: str, plugin_dir: str, launchers: Sequence[Sequence[str]]
) -> str | None:
    """Why *argv* does not run under this installation's restrictive profile (``None``: it does).

    Wrapped means exactly: a trusted launcher (:func:`trusted_launchers`),
    ``run``, only options of the restrictive profile (``--net none`` or
    ``--allow-host``, ``--read-only``, ``--deny-write``, ``--env``, and for
    servers and monitors ``--timeout none`` / ``--max-output none``), with
    ``--deny-write PLUGIN_DIR`` present, then ``--shell bash -c COMMAND`` (a
    hook or a monitor, :data:`SHELL_KINDS`) or ``-- ARGV`` (an MCP or LSP
    server). Any other option (``--backend none``, ``--net open``,
    ``--allow-write``, ``--allow-degraded``, ``--settings``, ``--profile``...)
    may weaken the sandbox, so such an entry is not wrapped.
    """
    launcher = next(
        (tuple(t) for t in launchers if tuple(argv[: len(t)]) == tuple(t)),
        None,
    )
    if launcher is None:
        return "not started by this installation's corral"
    words = list(argv[len(launcher) :])
    if words[:1] != ["run"]:
        return "not 'corral run'"
    i, net_none, hosts, denied = 1, False, 0, []
    while i < len(words):
        word, value = words[i], words[i + 1] if i + 1 < len(words) else None
        if kind in SHELL_KINDS and word == "--shell" and words[i + 1 : i + 3] == ["bash", "-c"]:
            if len(words) != i + 4:
                return "not one command after -c"
            break
        if kind not in SHELL_KINDS and word == "--":
            if len(words) == i + 1:
                return "no server command after --"
            break
        if word == "--read-only":
            i += 1
            continue
        if value is None:
            return f"{word} ends the command line"
        if word == "--net" and value == "none":
            net_none = True
        elif word == "--allow-host":
            hosts += 1
        elif word == "--deny-write":
            denied.append(value)
        elif not (
            (word == "--env" and _env_name_ok(value))
            or (kind != "hook" and word in ("--timeout", "--max-output") and value == "none")
        ):
            return f"{word} is not an option of the restrictive profile"
        i += 2
    else:
        return "no command to run"
    if plugin_dir not in denied:
        return "the plugin directory is not read-only"
    if net_none == bool(hosts):
        return "the network is neither off nor an allowlist"
    return None


def entry_problem(
    kind: str, entry: dict[str, Any], *, plugin_dir: str, launchers: Sequence[Sequence[str]]
) -> str | None:
    """Why a hook, monitor or local server *entry* does not run sandboxed (``None``: wrapped).

    A server's ``env`` is applied by Claude Code to the process it starts,
    that is to corral itself on the host (``CORRAL_BACKEND``, ``PYTHONPATH``,
    ``LD_PRELOAD`` ...), so a wrapped server has none: wrapping moves it into
    ``--env NAME=VALUE`` options, which set it inside the sandbox only.
    """
    if kind in SHELL_KINDS:
        words = split_words(entry["command"])
        if words is None:
            return "shell syntax around the corral command"
        argv = words
    else:
        argv = [entry["command"], *[str(a) for a in entry.get("args") or []]]
        if entry.get("env"):
            return "its env applies to corral itself, outside the sandbox"
    return profile_problem(argv, kind=kind, plugin_dir=plugin_dir, launchers=launchers)


# ---------------------------------------------------------------- locating the parts
class _Part:
    """One place of a plugin that holds hooks or servers: a whole file, or inline in plugin.json.

    *key* ``None``: the whole file; else ``document[key]``, or ``document[key][index]``
    when the manifest field is an array.
    """

    __slots__ = ("index", "key", "kind", "path")

    def __init__(
        self, kind: str, path: str, key: str | None = None, index: int | None = None
    ) -> None:
        self.kind, self.path, self.key, self.index = kind, path, key, index

    def select(self, document: dict[str, Any] | list[Any]) -> Any:
        """The part of *document* (this part's file) holding entries; edited in place."""
        part: Any = document
        if self.key is not None:
            assert isinstance(document, dict)
            part = document[self.key]
            if self.index is not None:
                part = part[self.index]
        return part


def _manifest(plugin_dir: str) -> dict[str, Any]:
    path = os.path.join(plugin_dir, ".claude-plugin", "plugin.json")
    if not os.path.exists(path):
        return {}
    return load_object(path)


def _in_plugin(plugin_dir: str, relative: str) -> str:
    """The file *relative* names in the plugin; a name leaving the plugin is refused.

    Links are resolved first: wrapping rewrites the file, so a file reached
    through a link out of the plugin (``hooks -> ~/.claude``) would be the
    user's own.
    """
    path = os.path.normpath(os.path.join(plugin_dir, relative))
    real = os.path.realpath(path)
    if not real.startswith(os.path.realpath(plugin_dir).rstrip("/") + "/"):
        raise UsageError(
            f"{relative}: the plugin names a file outside the plugin ({real})",
            hint="nothing was changed",
        )
    return path


def _parts(plugin_dir: str) -> list[_Part]:
    """Every place of the plugin that holds hooks, MCP or LSP servers, or monitors."""
    manifest = _manifest(plugin_dir)
    manifest_path = os.path.join(plugin_dir, ".claude-plugin", "plugin.json")
    parts: list[_Part] = []
    for kind, field, default in PART_FIELDS:
        declared = manifest.get(field)
        items: list[tuple[int | None, Any]] = [(None, declared)]
        if isinstance(declared, list) and kind != "monitors":  # monitors: one inline array
            items = list(enumerate(declared))
        for index, item in items:
            if isinstance(item, (dict, list)):
                parts.append(_Part(kind, manifest_path, field, index))
            elif isinstance(item, str):
                parts.append(_Part(kind, _in_plugin(plugin_dir, item)))
        default_path = os.path.join(plugin_dir, default)
        if os.path.exists(default_path) and all(p.path != default_path for p in parts):
            parts.append(_Part(kind, _in_plugin(plugin_dir, default)))
    return parts


def _field(part: Any, name: str, path: str, shape: type) -> Any:
    """``part[name]`` when *part* wraps its entries in *name*, else *part*; of type *shape*."""
    inner = part.get(name, part) if isinstance(part, dict) else part
    if not isinstance(inner, shape):
        raise UsageError(
            f"{path}: '{name}' is not an{' object' if shape is dict else ' array'}",
            hint="nothing was changed",
        )
    return inner


def _is_command(entry: Any) -> bool:
    """Whether *entry* is ``{"type": "command", "command": "..."}`` (a hook, a status line)."""
    return (
        isinstance(entry, dict)
        and entry.get("type") == "command"
        and isinstance(entry.get("command"), str)
    )


def _walk(plugin_dir: str, part: Any, kind: str, path: str) -> list[tuple[str, dict[str, Any]]]:
    """``(location, entry)`` for every command hook, server or monitor in *part*."""
    rel = posixpath.relpath(path, plugin_dir)
    found: list[tuple[str, dict[str, Any]]] = []
    if kind == "hooks":
        for event, groups in _field(part, "hooks", path, dict).items():
            if not isinstance(groups, list):
                continue
            for gi, group in enumerate(groups):
                for hi, hook in enumerate(
                    group.get("hooks") or [] if isinstance(group, dict) else []
                ):
                    if _is_command(hook):
                        found.append((f"{rel}: {event}[{gi}].hooks[{hi}]", hook))
    elif kind == "settings":
        for name in STATUS_LINES:
            line = part.get(name) if isinstance(part, dict) else None
            if isinstance(line, dict) and _is_command(line):
                found.append((f"{rel}: {name}", line))
    elif kind == "monitors":
        for mi, monitor in enumerate(_field(part, "monitors", path, list)):
            if isinstance(monitor, dict) and isinstance(monitor.get("command"), str):
                found.append((f"{rel}: monitors[{mi}]", monitor))
    else:
        field = "mcpServers" if kind == "mcp" else "lspServers"
        for name, server in _field(part, field, path, dict).items():
            if isinstance(server, dict):
                found.append((f"{rel}: {field}.{name}", server))
    return found


def _modules(plugin_dir: str, part: Any, kind: str, path: str) -> list[tuple[str, str]]:
    """``(location, module)`` for the hooks modules a hooks file names (``modules``)."""
    if kind != "hooks" or not isinstance(part, dict) or not isinstance(part.get("modules"), list):
        return []
    rel = posixpath.relpath(path, plugin_dir)
    return [(f"{rel}: modules[{i}]", str(m)) for i, m in enumerate(part["modules"])]


# ---------------------------------------------------------------- check and wrap
def check_plugin(plugin_dir: str, *, launchers: Sequence[Sequence[str]]) -> list[Finding]:
    """Every hook command, MCP or LSP server and monitor of the plugin in *plugin_dir*.

    *launchers*: the trusted ways of starting corral (:func:`trusted_launchers`).

    Raises:
        UsageError: *plugin_dir* is not a directory, or a file is malformed.
    """
    plugin_dir = _plugin_dir(plugin_dir)
    findings = []
    for part in _parts(plugin_dir):
        inner = part.select(load_document(part.path, missing_ok=False))
        what = ENTRY_KIND[part.kind]
        for location, module in _modules(plugin_dir, inner, part.kind, part.path):
            findings.append(Finding("hooks-module", location, module, False, MODULE_PROBLEM))
        for location, entry in _walk(plugin_dir, inner, part.kind, part.path):
            if what in SHELL_KINDS:
                command = entry["command"]
            elif isinstance(entry.get("command"), str):
                command = join([entry["command"], *[str(a) for a in entry.get("args") or []]])
            else:
                findings.append(Finding(what, location, str(entry.get("url", "?")), None))
                continue
            problem = entry_problem(what, entry, plugin_dir=plugin_dir, launchers=launchers)
            findings.append(Finding(what, location, command, problem is None, problem or ""))
    return findings


def wrap_plugin(plugin_dir: str, options: WrapOptions, *, dry_run: bool = False) -> list[Finding]:
    """Rewrite the plugin's hooks, servers and monitors to run under corral; return what changed.

    Entries already wrapped by this installation's restrictive profile
    (:func:`entry_problem`) are left alone, so wrapping twice changes
    nothing; anything else, including a ``corral run`` with a weakening
    option or a corral binary from elsewhere, is wrapped (it then runs inside
    the sandbox, whatever it is).

    Raises:
        UsageError: *plugin_dir* is not a directory, or a file is malformed
            (then no file is changed).
    """
    plugin_dir = _plugin_dir(plugin_dir)
    launchers = trusted_launchers(options.corral)
    changed: list[Finding] = []
    # one document per file: the parts inline in plugin.json are edited in the same one
    documents: dict[str, dict[str, Any] | list[Any]] = {}
    edited: list[str] = []
    for part in _parts(plugin_dir):
        if part.path not in documents:
            documents[part.path] = load_document(part.path, missing_ok=False)
        inner = part.select(documents[part.path])
        what = ENTRY_KIND[part.kind]
        for location, module in _modules(plugin_dir, inner, part.kind, part.path):
            raise UsageError(
                f"{location}: {module}: {MODULE_PROBLEM}",
                hint="disable the plugin, or remove its hooks module; nothing was changed",
            )
        touched = False
        for location, entry in _walk(plugin_dir, inner, part.kind, part.path):
            if what not in SHELL_KINDS and not isinstance(entry.get("command"), str):
                continue  # remote: nothing runs locally
            if entry_problem(what, entry, plugin_dir=plugin_dir, launchers=launchers) is None:
                continue
            if what in SHELL_KINDS:
                original = entry["command"]
                run = [*options.corral, "run", *options.run_options(plugin_dir)]
                if what == "monitor":  # runs for the session, speaking over stdout
                    run += ["--timeout", "none", "--max-output", "none"]
                entry["command"] = f"{join(run)} --shell bash -c {quote(original)}"
                changed.append(Finding(what, location, original, True))
            else:
                argv = [entry["command"], *[str(a) for a in entry.get("args") or []]]
                env: dict[str, Any] = entry.pop("env", None) or {}
                if not isinstance(env, dict):
                    raise UsageError(
                        f"{posixpath.relpath(part.path, plugin_dir)}: {location}: 'env' is not "
                        "an object",
                        hint="nothing was changed",
                    )
                settings = [f"{name}={value}" for name, value in sorted(env.items())]
                run = [
                    "run",
                    *options.run_options(plugin_dir, settings),
                    "--timeout",
                    "none",
                    "--max-output",
                    "none",
                    "--",
                ]
                entry["command"] = options.corral[0]
                entry["args"] = [*options.corral[1:], *run, *argv]
                changed.append(Finding(what, location, join(argv), True))
            touched = True
        if touched and part.path not in edited:
            edited.append(part.path)
    if not dry_run:
        for path in edited:  # every file parsed before the first is written
            save(path, documents[path])
    return changed


def _plugin_dir(path: str) -> str:
    directory = os.path.abspath(path)
    if not os.path.isdir(directory):
        raise UsageError(f"{path}: not a directory", hint="give the plugin's directory")
    return directory
