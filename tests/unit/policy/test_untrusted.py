"""The untrusted-project rule: an untrusted project file may only tighten the policy."""

from __future__ import annotations

import os
from typing import Any

import pytest

from corral._exceptions import SettingsError
from corral.policy import Credential

from .conftest import SettingsWorld


def ignored(world: SettingsWorld, key: str, path: str | None = None) -> str:
    return (
        f"ignoring {key} from untrusted {path or world.project_file} (it would loosen the "
        "policy); run 'corral trust' to accept it"
    )


def load_untrusted(world: SettingsWorld, project: Any, user: Any = None) -> Any:
    if user is not None:
        world.user(user)
    world.project(project)
    return world.load()


# ---------------------------------------------------------------- scalars
@pytest.mark.parametrize(
    ("user", "project", "expected", "warned"),
    [
        # isolation: higher tightens
        ({}, {"isolation": "kernel"}, ("isolation", "kernel"), False),
        ({"isolation": "vm"}, {"isolation": "kernel"}, ("isolation", "vm"), True),
        ({}, {"isolation": "namespace"}, ("isolation", "namespace"), False),
        # readOnly: true tightens
        ({}, {"filesystem": {"readOnly": True}}, ("filesystem.read_only", True), False),
        (
            {"filesystem": {"readOnly": True}},
            {"filesystem": {"readOnly": False}},
            ("filesystem.read_only", True),
            True,
        ),
        # allowUnixSockets: false tightens
        ({}, {"network": {"allowUnixSockets": True}}, ("network.allow_unix_sockets", False), True),
        (
            {"network": {"allowUnixSockets": True}},
            {"network": {"allowUnixSockets": False}},
            ("network.allow_unix_sockets", False),
            False,
        ),
        # network.mode: none < allowlist < open
        (
            {"network": {"mode": "open"}},
            {"network": {"mode": "allowlist"}},
            ("network.mode", "allowlist"),
            False,
        ),
        ({}, {"network": {"mode": "open"}}, ("network.mode", "none"), True),
        (
            {"network": {"mode": "allowlist"}},
            {"network": {"mode": "open"}},
            ("network.mode", "allowlist"),
            True,
        ),
        # resources: lower tightens, higher or null loosens
        ({}, {"resources": {"memory": "1G"}}, ("resources.memory", 1 << 30), False),
        ({}, {"resources": {"memory": "16G"}}, ("resources.memory", 8 << 30), True),
        ({}, {"resources": {"memory": None}}, ("resources.memory", 8 << 30), True),
        ({}, {"resources": {"cpus": 1.5}}, ("resources.cpus", 1.5), False),
        ({"resources": {"cpus": 1}}, {"resources": {"cpus": 2}}, ("resources.cpus", 1.0), True),
        ({}, {"resources": {"timeout": "10m"}}, ("resources.timeout", 600.0), False),
        ({}, {"resources": {"pids": 8192}}, ("resources.pids", 4096), True),
        ({}, {"resources": {"killGrace": "1s"}}, ("resources.kill_grace", 1.0), False),
        ({}, {"resources": {"killGrace": "1m"}}, ("resources.kill_grace", 2.0), True),
        (
            {"resources": {"output": None}},
            {"resources": {"output": None}},
            ("resources.output", None),
            False,
        ),
        # allowUnixSockets: false, or a list narrower than the one in force, tightens
        (
            {"network": {"allowUnixSockets": True}},
            {"network": {"allowUnixSockets": ["/run/a.sock"]}},
            ("network.allow_unix_sockets", ("/run/a.sock",)),
            False,
        ),
        (
            {"network": {"allowUnixSockets": ["/run/a.sock", "/run/b.sock"]}},
            {"network": {"allowUnixSockets": ["/run/b.sock"]}},
            ("network.allow_unix_sockets", ("/run/b.sock",)),
            False,
        ),
        (
            {"network": {"allowUnixSockets": ["/run/a.sock"]}},
            {"network": {"allowUnixSockets": ["/run/a.sock", "/run/docker.sock"]}},
            ("network.allow_unix_sockets", ("/run/a.sock",)),
            True,
        ),
        (
            {},
            {"network": {"allowUnixSockets": ["/run/docker.sock"]}},
            ("network.allow_unix_sockets", False),
            True,
        ),
        (
            {"network": {"allowUnixSockets": ["/run/a.sock"]}},
            {"network": {"allowUnixSockets": True}},
            ("network.allow_unix_sockets", ("/run/a.sock",)),
            True,
        ),
        (
            {"network": {"allowUnixSockets": ["/run/a.sock"]}},
            {"network": {"allowUnixSockets": False}},
            ("network.allow_unix_sockets", False),
            False,
        ),
        # always loosening scalars
        ({}, {"image": "evil:latest"}, ("image", None), True),
        ({"image": "a"}, {"image": "a"}, ("image", "a"), False),
    ],
)
def test_untrusted_scalars_apply_only_when_they_tighten(
    world: SettingsWorld, user: Any, project: Any, expected: tuple[str, Any], warned: bool
) -> None:
    resolved = load_untrusted(world, project, user)
    attr, value = expected
    actual: Any = resolved.policy
    for part in attr.split("."):
        actual = getattr(actual, part)
    assert actual == value
    ((section, content),) = project.items()
    key = f"{section}.{next(iter(content))}" if isinstance(content, dict) else section
    assert resolved.warnings == ((ignored(world, key),) if warned else ())


@pytest.mark.parametrize(
    ("user", "project", "backend", "warned"),
    [
        ({}, {"backend": "gvisor"}, "gvisor", False),  # kernel >= namespace
        ({}, {"backend": "microvm"}, "microvm", False),
        ({}, {"backend": "docker"}, "docker", False),  # namespace == namespace
        ({}, {"backend": "landlock"}, "auto", True),  # process < namespace
        ({}, {"backend": "none"}, "auto", True),
        ({"isolation": "process"}, {"backend": "seatbelt"}, "seatbelt", False),
        ({"backend": "gvisor"}, {"backend": "bubblewrap"}, "gvisor", True),  # below the current one
        ({"backend": "gvisor"}, {"backend": "auto"}, "gvisor", True),  # auto could pick weaker
        ({"backend": "bubblewrap"}, {"backend": "auto"}, "auto", False),
        ({}, {"isolation": "vm", "backend": "microvm"}, "microvm", False),
        ({}, {"isolation": "vm", "backend": "bubblewrap"}, "auto", True),  # below the new minimum
    ],
)
def test_an_untrusted_backend_must_be_at_least_as_strong(
    world: SettingsWorld, user: Any, project: Any, backend: str, warned: bool
) -> None:
    resolved = load_untrusted(world, project, user)
    assert resolved.policy.backend == backend
    assert resolved.warnings == ((ignored(world, "backend"),) if warned else ())


# ---------------------------------------------------------------- lists
@pytest.mark.parametrize(
    ("section", "key"),
    [("filesystem", "denyWrite"), ("filesystem", "protect"), ("network", "deny"), ("env", "deny")],
)
def test_untrusted_deny_lists_may_grow_but_not_shrink(
    world: SettingsWorld, section: str, key: str
) -> None:
    world.user({section: {key: ["keep-me"]}})
    resolved = load_untrusted(world, {section: {key: ["added", "!keep-me"]}})
    values = resolved.values[f"{section}.{key}"]
    assert "added" in values
    assert "keep-me" in values
    assert resolved.warnings == (ignored(world, f"{section}.{key}"),)


def test_untrusted_deny_read_may_grow_but_not_drop_built_in_rows(world: SettingsWorld) -> None:
    resolved = load_untrusted(world, {"filesystem": {"denyRead": ["/srv/secrets", "!~/.ssh"]}})
    deny_read = resolved.policy.filesystem.deny_read
    assert "/srv/secrets" in deny_read
    assert f"{world.home}/.ssh" in deny_read
    assert resolved.warnings == (ignored(world, "filesystem.denyRead"),)


@pytest.mark.parametrize(
    ("section", "key", "entry"),
    [
        ("filesystem", "allowWrite", "/data"),
        ("filesystem", "allowRead", "/data"),
        ("network", "allow", "example.com"),
        ("env", "pass", "AWS_*"),
        (None, "allowDegraded", "resources.memory"),
    ],
)
def test_untrusted_allow_lists_may_shrink_but_not_grow(
    world: SettingsWorld, section: str | None, key: str, entry: str
) -> None:
    def settings(entries: list[str]) -> dict[str, Any]:
        return {section: {key: entries}} if section else {key: entries}

    path = f"{section}.{key}" if section else key
    world.user(
        settings(
            ["/keep" if section == "filesystem" else "keep.example"]
            if key != "allowDegraded"
            else ["resources.pids"]
        )
    )
    before = list(world.load().values[path])
    resolved = load_untrusted(world, settings([entry]))
    assert resolved.values[path] == before
    assert resolved.warnings == (ignored(world, path),)

    resolved = load_untrusted(world, settings(["!" + before[0]]))
    assert before[0] not in resolved.values[path]
    assert resolved.warnings == ()


def test_one_warning_per_key_however_many_entries(world: SettingsWorld) -> None:
    resolved = load_untrusted(world, {"network": {"allow": ["a.com", "b.com", "c.com"]}})
    assert resolved.warnings == (ignored(world, "network.allow"),)


def test_untrusted_additions_already_present_are_not_reported(world: SettingsWorld) -> None:
    world.user({"network": {"allow": ["pypi.org"]}})
    resolved = load_untrusted(
        world, {"network": {"allow": ["pypi.org"]}, "env": {"pass": ["PATH"]}}
    )
    assert resolved.warnings == ()


def test_untrusted_credentials_may_be_removed_but_not_added(world: SettingsWorld) -> None:
    credential = {"name": "T", "from": "env:T", "commands": ["*"]}
    world.user({"credentials": [credential]})
    resolved = load_untrusted(
        world,
        {
            "credentials": [
                {"name": "T", "from": "env:OTHER", "commands": ["*"]},
                {"name": "U", "from": "env:U", "commands": ["*"]},
            ]
        },
    )
    assert resolved.policy.credentials == (Credential(name="T", source="env:T", commands=("*",)),)
    assert resolved.warnings == (ignored(world, "credentials"),)
    assert load_untrusted(world, {"credentials": ["!T"]}).policy.credentials == ()


# ---------------------------------------------------------------- maps and the rest
@pytest.mark.parametrize(
    ("project", "key"),
    [
        ({"env": {"set": {"LD_PRELOAD": "/evil.so"}}}, "env.set"),
        ({"caches": {"npm": "/"}}, "caches"),
        ({"rules": [{"match": "*", "network": {"mode": "open"}}]}, "rules"),
        ({"profiles": {"ci": {"network": {"mode": "open"}}}}, "profiles"),
        ({"filesystem": {"workspace": "/"}}, "filesystem.workspace"),
    ],
)
def test_untrusted_always_loosening_keys_are_ignored(
    world: SettingsWorld, project: Any, key: str
) -> None:
    before = world.load().values[key]
    resolved = load_untrusted(world, project)
    assert resolved.values[key] == before
    assert resolved.warnings == (ignored(world, key),)


def test_untrusted_map_removals_are_ignored_too(world: SettingsWorld) -> None:
    world.user({"env": {"set": {"A": "1"}}})
    resolved = load_untrusted(world, {"env": {"set": {"A": None, "B": None}}})
    assert resolved.policy.env.set == (("A", "1"),)
    assert resolved.warnings == (ignored(world, "env.set"),)


def test_untrusted_rules_do_not_apply(world: SettingsWorld) -> None:
    world.project({"rules": [{"match": "*", "network": {"mode": "open"}}]})
    resolved = world.load(command="curl evil.example")
    assert resolved.matched_rules == ()
    assert resolved.policy.network.mode == "none"


def test_selecting_an_untrusted_profile_says_how_to_trust_it(world: SettingsWorld) -> None:
    world.project({"profiles": {"dev": {"network": {"mode": "open"}}}})
    with pytest.raises(SettingsError) as info:
        world.load(profile="dev")
    assert info.value.hint == (
        "it is defined in an untrusted project file; run 'corral trust' to accept it"
    )


def test_the_local_file_is_untrusted_too(world: SettingsWorld) -> None:
    world.local({"network": {"mode": "open"}})
    resolved = world.load()
    assert resolved.policy.network.mode == "none"
    assert resolved.warnings == (ignored(world, "network.mode", world.local_file),)


# ---------------------------------------------------------------- trust
LOOSE = {
    "network": {"mode": "open", "allow": ["example.com"]},
    "resources": {"memory": None},
    "env": {"set": {"CI": "1"}},
}


def test_a_trusted_project_may_loosen(world: SettingsWorld) -> None:
    world.project(LOOSE)
    assert world.trust() == [world.project_file]
    resolved = world.load()
    assert resolved.warnings == ()
    assert resolved.policy.network.mode == "open"
    assert resolved.policy.resources.memory is None
    assert resolved.policy.env.set == (("CI", "1"),)
    project = next(layer for layer in resolved.layers if layer.name == "project")
    assert project.trusted


def test_a_changed_project_file_is_untrusted_again(world: SettingsWorld) -> None:
    world.project(LOOSE)
    world.trust()
    world.project({**LOOSE, "image": "x"})
    resolved = world.load()
    assert resolved.policy.network.mode == "none"
    assert ignored(world, "network.mode") in resolved.warnings
    project = next(layer for layer in resolved.layers if layer.name == "project")
    assert not project.trusted


def test_trust_covers_each_file_separately(world: SettingsWorld) -> None:
    world.project({"network": {"mode": "open"}})
    world.trust()
    world.local({"network": {"allow": ["example.com"]}})
    resolved = world.load()
    assert resolved.policy.network.mode == "open"
    assert resolved.policy.network.allow == ()
    assert resolved.warnings == (ignored(world, "network.allow", world.local_file),)


def test_malformed_trust_records_leave_everything_untrusted(world: SettingsWorld) -> None:
    world.project({"network": {"mode": "open"}})
    world.trust()
    world.write(world.trust_file, "{not json")
    resolved = world.load()
    assert resolved.policy.network.mode == "none"
    assert resolved.warnings[0].startswith(f"ignoring malformed trust records {world.trust_file}: ")
    assert resolved.warnings[0].endswith("treating project settings as untrusted")


def test_unreadable_trust_records_leave_everything_untrusted(world: SettingsWorld) -> None:
    world.project({"network": {"mode": "open"}})
    os.makedirs(world.trust_file)
    resolved = world.load()
    assert resolved.policy.network.mode == "none"
    assert resolved.warnings[0] == (
        f"cannot read trust records {world.trust_file}: not a regular file; "
        "treating project settings as untrusted"
    )


def test_a_trusted_project_cannot_move_the_workspace(world: SettingsWorld) -> None:
    world.project({"filesystem": {"workspace": world.workspace}})
    world.trust()
    assert world.load().workspace == world.workspace  # the same workspace is fine
    world.project({"filesystem": {"workspace": "/"}})
    with pytest.raises(SettingsError, match="cannot move the workspace"):
        world.trust()
    with pytest.raises(SettingsError, match="cannot move the workspace"):
        _trusted_load(world)


def _trusted_load(world: SettingsWorld) -> Any:
    """Trust the current project file by hand (trust_project refuses this one) and load."""
    import json

    from corral.policy._digest import sha256_hex

    with open(world.project_file, "rb") as file:
        digest = sha256_hex(file.read())
    world.write(
        world.trust_file,
        json.dumps({"version": 1, "files": {world.project_file: {"sha256": digest}}}),
    )
    return world.load()


def test_untrusted_removals_of_missing_entries_are_silent(world: SettingsWorld) -> None:
    resolved = load_untrusted(
        world, {"filesystem": {"denyRead": ["!/not/there"]}, "network": {"allow": ["!not.there"]}}
    )
    assert resolved.warnings == ()
