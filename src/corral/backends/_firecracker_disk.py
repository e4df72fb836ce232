"""The workspace of a Firecracker VM: an ext4 image built from the run's view, read back after.

Firecracker has no virtiofs: the guest gets the workspace as a second block
device. :func:`build_image` mounts the run's view (the same
:func:`~corral.backends.microvm.view_setup` script the qemu engine runs in
virtiofsd's namespace: the preview's overlay or copy, or the workspace,
secret paths masked) in a private mount namespace of a child process and
writes it into a fresh ext4 image with ``mkfs.ext4 -d`` (no loop device, no
mount of the image on the host).

After a writable run, :func:`read_back` brings the guest's changes home:

1. ``debugfs -R "rdump / OUT"`` copies the image's tree out, without
   mounting it. The image is the guest's to write, so debugfs parses
   attacker-controlled bytes: it runs inside bubblewrap with no network,
   no other file of the host but ``/usr`` (read-only), the image
   (read-only) and the output directory. That directory is a tmpfs in a
   private mount namespace, sized by the host (:func:`read_back_bound`:
   the image's size, and its inode count): rdump writes every regular
   file's whole size (holes as zeros) and a hard-linked file once per
   name, so a guest's sparse file claiming 16 TiB, or one inode under
   thousands of names, would otherwise fill the host's disk. The kernel
   enforces the bound; a tree that reaches it fails the read-back before
   anything is written into the view;
2. :mod:`corral.backends._firecracker_sync` (the process that owns that
   mount namespace, where the view is mounted writable, masks included)
   runs the dump, then makes the view equal to the tree: what the guest
   deleted is deleted (the preview's overlay records a whiteout), what it
   changed or made is written, metadata (mode, owner) set. The preview
   then holds exactly what the qemu engine's virtiofs writes would have
   left, and ``corral diff``/``apply``/``discard`` work unchanged. The
   tmpfs, and the whole dump, is gone when that process ends.

Known differences from the qemu engine: FIFOs, sockets and device nodes are
neither copied out of the image nor deleted by it (``rdump`` skips special
files); hard links come back as separate files; timestamps come back to the
second; extended attributes are not carried (virtiofsd runs ``no_xattr``
too); a tree that does not fit in the image's size once hard links are
written out in full and sparse files dense (a legitimately sparse file
larger than the image, say) is refused, where virtiofs would have kept it.
The dump is held in memory (tmpfs) while it is synced: at most the image's
size.
"""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = [
    "DEFAULT_HEADROOM_MB",
    "DiskFailed",
    "build_image",
    "image_size_mb",
    "in_view",
    "read_back",
    "read_back_bound",
]

#: Free space the guest gets in a writable workspace image beyond the view's size
#: (the image is sparse: unwritten space costs nothing on the host).
DEFAULT_HEADROOM_MB = 1024
#: Where the view is mounted in the helper's private mount namespace.
_VIEW_ROOT = "/mnt"


class DiskFailed(Exception):
    """The workspace image could not be built or read back (the message says why)."""


def image_size_mb(used_kib: int, *, headroom_mb: int = DEFAULT_HEADROOM_MB) -> int:
    """The image size for a view of *used_kib* KiB (apparent size) plus *headroom_mb*.

    ext4's own metadata (inode tables, directories) needs room on top of
    the files: a third more, and 16 MiB at least.
    """
    return used_kib * 4 // 3 // 1024 + 16 + headroom_mb


def in_view(setup: tuple[str, ...], *then: str) -> list[str]:
    """argv: in a private mount namespace, mount the view with *setup*, then exec *then*.

    *setup* is :func:`~corral.backends.microvm.view_setup`'s argv built with
    ``chain=True`` (it mounts at ``/mnt/ws``, on a fresh tmpfs here, then
    execs *then*).
    """
    prepare = (
        f"mount -t tmpfs -o mode=755,size=1m corral-view {_VIEW_ROOT} && "
        f'mkdir {_VIEW_ROOT}/ws && exec "$@"'
    )
    return [
        "/usr/bin/unshare", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", prepare, "corral-disk", *setup, *then,
    ]  # fmt: skip


def _run(argv: list[str], what: str, timeout: float = 600.0) -> str:
    try:
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiskFailed(f"{what}: {exc}") from None
    if result.returncode != 0:
        raise DiskFailed(f"{what} failed: {(result.stderr or result.stdout).strip()[-600:]}")
    return result.stderr


def build_image(
    setup: tuple[str, ...],
    image: str,
    *,
    size_mb: int,
    owner: tuple[int, int],
    mkfs: str = "/usr/sbin/mkfs.ext4",
) -> None:
    """Write the view mounted by *setup* into the new ext4 image *image* (sparse).

    *setup* is built with ``chain=True``; this function supplies what it
    execs (``mkfs.ext4 -d``). The root directory gets *owner* (the
    workspace's uid and gid); ``lost+found`` is removed (the guest sees the
    view and nothing else). No journal: once the guest has run ``sync``,
    every change is in place, where ``debugfs`` reads it (it does not replay
    a journal, and a journalled file system may keep committed metadata
    only in its journal until a later checkpoint).

    Raises:
        DiskFailed: mkfs failed, e.g. the view does not fit in *size_mb* MiB.
    """
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.close(fd)
    _run(
        in_view(
            setup,
            mkfs, "-q", "-F", "-t", "ext4", "-L", "corral-ws", "-i", "4096", "-O", "^has_journal",
            "-d", f"{_VIEW_ROOT}/ws", "-E", f"root_owner={owner[0]}:{owner[1]}",
            image, f"{size_mb}M",
        ),
        f"building the workspace image ({size_mb} MiB)",
    )  # fmt: skip
    debugfs = os.path.join(os.path.dirname(mkfs), "debugfs")
    _run([debugfs, "-w", "-R", "rmdir lost+found", image], "removing lost+found")


def read_back_bound(image_bytes: int) -> tuple[int, int]:
    """``(bytes, inodes)`` the read-back of an image of *image_bytes* may write at most.

    The host chose the image's size; a tree that fits in it fits in as
    many bytes, and in as many inodes as ``mkfs.ext4 -i 4096`` gave it
    (one per 4 KiB, rounded up per block group: one more per MiB, and 64,
    covers the rounding). A sparse file larger than the image, or one
    file's content written out again for each of its hard links past the
    bound, does not fit and is refused.
    """
    return image_bytes, image_bytes // 4096 + image_bytes // (1 << 20) + 64


def read_back(
    image: str,
    setup: tuple[str, ...],
    *,
    masks: tuple[str, ...],
    bwrap: str,
    debugfs: str = "/usr/sbin/debugfs",
) -> None:
    """Make the writable view mounted by *setup* equal to *image*'s tree (see the module doc).

    *masks* are the workspace-relative secret paths masked in the view:
    neither read nor written. The tree is copied out into a tmpfs of the
    view's private mount namespace, bounded by :func:`read_back_bound`:
    nothing of it reaches the host's disk but what the sync writes into
    the view, and nothing is left behind.

    Raises:
        DiskFailed: the tree exceeds the bound, or debugfs could not read
            the image (a guest that broke its file system): in both cases
            the view is left unchanged; or the view could not be written.
    """
    nbytes, inodes = read_back_bound(os.stat(image).st_size)
    out = f"{_VIEW_ROOT}/out"
    dump = [
        # every namespace but the user namespace: rdump restores the files' owners
        bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
        "--unshare-cgroup-try", "--die-with-parent", "--new-session",
        "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
        "--symlink", "usr/sbin", "/sbin", "--dev", "/dev", "--proc", "/proc",
        "--ro-bind", image, "/image", "--bind", out, "/out",
        "--cap-drop", "ALL", "--cap-add", "CAP_CHOWN", "--cap-add", "CAP_FOWNER",
        "--cap-add", "CAP_DAC_OVERRIDE",
        "--", debugfs, "-R", "rdump / /out", "/image",
    ]  # fmt: skip
    sync = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_firecracker_sync.py")
    _run(
        in_view(
            setup, sys.executable, "-I", "-S", sync, str(nbytes), str(inodes), out,
            f"{_VIEW_ROOT}/ws", *masks, "--", *dump,
        ),
        "reading the guest's workspace back",
    )  # fmt: skip
