"""Conflict detection: the base time against real ctimes, and the records' rules."""

from __future__ import annotations

import os

from corral.preview._base import base_time_ns, exact, find_conflicts, observe


def write(path, data="x"):
    with open(path, "w") as f:
        f.write(data)


def test_base_time_separates_changes_before_from_changes_after(tmp_path):
    before = tmp_path / "before"
    write(before)
    base = base_time_ns()
    after = tmp_path / "after"
    write(after)
    assert os.lstat(before).st_ctime_ns < base
    assert os.lstat(after).st_ctime_ns >= base


def test_rules(tmp_path):
    ws = str(tmp_path)
    write(f"{ws}/old")
    os.mkdir(f"{ws}/quiet")
    base = base_time_ns()
    write(f"{ws}/new")
    write(f"{ws}/applied")
    records = {
        "old": "present:file",
        "was_absent": "absent",
        "gone": "present:file",
        "seen_changed": "changed",
        "applied": exact(ws, "applied"),
    }
    write(f"{ws}/was_absent")
    conflicts = dict(
        find_conflicts(
            ws,
            ["old", "new", "was_absent", "gone", "seen_changed", "applied", "quiet/fresh"],
            records,
            base,
        )
    )
    assert set(conflicts) == {"new", "was_absent", "gone", "seen_changed"}
    assert "since the preview began" in conflicts["new"]
    assert conflicts["gone"] == "deleted in the real workspace since the preview began"
    # a directory that gained an entry makes an unrecorded absent path "unknown"
    assert observe(ws, "quiet/fresh", base) == "absent"
    write(f"{ws}/quiet/other")
    assert observe(ws, "quiet/fresh", base) == "unknown"
    write(f"{ws}/applied", "edited after corral applied it")
    assert dict(find_conflicts(ws, ["applied"], records, base)) == {
        "applied": "changed in the real workspace since corral applied it"
    }
