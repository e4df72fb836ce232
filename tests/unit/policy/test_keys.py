"""The key table: every row is consistent, and bad rows are refused."""

from __future__ import annotations

import re

import pytest

from corral.policy import BACKENDS, KEYS, Key, KeyTable, default_policy
from corral.policy import _keys as k


def test_lists_every_backend_of_the_design() -> None:
    assert set(BACKENDS) == {
        "auto",
        "bubblewrap",
        "landlock",
        "gvisor",
        "podman",
        "docker",
        "microvm",
        "boxlite",
        "firecracker",
        "seatbelt",
        "none",
    }


def test_every_policy_attribute_exists_on_the_default_policy() -> None:
    policy = default_policy("/ws", home="/home/u")
    for row in KEYS.rows:
        if row.attr is None:
            continue
        value: object = policy
        for part in row.attr.split("."):
            value = getattr(value, part)


def test_isolation_is_processed_before_backend() -> None:
    paths = [row.path for row in KEYS.rows]
    assert paths.index("isolation") < paths.index("backend")


def test_exposes_object_nodes_and_their_children() -> None:
    assert (KEYS.children("") or ())[:3] == ("isolation", "backend", "allowDegraded")
    assert "integrations" in (KEYS.children("") or ())
    assert k.KeyTable(k.CORE_KEYS).children("integrations") == ()
    assert KEYS.children("resources.memory") is None
    assert KEYS.get("filesystem") is None
    row = KEYS.get("resources.memory")
    assert row is not None
    assert (row.name, row.merge) == ("memory", k.REPLACE)


def test_derives_merge_rules_from_kinds() -> None:
    merges = {row.path: row.merge for row in KEYS.rows}
    assert merges["filesystem.denyRead"] == k.CONCAT
    assert merges["env.set"] == k.PER_KEY
    assert merges["backend"] == k.REPLACE


def test_restriction_paths_exclude_openings() -> None:
    paths = KEYS.restriction_paths()
    assert "resources.memory" in paths
    assert "filesystem.protect" in paths
    assert "filesystem.allowWrite" not in paths
    assert "backend" not in paths
    assert "allowDegraded" not in paths


def _row(**changes: object) -> Key:
    base: dict[str, object] = {
        "path": "integrations.tool.flag",
        "kind": k.BOOL,
        "tighten": k.TRUE_TIGHTENS,
        "description": "A flag.",
    }
    base.update(changes)
    return Key(**base)  # type: ignore[arg-type]


def test_extended_table_adds_integration_keys() -> None:
    core = k.KeyTable(k.CORE_KEYS)
    table = core.extended([_row()])
    assert table.children("integrations") == ("tool",)
    assert table.children("integrations.tool") == ("flag",)
    assert core.children("integrations") == ()  # the original is unchanged


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([_row(), _row()], "declared twice"),
        ([_row(kind="colour")], "unknown kind"),
        ([_row(tighten="sideways")], "unknown tighten direction"),
        ([_row(kind=k.ENUM)], "choices go with kind 'enum' only"),
        ([_row(choices=("a",))], "choices go with kind 'enum' only"),
        ([_row(description="")], "empty description"),
        ([_row(attr="image")], "integrations.<tool>.<key>"),
        ([_row(path="integrations.flag")], "integrations.<tool>.<key>"),
        ([_row(path="colour")], "core keys need a Policy attribute"),
        ([_row(kind=k.PATHS)], "does not fit kind"),
        ([_row(kind=k.ENV_MAP, tighten=k.ADDITIONS)], "does not fit kind"),
        ([_row(kind=k.INT, tighten=k.REMOVALS)], "does not fit kind"),
        (
            [_row(path="integrations.tool.a"), _row(path="integrations.tool.a.b")],
            "both a value and an object",
        ),
        (
            [_row(path="integrations.tool.a.b"), _row(path="integrations.tool.a")],
            "both a value and an object",
        ),
    ],
)
def test_refuses_inconsistent_rows(rows: list[Key], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        KeyTable(rows)
