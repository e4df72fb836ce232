"""Where the fast client is, its sidecar and the plugin record (real files in tmp_path)."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from corral.server import _fastclient
from corral.server._fastclient import client_stamp, note_for_plugin, usable_client


@pytest.fixture
def binary(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> str:
    """A stand-in for _bin/corral-client in a private directory."""
    directory = os.path.join(str(tmp_path), "_bin")
    os.makedirs(directory)
    path = os.path.join(directory, "corral-client")
    with open(path, "wb") as f:
        f.write(b"\x7fELF")
    os.chmod(path, 0o755)
    monkeypatch.setattr(_fastclient, "client_path", lambda: path)
    return path


def sidecar(binary: str) -> bytes:
    with open(binary + ".cli", "rb") as f:
        return f.read()


def test_the_sidecar_names_this_interpreter_and_is_written_once(binary: str) -> None:
    assert usable_client() == binary
    assert sidecar(binary) == sys.executable.encode() + b"\n"
    mode = os.stat(binary + ".cli").st_mode
    assert stat.S_ISREG(mode) and mode & 0o777 == 0o644
    before = os.stat(binary + ".cli").st_mtime_ns
    assert usable_client() == binary
    assert os.stat(binary + ".cli").st_mtime_ns == before
    assert sorted(os.listdir(os.path.dirname(binary))) == ["corral-client", "corral-client.cli"]


def test_a_twin_interpreter_of_the_same_environment_keeps_the_sidecar(
    binary: str, tmp_path: object
) -> None:
    bin_dir = os.path.join(str(tmp_path), "venv", "bin")
    os.makedirs(bin_dir)
    os.symlink(sys.executable, os.path.join(bin_dir, "python3"))
    os.symlink("python3", os.path.join(bin_dir, "python"))
    assert usable_client(os.path.join(bin_dir, "python3")) == binary
    assert usable_client(os.path.join(bin_dir, "python")) == binary
    assert sidecar(binary) == os.path.join(bin_dir, "python3").encode() + b"\n"
    # another environment's interpreter rewrites it
    assert usable_client(sys.executable) == binary
    assert sidecar(binary) == sys.executable.encode() + b"\n"


@pytest.mark.parametrize(
    "content", [b"/usr/bin/python3\n", b"", b"relative\n", b"/a\n/b\n"], ids=repr
)
def test_a_sidecar_naming_something_else_is_replaced(binary: str, content: bytes) -> None:
    with open(binary + ".cli", "wb") as f:
        f.write(content)
    assert usable_client("/opt/py/bin/python3") == binary
    assert sidecar(binary) == b"/opt/py/bin/python3\n"


def test_a_sidecar_the_client_would_not_trust_is_replaced(binary: str) -> None:
    with open(binary + ".cli", "wb") as f:
        f.write(sys.executable.encode() + b"\n")
    os.chmod(binary + ".cli", 0o666)  # writable by others: the C client refuses it
    assert usable_client() == binary
    assert os.stat(binary + ".cli").st_mode & 0o777 == 0o644


def test_a_symlinked_sidecar_is_replaced_not_followed(binary: str, tmp_path: object) -> None:
    target = os.path.join(str(tmp_path), "elsewhere")
    with open(target, "wb") as f:
        f.write(sys.executable.encode() + b"\n")
    os.symlink(target, binary + ".cli")
    assert usable_client() == binary
    assert not os.path.islink(binary + ".cli")
    with open(target, "rb") as f:
        assert f.read() == sys.executable.encode() + b"\n"  # untouched


def test_no_binary_or_no_way_to_record_means_the_python_cli(
    binary: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert usable_client("relative/python") is None
    assert usable_client("/bin/py\nthon") is None
    os.chmod(binary, 0o644)
    assert usable_client() is None
    os.chmod(binary, 0o755)
    monkeypatch.setattr(_fastclient, "client_path", lambda: str(tmp_path) + "/missing")
    assert usable_client() is None


def test_a_sidecar_that_cannot_be_written_means_the_python_cli(binary: str) -> None:
    os.mkdir(binary + ".cli")  # (a read-only installation fails the same way, except for root)
    assert usable_client() is None
    # no temporary file is left behind
    assert sorted(os.listdir(os.path.dirname(binary))) == ["corral-client", "corral-client.cli"]


def test_the_stamp_is_the_real_path_of_the_binary(binary: str, tmp_path: object) -> None:
    link = os.path.join(str(tmp_path), "link")
    os.symlink(os.path.dirname(binary), link)
    assert client_stamp() == "c1:" + os.path.realpath(binary)


def test_the_plugin_record_follows_the_fast_client(tmp_path: object) -> None:
    state = os.path.join(str(tmp_path), "state")
    record = os.path.join(state, "fast-client")
    note_for_plugin(state, "/venv/bin/corral", "/venv/lib/corral/_bin/corral-client")
    with open(record, "rb") as f:
        assert f.read() == b"/venv/bin/corral\n/venv/lib/corral/_bin/corral-client\n"
    note_for_plugin(state, "/other/bin/corral", None)  # not ours: kept
    assert os.path.exists(record)
    note_for_plugin(state, "/venv/bin/corral", None)  # ours, and no fast client: removed
    assert not os.path.exists(record)
