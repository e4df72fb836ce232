"""``corral wrap-plugin DIR``: run another Claude Code plugin's hooks and MCP servers in corral.

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

What is rewritten: every ``"type": "command"`` hook in ``hooks/hooks.json``
(or the file or object ``plugin.json`` names under ``hooks``), and every
server with a ``command`` in ``.mcp.json`` (or ``plugin.json``'s
``mcpServers``); a server's ``env`` moves into ``--env NAME=VALUE`` options,
because Claude Code applies it to the process it starts, which is corral on
the host. A hook command becomes ``corral run ... --shell bash -c
'<original>'`` (quoted by :mod:`._shell`), so stdin (the hook JSON), stdout
(its decision) and the exit status (2 blocks) pass through unchanged. Remote
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
from ._jsonfile import load_object, save
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
        self.kind = kind  # "hook" or "mcp-server"
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
    servers ``--timeout none`` / ``--max-output none``), with ``--deny-write
    PLUGIN_DIR`` present, then ``--shell bash -c COMMAND`` (a hook) or ``--
    ARGV`` (a server). Any other option (``--backend none``, ``--net open``,
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
        if kind == "hook" and word == "--shell" and words[i + 1 : i + 3] == ["bash", "-c"]:
            if len(words) != i + 4:
                return "not one command after -c"
            break
        if kind == "mcp-server" and word == "--":
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
            or (kind == "mcp-server" and word in ("--timeout", "--max-output") and value == "none")
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
    """Why a hook or local server *entry* does not run sandboxed (``None``: it is wrapped).

    A server's ``env`` is applied by Claude Code to the process it starts,
    that is to corral itself on the host (``CORRAL_BACKEND``, ``PYTHONPATH``,
    ``LD_PRELOAD`` ...), so a wrapped server has none: wrapping moves it into
    ``--env NAME=VALUE`` options, which set it inside the sandbox only.
    """
    if kind == "hook":
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
def _manifest(plugin_dir: str) -> dict[str, Any]:
    path = os.path.join(plugin_dir, ".claude-plugin", "plugin.json")
    if not os.path.exists(path):
        return {}
    return load_object(path)


def _parts(plugin_dir: str) -> list[tuple[str, str, str | None]]:
    """``(kind, file, key)``: where hooks and servers live (key: an inline plugin.json object)."""
    manifest = _manifest(plugin_dir)
    parts: list[tuple[str, str, str | None]] = []
    for kind, field, default in (
        ("hooks", "hooks", "hooks/hooks.json"),
        ("mcp", "mcpServers", ".mcp.json"),
    ):
        declared = manifest.get(field)
        manifest_path = os.path.join(plugin_dir, ".claude-plugin", "plugin.json")
        if isinstance(declared, dict):
            parts.append((kind, manifest_path, field))
        elif isinstance(declared, str):
            parts.append((kind, os.path.normpath(os.path.join(plugin_dir, declared)), None))
        elif isinstance(declared, list):
            parts += [
                (kind, os.path.normpath(os.path.join(plugin_dir, p)), None)
                for p in declared
                if isinstance(p, str)
            ]
        default_path = os.path.join(plugin_dir, default)
        if os.path.exists(default_path) and all(p[1] != default_path for p in parts):
            parts.append((kind, default_path, None))
    return parts


def _hook_groups(document: dict[str, Any], path: str) -> dict[str, Any]:
    hooks = document.get("hooks", document)
    if not isinstance(hooks, dict):
        raise UsageError(f"{path}: 'hooks' is not an object", hint="nothing was changed")
    return hooks


def _servers(document: dict[str, Any], path: str) -> dict[str, Any]:
    servers = document.get("mcpServers", document)
    if not isinstance(servers, dict):
        raise UsageError(f"{path}: 'mcpServers' is not an object", hint="nothing was changed")
    return servers


def _walk(
    plugin_dir: str, document: dict[str, Any], kind: str, path: str
) -> list[tuple[str, dict[str, Any]]]:
    """``(location, entry)`` for every command hook or server entry in *document*."""
    rel = posixpath.relpath(path, plugin_dir)
    found: list[tuple[str, dict[str, Any]]] = []
    if kind == "hooks":
        for event, groups in _hook_groups(document, path).items():
            if not isinstance(groups, list):
                continue
            for gi, group in enumerate(groups):
                for hi, hook in enumerate(
                    group.get("hooks") or [] if isinstance(group, dict) else []
                ):
                    if (
                        isinstance(hook, dict)
                        and hook.get("type") == "command"
                        and isinstance(hook.get("command"), str)
                    ):
                        found.append((f"{rel}: {event}[{gi}].hooks[{hi}]", hook))
    else:
        for name, server in _servers(document, path).items():
            if isinstance(server, dict):
                found.append((f"{rel}: mcpServers.{name}", server))
    return found


def _load(path: str, key: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(file document, the part of it to edit)``."""
    document = load_object(path, missing_ok=False)
    if key is None:
        return document, document
    part = document[key]
    return document, {"hooks": part} if key == "hooks" else {"mcpServers": part}


# ---------------------------------------------------------------- check and wrap
def check_plugin(plugin_dir: str, *, launchers: Sequence[Sequence[str]]) -> list[Finding]:
    """Every hook command and MCP server of the plugin in *plugin_dir*, wrapped or not.

    *launchers*: the trusted ways of starting corral (:func:`trusted_launchers`).

    Raises:
        UsageError: *plugin_dir* is not a directory, or a file is malformed.
    """
    plugin_dir = _plugin_dir(plugin_dir)
    findings = []
    for kind, path, key in _parts(plugin_dir):
        _, part = _load(path, key)
        for location, entry in _walk(plugin_dir, part, kind, path):
            what = "hook" if kind == "hooks" else "mcp-server"
            if kind == "hooks":
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
    """Rewrite the plugin's hooks and MCP servers to run under corral; return what was wrapped.

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
    edits: list[tuple[str, dict[str, Any]]] = []
    for kind, path, key in _parts(plugin_dir):
        document, part = _load(path, key)
        touched = False
        for location, entry in _walk(plugin_dir, part, kind, path):
            what = "hook" if kind == "hooks" else "mcp-server"
            if kind != "hooks" and not isinstance(entry.get("command"), str):
                continue  # remote: nothing runs locally
            if entry_problem(what, entry, plugin_dir=plugin_dir, launchers=launchers) is None:
                continue
            if kind == "hooks":
                original = entry["command"]
                run = [*options.corral, "run", *options.run_options(plugin_dir)]
                entry["command"] = f"{join(run)} --shell bash -c {quote(original)}"
                changed.append(Finding("hook", location, original, True))
            else:
                argv = [entry["command"], *[str(a) for a in entry.get("args") or []]]
                env: dict[str, Any] = entry.pop("env", None) or {}
                if not isinstance(env, dict):
                    raise UsageError(
                        f"{posixpath.relpath(path, plugin_dir)}: {location}: 'env' is not an "
                        "object",
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
                changed.append(Finding("mcp-server", location, join(argv), True))
            touched = True
        if touched:
            if key is not None:
                document[key] = part[key]
            edits.append((path, document))
    if not dry_run:
        for path, document in edits:  # every file parsed before the first is written
            save(path, document)
    return changed


def _plugin_dir(path: str) -> str:
    directory = os.path.abspath(path)
    if not os.path.isdir(directory):
        raise UsageError(f"{path}: not a directory", hint="give the plugin's directory")
    return directory
