"""The Firecracker engine's workspace image, round trip, with the real e2fsprogs (no VM).

One change set is made twice on two previews of the same workspace: once
through the preview's view mounted writable (what the qemu engine's
virtiofsd does with a guest's writes) or by a real guest of the qemu
engine, once inside the ext4 image the Firecracker engine builds from that
view (with debugfs, as a guest's kernel would write it), then read back.
Both previews must report the same changes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from corral.backends import _firecracker_disk as disk
from corral.backends.microvm import view_setup
from corral.preview import Preview
from tests.integration.conftest import needs_microvm

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the view is mounted in a mount namespace (root)"),
    pytest.mark.skipif(
        not shutil.which("debugfs", path="/usr/sbin:/sbin") or not shutil.which("bwrap"),
        reason="needs e2fsprogs and bubblewrap",
    ),
]

#: The same changes, as shell commands on the view and as debugfs commands on the image.
SHELL = """
set -e
cd "$1"
printf 'changed\\n' > kept.txt
rm gone.txt
rm -r olddir
mkdir -p newdir && printf 'n\\n' > newdir/n.txt
ln -s kept.txt link2
chmod 700 mode.sh
rm swap && mkdir swap
rm link && ln -s elsewhere link
printf 'x' > .git/hooks/post-checkout && chmod 755 .git/hooks/post-checkout
chown 1234:1234 owned.txt
"""
DEBUGFS = """
rm kept.txt
write {changed} kept.txt
set_inode_field kept.txt mode 0100644
rm gone.txt
rm olddir/inner.txt
rmdir olddir
mkdir newdir
write {n} newdir/n.txt
set_inode_field newdir/n.txt mode 0100644
symlink link2 kept.txt
set_inode_field mode.sh mode 0100700
rm swap
mkdir swap
rm link
symlink link elsewhere
write {x} .git/hooks/post-checkout
set_inode_field .git/hooks/post-checkout mode 0100755
set_inode_field owned.txt uid 1234
set_inode_field owned.txt gid 1234
"""


def _workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / "olddir").mkdir(parents=True)
    (ws / "olddir" / "inner.txt").write_text("inner\n")
    (ws / "kept.txt").write_text("original\n")
    (ws / "gone.txt").write_text("bye\n")
    (ws / "owned.txt").write_text("mine\n")
    (ws / "mode.sh").write_text("#!/bin/sh\n")
    (ws / "mode.sh").chmod(0o644)
    (ws / "swap").write_text("file\n")
    (ws / "link").symlink_to("kept.txt")
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".env").write_text("SECRET=1\n")
    for path in [ws, *ws.rglob("*")]:
        if not path.is_symlink():
            os.utime(path, (1_700_000_000, 1_700_000_000))
    return ws


def _setup(preview: Preview, ws: Path, *, masks: list[tuple[str, str]]) -> tuple[str, ...]:
    return view_setup(
        workspace=str(ws),
        preview=preview.spec(),
        read_only=False,
        masks=masks,
        read_only_paths=[],
        chain=True,
    )


def _changed_through_an_image(
    preview: Preview, ws: Path, tmp_path: Path, *, masks: list[tuple[str, str]]
) -> str:
    """The Firecracker engine's way: an image of *preview*'s view, changed with debugfs
    (:data:`DEBUGFS`, as a guest kernel writes its disk), read back into the preview."""
    image = str(tmp_path / "ws.ext4")
    disk.build_image(
        _setup(preview, ws, masks=masks),
        image,
        size_mb=disk.image_size_mb(100, headroom_mb=32),
        owner=(os.stat(ws).st_uid, os.stat(ws).st_gid),
    )
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name, data in (("changed", "changed\n"), ("n", "n\n"), ("x", "x")):
        (blobs / name).write_text(data)
    script = DEBUGFS.format(changed=blobs / "changed", n=blobs / "n", x=blobs / "x")
    subprocess.run(
        ["debugfs", "-w", "-f", "-", image], input=script, text=True, check=True,
        capture_output=True,
    )  # fmt: skip
    disk.read_back(
        image,
        _setup(preview, ws, masks=masks),
        masks=tuple(p[len(str(ws)) + 1 :] for p, _k in masks),
        bwrap=str(shutil.which("bwrap")),
    )
    return image


def _described(preview: Preview) -> list[tuple[str, str]]:
    return sorted((c.path, c.kind) for c in preview.changes())


@pytest.mark.parametrize("mechanism", ["overlay", "copy"])
def test_the_image_round_trip_reports_what_writes_through_the_view_report(
    tmp_path: Path, mechanism: str
) -> None:
    ws = _workspace(tmp_path)
    state = tmp_path / "state"
    masks = [(str(ws / ".env"), "file")]
    via_view = Preview.create(str(ws), state_dir=str(state), mechanism=mechanism)
    via_image = Preview.create(str(ws), state_dir=str(state), mechanism=mechanism)
    try:
        # the qemu engine: the guest's writes land in the view virtiofsd serves
        subprocess.run(
            disk.in_view(
                _setup(via_view, ws, masks=masks), "/bin/sh", "-c", SHELL, "sh", "/mnt/ws"
            ),
            check=True,
        )
        # the firecracker engine: an image of the view, written by the "guest", read back
        image = _changed_through_an_image(via_image, ws, tmp_path, masks=masks)
        listing = subprocess.run(
            ["debugfs", "-R", "ls -l /", image], capture_output=True, text=True, check=True
        ).stdout
        assert "lost+found" not in listing and "kept.txt" in listing
        features = subprocess.run(
            ["debugfs", "-R", "features", image], capture_output=True, text=True, check=True
        ).stdout
        assert "has_journal" not in features  # a synced change is in place, where rdump reads
        # the secret is masked in the view: the image holds /dev/null's node, not its bytes
        dumped = subprocess.run(
            ["debugfs", "-R", "cat .env", image], capture_output=True, check=True
        ).stdout
        assert b"SECRET" not in dumped
        expected = _described(via_view)
        assert expected, "the change set is empty: the test proves nothing"
        assert _described(via_image) == expected
        by_path = {c.path: c for c in via_image.changes()}
        assert by_path["mode.sh"].kind == "modified"
        spec = via_image.spec()
        owned = os.path.join(spec.upper or spec.tree, "owned.txt")
        assert os.stat(owned).st_uid == 1234  # an owner change comes back into the view too
        assert ".env" not in by_path  # the masked secret neither came back nor was deleted
        # the protected path is reported as the qemu engine's preview reports it
        assert via_image.protected() == via_view.protected()
        assert via_image.protected()  # .git/hooks is protected: corral apply refuses it
    finally:
        via_view.discard()
        via_image.discard()
    assert (ws / "kept.txt").read_text() == "original\n"  # nothing reached the workspace


def test_a_view_larger_than_the_image_fails_clearly(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big").write_bytes(os.urandom(3 << 20))
    preview = Preview.create(str(ws), state_dir=str(tmp_path / "state"), mechanism="overlay")
    try:
        with pytest.raises(disk.DiskFailed, match="building the workspace image"):
            disk.build_image(
                _setup(preview, ws, masks=[]), str(tmp_path / "img"), size_mb=2, owner=(0, 0)
            )
    finally:
        preview.discard()


def test_a_broken_image_is_refused_not_half_read(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a").write_text("a\n")
    preview = Preview.create(str(ws), state_dir=str(tmp_path / "state"), mechanism="overlay")
    try:
        image = tmp_path / "img"
        disk.build_image(_setup(preview, ws, masks=[]), str(image), size_mb=20, owner=(0, 0))
        with open(image, "r+b") as f:  # the guest's root overwrote the superblock
            f.seek(1024)
            f.write(b"\xff" * 1024)
        with pytest.raises(disk.DiskFailed, match="unreadable"):
            disk.read_back(
                str(image),
                _setup(preview, ws, masks=[]),
                masks=(),
                bwrap=str(shutil.which("bwrap")),
            )
        assert not preview.changes()
    finally:
        preview.discard()


@needs_microvm
def test_the_image_round_trip_reports_what_a_real_qemu_guest_reports(
    tmp_path: Path, vm_cache: str
) -> None:
    """The same change set made by a real guest under the qemu engine (virtiofs) and
    through a workspace image: both previews report the same changes."""
    ws = _workspace(tmp_path)
    state = tmp_path / "xdg-state"
    env = {**os.environ, "XDG_CACHE_HOME": vm_cache, "XDG_STATE_HOME": str(state)}
    result = subprocess.run(
        [sys.executable, "-m", "corral", "preview", "--backend", "microvm",
         "--deny-read", str(ws / ".env"), "--", "sh", "-c", SHELL, "sh", str(ws)],
        cwd=ws, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    preview_id = result.stderr.split("preview ", 1)[1].split()[0]
    via_qemu = Preview.open(preview_id, state_dir=os.path.join(state, "corral"))
    via_image = Preview.create(
        str(ws), state_dir=os.path.join(state, "corral"), mechanism=via_qemu.mechanism
    )
    masks = [(str(ws / ".env"), "file")]
    try:
        _changed_through_an_image(via_image, ws, tmp_path, masks=masks)
        expected = _described(via_qemu)
        assert ("kept.txt", "modified") in expected, expected  # the guest really ran
        assert _described(via_image) == expected
        assert via_image.protected() == via_qemu.protected()
    finally:
        via_qemu.discard()
        via_image.discard()


#: What a guest's root does to its image to make the read-back write more than the image
#: holds (debugfs commands, as a guest kernel would write them). A 20 MiB image (1 KiB
#: blocks, 5,120 inodes) bounds the read-back to 20 MiB and ~5,200 files.
AMPLIFIERS = {
    # one file that claims 4 TiB (the most a 1 KiB-block ext4 file can) and holds no block
    "sparse file": "write /dev/null big\nsif big size 0x3ffffffffff\n",
    # one 1 MiB file under 40 names: rdump writes its content once per name (40 MiB)
    "hard links to data": "write {blob} big\n"
    + "".join(f"ln big big{i}\n" for i in range(40))
    + "sif big links_count 41\n",
    # one empty file under 6,000 names: a file per name, more than the image has inodes
    # (debugfs's ln does not grow a directory: expand_dir adds a block per 50 names)
    "hard links by the thousand": "write /dev/null e\n"
    + "".join(("expand_dir /\n" if i % 50 == 0 else "") + f"ln e e{i}\n" for i in range(6000))
    + "sif e links_count 6001\n",
}


@pytest.mark.parametrize("amplifier", list(AMPLIFIERS))
def test_a_guest_cannot_make_the_read_back_write_more_than_its_image(
    tmp_path: Path, amplifier: str
) -> None:
    """The read-back writes no more than the image holds, whatever sizes and links the
    guest's file system claims: it fails clearly, naming the bound, leaves the preview
    unchanged and leaves nothing behind.

    Everything the test owns (workspace, preview, image) is on a 64 MiB tmpfs here,
    so a failure costs 64 MiB of memory, not the machine's disk."""
    host = tmp_path / "host"
    host.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=700", "host", str(host)],
                   check=True)  # fmt: skip
    try:
        ws = host / "ws"
        ws.mkdir()
        (ws / "a").write_text("a\n")
        preview = Preview.create(str(ws), state_dir=str(host / "state"), mechanism="overlay")
        image = host / "img"
        disk.build_image(_setup(preview, ws, masks=[]), str(image), size_mb=20, owner=(0, 0))
        (tmp_path / "blob").write_bytes(os.urandom(1 << 20))
        subprocess.run(
            ["debugfs", "-w", "-f", "-", str(image)],
            input=AMPLIFIERS[amplifier].format(blob=tmp_path / "blob"),
            text=True, check=True, capture_output=True,
        )  # fmt: skip
        before = sorted(p.name for p in host.iterdir())
        with pytest.raises(disk.DiskFailed, match=r"bound of 20971520 bytes and \d+ files"):
            disk.read_back(
                str(image),
                _setup(preview, ws, masks=[]),
                masks=(),
                bwrap=str(shutil.which("bwrap")),
            )
        assert not preview.changes()  # nothing half-synced
        assert sorted(p.name for p in host.iterdir()) == before  # no temp files
        used = os.statvfs(host)
        written = (used.f_blocks - used.f_bfree) * used.f_frsize
        assert written < (8 << 20), f"{written} bytes on the host for a 20 MiB image"
        with open("/proc/self/mountinfo") as mounts:
            assert "corral-readback" not in mounts.read()  # the dump's tmpfs is gone
        preview.discard()
    finally:
        subprocess.run(["umount", "-l", str(host)], check=False)


def test_a_tree_within_the_bound_comes_back_whole(tmp_path: Path) -> None:
    """The bound refuses amplification, not use: a guest that fills most of its image
    with real data (and a few hard links within the bound) gets all of it back."""
    ws = tmp_path / "ws"
    ws.mkdir()
    preview = Preview.create(str(ws), state_dir=str(tmp_path / "state"), mechanism="overlay")
    try:
        image = tmp_path / "img"
        disk.build_image(_setup(preview, ws, masks=[]), str(image), size_mb=20, owner=(0, 0))
        blob = tmp_path / "blob"
        blob.write_bytes(os.urandom(6 << 20))
        subprocess.run(
            ["debugfs", "-w", "-f", "-", str(image)],
            input=f"write {blob} big\nln big big2\nsif big links_count 2\n",
            text=True, check=True, capture_output=True,
        )  # fmt: skip
        disk.read_back(
            str(image), _setup(preview, ws, masks=[]), masks=(), bwrap=str(shutil.which("bwrap"))
        )
        upper = Path(preview.spec().upper or "")
        assert (upper / "big").read_bytes() == blob.read_bytes()
        assert (upper / "big2").read_bytes() == blob.read_bytes()
    finally:
        preview.discard()
