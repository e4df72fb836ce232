"""The probe cache (``probe-cache.json``) stays bounded: its keys name versions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corral import _state


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.setattr(_state, "_loaded", None)
    return tmp_path / "corral" / "probe-cache.json"


def test_each_family_keeps_only_its_newest_entries(cache: Path) -> None:
    for version in range(10):  # ten versions of corral's sources, one filter each
        _state.cache_put(f"seccomp:x86_64:{version}", {"program": "x" * 100})
    _state.cache_put("bwrap:/usr/bin/bwrap:1", "0.8.0")
    _state.cache_put("seccomp:x86_64:7", {"program": "again"})  # stored again: the newest
    on_disk = json.loads(cache.read_text())
    keep = _state.CACHE_PER_FAMILY
    assert [k for k in on_disk if k.startswith("seccomp:")] == [
        *(f"seccomp:x86_64:{v}" for v in range(10 - keep, 10) if v != 7),
        "seccomp:x86_64:7",
    ]
    assert on_disk["bwrap:/usr/bin/bwrap:1"] == "0.8.0"  # other families are untouched
    _state._loaded = None  # a new process reads what was kept
    assert _state.cache_get("seccomp:x86_64:7") == {"program": "again"}
    assert _state.cache_get("seccomp:x86_64:0") is None
    assert os.listdir(cache.parent) == ["probe-cache.json"]  # no temporary file left
