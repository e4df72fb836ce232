"""The run-option parser: settings-shaped flags, the command, errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral._exceptions import UsageError
from corral.cli._options import RUN_OPTIONS, option_for_key, parse_run_options


def test_command_after_double_dash_or_first_word() -> None:
    assert parse_run_options(["--", "ls", "-la"]).argv == ["ls", "-la"]
    assert parse_run_options(["--read-only", "ls", "--", "-x"]).argv == ["ls", "--", "-x"]
    opts = parse_run_options(["-c", "echo hi | wc"])
    assert opts.shell == "echo hi | wc" and opts.argv == []


def test_flags_take_the_settings_shape() -> None:
    opts = parse_run_options(
        [
            "--memory",
            "512M",
            "--pids=64",
            "--cpus",
            "1.5",
            "--timeout",
            "30s",
            "--max-output",
            "none",
            "--allow-write",
            "/a",
            "--allow-write",
            "/b",
            "--deny-read",
            "/s",
            "--net",
            "open",
            "--env",
            "FOO=bar",
            "--env",
            "LANGUAGE",
            "--read-only",
            "--backend",
            "bubblewrap",
            "--allow-degraded",
            "resources.memory",
            "--",
            "true",
        ]
    )
    assert opts.flags == {
        "resources": {"memory": "512M", "pids": 64, "cpus": 1.5, "timeout": "30s", "output": None},
        "filesystem": {"allowWrite": ["/a", "/b"], "denyRead": ["/s"], "readOnly": True},
        "network": {"mode": "open"},
        "env": {"set": {"FOO": "bar"}, "pass": ["LANGUAGE"]},
        "backend": "bubblewrap",
        "allowDegraded": ["resources.memory"],
    }


def test_allow_host_implies_allowlist_mode() -> None:
    opts = parse_run_options(["--allow-host", "pypi.org", "--", "pip", "download", "x"])
    assert opts.flags["network"] == {"mode": "allowlist", "allow": ["pypi.org"]}


def test_special_options() -> None:
    opts = parse_run_options(
        [
            "--profile",
            "ci",
            "--settings",
            "a.json",
            "--json-out",
            "o.json",
            "--agent-session",
            "s1",
            "--",
            "true",
        ]
    )
    assert (opts.profile, opts.settings_files, opts.json_out, opts.agent_session) == (
        "ci",
        ["a.json"],
        "o.json",
        "s1",
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memroy", "1G", "--", "x"], "did you mean --memory"),
        (["--memory"], "needs a value"),
        (["--pids", "lots", "--", "x"], "not a number"),
        (["--read-only=yes", "--", "x"], "takes no value"),
        (["--env", "=x", "--", "x"], "NAME or NAME=VALUE"),
        (["-c", "x", "y"], "not both"),
        ([], "no command given"),
    ],
)
def test_errors(args: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_run_options(args)


def test_extra_options_and_optional_command() -> None:
    opts = parse_run_options(
        ["--explain", "--id", "p1"],
        extra={"--explain": "flag", "--id": "value"},
        command_required=False,
    )
    assert opts.extra == {"--explain": True, "--id": "p1"} and opts.argv == []


def test_every_settings_target_maps_back_to_its_option() -> None:
    for option, _kind, target, _help in RUN_OPTIONS:
        if not target.startswith("@"):
            assert option_for_key(target) == option
    assert option_for_key("env.set.FOO") == "--env"
    assert option_for_key("filesystem.allowWrite[2]") == "--allow-write"
    assert option_for_key("nope") is None


def test_command_file_is_read_like_a_c_string(tmp_path: Path) -> None:
    path = tmp_path / "cmd"
    path.write_bytes("echo 'it\\'s'\ngit status \xe2\x80\x8b".encode("latin-1"))
    opts = parse_run_options(["--shell", "bash", "--command-file", str(path)])
    assert opts.shell == os.fsdecode(path.read_bytes()) and opts.shell_program == "bash"


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (None, (), "No such file or directory"),
        (b"a\0b", (), "NUL byte"),
        (b"true", ("-c", "true"), "not both"),
    ],
    ids=["missing", "nul", "with-c"],
)
def test_bad_command_files_are_usage_errors(
    tmp_path: Path, content: bytes | None, args: tuple[str, ...], message: str
) -> None:
    path = tmp_path / "cmd"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UsageError, match=message):
        parse_run_options([*args, "--command-file", str(path)])
    if content is not None and args:
        with pytest.raises(UsageError, match=message):
            parse_run_options(["--command-file", str(path), *args])
