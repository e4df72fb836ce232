"""The Claude Code plugin and marketplace in the repository are well formed.

Every JSON file parses, every path it references exists, names are kebab-case,
the hook's matcher covers every tool (the hook judges unknown ones), and the slash
command only runs corral subcommands that exist.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

from corral.cli import COMMANDS
from corral.integrations.claude_code_hook import MATCHER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def load(*parts: str) -> Any:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return json.load(f)


def frontmatter(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("---\n"), f"{path}: no frontmatter"
    head = text[4 : text.index("\n---\n", 4)]
    fields = {}
    for line in head.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def marketplace_plugins() -> list[dict[str, Any]]:
    plugins: list[dict[str, Any]] = load(".claude-plugin", "marketplace.json")["plugins"]
    return plugins


def test_marketplace_is_valid_and_its_plugins_exist() -> None:
    market = load(".claude-plugin", "marketplace.json")
    assert KEBAB.match(market["name"])
    assert market["owner"]["name"]
    assert market["plugins"]
    for entry in market["plugins"]:
        assert KEBAB.match(entry["name"]), entry["name"]
        assert entry["source"].startswith("./")
        source = os.path.normpath(os.path.join(ROOT, entry["source"]))
        assert os.path.isfile(os.path.join(source, ".claude-plugin", "plugin.json"))
        manifest = load(entry["source"], ".claude-plugin", "plugin.json")
        assert manifest["name"] == entry["name"]
        assert manifest["version"] == entry["version"]


@pytest.mark.parametrize("entry", marketplace_plugins(), ids=lambda e: e["name"])
def test_plugin_files_parse_and_every_name_is_kebab_case(entry: dict[str, Any]) -> None:
    plugin = os.path.join(ROOT, entry["source"])
    manifest = load(entry["source"], ".claude-plugin", "plugin.json")
    assert KEBAB.match(manifest["name"])
    assert manifest["description"]
    for key in ("commands", "agents", "hooks", "mcpServers"):  # custom paths, when given, exist
        for ref in (
            [manifest[key]] if isinstance(manifest.get(key), str) else manifest.get(key) or []
        ):
            if isinstance(ref, str):
                assert os.path.exists(os.path.join(plugin, ref)), ref
    for directory, subdirs, files in os.walk(plugin):
        for name in subdirs + files:
            if name in (".claude-plugin", ".mcp.json", "plugin.json", "hooks.json"):
                continue
            stem = name[:-3] if name.endswith(".md") else name
            assert KEBAB.match(stem), os.path.join(directory, name)
        for name in files:
            if name.endswith(".json"):
                load(os.path.join(directory, name))  # parses


def test_hooks_see_every_tool_and_fail_closed() -> None:
    hooks = load("plugins", "corral", "hooks", "hooks.json")["hooks"]
    assert list(hooks) == ["PreToolUse"]
    (group,) = hooks["PreToolUse"]
    assert group["matcher"] == MATCHER == "*"
    (hook,) = group["hooks"]
    assert hook["type"] == "command"
    assert hook["command"] == '"${CLAUDE_PLUGIN_ROOT}/hooks/corral-hook" || exit 2'
    script = os.path.join(ROOT, "plugins", "corral", "hooks", "corral-hook")
    assert os.access(script, os.X_OK)
    with open(script, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "#!/bin/sh"
    assert lines[-1] == 'exec "$corral" hook claude-code'  # the fallback: corral on PATH
    assert "hook" in COMMANDS


def test_mcp_json_starts_corral_mcp() -> None:
    servers = load("plugins", "corral", ".mcp.json")["mcpServers"]
    assert servers == {"corral": {"command": "corral", "args": ["mcp"]}}
    assert "mcp" in COMMANDS


def test_agents_and_commands_have_frontmatter_and_name_real_tools() -> None:
    plugin = os.path.join(ROOT, "plugins", "corral")
    agents = os.listdir(os.path.join(plugin, "agents"))
    assert agents
    for name in agents:
        fields = frontmatter(os.path.join(plugin, "agents", name))
        assert fields["name"] == name[:-3]
        assert fields["description"]
        for tool in fields["tools"].split(", "):
            if tool.startswith("mcp__corral__"):
                from corral.integrations.mcp_server import TOOL_NAMES

                assert tool.removeprefix("mcp__corral__") in TOOL_NAMES, tool
    sandbox = os.path.join(plugin, "commands", "sandbox.md")
    fields = frontmatter(sandbox)
    assert fields["description"]
    with open(sandbox, encoding="utf-8") as f:
        body = f.read()
    runs = re.findall(r"!`corral ([a-z-]+)[^`]*`", body)
    assert runs == ["doctor", "policy", "audit"]
    for sub in runs:
        assert sub in COMMANDS
        assert f"Bash(corral {sub}:*)" in fields["allowed-tools"]
