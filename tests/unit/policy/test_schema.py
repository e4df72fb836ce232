"""The generated JSON Schema and policy reference: current, valid, agreeing with the loader."""

from __future__ import annotations

import json
import os
from typing import Any

import jsonschema
import pytest

from corral._exceptions import SettingsError
from corral.policy import KEYS, _defaults, _schema, effective_settings_json
from corral.policy._validate import Context, validate_layer

from .conftest import SettingsWorld

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
SCHEMA = _schema.generate_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
CTX = Context(workspace="/ws", home="/home/u", cwd="/ws")


def loader_accepts(document: Any) -> bool:
    try:
        validate_layer(document, source="test", ctx=CTX)
    except SettingsError:
        return False
    return True


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_every_object_forbids_unknown_keys() -> None:
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                assert node["additionalProperties"] is False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(SCHEMA)


def test_the_checked_in_files_are_up_to_date() -> None:
    assert _schema.main(["--check", "--root", ROOT]) == 0
    with open(os.path.join(ROOT, "src/corral/schema/corral-settings.schema.json")) as file:
        assert json.load(file) == SCHEMA


def test_write_then_check(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(tmp_path)
    assert _schema.main(["--check", "--root", root]) == 1
    assert "docs/policy-reference.md is out of date" in capsys.readouterr().err
    assert _schema.main(["--write", "--root", root]) == 0
    assert "wrote schema/corral-settings.schema.json" in capsys.readouterr().out
    assert _schema.main(["--check", "--root", root]) == 0
    assert _schema.main(["--write", "--root", root]) == 0
    assert capsys.readouterr().out == ""  # nothing changed, nothing written
    with open(os.path.join(root, _schema.DOCS_FILE), "a") as file:
        file.write("edited by hand\n")
    assert _schema.main(["--check", "--root", root]) == 1


def test_the_default_root_is_the_repository() -> None:
    assert _schema._default_root() == ROOT


VALID: list[Any] = [
    {},
    {"$schema": "./schema/corral-settings.schema.json"},
    {"backend": "gvisor", "isolation": "kernel", "allowDegraded": ["resources.memory"]},
    {
        "filesystem": {
            "workspace": "~/src/app",
            "readOnly": True,
            "allowWrite": ["/data", "out"],
            "denyWrite": ["**/*.pem", "!secrets/**"],
            "denyRead": ["!~/.npmrc"],
            "allowRead": ["~/.ssh/known_hosts"],
            "protect": ["Makefile"],
        }
    },
    {
        "network": {
            "mode": "allowlist",
            "allow": ["pypi.org", "*.github.com", "10.0.0.0/8", "[::1]:8080", "!*"],
            "deny": ["evil.example", "*", "*.com:25"],
            "allowUnixSockets": False,
        }
    },
    {
        "resources": {
            "memory": "512M",
            "pids": 64,
            "cpus": 1.5,
            "cpuTime": "1m30s",
            "timeout": 30,
            "output": 1048576,
            "killGrace": "500ms",
        }
    },
    {"resources": {"memory": None, "timeout": None, "output": "2GiB"}},
    {
        "env": {
            "pass": ["LC_*", "!TZ"],
            "set": {"CI": "1", "EMPTY": "", "GONE": None},
            "deny": ["AWS_*"],
        }
    },
    {
        "credentials": [
            {
                "name": "NPM_TOKEN",
                "from": "env:NPM_TOKEN",
                "commands": ["npm publish*"],
                "hosts": ["registry.npmjs.org"],
                "mode": "env",
            },
            "!OLD",
        ]
    },
    {"credentials": [{"name": "K", "from": "file:~/.k", "commands": ["*"]}]},
    {"caches": {"npm": "~/.npm", "pip": None}},
    {"image": "docker.io/library/python:3.12"},
    {"image": None},
    {"rules": [{"match": "pytest*", "isolation": "vm", "resources": {"memory": "2G"}}, "!npm*"]},
    {"profiles": {"ci": {"network": {"mode": "open"}, "env": {"set": {"CI": "1"}}}, "x": None}},
]

INVALID: list[Any] = [
    [],
    {"backend": "bubblewarp"},
    {"isolation": "none"},
    {"allowDegraded": ["resources.memroy"]},
    {"allowDegraded": ["filesystem.allowWrite"]},
    {"filesystem": {"alowWrite": []}},
    {"filesystem": {"readOnly": "yes"}},
    {"filesystem": {"allowWrite": "/data"}},
    {"filesystem": {"allowWrite": ["!"]}},
    {"filesystem": {"allowWrite": ["/a\u0000b"]}},
    {"network": {"mode": "closed"}},
    {"network": {"allow": ["a b"]}},
    {"network": {"allow": ["*"]}},
    {"network": {"allow": ["*.com"]}},
    {"network": {"allow": ["*.COM.:443"]}},
    {"network": {"allow": ["fe80::1%eth0"]}},
    {"network": {"allow": ["user@example.com"]}},
    {"credentials": [{"name": "T", "from": "env:T", "commands": ["*"], "hosts": ["*"]}]},
    {"resources": {"memory": 0}},
    {"resources": {"memory": "0M"}},
    {"resources": {"memory": "-1G"}},
    {"resources": {"memory": "12Q"}},
    {"resources": {"memory": "1.5"}},
    {"resources": {"memory": True}},
    {"resources": {"timeout": "2d"}},
    {"resources": {"timeout": 0}},
    {"resources": {"timeout": "0s"}},
    {"resources": {"timeout": "1h30"}},
    {"resources": {"killGrace": None}},
    {"resources": {"pids": 0}},
    {"resources": {"pids": 1.5}},
    {"resources": {"cpus": 0}},
    {"env": {"pass": ["A=B"]}},
    {"env": {"set": {"A=B": "1"}}},
    {"env": {"set": {"A": 1}}},
    {"credentials": [{"name": "T", "from": "vault:T", "commands": ["*"]}]},
    {"credentials": [{"name": "T", "from": "env:T"}]},
    {"credentials": [{"name": "T", "from": "env:T", "commands": []}]},
    {"credentials": [{"name": "T", "from": "file:rel", "commands": ["*"]}]},
    {"credentials": [{"name": "T", "from": "env:T", "commands": ["*"], "mode": "proxy"}]},
    {"credentials": [{"name": "T", "from": "env:T", "commands": ["*"], "extra": 1}]},
    {"caches": {"a/b": "/c"}},
    {"caches": {"..": "/c"}},
    {"image": ""},
    {"rules": [{"isolation": "vm"}]},
    {"rules": [{"match": "x", "rules": []}]},
    {"rules": [{"match": "x", "filesystem": {"workspace": "/"}}]},
    {"profiles": {"ci": {"profiles": {}}}},
    {"profiles": {"ci": []}},
    {"integrations": {"cursor": {}}},
    {"$schema": 1},
]


@pytest.mark.parametrize("document", VALID)
def test_schema_and_loader_accept_the_same_valid_files(document: Any) -> None:
    assert list(VALIDATOR.iter_errors(document)) == []
    assert loader_accepts(document)


@pytest.mark.parametrize("document", INVALID)
def test_schema_and_loader_reject_the_same_invalid_files(document: Any) -> None:
    assert list(VALIDATOR.iter_errors(document)) != []
    assert not loader_accepts(document)


def test_the_effective_settings_satisfy_the_schema(world: SettingsWorld) -> None:
    world.user(VALID[8] | VALID[5] | {"caches": {"npm": "~/.npm"}, "env": {"set": {"CI": "1"}}})
    assert list(VALIDATOR.iter_errors(effective_settings_json(world.load()))) == []


def test_the_reference_documents_every_key_and_default_row() -> None:
    docs = _schema.generate_docs()
    for row in KEYS.rows:
        assert f"#### `{row.path}`" in docs
    for table in (_defaults.SECRET_PATHS, _defaults.PROTECTED_PATTERNS, _defaults.ENV_PASS):
        for item, reason in table:
            assert f"| `{item}` | {reason} |" in docs
    for name, _, reason in _defaults.DEFAULT_RESOURCES:
        assert f"resources.{name}" in docs
        assert reason in docs
    assert "none are defined yet" not in docs  # the shipped integration keys are documented


def test_the_reference_documents_integration_keys_when_there_are_some() -> None:
    from corral.policy import Key
    from corral.policy import _keys as k

    table = KEYS.extended(
        [
            Key(
                path="integrations.mcp.limit",
                kind=k.SIZE,
                tighten=k.LOWER,
                nullable=True,
                default=None,
                description="A limit.",
            )
        ]
    )
    docs = _schema.generate_docs(table)
    assert "#### `integrations.mcp.limit`" in docs
    assert "none are defined yet" not in docs
    schema = _schema.generate_schema(table)
    limit = schema["properties"]["integrations"]["properties"]["mcp"]["properties"]["limit"]
    assert limit["anyOf"][1] == {"type": "null"}
