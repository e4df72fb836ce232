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
``mcpServers``). A hook command becomes ``corral run ... --shell bash -c
'<original>'`` (quoted by :mod:`._shell`), so stdin (the hook JSON), stdout
(its decision) and the exit status (2 blocks) pass through unchanged. Remote
servers (``url``) run nothing locally and are left alone. Wrapping twice
changes nothing; :func:`check_plugin` lists what is not wrapped.
"""

from __future__ import annotations

import os
import posixpath

from .._exceptions import UsageError
from ._jsonfile import load_object, save
from ._shell import join, quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["Finding", "WrapOptions", "check_plugin", "is_wrapped", "wrap_plugin"]

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

    def run_options(self, plugin_dir: str, env_names: Sequence[str] = ()) -> list[str]:
        """The ``corral run`` options of the restrictive profile."""
        options: list[str] = []
        if self.allow_hosts:
            for host in self.allow_hosts:
                options += ["--allow-host", host]
        else:
            options += ["--net", "none"]
        if not self.workspace_writable:
            options.append("--read-only")
        options += ["--deny-write", plugin_dir]
        for name in (*PLUGIN_ENV, *env_names):
            options += ["--env", name]
        return options


class Finding:
    """One hook or server of a plugin: where it is and whether it is wrapped."""

    __slots__ = ("command", "kind", "location", "wrapped")

    def __init__(self, kind: str, location: str, command: str, wrapped: bool | None) -> None:
        self.kind = kind  # "hook" or "mcp-server"
        self.location = location  # e.g. "hooks/hooks.json: PreToolUse[0].hooks[1]"
        self.command = command
        self.wrapped = wrapped  # None: nothing runs locally (remote server)

    def describe(self) -> str:
        """One line for ``--check``."""
        state = {True: "wrapped", False: "NOT wrapped", None: "remote (nothing runs locally)"}[
            self.wrapped
        ]
        return f"{state:<29} {self.kind:<10} {self.location}: {self.command}"


def _first_words(command: str) -> list[str]:
    """The first two words of a shell command, understanding single quotes (for is_wrapped)."""
    words: list[str] = []
    i = 0
    text = command.lstrip()
    while i < len(text) and len(words) < 2:
        if text[i] == "'":
            end = text.find("'", i + 1)
            if end < 0:
                return words
            words.append(text[i + 1 : end])
            i = end + 1
        else:
            end = i
            while end < len(text) and not text[end].isspace():
                end += 1
            words.append(text[i:end])
            i = end
        while i < len(text) and text[i].isspace():
            i += 1
    return words


def is_wrapped(command: str | Sequence[str]) -> bool:
    """Whether a hook command (string) or server argv already starts ``corral run``."""
    words = _first_words(command) if isinstance(command, str) else list(command[:2])
    if len(words) == 2 and words[1] == "run" and posixpath.basename(words[0]) == "corral":
        return True
    # python -m corral run ...
    return (
        not isinstance(command, str)
        and len(command) >= 4
        and list(command[1:4]) == ["-m", "corral", "run"]
    )


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
def check_plugin(plugin_dir: str) -> list[Finding]:
    """Every hook command and MCP server of the plugin in *plugin_dir*, wrapped or not.

    Raises:
        UsageError: *plugin_dir* is not a directory, or a file is malformed.
    """
    plugin_dir = _plugin_dir(plugin_dir)
    findings = []
    for kind, path, key in _parts(plugin_dir):
        _, part = _load(path, key)
        for location, entry in _walk(plugin_dir, part, kind, path):
            if kind == "hooks":
                findings.append(
                    Finding("hook", location, entry["command"], is_wrapped(entry["command"]))
                )
            elif isinstance(entry.get("command"), str):
                argv = [entry["command"], *[str(a) for a in entry.get("args") or []]]
                findings.append(Finding("mcp-server", location, join(argv), is_wrapped(argv)))
            else:
                findings.append(Finding("mcp-server", location, str(entry.get("url", "?")), None))
    return findings


def wrap_plugin(plugin_dir: str, options: WrapOptions, *, dry_run: bool = False) -> list[Finding]:
    """Rewrite the plugin's hooks and MCP servers to run under corral; return what was wrapped.

    Already wrapped entries are left alone, so wrapping twice changes nothing.

    Raises:
        UsageError: *plugin_dir* is not a directory, or a file is malformed
            (then no file is changed).
    """
    plugin_dir = _plugin_dir(plugin_dir)
    changed: list[Finding] = []
    edits: list[tuple[str, dict[str, Any]]] = []
    for kind, path, key in _parts(plugin_dir):
        document, part = _load(path, key)
        touched = False
        for location, entry in _walk(plugin_dir, part, kind, path):
            if kind == "hooks":
                original = entry["command"]
                if is_wrapped(original):
                    continue
                run = [*options.corral, "run", *options.run_options(plugin_dir)]
                entry["command"] = f"{join(run)} --shell bash -c {quote(original)}"
                changed.append(Finding("hook", location, original, True))
                touched = True
            elif isinstance(entry.get("command"), str):
                argv = [entry["command"], *[str(a) for a in entry.get("args") or []]]
                if is_wrapped(argv):
                    continue
                env: dict[str, Any] = entry["env"] if isinstance(entry.get("env"), dict) else {}
                run = [
                    "run",
                    *options.run_options(plugin_dir, sorted(env)),
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
