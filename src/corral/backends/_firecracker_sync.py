"""Read a guest's workspace back into its view, bounded.

``python -I -S _firecracker_sync.py BYTES INODES OUT VIEW [MASK...] -- DUMP...``

Run by :func:`corral.backends._firecracker_disk.read_back` as the only
process of a private mount namespace where *VIEW* is the run's writable
view (a preview's overlay or copy). Two steps:

1. **Dump, bounded.** A tmpfs of *BYTES* bytes and *INODES* inodes is
   mounted on *OUT*, and *DUMP* (``debugfs rdump`` in bubblewrap, writing
   into *OUT*) copies the guest's tree there. The kernel enforces the
   bound: a guest's sparse file that claims terabytes, or one inode
   hard-linked under thousands of names (rdump writes every name out in
   full), fills the tmpfs and no more. A full tmpfs (no byte or no inode
   left) means the tree does not fit: *DUMP* is killed at once (rdump
   would go on reading a claimed size through failing writes), nothing is
   written into *VIEW*, and the exit status is :data:`TOO_LARGE`. The
   tmpfs lives in this mount namespace alone, so it is gone, with every
   byte of the dump, when this process ends, however it ends.
2. **Sync.** *VIEW* is made equal to the dumped tree:

* an entry of *VIEW* missing from the tree is removed (the overlay records
  a whiteout), unless it is a FIFO, socket or device (``rdump`` never copies
  those, so their absence says nothing);
* a file whose content, mode or owner differs is rewritten in place or
  has its metadata set (the overlay copies it up); an unchanged one is not
  touched (a copy preview's manifest still sees it as untouched);
* a symlink is recreated when its target differs; an entry whose type
  changed is replaced;
* the workspace-relative *MASK* paths (masked secrets in the view) are
  neither read nor written.

Nothing is followed: the tree is read with ``lstat`` and ``O_NOFOLLOW`` (it
was made from the guest's bytes), and *VIEW* is written below directories
this program made or checked to be directories. Standard library only.

Exit status: 0 done; :data:`TOO_LARGE` the tree exceeds the bound (nothing
synced); :data:`UNREADABLE` the dump failed or complained (nothing
synced); 1 the view could not be written; 2 usage.
"""

import os
import select
import signal
import stat
import subprocess
import sys

CHUNK = 1 << 20
#: Exit status: the dumped tree exceeds the bound; the view is untouched.
TOO_LARGE = 3
#: Exit status: the dump failed or reported a problem; the view is untouched.
UNREADABLE = 4
#: Seconds between two looks at the dump's tmpfs while the dump runs.
POLL = 0.02
#: How much of the dump's stderr is kept for the message (the rest is read and dropped).
STDERR_KEPT = 1 << 14


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


def _full(out: str) -> bool:
    st = os.statvfs(out)
    return st.f_bavail == 0 or st.f_favail == 0


def dump(argv: list[str], out: str, nbytes: int, inodes: int) -> tuple[int, str]:
    """Run *argv* (which writes into *out*) with *out* a tmpfs of *nbytes* and *inodes*.

    Returns ``(0, stderr)`` when the dump ended by itself within the bound,
    ``(TOO_LARGE, why)`` when the tmpfs filled (the dump is killed as soon
    as it is seen full), ``(UNREADABLE, why)`` when the dump failed.
    """
    os.mkdir(out, 0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o",
         f"size={nbytes},nr_inodes={inodes},mode=700,nosuid,nodev,noexec",
         "corral-readback", out],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        return UNREADABLE, f"could not mount the read-back's tmpfs: {mounted.stderr.strip()}"
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.fileno()
    kept = bytearray()
    full, reading = False, True
    while True:
        # wake at least every POLL seconds, sooner when the dump writes to stderr
        ready, _w, _x = select.select([err] if reading else [], [], [], POLL)
        if ready:
            data = os.read(err, CHUNK)
            kept += data[: max(0, STDERR_KEPT - len(kept))]
            reading = bool(data)
        if _full(out):
            full = True
            proc.send_signal(signal.SIGKILL)
            break
        if not reading and proc.poll() is not None:
            break
    proc.stderr.close()
    status = proc.wait()
    text = kept.decode("utf-8", "replace")
    if full or _full(out):
        return TOO_LARGE, (
            f"the guest's workspace does not fit in the read-back's bound of {nbytes} bytes "
            f"and {inodes} files (the workspace image's size); the preview was left unchanged"
        )
    problems = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("debugfs ")]
    if status != 0 or problems:
        why = problems[0][:300] if problems else f"exit status {status}"
        return UNREADABLE, f"the guest's workspace image is unreadable: {why}"
    return 0, text


def main() -> int:
    """Entry point (see the module docstring)."""
    args = sys.argv[1:]
    if "--" not in args or args.index("--") < 4 or not args[0].isdigit() or not args[1].isdigit():
        sys.stderr.write("usage: _firecracker_sync.py BYTES INODES OUT VIEW [MASK...] -- DUMP...\n")
        return 2
    split = args.index("--")
    nbytes, inodes, out, view, masks = int(args[0]), int(args[1]), args[2], args[3], args[4:split]
    try:
        status, why = dump(args[split + 1 :], out, nbytes, inodes)
        if status:
            sys.stderr.write(f"{why}\n")
            return status
        sync(out, view, set(masks))
    except OSError as exc:
        sys.stderr.write(f"corral: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
