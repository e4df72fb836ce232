"""Change sets read from each mechanism's layer format, against a real workspace directory.

The layers here are written the way the mechanisms write them (whiteouts as
0/0 character devices, opaque directories as xattrs, fuse-overlayfs's
``.wh.`` names, a copy plus manifest), so these tests pin the format reading
without needing a mount.
"""

from __future__ import annotations

import os
import stat

import pytest

from corral._exceptions import PreviewError
from corral.preview._changes import compute_changes
from corral.preview._layers import Layer
from corral.preview._mechanism import copy_tree


def write(path: str, data: str | bytes, mode: int = 0o644) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.chmod(path, mode)


def whiteout(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o000, 0)


def opaque(path: str, value: bytes = b"y") -> None:
    os.makedirs(path, exist_ok=True)
    os.setxattr(path, "user.overlay.opaque", value)


@pytest.fixture
def dirs(tmp_path):
    ws, upper = tmp_path / "ws", tmp_path / "upper"
    ws.mkdir()
    upper.mkdir()
    if os.geteuid() == 0:
        # the upper dir of an unprivileged (userxattr) mount, whose metadata is user.overlay.*
        os.chown(upper, 65534, 65534)
    return str(ws), str(upper)


def kinds(changeset):
    return [(c.kind, c.path) for c in changeset]


def test_reports_added_modified_and_deleted_files(dirs):
    ws, upper = dirs
    write(f"{ws}/keep.txt", "same\n")
    write(f"{ws}/edit.txt", "old\n")
    write(f"{ws}/gone.txt", "bye\n")
    write(f"{upper}/edit.txt", "new\n")
    write(f"{upper}/keep.txt", "same\n")  # copied up, unchanged: not a change
    write(f"{upper}/new.txt", "hello\n")
    whiteout(f"{upper}/gone.txt")
    changes = compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")
    assert kinds(changes) == [
        ("modified", "edit.txt"),
        ("deleted", "gone.txt"),
        ("added", "new.txt"),
    ]
    edit = changes.get("edit.txt")
    assert edit.content_changed
    assert not edit.mode_changed
    assert edit.source == f"{upper}/edit.txt"


def test_reports_a_mode_change_without_content_change(dirs):
    ws, upper = dirs
    write(f"{ws}/run.sh", "echo\n", 0o644)
    write(f"{upper}/run.sh", "echo\n", 0o755)
    [change] = compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")
    assert (change.kind, change.content_changed, change.old_mode, change.new_mode) == (
        "modified",
        False,
        0o644,
        0o755,
    )


def test_whiteout_of_a_directory_deletes_everything_below_it(dirs):
    ws, upper = dirs
    write(f"{ws}/d/a", "a")
    write(f"{ws}/d/sub/b", "b")
    whiteout(f"{upper}/d")
    changes = compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")
    assert kinds(changes) == [
        ("deleted", "d"),
        ("deleted", "d/a"),
        ("deleted", "d/sub"),
        ("deleted", "d/sub/b"),
    ]


def test_opaque_directory_hides_the_real_entries(dirs):
    ws, upper = dirs
    write(f"{ws}/d/old", "o")
    write(f"{ws}/d/both", "same")
    opaque(f"{upper}/d")
    write(f"{upper}/d/both", "same")
    write(f"{upper}/d/fresh", "f")
    changes = compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")
    assert kinds(changes) == [("added", "d/fresh"), ("deleted", "d/old")]


def test_non_opaque_directory_leaves_untouched_real_entries_alone(dirs):
    ws, upper = dirs
    write(f"{ws}/d/old", "o")
    os.makedirs(f"{upper}/d")
    write(f"{upper}/d/fresh", "f")
    assert kinds(compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")) == [
        ("added", "d/fresh")
    ]


def test_pairs_identical_deleted_and_added_files_as_a_rename(dirs):
    ws, upper = dirs
    write(f"{ws}/src/old_name.py", "print('x')\n")
    write(f"{ws}/other.py", "different\n")
    whiteout(f"{upper}/src/old_name.py")
    write(f"{upper}/src/new_name.py", "print('x')\n")
    [change] = compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")
    assert (change.kind, change.old_path, change.path) == (
        "renamed",
        "src/old_name.py",
        "src/new_name.py",
    )


def test_symlinks_and_type_changes(dirs):
    ws, upper = dirs
    write(f"{ws}/was_file", "f")
    write(f"{ws}/was_dir/inner", "i")
    os.symlink("target-a", f"{ws}/link")
    os.makedirs(f"{upper}/was_file")
    write(f"{upper}/was_file/child", "c")
    write(f"{upper}/was_dir", "now a file")
    os.symlink("target-b", f"{upper}/link")
    changes = compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")
    assert kinds(changes) == [
        ("modified", "link"),
        ("modified", "was_dir"),
        ("deleted", "was_dir/inner"),
        ("modified", "was_file"),
        ("added", "was_file/child"),
    ]
    link = changes.get("link")
    assert (link.old_target, link.new_target) == ("target-a", "target-b")
    assert changes.get("was_dir").type_changed
    assert (changes.get("was_file").old_type, changes.get("was_file").new_type) == ("file", "dir")


def test_fifo_is_reported_as_unsupported(dirs):
    ws, upper = dirs
    os.mkfifo(f"{upper}/pipe")
    assert kinds(compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")) == [
        ("unsupported", "pipe")
    ]


def test_wh_names_are_plain_files_under_kernel_overlay(dirs):
    ws, upper = dirs
    write(f"{ws}/important", "keep me")
    write(f"{upper}/.wh.important", "")  # a file the command created, not a whiteout
    assert kinds(compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")) == [
        ("added", ".wh.important")
    ]


def test_wh_names_are_whiteouts_under_fuse_overlayfs(dirs):
    ws, upper = dirs
    write(f"{ws}/gone", "x")
    write(f"{ws}/d/old", "x")
    write(f"{upper}/.wh.gone", "")
    os.makedirs(f"{upper}/d")
    write(f"{upper}/d/.wh..wh..opq", "")
    whiteout(f"{upper}/d/.wh..opq")
    write(f"{upper}/d/new", "n")
    changes = compute_changes(Layer(upper, "fuse-overlayfs"), ws, preview_id="pv-test")
    assert kinds(changes) == [("added", "d/new"), ("deleted", "d/old"), ("deleted", "gone")]


def test_xattr_whiteouts_in_an_x_marked_directory(dirs):
    ws, upper = dirs
    write(f"{ws}/d/gone", "x")
    opaque(f"{upper}/d", b"x")
    write(f"{upper}/d/gone", "")
    os.setxattr(f"{upper}/d/gone", "user.overlay.whiteout", b"")
    assert kinds(compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")) == [
        ("deleted", "d/gone")
    ]


def test_refuses_a_redirect_it_cannot_interpret(dirs):
    ws, upper = dirs
    os.makedirs(f"{upper}/moved")
    os.setxattr(f"{upper}/moved", "user.overlay.redirect", b"/elsewhere")
    with pytest.raises(PreviewError, match="redirect"):
        compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")


@pytest.mark.skipif(
    os.geteuid() != 0, reason="trusted.* xattrs need root (a root mount writes these)"
)
def test_reads_trusted_opaque_attribute_of_a_root_mount(dirs):
    ws, upper = dirs
    write(f"{ws}/d/old", "o")
    os.chown(upper, 0, 0)  # a root mount's upper dir
    os.makedirs(f"{upper}/d")
    os.setxattr(f"{upper}/d", "trusted.overlay.opaque", b"y")
    assert kinds(compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")) == [
        ("deleted", "d/old")
    ]


def test_copy_layer_reports_only_what_the_command_touched(tmp_path):
    ws, tree = str(tmp_path / "ws"), str(tmp_path / "tree")
    write(f"{ws}/a.txt", "a")
    write(f"{ws}/d/b.txt", "b")
    write(f"{ws}/d/c.txt", "c")
    manifest = copy_tree(ws, tree)
    assert set(manifest) == {"a.txt", "d", "d/b.txt", "d/c.txt"}
    write(f"{tree}/a.txt", "changed")
    os.unlink(f"{tree}/d/b.txt")
    write(f"{tree}/new.txt", "n")
    # the user edits the real workspace meanwhile: not the command's change
    write(f"{ws}/d/c.txt", "user edit")
    write(f"{ws}/user_new.txt", "u")
    layer = Layer(tree, "copy", manifest)
    changes = compute_changes(layer, ws, preview_id="pv-test")
    assert kinds(changes) == [("modified", "a.txt"), ("deleted", "d/b.txt"), ("added", "new.txt")]


def test_to_json_has_no_internal_source_and_octal_modes(dirs):
    ws, upper = dirs
    write(f"{upper}/x", "x", 0o600)
    changes = compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")
    data = changes.to_json()
    assert data["summary"] == {"added": 1}
    assert data["changes"] == [
        {
            "path": "x",
            "kind": "added",
            "new_type": "file",
            "new_size": 1,
            "new_mode": "0600",
            "content_changed": True,
        }
    ]
