"""Make a workspace view equal to a tree: ``python -I -S _firecracker_sync.py SOURCE VIEW [MASK...]``.

Run by :func:`corral.backends._firecracker_disk.read_back` in a private
mount namespace where *VIEW* is the run's writable view (a preview's overlay
or copy) and *SOURCE* the tree ``debugfs rdump`` copied out of the guest's
workspace image. Afterwards *VIEW* holds what *SOURCE* holds:

* an entry of *VIEW* missing from *SOURCE* is removed (the overlay records
  a whiteout), unless it is a FIFO, socket or device (``rdump`` never copies
  those, so their absence says nothing);
* a file whose content, mode or owner differs is rewritten in place or
  has its metadata set (the overlay copies it up); an unchanged one is not
  touched (a copy preview's manifest still sees it as untouched);
* a symlink is recreated when its target differs; an entry whose type
  changed is replaced;
* the workspace-relative *MASK* paths (masked secrets in the view) are
  neither read nor written.

Nothing is followed: *SOURCE* is read with ``lstat`` and ``O_NOFOLLOW`` (it
was made from the guest's bytes), and *VIEW* is written below directories
this program made or checked to be directories. Standard library only.
"""

import os
import stat
import sys

CHUNK = 1 << 20


def _same_content(a: str, b: str) -> bool:
    fa = os.open(a, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fb = os.open(b, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            while True:
                x, y = os.read(fa, CHUNK), os.read(fb, CHUNK)
                if x != y:
                    return False
                if not x:
                    return True
        finally:
            os.close(fb)
    finally:
        os.close(fa)


def _copy(src: str, dst: str, exists: bool) -> None:
    flags = (
        os.O_WRONLY
        | os.O_NOFOLLOW
        | os.O_CLOEXEC
        | (os.O_TRUNC if exists else os.O_CREAT | os.O_EXCL)
    )
    fs = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = os.open(dst, flags, 0o600)
        try:
            while True:
                data = os.read(fs, CHUNK)
                if not data:
                    break
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    finally:
        os.close(fs)


def _remove(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    for name in os.listdir(path):
        _remove(os.path.join(path, name))
    os.rmdir(path)


def _meta(src: os.stat_result, dst: str) -> None:
    cur = os.lstat(dst)
    if (cur.st_uid, cur.st_gid) != (src.st_uid, src.st_gid):
        os.lchown(dst, src.st_uid, src.st_gid)
    if stat.S_IMODE(cur.st_mode) != stat.S_IMODE(src.st_mode):
        os.chmod(dst, stat.S_IMODE(src.st_mode), follow_symlinks=False)


def _special(mode: int) -> bool:
    return not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode))


def sync(source: str, view: str, masks: set[str]) -> None:
    """Make *view* equal to *source* (see the module docstring); iterative."""
    stack = [("", source, view)]
    while stack:
        rel, src_dir, dst_dir = stack.pop()
        have = {n: os.lstat(os.path.join(dst_dir, n)) for n in os.listdir(dst_dir)}
        want = {n: os.lstat(os.path.join(src_dir, n)) for n in os.listdir(src_dir)}
        for name, st in have.items():
            child = f"{rel}/{name}" if rel else name
            if name not in want and child not in masks and not _special(st.st_mode):
                _remove(os.path.join(dst_dir, name))
        for name, st in sorted(want.items()):
            child = f"{rel}/{name}" if rel else name
            if child in masks or _special(st.st_mode):
                continue
            src, dst = os.path.join(src_dir, name), os.path.join(dst_dir, name)
            cur = have.get(name)
            if cur is not None and stat.S_IFMT(cur.st_mode) != stat.S_IFMT(st.st_mode):
                _remove(dst)
                cur = None
            if stat.S_ISDIR(st.st_mode):
                if cur is None:
                    os.mkdir(dst, 0o700)
                stack.append((child, src, dst))
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(src)
                if cur is not None and os.readlink(dst) == target:
                    continue
                if cur is not None:
                    os.unlink(dst)
                os.symlink(target, dst)
                os.lchown(dst, st.st_uid, st.st_gid)
                continue
            elif cur is None or cur.st_size != st.st_size or not _same_content(src, dst):
                _copy(src, dst, cur is not None)
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            _meta(st, dst)
    _meta(os.lstat(source), view)


def main() -> int:
    """Entry point (see the module docstring)."""
    if len(sys.argv) < 3:
        sys.stderr.write("usage: _firecracker_sync.py SOURCE VIEW [MASK...]\n")
        return 2
    try:
        sync(sys.argv[1], sys.argv[2], set(sys.argv[3:]))
    except OSError as exc:
        sys.stderr.write(f"corral: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
