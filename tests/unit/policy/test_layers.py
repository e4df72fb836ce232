"""Layering: order, array concatenation and removal, maps, provenance, path resolution."""

from __future__ import annotations

import os

import pytest

from corral._exceptions import SettingsError
from corral.policy import Credential, default_policy

from .conftest import SettingsWorld


def built_in(world: SettingsWorld) -> object:
    """The default policy, plus the secret paths under the user database's home.

    The fixture's ``$HOME`` is not the passwd home, as under ``sudo``: the
    secrets are hidden under both.
    """
    import pwd

    from corral.policy import SECRET_PATHS
    from corral.policy._defaults import expand_home

    policy = default_policy(world.workspace, home=world.home)
    other = pwd.getpwuid(os.getuid()).pw_dir
    extra = tuple(expand_home(path, other) for path, _ in SECRET_PATHS)
    fs = policy.filesystem
    return policy.replace(filesystem=fs.replace(deny_read=(*fs.deny_read, *extra)))


def test_with_no_settings_the_policy_is_the_built_in_default(world: SettingsWorld) -> None:
    resolved = world.load()
    assert resolved.policy == built_in(world)
    assert resolved.warnings == ()
    sources = {
        source for key, source in resolved.provenance.items() if key != "filesystem.workspace"
    }
    assert sources == {"defaults", "defaults (secret paths of other homes)"}


def test_later_layers_win_in_the_documented_order(world: SettingsWorld) -> None:
    # Every layer sets resources.timeout; each assertion then drops the latest one.
    world.user(
        {
            "resources": {"timeout": 1},
            "profiles": {"p": {"resources": {"timeout": 7}}},
            "rules": [{"match": "make*", "resources": {"timeout": 8}}],
        }
    )
    world.project({"resources": {"timeout": 2}})
    world.local({"resources": {"timeout": 3}})
    world.trust()
    env_file = world.write("env.json", {"resources": {"timeout": 4}})
    extra = world.write("extra.json", {"resources": {"timeout": 5}})
    world.environ["CORRAL_SETTINGS"] = env_file
    layers = {
        "settings_files": [extra],
        "profile": "p",
        "command": "make all",
        "flags": {"resources": {"timeout": 9}},
    }

    def timeout() -> tuple[float | None, str]:
        resolved = world.load(**layers)
        return resolved.policy.resources.timeout, resolved.provenance["resources.timeout"]

    assert timeout() == (9.0, "flags")
    del layers["flags"]
    assert timeout() == (8.0, "rule:make*")
    del layers["command"]
    assert timeout() == (7.0, "profile:p")
    del layers["profile"]
    assert timeout() == (5.0, f"settings {extra}")
    del layers["settings_files"]
    assert timeout() == (4.0, f"environment CORRAL_SETTINGS={env_file}")
    del world.environ["CORRAL_SETTINGS"]
    assert timeout() == (3.0, f"local {world.local_file}")
    os.remove(world.local_file)
    assert timeout() == (2.0, f"project {world.project_file}")
    os.remove(world.project_file)
    assert timeout() == (1.0, f"user {world.user_file}")
    os.remove(world.user_file)
    assert timeout() == (3600.0, "defaults")


def test_environment_variables_override_the_settings_file(world: SettingsWorld) -> None:
    world.environ["CORRAL_SETTINGS"] = world.write("env.json", {"backend": "docker"})
    world.environ["CORRAL_BACKEND"] = "podman"
    world.environ["CORRAL_ISOLATION"] = "kernel"
    resolved = world.load()
    assert (resolved.policy.backend, resolved.policy.isolation) == ("podman", "kernel")
    assert resolved.provenance["backend"] == "environment CORRAL_BACKEND"
    assert resolved.provenance["isolation"] == "environment CORRAL_ISOLATION"
    assert [layer.label for layer in resolved.layers if layer.name == "environment"][1:] == [
        "environment CORRAL_ISOLATION",
        "environment CORRAL_BACKEND",
    ]


def test_empty_environment_variables_count_as_unset(world: SettingsWorld) -> None:
    world.environ.update(CORRAL_BACKEND="", CORRAL_SETTINGS="", CORRAL_PROFILE="")
    assert world.load().policy == built_in(world)


def test_arrays_concatenate_without_duplicates_and_remember_each_source(
    world: SettingsWorld,
) -> None:
    world.user({"network": {"allow": ["pypi.org", "github.com"]}})
    resolved = world.load(flags={"network": {"allow": ["github.com", "npmjs.org", "NPMJS.org"]}})
    assert resolved.policy.network.allow == ("pypi.org", "github.com", "npmjs.org")
    user = f"user {world.user_file}"
    assert [resolved.provenance[f"network.allow[{i}]"] for i in range(3)] == [user, user, "flags"]
    assert resolved.provenance["network.allow"] == "flags"


def test_a_bang_entry_removes_a_built_in_row(world: SettingsWorld) -> None:
    world.user(
        {
            "filesystem": {"denyRead": ["!~/.npmrc"], "protect": ["!**/.vscode/**"]},
            "env": {"pass": ["!TZ", "!LC_*"]},
        }
    )
    policy = world.load().policy
    assert f"{world.home}/.npmrc" not in policy.filesystem.deny_read
    assert f"{world.home}/.ssh" in policy.filesystem.deny_read
    assert "**/.vscode/**" not in policy.filesystem.protect
    assert "TZ" not in policy.env.pass_through
    assert "LC_*" not in policy.env.pass_through


def test_a_removal_that_matches_nothing_is_reported(world: SettingsWorld) -> None:
    world.user({"filesystem": {"denyRead": ["!~/.npmrcc"]}})
    resolved = world.load()
    assert resolved.warnings == (
        f'user {world.user_file}: filesystem.denyRead: "!{world.home}/.npmrcc" removes nothing '
        "(no earlier entry matches)",
    )


def test_a_later_layer_can_re_add_a_removed_entry(world: SettingsWorld) -> None:
    world.user({"filesystem": {"denyRead": ["!~/.npmrc"]}})
    resolved = world.load(flags={"filesystem": {"denyRead": ["~/.npmrc"]}})
    assert resolved.policy.filesystem.deny_read[-1] == f"{world.home}/.npmrc"
    index = len(resolved.policy.filesystem.deny_read) - 1
    assert resolved.provenance[f"filesystem.denyRead[{index}]"] == "flags"


def test_maps_merge_per_name_and_null_removes(world: SettingsWorld) -> None:
    world.user(
        {
            "env": {"set": {"CI": "1", "LANG": "C", "KEEP": ""}},
            "caches": {"npm": "~/.cache/npm", "pip": "/var/cache/pip"},
        }
    )
    resolved = world.load(
        flags={
            "env": {"set": {"LANG": "C.UTF-8", "CI": None, "NEW": None}},
            "caches": {"pip": None, "cargo": "caches/cargo"},
        }
    )
    policy = resolved.policy
    assert policy.env.set == (("LANG", "C.UTF-8"), ("KEEP", ""))
    assert policy.caches == (
        ("npm", f"{world.home}/.cache/npm"),
        ("cargo", f"{world.workspace}/caches/cargo"),
    )
    assert resolved.provenance["env.set.LANG"] == "flags"
    assert resolved.provenance["env.set.KEEP"] == f"user {world.user_file}"
    assert "env.set.CI" not in resolved.provenance


def test_a_credential_replaces_one_of_the_same_name(world: SettingsWorld) -> None:
    world.user(
        {
            "credentials": [
                {"name": "NPM_TOKEN", "from": "env:NPM_TOKEN", "commands": ["npm publish*"]},
                {
                    "name": "GH_TOKEN",
                    "from": "file:~/.gh-token",
                    "commands": ["gh *"],
                    "hosts": ["API.github.com"],
                    "mode": "mask",
                },
            ]
        }
    )
    resolved = world.load(
        flags={
            "credentials": [
                {"name": "NPM_TOKEN", "from": "file:/run/npm", "commands": ["npm *", "npm *"]},
                {
                    "name": "GH_TOKEN",
                    "from": "file:~/.gh-token",
                    "commands": ["gh *"],
                    "hosts": ["api.github.com"],
                    "mode": "mask",
                },
            ]
        }
    )
    assert resolved.policy.credentials == (
        Credential(name="NPM_TOKEN", source="file:/run/npm", commands=("npm *",)),
        Credential(
            name="GH_TOKEN",
            source=f"file:{world.home}/.gh-token",
            commands=("gh *",),
            hosts=("api.github.com",),
            mode="mask",
        ),
    )
    assert resolved.provenance["credentials[0]"] == "flags"
    assert resolved.provenance["credentials[1]"] == f"user {world.user_file}"


def test_a_bang_name_removes_a_credential(world: SettingsWorld) -> None:
    world.user({"credentials": [{"name": "T", "from": "env:T", "commands": ["*"]}]})
    assert world.load(flags={"credentials": ["!T"]}).policy.credentials == ()


def test_profiles_merge_per_name(world: SettingsWorld) -> None:
    world.user({"profiles": {"ci": {"resources": {"pids": 10}}, "old": {"image": "x"}}})
    extra = world.write(
        "extra.json", {"profiles": {"ci": {"resources": {"pids": 20}}, "old": None}}
    )
    resolved = world.load(settings_files=[extra], profile="ci")
    assert resolved.policy.resources.pids == 20
    assert set(resolved.values["profiles"]) == {"ci"}


def test_rules_apply_in_order_and_bang_removes_them(world: SettingsWorld) -> None:
    world.user(
        {
            "rules": [
                {"match": "pytest*", "isolation": "vm", "resources": {"memory": "2G"}},
                {"match": "*", "resources": {"memory": "1G"}},
                {"match": "npm *", "network": {"mode": "open"}},
            ]
        }
    )
    resolved = world.load(command=["pytest", "-q"])
    assert resolved.matched_rules == ("pytest*", "*")
    assert resolved.policy.isolation == "vm"
    assert resolved.policy.resources.memory == 1 << 30
    assert resolved.provenance["resources.memory"] == "rule:*"
    assert resolved.policy.network.mode == "none"

    resolved = world.load(command="pytest -q", flags={"rules": ["!*"]})
    assert resolved.matched_rules == ("pytest*",)
    assert resolved.policy.resources.memory == 2 << 30


def test_no_rule_applies_without_a_command(world: SettingsWorld) -> None:
    world.user({"rules": [{"match": "*", "isolation": "vm"}]})
    resolved = world.load()
    assert resolved.matched_rules == ()
    assert resolved.policy.isolation == "namespace"


def test_flags_may_define_the_profile_they_select(world: SettingsWorld) -> None:
    resolved = world.load(
        profile="quick",
        flags={
            "profiles": {"quick": {"resources": {"timeout": "10s"}}},
            "resources": {"memory": "1G"},
        },
    )
    assert resolved.policy.resources.timeout == 10.0
    assert resolved.policy.resources.memory == 1 << 30


def test_the_profile_comes_from_the_environment_unless_given(world: SettingsWorld) -> None:
    world.user({"profiles": {"a": {"image": "a"}, "b": {"image": "b"}}})
    world.environ["CORRAL_PROFILE"] = "a"
    assert world.load().policy.image == "a"
    resolved = world.load(profile="b")
    assert (resolved.profile, resolved.policy.image) == ("b", "b")


def test_an_unknown_profile_is_an_error_with_a_suggestion(world: SettingsWorld) -> None:
    world.user({"profiles": {"release": {}}})
    with pytest.raises(SettingsError) as info:
        world.load(profile="relase")
    assert str(info.value) == 'flags: unknown profile "relase" (did you mean "release"?)'
    assert info.value.hint == "defined profiles: release"
    world.environ["CORRAL_PROFILE"] = "nope"
    with pytest.raises(SettingsError, match="environment CORRAL_PROFILE: unknown profile"):
        world.load()


def test_paths_resolve_against_the_workspace_and_home(world: SettingsWorld) -> None:
    world.user(
        {
            "filesystem": {
                "allowWrite": ["build/../out", "~/scratch", "/data//x/"],
                "denyWrite": ["secrets/**", "./vendor/*.pem", "~/notes/**", "//etc/*.conf"],
            }
        }
    )
    fs = world.load().policy.filesystem
    assert fs.allow_write == (f"{world.workspace}/out", f"{world.home}/scratch", "/data/x")
    assert fs.deny_write == ("secrets/**", "vendor/*.pem", f"{world.home}/notes/**", "/etc/*.conf")


def test_the_workspace_argument_wins_and_is_attributed_to_flags(world: SettingsWorld) -> None:
    other = os.path.join(world.root, "other")
    os.makedirs(other)
    world.user({"filesystem": {"workspace": world.workspace, "allowWrite": ["out"]}})
    resolved = world.load(workspace="../other")
    assert resolved.workspace == other
    assert resolved.policy.filesystem.workspace == other
    assert resolved.policy.filesystem.allow_write == (f"{other}/out",)
    assert resolved.provenance["filesystem.workspace"] == "flags"


def test_values_have_the_policy_types(world: SettingsWorld) -> None:
    world.user(
        {
            "allowDegraded": ["resources.memory", "network.allowUnixSockets"],
            "resources": {
                "memory": "512M",
                "pids": 64.0,
                "cpus": 2,
                "cpuTime": "1m",
                "timeout": 30,
                "output": 1024,
                "killGrace": "500ms",
            },
            "image": "docker.io/library/python:3.12",
        }
    )
    policy = world.load().policy
    assert policy.allow_degraded == frozenset({"resources.memory", "network.allowUnixSockets"})
    resources = policy.resources
    assert (resources.memory, resources.pids, resources.cpus) == (512 << 20, 64, 2.0)
    assert type(resources.pids) is int
    assert type(resources.cpus) is float
    assert (resources.cpu_time, resources.timeout, resources.kill_grace) == (60.0, 30.0, 0.5)
    assert resources.output == 1024
    assert policy.image == "docker.io/library/python:3.12"


def test_null_removes_a_limit(world: SettingsWorld) -> None:
    world.user({"resources": {"memory": None, "timeout": None}, "image": None})
    resources = world.load().policy.resources
    assert (resources.memory, resources.timeout) == (None, None)


def test_corral_own_files_stay_read_only_when_they_are_writable(world: SettingsWorld) -> None:
    world.user({"filesystem": {"allowWrite": ["~"]}})
    resolved = world.load()
    config = f"{world.home}/.config/corral"
    state = f"{world.home}/.local/state/corral"
    assert resolved.policy.filesystem.deny_write == (config, config + "/**", state, state + "/**")
    assert resolved.provenance["filesystem.denyWrite[0]"] == "defaults (corral's own files)"


def test_corral_own_files_elsewhere_are_hidden_too(world: SettingsWorld) -> None:
    world.environ["XDG_CONFIG_HOME"] = os.path.join(world.workspace, "xdg-config")
    world.environ["XDG_STATE_HOME"] = "relative/is/ignored"
    resolved = world.load()
    config = f"{world.workspace}/xdg-config/corral"
    assert resolved.policy.filesystem.deny_read[-1] == config
    assert resolved.policy.filesystem.deny_write == (config, config + "/**")


def test_own_file_protection_does_not_duplicate_user_rows(world: SettingsWorld) -> None:
    config = f"{world.home}/.config/corral"
    world.user({"filesystem": {"allowWrite": ["~"], "denyWrite": [config]}})
    deny_write = world.load().policy.filesystem.deny_write
    assert deny_write.count(config) == 1
    assert config + "/**" in deny_write
