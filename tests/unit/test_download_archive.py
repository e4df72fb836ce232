"""A download's archive comes from the sandbox: whatever it holds, nothing lands outside.

The archive is made by ``tar`` inside the sandbox, which the sandboxed
command may have chosen (a ``tar`` earlier on its ``PATH``); these are the
bytes such a ``tar`` can send. tarfile's ``data`` filter is absent on Python
3.11 before 3.11.4 (Debian 12's 3.11.2, what CI's venv uses) and bypassable
before 3.11.13, so corral checks the members itself.
"""

from __future__ import annotations

import io
import os
import tarfile
import types

import pytest

from corral._exceptions import CommandFailed
from corral._files import _checked_members, extract_download


def _archive(*members: tuple[str, str, str]) -> bytes:
    """(kind, name, target or content) members, in order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = value.encode()
                info.size = len(data)
                info.mode = 0o6777
                archive.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "lnk": tarfile.LNKTYPE}[
                kind
            ]
            info.linkname = value
            archive.addfile(info)
    return buffer.getvalue()


def _attacks(outside: str) -> dict[str, bytes]:
    return {
        "file through a link out": _archive(("sym", "l", outside), ("file", "l/planted", "x")),
        "file through a relative link": _archive(
            ("dir", "d", ""), ("sym", "d/up", "../.."), ("file", "d/up/planted", "x")
        ),
        "link through a link": _archive(
            ("sym", "a", "."), ("sym", "b", "a/../.."), ("file", "b/planted", "x")
        ),
        "hard link to a host file": _archive(
            ("lnk", "h", os.path.join(outside, "victim")), ("file", "h", "overwritten")
        ),
        # the absolute link name, stripped of its "/", names a file of the archive, but
        # tarfile links os.path.join(target, "/abs") = the host's file, then chmods it
        "hard link to a host file named like a member": _archive(
            ("file", os.path.join(outside, "victim").lstrip("/"), "decoy"),
            ("lnk", "h", os.path.join(outside, "victim")),
        ),
        "absolute name": _archive(("file", os.path.join(outside, "planted"), "x")),
        "dotdot name": _archive(("file", "../planted", "x")),
    }


@pytest.mark.parametrize(
    "attack",
    [
        "file through a link out",
        "file through a relative link",
        "link through a link",
        "hard link to a host file",
        "hard link to a host file named like a member",
        "absolute name",
        "dotdot name",
    ],
)
def test_a_hostile_archive_plants_nothing_outside(tmp_path: object, attack: str) -> None:
    root = str(tmp_path)
    outside = os.path.join(root, "outside")
    os.makedirs(outside)
    victim = os.path.join(outside, "victim")
    with open(victim, "w") as f:
        f.write("original\n")
    os.chmod(victim, 0o600)
    before = os.stat(victim)
    local = os.path.join(root, "back", "down")
    outcome = types.SimpleNamespace(stdout=_attacks(outside)[attack])
    with pytest.raises(CommandFailed):
        extract_download(outcome, local, "/tmp/evil")  # type: ignore[arg-type]
    # corral's own checks, without tarfile's data filter (absent on Debian 12's Python)
    with tarfile.open(fileobj=io.BytesIO(outcome.stdout)) as archive, pytest.raises(ValueError):
        _checked_members(archive.getmembers())
    assert sorted(os.listdir(outside)) == ["victim"]
    with open(victim) as f:
        assert f.read() == "original\n"
    after = os.stat(victim)
    assert (after.st_mode, after.st_nlink, after.st_mtime) == (
        before.st_mode,
        before.st_nlink,
        before.st_mtime,
    )
    assert not os.path.lexists(os.path.join(root, "back", "planted"))
    assert not os.path.lexists(os.path.join(root, "planted"))


def test_a_plain_archive_unpacks_without_set_id_bits(tmp_path: object) -> None:
    local = os.path.join(str(tmp_path), "down")
    data = _archive(
        ("dir", "pkg", ""),
        ("file", "pkg/mod.py", "X = 1\n"),
        ("sym", "link", "pkg/mod.py"),
        ("lnk", "hard", "pkg/mod.py"),
    )
    extract_download(types.SimpleNamespace(stdout=data), local, "/tmp/ok")  # type: ignore[arg-type]
    with open(os.path.join(local, "link")) as f:
        assert f.read() == "X = 1\n"
    assert (
        os.stat(os.path.join(local, "hard")).st_ino
        == os.stat(os.path.join(local, "pkg", "mod.py")).st_ino
    )
    assert os.stat(os.path.join(local, "pkg", "mod.py")).st_mode & 0o7022 == 0
