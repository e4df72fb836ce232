"""corral policy --explain and --json."""

from __future__ import annotations

from corral.policy import effective_settings_json, explain, policy_digest
from corral.policy._explain import layer_to_json
from corral.policy._validate import Context, validate_layer

from .conftest import SettingsWorld


def line_for(text: str, prefix: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(prefix))


def test_explain_names_the_source_of_every_value(world: SettingsWorld) -> None:
    world.project({"filesystem": {"allowWrite": ["/data"]}, "resources": {"memory": "1G"}})
    world.trust()
    text = explain(world.load())
    project = f"(project {world.project_file})"
    assert (
        " ".join(line_for(text, "resources.memory =").split()) == f"resources.memory = 1G {project}"
    )
    assert " ".join(line_for(text, "filesystem.allowWrite =").split()) == (
        f'filesystem.allowWrite = ["/data"] {project}'
    )
    assert " ".join(line_for(text, "resources.timeout =").split()) == (
        "resources.timeout = 1h (defaults: nothing an agent starts runs unbounded; long test suites "
        "still fit)"
    )
    assert " ".join(line_for(text, "resources.cpus =").split()) == (
        "resources.cpus = null (no limit) (defaults)"
    )
    assert " ".join(line_for(text, "image =").split()) == "image = null (defaults)"


def test_explain_lists_each_entry_of_a_mixed_array(world: SettingsWorld) -> None:
    world.user({"filesystem": {"denyRead": ["/srv/secrets"]}})
    text = explain(world.load())
    lines = text.splitlines()
    start = lines.index("filesystem.denyRead =")
    assert " ".join(lines[start + 1].split()) == (
        f'"{world.home}/.ssh" (defaults: SSH private keys, agent sockets and known hosts)'
    )
    assert any(
        " ".join(line.split()) == f'"/srv/secrets" (user {world.user_file})'
        for line in lines[start:]
    )


def test_explain_shows_maps_rules_and_profiles(world: SettingsWorld) -> None:
    world.user(
        {
            "env": {"set": {"CI": "1"}},
            "rules": [{"match": "pytest*", "resources": {"timeout": "10m"}}, "!npm*"],
            "profiles": {"ci": {"network": {"allow": ["a.org", "!b.org"]}}},
            "credentials": [{"name": "T", "from": "env:T", "commands": ["*"]}],
        }
    )
    resolved = world.load(command="pytest", profile="ci")
    text = explain(resolved)
    user = f"(user {world.user_file})"
    assert " ".join(line_for(text, "env.set.CI").split()) == f'env.set.CI = "1" {user}'
    assert 'rules = [{"match": "pytest*", "resources": {"timeout": 600.0}}]' in text
    assert 'profiles.ci = {"network": {"allow": ["a.org", "!b.org"]}}' in text
    assert "\ncredentials =\n" in text  # too long to print inline
    assert " ".join(line_for(text, '    {"name": "T"').split()) == (
        f'{{"name": "T", "from": "env:T", "commands": ["*"], "mode": "env"}} {user}'
    )
    assert "env.set = {}" not in text
    assert "caches = {}" in text
    assert "profile: ci" in text
    assert 'matched rules: "pytest*"' in text
    assert f"policy digest: sha256:{policy_digest(resolved.policy)}" in text


def test_explain_ends_with_warnings_and_layers(world: SettingsWorld) -> None:
    world.project({"network": {"mode": "open"}})
    text = explain(world.load())
    assert text.endswith("\n")
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "profile: (none)" in lines
    assert "matched rules: (none)" in lines
    warning = lines.index("warnings:")
    assert lines[warning + 1].startswith("ignoring network.mode from untrusted")
    layers = lines.index("layers:")
    assert lines[layers + 1 : layers + 6] == [
        "defaults",
        f"user {world.user_file} (not found)",
        f"project {world.project_file} (untrusted: only tightening values applied; run "
        "'corral trust' to accept it)",
        f"local {world.local_file} (not found)",
        "flags",
    ]
    world.trust()
    assert f"project {world.project_file} (trusted)" in [
        " ".join(line.split()) for line in explain(world.load()).splitlines()
    ]
    assert "warnings:" not in explain(world.load())


def test_effective_settings_use_the_settings_shape(world: SettingsWorld) -> None:
    world.user(
        {
            "resources": {"memory": "1G"},
            "caches": {"npm": "/c"},
            "credentials": [
                {
                    "name": "T",
                    "from": "env:T",
                    "commands": ["*"],
                    "hosts": ["a.org"],
                    "mode": "mask",
                }
            ],
        }
    )
    data = effective_settings_json(world.load())
    assert data["resources"]["memory"] == 1 << 30
    assert data["resources"]["timeout"] == 3600.0
    assert data["caches"] == {"npm": "/c"}
    assert data["credentials"] == [
        {"name": "T", "from": "env:T", "commands": ["*"], "hosts": ["a.org"], "mode": "mask"}
    ]
    assert "rules" not in data
    assert "profiles" not in data
    assert data["filesystem"]["workspace"] == world.workspace


def test_layer_values_turn_back_into_settings_json(world: SettingsWorld) -> None:
    ctx = Context(workspace=world.workspace, home=world.home, cwd=world.workspace)
    raw = {"profiles": {"a": {"env": {"pass": ["!TZ"]}}, "b": None}, "env": {"set": {"X": None}}}
    values = validate_layer(raw, source="test", ctx=ctx)
    assert layer_to_json(values) == raw
