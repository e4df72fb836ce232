"""Which copy-on-write mechanism a preview uses, and the copy fallback.

In order of preference:

1. ``overlay``: kernel overlayfs, mounted by the exec helper
   (``corral-exec --mount-overlay``) in a private mount namespace - a user
   namespace as well when corral is not root - over the workspace's own
   path, just before bubblewrap starts. Set-up cost does not depend on the
   workspace's size: one ``mount(2)``.
2. ``fuse-overlayfs``: the same with the fuse-overlayfs daemon, for kernels
   that refuse overlayfs here (older than 5.11 in a user namespace, or
   ``overlay`` not built). Needs the binary and access to ``/dev/fuse``.
3. ``copy``: a full copy of the workspace in corral's state dir (reflinked
   where the filesystem can: btrfs, XFS), bound at the workspace's path.
   Costs time and space proportional to the workspace; used when neither
   overlay works, or when asked for.

Each overlay candidate is *tried* once - a real mount in a throw-away
namespace, writing a file through it and checking where it landed - and the
result is cached per kernel, user and state-dir filesystem in corral's probe
cache. ``CORRAL_PREVIEW_MECHANISM`` (``auto``, ``overlay``,
``fuse-overlayfs``, ``copy``) overrides the choice; a mechanism that was
asked for by name and does not work is an error, not a fallback.
"""

from __future__ import annotations

import os
import stat

from .._exceptions import PreviewError
from ._layers import kind_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MECHANISMS",
    "choose_mechanism",
    "copy_tree",
    "find_fuse_overlayfs",
    "probe",
    "remove_tree",
]

MECHANISMS: tuple[str, ...] = ("overlay", "fuse-overlayfs", "copy")
_PROBE_TIMEOUT = 20.0


def find_fuse_overlayfs(environ: Mapping[str, str] | None = None) -> str | None:
    """Absolute path of fuse-overlayfs (absolute ``PATH`` entries only), or ``None``."""
    env = os.environ if environ is None else environ
    for directory in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        if not directory.startswith("/"):
            continue
        candidate = os.path.join(directory, "fuse-overlayfs")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def probe(mechanism: str, previews_dir: str, *, use_cache: bool = True) -> str | None:
    """Why *mechanism* does not work here (with the fix), or ``None`` if it does.

    ``overlay`` and ``fuse-overlayfs`` are tried for real: a mount by the exec
    helper over a scratch directory under *previews_dir*, a write through it,
    and a check that the write landed in the upper layer and not below.
    """
    if mechanism == "copy":
        return None
    if mechanism not in ("overlay", "fuse-overlayfs"):
        return f"unknown preview mechanism {mechanism!r} (known: {', '.join(MECHANISMS)})"
    from .. import _state
    from ..backends import helper_path

    helper = helper_path()
    if helper is None:
        return (
            "corral's exec helper is missing "
            "(reinstall corral with a C compiler: apt-get install gcc libc6-dev)"
        )
    fuse = None
    if mechanism == "fuse-overlayfs":
        fuse = find_fuse_overlayfs()
        if fuse is None:
            return "fuse-overlayfs is not installed (apt-get install fuse-overlayfs)"
        if not os.access("/dev/fuse", os.R_OK | os.W_OK):
            return "/dev/fuse is missing or not accessible to this user"
    os.makedirs(previews_dir, mode=0o700, exist_ok=True)
    key = f"preview-{mechanism}:{os.uname().release}:{os.geteuid()}:{os.stat(previews_dir).st_dev}"
    if use_cache:
        cached = _state.cache_get(key)
        if (
            isinstance(cached, list)
            and len(cached) == 1
            and (cached[0] is None or isinstance(cached[0], str))
        ):
            return cached[0]
    problem = _try_mount(helper, mechanism, fuse, previews_dir)
    _state.cache_put(key, [problem])
    return problem


def _try_mount(helper: str, mechanism: str, fuse: str | None, previews_dir: str) -> str | None:
    import subprocess
    import tempfile

    scratch = tempfile.mkdtemp(prefix=".probe-", dir=previews_dir)
    try:
        lower, upper, work = (os.path.join(scratch, d) for d in ("lower", "upper", "work"))
        for d in (lower, upper, work):
            os.mkdir(d, 0o700)
        argv = [
            helper,
            "--mount-overlay",
            "fuse" if fuse else "overlay",
            lower,
            upper,
            work,
            "--status-fd",
            "2",
        ]
        if fuse:
            argv += ["--fuse-binary", fuse]
        argv += ["--", "/bin/sh", "-c", 'echo probe > "$1/written"', "sh", lower]
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the trial mount did not finish: {exc}"
        if result.returncode != 0:
            detail = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
            text = detail[0]
            if text.startswith("E"):
                step, _, rest = text[1:].partition("\t")
                text = f"{step}: {rest.partition(chr(9))[2]}"
            return f"the trial mount failed ({text})"
        if os.path.exists(os.path.join(lower, "written")):
            return "the trial mount wrote through to the lower directory"
        if not os.path.isfile(os.path.join(upper, "written")):
            return "the trial write did not land in the upper directory"
        return None
    finally:
        remove_tree(scratch)


def choose_mechanism(requested: str, previews_dir: str) -> str:
    """Resolve ``auto`` (or *requested* by name) to a working mechanism.

    Raises:
        PreviewError: a mechanism asked for by name does not work here, or is unknown.
    """
    requested = requested or "auto"
    if requested != "auto":
        if requested not in MECHANISMS:
            raise PreviewError(
                f"Failed to create a preview: unknown mechanism {requested!r}",
                hint=f"use one of: auto, {', '.join(MECHANISMS)}",
            )
        problem = probe(requested, previews_dir)
        if problem is not None:
            raise PreviewError(
                f"Failed to create a preview with {requested}: {problem}",
                hint="unset CORRAL_PREVIEW_MECHANISM (or use 'auto') to fall back",
            )
        return requested
    for mechanism in MECHANISMS:
        if probe(mechanism, previews_dir) is None:
            return mechanism
    return "copy"  # pragma: no cover - copy always works


def copy_tree(workspace: str, tree: str) -> dict[str, tuple[str, int, int]]:
    """Copy *workspace* into the new directory *tree*; return its manifest.

    Regular files are reflinked where the filesystem supports it (else
    copied in the kernel), with mode and mtime; directories and symlinks are
    recreated; FIFOs, sockets and devices are left out (the sandbox does not
    see them). The manifest maps each copied path to ``(kind, inode, ctime)``
    of the copy, taken after the copy's last change, so a later difference
    means the sandboxed command touched it.
    """
    from ._apply import _copy_data

    manifest: dict[str, tuple[str, int, int]] = {}
    os.mkdir(tree, 0o700)

    def walk(src_dir: str, dst_dir: str, rel: str) -> None:
        with os.scandir(src_dir) as entries:
            items = sorted(entries, key=lambda e: e.name)
        for entry in items:
            child = f"{rel}/{entry.name}" if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            dst = os.path.join(dst_dir, entry.name)
            kind = kind_of(st.st_mode)
            if kind == "dir":
                os.mkdir(dst, 0o700)
                walk(entry.path, dst, child)
                os.chmod(dst, stat.S_IMODE(st.st_mode))
                os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            elif kind == "file":
                src_fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    dst_fd = os.open(
                        dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
                    )
                    try:
                        _copy_data(src_fd, dst_fd)
                        os.fchmod(dst_fd, stat.S_IMODE(st.st_mode))
                        os.utime(dst_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
                    finally:
                        os.close(dst_fd)
                finally:
                    os.close(src_fd)
            elif kind == "symlink":
                os.symlink(os.readlink(entry.path), dst)
            else:
                continue
            copied = os.lstat(dst)
            manifest[child] = (kind, copied.st_ino, copied.st_ctime_ns)

    walk(workspace, tree, "")
    root = os.stat(workspace)
    os.chmod(tree, stat.S_IMODE(root.st_mode))
    return manifest


def remove_tree(path: str) -> None:
    """Remove *path* recursively, including directories without permissions.

    The overlay's work directory holds a mode-000 ``work`` directory, and the
    sandboxed command may have left read-only directories in the tree: each
    directory is opened with ``O_NOFOLLOW`` relative to its parent's fd and
    made accessible through that fd, so a symlink swapped in for a directory
    (by a command still running in the same session) is unlinked, never
    followed, and nothing outside the tree changes mode. Best effort: what
    cannot be removed stays. No recursion (a deep tree cannot exhaust the
    stack); one fd per level is open at a time.
    """
    parent, name = os.path.split(path.rstrip("/"))
    if not name:
        return
    try:
        parent_fd = os.open(parent or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    # frames: [parent fd, name, own fd, names left to remove]
    frames: list[tuple[int, str, int, list[str]]] = []
    try:
        _enter(parent_fd, name, frames)
        while frames:
            dir_parent, dir_name, dir_fd, left = frames[-1]
            if left:
                _enter(dir_fd, left.pop(), frames)
                continue
            frames.pop()
            os.close(dir_fd)
            try:
                os.rmdir(dir_name, dir_fd=dir_parent)
            except OSError:
                pass
    finally:
        for _p, _n, fd, _l in frames:
            os.close(fd)
        os.close(parent_fd)


def _enter(parent_fd: int, name: str, frames: list[tuple[int, str, int, list[str]]]) -> None:
    """Unlink *name* below *parent_fd*, or push a frame to empty it if it is a directory."""
    import stat

    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(name, dir_fd=parent_fd)
        except OSError:
            pass
        return
    try:
        fd = os.open(
            name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd
        )
    except OSError:
        try:
            os.unlink(name, dir_fd=parent_fd)  # swapped for a non-directory meanwhile
        except OSError:
            pass
        return
    try:
        # the directory itself, through our fd (a magic link to this very inode)
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
    except OSError:
        pass
    try:
        listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            names = os.listdir(listing)
        finally:
            os.close(listing)
    except OSError:
        names = []
    frames.append((parent_fd, name, fd, names))
