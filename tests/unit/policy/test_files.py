"""Careful reads and atomic writes of corral's small files."""

from __future__ import annotations

import os
import stat
from typing import Any

import pytest

from corral.policy._files import read_small_file, write_file_atomically
from corral.policy._locations import config_dir, state_dir, trust_file, user_settings_file


def test_reads_a_small_file(tmp_path: Any) -> None:
    path = tmp_path / "a.json"
    path.write_bytes(b"{}")
    assert read_small_file(str(path)) == b"{}"
    assert read_small_file(str(tmp_path / "missing")) is None
    assert read_small_file(str(path / "below-a-file")) is None


def test_refuses_a_file_over_the_limit(tmp_path: Any) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * 11)
    with pytest.raises(ValueError, match="larger than 10 bytes"):
        read_small_file(str(path), limit=10)


def test_writes_atomically_with_private_permissions(tmp_path: Any) -> None:
    path = str(tmp_path / "new" / "dir" / "file")
    write_file_atomically(path, b"one")
    write_file_atomically(path, b"two")
    with open(path, "rb") as file:
        assert file.read() == b"two"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(os.listdir(os.path.dirname(path))) == ["file"]


def test_a_failed_write_removes_its_temporary_file(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(data_fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("corral.policy._files.os.fsync", fail)
    with pytest.raises(OSError, match="Input/output error"):
        write_file_atomically(str(tmp_path / "f"), b"x")
    assert os.listdir(tmp_path) == []


def test_a_vanished_temporary_file_does_not_hide_the_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def vanish(src: str, dst: str) -> None:
        os.unlink(src)
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr("corral.policy._files.os.replace", vanish)
    with pytest.raises(OSError, match="cross-device"):
        write_file_atomically(str(tmp_path / "f"), b"x")


def test_locations_follow_xdg() -> None:
    env = {"XDG_CONFIG_HOME": "/cfg/", "XDG_STATE_HOME": "/state"}
    assert config_dir(home="/h", environ=env) == "/cfg/corral"
    assert state_dir(home="/h", environ=env) == "/state/corral"
    assert user_settings_file(home="/h", environ={}) == "/h/.config/corral/settings.json"
    assert trust_file(home="/h", environ={"XDG_STATE_HOME": "rel"}) == (
        "/h/.local/state/corral/trust.json"
    )


def test_malformed_json_is_a_json_error_in_a_fresh_interpreter() -> None:
    # the C scanner needs json.decoder for some messages; _jsonfast must not leak SystemError
    import subprocess
    import sys

    code = (
        "from corral._jsonfast import JSONError, loads\n"
        "for text in ('{bad', '\"abc', '{\"a\" 1}'):\n"
        "    try:\n"
        "        loads(text)\n"
        "    except JSONError as exc:\n"
        "        print(exc.line, exc.column)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "2", "1", "1", "1", "6"]
