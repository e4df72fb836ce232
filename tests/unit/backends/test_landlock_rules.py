"""The Landlock read split and spec encoding (pure)."""

from __future__ import annotations

import struct

from corral.backends._landlock_rules import (
    FS_READ,
    LandlockRule,
    ancestors_to_list,
    encode_spec,
    fs_rights,
    handled_net,
    scoped,
    split_readable,
)

LISTINGS = {
    "/": (("bin", "symlink"), ("etc", "dir"), ("home", "dir"), ("tmp", "dir"), ("usr", "dir")),
    "/home": (("me", "dir"), ("other", "dir")),
    "/home/me": ((".bashrc", "file"), (".ssh", "dir"), ("src", "dir")),
}


def test_hides_a_path_by_granting_its_siblings_only() -> None:
    rules = split_readable("/", ("/home/me/.ssh", "/tmp"), LISTINGS, "readable system")
    assert [r.path for r in rules] == [
        "/etc",
        "/home/me/.bashrc",
        "/home/me/src",
        "/home/other",
        "/usr",
    ]
    assert all(r.access == FS_READ and r.reason == "readable system" for r in rules)


def test_symlinks_get_no_rule() -> None:
    rules = split_readable("/", ("/tmp",), LISTINGS, "x")
    assert "/bin" not in [r.path for r in rules]


def test_grants_the_whole_root_when_nothing_is_hidden_below() -> None:
    assert split_readable("/srv", ("/home/me/.ssh",), LISTINGS, "x") == [
        LandlockRule("path", FS_READ, "x", path="/srv")
    ]


def test_grants_nothing_inside_a_hidden_path() -> None:
    assert split_readable("/home/me/.ssh/keys", ("/home/me/.ssh",), LISTINGS, "x") == []


def test_unlisted_ancestor_grants_nothing() -> None:
    assert split_readable("/", ("/nowhere/secret",), {"/": (("nowhere", "dir"),)}, "x") == []


def test_lists_exactly_the_ancestors() -> None:
    assert ancestors_to_list("/", ("/home/me/.ssh", "/tmp")) == {"/", "/home", "/home/me"}
    assert ancestors_to_list("/home/me", ("/home/me/.ssh", "/etc")) == {"/home/me"}


def test_handles_every_right_the_abi_knows() -> None:
    read1, write1 = fs_rights(1)
    read7, write7 = fs_rights(7)
    assert read1 == read7 == FS_READ
    assert write1 < write7
    assert write1 & write7 == write1
    assert handled_net(3) == 0
    assert handled_net(4) == 3
    assert scoped(5) == 0
    assert scoped(6) == 3


def test_encodes_the_helper_format() -> None:
    spec = encode_spec(
        handled_fs=7,
        handled_net=3,
        scoped=0,
        rules=[LandlockRule("path", 5, "r", path="/etc"), LandlockRule("port", 2, "p", port=3128)],
    )
    assert struct.unpack_from("<QQQ", spec, 0) == (7, 3, 0)
    kind, length, access = struct.unpack_from("<IIQ", spec, 24)
    assert (kind, length, access) == (1, 5, 5)
    assert spec[40:45] == b"/etc\0"
    assert struct.unpack_from("<IIQQ", spec, 45) == (2, 8, 2, 3128)
