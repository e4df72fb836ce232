"""Every way a settings file can be wrong gives one clear SettingsError.

Each error names the file, the dotted key path and, where it helps, the fix.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from corral import _exceptions
from corral.policy import _files

from .conftest import SettingsWorld

SettingsError = _exceptions.SettingsError


def user_error(world: SettingsWorld, data: Any) -> SettingsError:
    world.user(data)
    with pytest.raises(SettingsError) as info:
        world.load()
    return info.value


# ---------------------------------------------------------------- JSON
def test_malformed_json_names_line_and_column(world: SettingsWorld) -> None:
    err = user_error(world, '{\n  "backend": "auto",,\n}')
    assert str(err).startswith(f"{world.user_file}: malformed JSON at line 2 column 21: ")
    assert err.source == world.user_file
    assert err.hint is not None
    assert "no trailing commas" in err.hint


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"backend": "auto", // comment\n}', "line 1 column 21"),
        ('{"backend": "auto",}', "line 1 column 20"),
        ('{"backend": "auto", "backend": "none"}', "duplicate key 'backend'"),
        ('{"resources": {"cpus": NaN}}', "NaN is not valid JSON"),
        ("{} {}", "unexpected data after the JSON value"),
        ("", "expected a JSON value, found nothing"),
        (b'{"image": "\x00"}', "line 1 column 12"),
        (b"\xff{}", "invalid UTF-8"),
    ],
)
def test_rejects_malformed_json(world: SettingsWorld, text: Any, reason: str) -> None:
    err = user_error(world, text)
    assert "malformed JSON" in str(err)
    assert reason in str(err)


def test_rejects_a_non_object_top_level(world: SettingsWorld) -> None:
    err = user_error(world, [])
    assert str(err) == f"{world.user_file}: expected a JSON object at the top level, got an array"


# ---------------------------------------------------------------- keys
def test_unknown_key_suggests_the_closest_name(world: SettingsWorld) -> None:
    err = user_error(world, {"filesystem": {"alowWrite": ["/data"]}})
    assert str(err) == (
        f'{world.user_file}: filesystem.alowWrite: unknown key (did you mean "allowWrite"?)'
    )
    assert err.key == "filesystem.alowWrite"
    assert err.hint is not None
    assert err.hint.startswith("valid keys in filesystem: workspace,")


def test_unknown_top_level_key_without_a_close_match(world: SettingsWorld) -> None:
    err = user_error(world, {"zzz": 1})
    assert str(err) == f"{world.user_file}: zzz: unknown key"
    assert err.hint is not None
    assert err.hint.startswith("valid keys at the top level: isolation,")


def test_unknown_integration_tool_lists_the_known_ones(world: SettingsWorld) -> None:
    err = user_error(world, {"integrations": {"cursor": {}}})
    assert err.key == "integrations.cursor"
    assert err.hint is not None
    assert err.hint.startswith("valid keys in integrations: claudeCode, mcp")


def test_odd_key_names_are_quoted(world: SettingsWorld) -> None:
    err = user_error(world, {"a.b\x01": 1})
    assert err.key == '"a.b\\u0001"'


def test_a_section_must_be_an_object(world: SettingsWorld) -> None:
    err = user_error(world, {"network": ["open"]})
    assert str(err) == f"{world.user_file}: network: expected an object, got an array"


def test_accepts_and_ignores_a_schema_reference(world: SettingsWorld) -> None:
    world.user({"$schema": "../schema/corral-settings.schema.json"})
    world.load()
    err = user_error(world, {"$schema": 3})
    assert err.key == "$schema"


# ---------------------------------------------------------------- values
@pytest.mark.parametrize(
    ("data", "key", "message"),
    [
        (
            {"filesystem": {"readOnly": "yes"}},
            "filesystem.readOnly",
            'expected true or false, got "yes"',
        ),
        ({"resources": {"memory": "lots"}}, "resources.memory", 'expected a size such as "512M"'),
        ({"resources": {"memory": 0}}, "resources.memory", "greater than zero"),
        ({"resources": {"output": "1.5"}}, "resources.output", "whole number"),
        ({"resources": {"timeout": "2d"}}, "resources.timeout", 'unknown duration unit "d"'),
        ({"resources": {"cpuTime": "1m1h"}}, "resources.cpuTime", "largest unit to the smallest"),
        ({"resources": {"killGrace": None}}, "resources.killGrace", "expected a duration"),
        ({"resources": {"pids": 0}}, "resources.pids", "must be greater than zero, got 0"),
        ({"resources": {"pids": 1.5}}, "resources.pids", "expected a whole number, got 1.5"),
        ({"resources": {"pids": True}}, "resources.pids", "expected a whole number, got true"),
        ({"resources": {"pids": 1 << 40}}, "resources.pids", "is too large"),
        ({"resources": {"cpus": "2"}}, "resources.cpus", 'expected a number, got "2"'),
        ({"resources": {"cpus": 0}}, "resources.cpus", "must be greater than zero, got 0"),
        ({"isolation": "kernal"}, "isolation", 'unknown value "kernal" (did you mean "kernel"?)'),
        ({"isolation": 3}, "isolation", "expected one of: process, namespace, kernel, vm, got 3"),
        (
            {"backend": "bubblewarp"},
            "backend",
            'unknown backend "bubblewarp" (did you mean "bubblewrap"?)',
        ),
        ({"network": {"mode": "closed"}}, "network.mode", 'unknown value "closed"'),
        ({"image": ""}, "image", "expected a string, got an empty string"),
        ({"image": "a\u0000b"}, "image", "contains a NUL byte"),
        (
            {"filesystem": {"allowWrite": "/data"}},
            "filesystem.allowWrite",
            'expected an array of paths, got "/data"',
        ),
        ({"filesystem": {"allowWrite": [3]}}, "filesystem.allowWrite[0]", "expected a path, got 3"),
        (
            {"filesystem": {"allowWrite": ["/ok", "/x\u0000"]}},
            "filesystem.allowWrite[1]",
            "contains a NUL byte",
        ),
        (
            {"filesystem": {"denyRead": ["~bob/.ssh"]}},
            "filesystem.denyRead[0]",
            'only "~/" is expanded',
        ),
        (
            {"filesystem": {"denyRead": ["!"]}},
            "filesystem.denyRead[0]",
            '"!" must be followed by the entry to remove',
        ),
        (
            {"filesystem": {"denyWrite": ["[abc"]}},
            "filesystem.denyWrite[0]",
            "invalid glob \"[abc\": unclosed '[' at position 0",
        ),
        (
            {"filesystem": {"protect": ["../outside/**"]}},
            "filesystem.protect[0]",
            '".." is not allowed in a path glob',
        ),
        ({"filesystem": {"protect": ["./"]}}, "filesystem.protect[0]", "names no path"),
        ({"filesystem": {"protect": ["~bob/x"]}}, "filesystem.protect[0]", 'only "~/" is expanded'),
        (
            {"network": {"allow": ["exa mple.com"]}},
            "network.allow[0]",
            "is not a valid host pattern: the host contains spaces or control characters",
        ),
        ({"network": {"allow": ["*.com"]}}, "network.allow[0]", '"*.com" is too broad'),
        ({"network": {"allow": ["*"]}}, "network.allow[0]", "allows every host"),
        ({"network": {"allow": ["10.0.0.1/8"]}}, "network.allow[0]", "bits set beyond"),
        ({"network": {"allow": {"a": 1}}}, "network.allow", "expected an array of hosts"),
        ({"env": {"pass": ["A=B"]}}, "env.pass[0]", 'cannot contain "="'),
        ({"env": {"deny": ["[x"]}}, "env.deny[0]", "invalid glob"),
        ({"env": {"set": []}}, "env.set", "expected an object, got an array"),
        ({"env": {"set": {"A=B": "x"}}}, "env.set.A=B", 'cannot contain "="'),
        ({"env": {"set": {"A": 1}}}, "env.set.A", "expected a string, got 1"),
        ({"caches": {"a/b": "/c"}}, "caches.a/b", 'cannot contain "/"'),
        ({"caches": {"..": "/c"}}, 'caches.".."', 'cannot contain "/"'),
        ({"caches": {"npm": 3}}, "caches.npm", "expected a path"),
        (
            {"allowDegraded": ["resources.memroy"]},
            "allowDegraded[0]",
            'unknown key "resources.memroy" (did you mean "resources.memory"?)',
        ),
        ({"profiles": {"ci": []}}, "profiles.ci", "expected an object of overrides"),
        (
            {"profiles": {"ci": {"profiles": {}}}},
            "profiles.ci.profiles",
            "cannot be set in a profile",
        ),
        (
            {"profiles": {"ci": {"resources": {"memroy": 1}}}},
            "profiles.ci.resources.memroy",
            'unknown key (did you mean "memory"?)',
        ),
        (
            {"profiles": {"ci": {"filesystem": {"workspace": "/x"}}}},
            "profiles.ci.filesystem.workspace",
            "cannot be set in a profile",
        ),
    ],
)
def test_rejects_invalid_values(world: SettingsWorld, data: Any, key: str, message: str) -> None:
    err = user_error(world, data)
    assert err.key == key
    assert message in err.message
    assert err.message.startswith(f"{world.user_file}: {key}: ")


@pytest.mark.parametrize(
    ("credential", "key", "message"),
    [
        ("npm", "credentials[0]", 'expected a credential {"name": ..., "from": ...} or "!NAME"'),
        (
            {"name": "T", "from": "env:T", "commands": ["*"], "scope": 1},
            "credentials[0].scope",
            "unknown key",
        ),
        (
            {"name": "T", "form": "env:T", "commands": ["*"]},
            "credentials[0].form",
            'unknown key (did you mean "from"?)',
        ),
        ({"from": "env:T", "commands": ["*"]}, "credentials[0]", 'a credential needs "name"'),
        ({"name": "T", "commands": ["*"]}, "credentials[0]", 'a credential needs "from"'),
        ({"name": "T", "from": "env:T"}, "credentials[0]", 'a credential needs "commands"'),
        (
            {"name": "T", "from": "env:T", "commands": []},
            "credentials[0].commands",
            "must name at least one command glob",
        ),
        (
            {"name": "T", "from": "env:T", "commands": "npm*"},
            "credentials[0].commands",
            "expected an array",
        ),
        (
            {"name": "T", "from": "env:T", "commands": ["[x"]},
            "credentials[0].commands[0]",
            "invalid glob",
        ),
        (
            {"name": "T=1", "from": "env:T", "commands": ["*"]},
            "credentials[0].name",
            'cannot contain "="',
        ),
        (
            {"name": "T", "from": "vault:T", "commands": ["*"]},
            "credentials[0].from",
            'expected "env:NAME" or "file:/path", got "vault:T"',
        ),
        (
            {"name": "T", "from": "env:", "commands": ["*"]},
            "credentials[0].from",
            'expected "env:NAME" or "file:/path"',
        ),
        (
            {"name": "T", "from": "file:token.txt", "commands": ["*"]},
            "credentials[0].from",
            "must be absolute or start with ~/",
        ),
        (
            {"name": "T", "from": "env:T", "commands": ["*"], "hosts": ["a b"]},
            "credentials[0].hosts[0]",
            "contains spaces",
        ),
        (
            {"name": "T", "from": "env:T", "commands": ["*"], "hosts": ["*.ngrok.io"]},
            "credentials[0].hosts[0]",
            "tunnel service",
        ),
        (
            {"name": "T", "from": "env:T", "commands": ["*"], "mode": "proxy"},
            "credentials[0].mode",
            'unknown mode "proxy"',
        ),
    ],
)
def test_rejects_invalid_credentials(
    world: SettingsWorld, credential: Any, key: str, message: str
) -> None:
    err = user_error(world, {"credentials": [credential]})
    assert err.key == key
    assert message in err.message


@pytest.mark.parametrize(
    ("rule", "key", "message"),
    [
        ("pytest*", "rules[0]", "expected a rule"),
        ({"isolation": "vm"}, "rules[0]", 'a rule needs "match", a command glob'),
        ({"match": "[py", "isolation": "vm"}, "rules[0].match", "invalid glob"),
        ({"match": "py*", "mach": 1}, "rules[0].mach", 'unknown key (did you mean "match"?)'),
        ({"match": "py*", "rules": []}, "rules[0].rules", "cannot be set in a rule"),
        (
            {"match": "py*", "filesystem": {"workspace": "/x"}},
            "rules[0].filesystem.workspace",
            "cannot be set in a rule",
        ),
        (
            {"match": "py*", "resources": {"memory": "x"}},
            "rules[0].resources.memory",
            "expected a size",
        ),
    ],
)
def test_rejects_invalid_rules(world: SettingsWorld, rule: Any, key: str, message: str) -> None:
    err = user_error(world, {"rules": [rule]})
    assert err.key == key
    assert message in err.message


def test_rejects_a_rule_removal_that_is_not_a_glob(world: SettingsWorld) -> None:
    err = user_error(world, {"rules": ["![x"]})
    assert err.key == "rules[0]"


# ---------------------------------------------------------------- files
def test_an_unreadable_file_is_an_error(
    world: SettingsWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.user({})
    real_open = os.open

    def deny(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        full = (
            path if dir_fd is None else os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        )
        if full == world.user_file:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr("corral.policy._files.os.open", deny)
    with pytest.raises(SettingsError) as info:
        world.load()
    assert str(info.value) == f"{world.user_file}: cannot read the file: Permission denied"


def test_a_directory_in_place_of_a_file_is_an_error(world: SettingsWorld) -> None:
    os.makedirs(world.project_file)
    with pytest.raises(SettingsError, match="cannot read the file: not a regular file"):
        world.load()


def test_a_fifo_in_place_of_a_file_is_an_error_not_a_hang(world: SettingsWorld) -> None:
    os.makedirs(os.path.dirname(world.user_file))
    os.mkfifo(world.user_file)
    with pytest.raises(SettingsError, match="not a regular file"):
        world.load()


def test_an_oversized_file_is_an_error(world: SettingsWorld) -> None:
    world.user(b" " * (_files.MAX_FILE_SIZE + 1))
    with pytest.raises(SettingsError, match="larger than"):
        world.load()


def test_a_named_settings_file_must_exist(world: SettingsWorld) -> None:
    with pytest.raises(SettingsError) as info:
        world.load(settings_files=["nope.json"])
    assert str(info.value) == f"{world.workspace}/nope.json: settings file not found"


def test_corral_settings_must_exist(world: SettingsWorld) -> None:
    world.environ["CORRAL_SETTINGS"] = "/nonexistent/settings.json"
    with pytest.raises(
        SettingsError, match=r"/nonexistent/settings\.json: settings file not found"
    ):
        world.load()


def test_an_invalid_environment_value_names_the_variable(world: SettingsWorld) -> None:
    world.environ["CORRAL_BACKEND"] = "podmn"
    with pytest.raises(SettingsError) as info:
        world.load()
    assert str(info.value) == (
        'environment CORRAL_BACKEND: backend: unknown backend "podmn" (did you mean "podman"?)'
    )


def test_flags_are_validated_like_files(world: SettingsWorld) -> None:
    with pytest.raises(SettingsError) as info:
        world.load(flags={"resources": {"memory": "-1G"}})
    assert str(info.value).startswith("flags: resources.memory: a size must be greater than zero")
    assert info.value.hint == "use null for no limit"


# ---------------------------------------------------------------- workspace
def test_a_missing_workspace_is_an_error(world: SettingsWorld) -> None:
    with pytest.raises(SettingsError) as info:
        world.load(workspace="/nonexistent/project")
    assert (
        str(info.value)
        == "flags: filesystem.workspace: workspace /nonexistent/project does not exist"
    )
    assert info.value.hint is not None


def test_a_workspace_that_is_a_file_is_an_error(world: SettingsWorld) -> None:
    path = world.write("file.txt", "x")
    world.user({"filesystem": {"workspace": path}})
    with pytest.raises(SettingsError, match=r"workspace .*file.txt is not a directory"):
        world.load()


def test_a_bad_workspace_value_is_reported_against_its_file(world: SettingsWorld) -> None:
    world.user({"filesystem": {"workspace": 7}})
    with pytest.raises(SettingsError) as info:
        world.load()
    assert str(info.value) == f"{world.user_file}: filesystem.workspace: expected a path, got 7"


def test_null_is_named_in_type_errors(world: SettingsWorld) -> None:
    err = user_error(world, {"filesystem": {"readOnly": None}})
    assert err.message.endswith("filesystem.readOnly: expected true or false, got null")


def test_long_values_are_shortened_in_messages(world: SettingsWorld) -> None:
    err = user_error(world, {"isolation": "x" * 100})
    assert f'"{"x" * 57}..."' in err.message


@pytest.mark.parametrize(
    ("value", "key", "words"),
    [
        ("yes", "network.allowUnixSockets", "true, false or a list of socket paths"),
        ([], "network.allowUnixSockets", "at least one socket path"),
        (["run/a.sock"], "network.allowUnixSockets[0]", "not an absolute path"),
        (["/run/a.sock", 5], "network.allowUnixSockets[1]", "expected a socket path"),
        (["/"], "network.allowUnixSockets[0]", "not a socket"),
    ],
)
def test_a_wrong_unix_socket_list_names_the_entry(
    world: SettingsWorld, value: Any, key: str, words: str
) -> None:
    err = user_error(world, {"network": {"allowUnixSockets": value}})
    assert err.key == key
    assert words in str(err)


def test_a_unix_socket_list_is_normalised(world: SettingsWorld) -> None:
    world.user({"network": {"allowUnixSockets": ["/run//pg/./a.sock", "/run/pg/a.sock", "~/s"]}})
    sockets = world.load().policy.network.allow_unix_sockets
    assert sockets == ("/run/pg/a.sock", os.path.join(world.home, "s"))
