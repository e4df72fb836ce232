"""CORRAL_HANDOFF: what corral-client tells the Python CLI it already learned."""

from __future__ import annotations

import pytest

from corral.cli._client import take_handoff


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("no-server", ("no-server", [])),
        ("stale", ("stale", [])),
        ("refused:15", ("refused", [15])),
        ("no-server:2,1,2", ("no-server", [2, 1, 2])),
    ],
)
def test_a_handoff_is_read_and_removed(value: str, expected: tuple[str, list[int]]) -> None:
    environ = {"CORRAL_HANDOFF": value, "KEEP": "1"}
    assert take_handoff(environ) == expected
    assert environ == {"KEEP": "1"}


@pytest.mark.parametrize("value", ["", "served", "stale:", "refused:9", "stale:x", "stale:2;3"])
def test_a_malformed_handoff_is_removed_and_ignored(value: str) -> None:
    environ = {"CORRAL_HANDOFF": value}
    assert take_handoff(environ) is None
    assert environ == {}


def test_no_handoff() -> None:
    assert take_handoff({}) is None
