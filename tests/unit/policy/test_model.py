"""The policy model and the built-in defaults."""

from __future__ import annotations

import pickle

import pytest

from corral._frozen import FrozenInstanceError
from corral.policy import (
    ENV_PASS,
    ISOLATION_LEVELS,
    PROTECTED_PATTERNS,
    SECRET_PATHS,
    Policy,
    ResourceLimits,
    default_policy,
    isolation_rank,
)
from corral.policy._defaults import DEFAULT_RESOURCES, expand_home


def test_isolation_levels_are_ranked_weakest_first() -> None:
    ranks = [isolation_rank(level) for level in ISOLATION_LEVELS]
    assert ranks == sorted(ranks)
    assert isolation_rank("vm") > isolation_rank("kernel") > isolation_rank("namespace")
    with pytest.raises(ValueError):
        isolation_rank("bogus")


def test_policy_for_workspace_is_the_default_policy() -> None:
    policy = Policy.for_workspace("/src/app", home="/home/me")
    assert policy == default_policy("/src/app", home="/home/me")
    assert policy.filesystem.workspace == "/src/app"
    assert policy.filesystem.deny_read[0] == "/home/me/.ssh"
    assert policy.resources == ResourceLimits(
        memory=8 << 30, pids=4096, timeout=3600.0, output=64 << 20
    )


def test_policies_are_frozen_hashable_and_picklable() -> None:
    policy = default_policy("/w", home="/h")
    with pytest.raises(FrozenInstanceError):
        policy.backend = "none"  # type: ignore[misc]
    assert hash(policy) == hash(default_policy("/w", home="/h"))
    assert pickle.loads(pickle.dumps(policy)) == policy


@pytest.mark.parametrize("table", [SECRET_PATHS, PROTECTED_PATTERNS, ENV_PASS])
def test_every_default_row_has_a_reason(table: tuple[tuple[str, str], ...]) -> None:
    for item, reason in table:
        assert item
        assert reason.strip()


def test_every_default_limit_has_a_reason() -> None:
    for name, value, reason in DEFAULT_RESOURCES:
        assert hasattr(ResourceLimits(), name)
        assert value
        assert reason.strip()


@pytest.mark.parametrize(
    ("path", "expected"),
    [("~", "/home/me"), ("~/.ssh", "/home/me/.ssh"), ("/etc", "/etc"), ("~bob", "~bob")],
)
def test_expands_home(path: str, expected: str) -> None:
    assert expand_home(path, "/home/me") == expected
