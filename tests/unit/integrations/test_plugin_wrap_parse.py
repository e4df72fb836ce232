"""wrap-plugin parses what it trusts: the word splitter and the profile check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.integrations._shell import join
from corral.integrations.plugin_wrap import profile_problem, split_words

CORRAL = ("/opt/corral/bin/corral",)
PLUGIN = "/p/plug"
PROFILE = ["run", "--net", "none", "--read-only", "--deny-write", PLUGIN]


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=8)))
def test_split_words_reads_back_what_join_wrote(argv: list[str]) -> None:
    assert split_words(join(argv)) == argv


@pytest.mark.parametrize(
    "command",
    ["a; b", "a && b", "a $(b)", "a `b`", "a > f", "a 'unterminated", "a\tb", "a\nb"],
)
def test_split_words_refuses_other_shell_syntax(command: str) -> None:
    assert split_words(command) is None


def check(*words: str, kind: str = "hook") -> str | None:
    return profile_problem([*CORRAL, *words], kind=kind, plugin_dir=PLUGIN, launchers=[CORRAL])


def test_the_restrictive_profile_is_wrapped() -> None:
    assert check(*PROFILE, "--env", "X", "--shell", "bash", "-c", "cmd") is None
    assert check(*PROFILE, "--timeout", "none", "--", "srv", "-x", kind="mcp-server") is None
    allow = ["run", "--allow-host", "pypi.org", "--deny-write", PLUGIN, "--shell", "bash"]
    assert check(*allow, "-c", "x") is None


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (["--backend", "none"], "--backend is not an option"),
        (["--net", "open"], "--net is not an option"),
        (["--allow-write", "/"], "--allow-write is not an option"),
        (["--allow-degraded", "resources.memory"], "--allow-degraded is not an option"),
        (["--settings", "/tmp/s.json"], "--settings is not an option"),
        (["--profile", "loose"], "--profile is not an option"),
        (["--timeout", "none"], "--timeout is not an option"),  # hooks keep their timeout
        (["--env", "A=$(x)"], None),  # a value is set inside the sandbox only
        (["--env", "1X"], "--env is not an option"),
    ],
)
def test_weakening_options_are_not_wrapped(extra: list[str], reason: str | None) -> None:
    problem = check(*PROFILE, *extra, "--shell", "bash", "-c", "cmd")
    assert problem == reason or (reason is not None and problem is not None and reason in problem)


def test_the_launcher_and_the_shape_are_checked() -> None:
    assert check(*PROFILE, "--shell", "bash", "-c", "a", "b") == "not one command after -c"
    assert check(*PROFILE, "--shell", "sh", "-c", "a") is not None
    assert check("shell", "--shell", "bash", "-c", "a") == "not 'corral run'"
    other = profile_problem(
        ["/p/plug/bin/corral", *PROFILE, "--shell", "bash", "-c", "a"],
        kind="hook",
        plugin_dir=PLUGIN,
        launchers=[CORRAL],
    )
    assert other == "not started by this installation's corral"
    assignment = split_words(f"CORRAL_BACKEND=none {join([*CORRAL, *PROFILE])} --shell bash -c a")
    assert assignment is not None
    assert profile_problem(assignment, kind="hook", plugin_dir=PLUGIN, launchers=[CORRAL]) == (
        "not started by this installation's corral"
    )
    no_deny = ["run", "--net", "none", "--shell", "bash", "-c", "a"]
    assert check(*no_deny) == "the plugin directory is not read-only"
    no_net = ["run", "--deny-write", PLUGIN, "--shell", "bash", "-c", "a"]
    assert check(*no_net) == "the network is neither off nor an allowlist"
