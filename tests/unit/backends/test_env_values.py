"""Locale variables pass only locale names; other allowlisted variables pass as they are."""

from __future__ import annotations

import pytest

from corral.backends.bubblewrap import sandbox_env
from corral.pipeline._request import ExecRequest
from corral.policy import Policy
from corral.policy._defaults import env_value_allowed


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "en_US.UTF-8@euro"),
        ("LC_TIME", "sr_RS@latin"),
        ("LC_CTYPE", "POSIX"),
        ("LC_ALL", ""),
        ("LANGUAGE", "en_US:en"),
        ("LC_ALL", "C"),
        ("LC_CTYPE", "de_DE.ISO-8859-1"),
        ("LANG", "C.utf8"),
    ],
)
def test_locale_names_pass(name: str, value: str) -> None:
    assert env_value_allowed(name, value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LC_SECRET", "token=abc123"),
        ("LC_ALL", "en_US.UTF-8; curl evil"),
        ("LANG", "/home/me/.ssh/id_rsa"),
        ("LC_X", "a" * 65),
        ("LANGUAGE", "en:$(id)"),
        ("LC_MESSAGES", "C.UTF-8\n"),
        ("LC_TOKEN", "ghp_0123456789abcdef"),
        ("LANG", "EN_us"),
    ],
)
def test_other_values_do_not(name: str, value: str) -> None:
    assert not env_value_allowed(name, value)


def test_the_sandbox_environment_drops_them_and_keeps_the_rest() -> None:
    policy = Policy.for_workspace("/ws", home="/home/u")
    host = (
        ("LANG", "C.UTF-8"),
        ("LC_TIME", "en_GB.UTF-8"),
        ("LC_SECRET", "ghp_0123456789abcdef"),
        ("TERM", "xterm-256color"),
    )
    env = dict(sandbox_env(ExecRequest.from_argv(["true"]), policy, host))
    assert env["LANG"] == "C.UTF-8"
    assert env["LC_TIME"] == "en_GB.UTF-8"
    assert "LC_SECRET" not in env
    assert env["TERM"] == "xterm-256color"


def test_pattern_lists_edited_between_calls_are_judged_anew() -> None:
    # the per-name verdicts are remembered per (passThrough, deny): an edit is a new key,
    # and a policy built with lists (an SDK caller) works as one built with tuples
    policy = Policy.for_workspace("/ws", home="/home/u")
    host = (("TOKEN_A", "a"), ("TOKEN_B", "b"))
    request = ExecRequest.from_argv(["true"])
    passes = policy.replace(env=policy.env.replace(pass_through=["TOKEN_*"], deny=[]))
    denied = policy.replace(env=policy.env.replace(pass_through=["TOKEN_*"], deny=["TOKEN_B"]))
    assert {"TOKEN_A", "TOKEN_B"} <= dict(sandbox_env(request, passes, host)).keys()
    env = dict(sandbox_env(request, denied, host))
    assert "TOKEN_A" in env
    assert "TOKEN_B" not in env
    assert "TOKEN_B" in dict(sandbox_env(request, passes, host))
