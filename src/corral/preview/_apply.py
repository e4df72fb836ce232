"""Land a preview's changes in the real workspace: journaled, one file at a time.

Guarantees (docs/preview.md, "Safety of apply"):

* **Nothing is written before the journal is.** Apply first checks
  everything (protected paths, conflicts), then writes the complete list of
  operations to ``<state>/apply-journals/<id>.json`` (temp file, fsync,
  rename, fsync of the directory). Only then does it touch the workspace.
* **Every file is whole, old or new.** A regular file is copied from the
  preview into a temporary name in its target directory (reflink when the
  filesystem can), given its mode and mtime, fsynced, and renamed over the
  target: ``rename(2)`` replaces the name atomically. Files are staged in
  batches (up to 128, and always before a ``chmod`` that could make their
  directory read-only): every staged file is fsynced - the first fsync
  commits the filesystem journal for all of them, so the rest are cheap -
  and only then renamed into place. Symlinks go the same
  way. Where a directory becomes a file or symlink (or the reverse), the new
  object is prepared under the temporary name and swapped in with
  ``renameat2(RENAME_EXCHANGE)``, so the name never disappears in between.
  Deletions, ``mkdir`` and ``chmod`` are single system calls.
* **Every operation is idempotent**, judged from the state it finds (a
  deletion of a missing name, a ``mkdir`` of an existing directory, a copy
  redone from the unchanged preview), so completing the journal after a
  crash at *any* point - repeating operations that already happened - ends
  in the same tree. Recovery therefore always rolls *forward*; there is
  nothing to roll back, because before the journal exists nothing was
  written.
* **The next corral command finishes it.** A journal present without a live
  owner (the preview's lock is free: ``flock`` dies with its process) is
  completed by :func:`recover_interrupted`, which every ``corral`` command
  and every :class:`~corral.preview.Preview` lookup calls first.

Paths in the workspace are resolved one component at a time with
``O_NOFOLLOW | O_DIRECTORY``: a directory replaced by a symlink meanwhile
makes that operation fail instead of writing outside the workspace.

Tests inject faults through :data:`FAULT_HOOK`, called with a label at every
step that changes the disk.
"""

from __future__ import annotations

import errno
import os
import stat

from .._frozen import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from ._changes import Change

__all__ = [
    "FAULT_HOOK",
    "ApplyResult",
    "journal_dir",
    "plan_operations",
    "roll_forward",
    "write_journal",
]

#: Called with a step label before each durable step (tests kill the process here).
FAULT_HOOK: Callable[[str], None] | None = None

_FICLONE = 0x40049409
_BATCH = 128  # files staged before they are fsynced and renamed together
_TEMP_PREFIX = ".corral-apply-"


class ApplyResult(Record):
    """What an apply did.

    Attributes:
        preview_id: the preview applied.
        applied: workspace-relative paths written, created or removed.
        skipped_conflicts: changes left out because the real file changed
            meanwhile (``skip_conflicts=True``); they stay in the preview.
        skipped_unsupported: FIFOs, sockets and devices, never applied.
        failed: ``(path, error)`` of operations that failed; the files are
            each still wholly old or new, and the preview is kept.
        preview_removed: the preview was consumed (everything landed).
        quarantined: ``(path, reason)`` of git inputs that landed and that
            the git check renamed out of git's way (see
            :mod:`corral.backends._gitcheck`).
    """

    preview_id: str
    applied: tuple[str, ...] = ()
    skipped_conflicts: tuple[str, ...] = ()
    skipped_unsupported: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    preview_removed: bool = False
    quarantined: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "preview": self.preview_id,
            "applied": list(self.applied),
            "skipped_conflicts": list(self.skipped_conflicts),
            "skipped_unsupported": list(self.skipped_unsupported),
            "failed": [list(f) for f in self.failed],
            "preview_removed": self.preview_removed,
            "quarantined": [list(q) for q in self.quarantined],
        }


def _step(label: str) -> None:
    if FAULT_HOOK is not None:
        FAULT_HOOK(label)


def journal_dir(state_dir: str) -> str:
    """Where apply journals live (one file per preview being applied)."""
    return os.path.join(state_dir, "apply-journals")


# ---------------------------------------------------------------- planning
def _depth(path: str) -> int:
    return path.count("/")


def _key(path: str) -> tuple[str, ...]:
    return tuple(path.split("/"))


def plan_operations(changes: Iterable[Change]) -> list[list[object]]:
    """The ordered operations that turn the real workspace into the preview's tree.

    1. removals (``rm`` for non-directories, ``rmdir``), deepest first;
    2. creations in path order (parents first): ``mkdir`` (a directory,
       prepared under a temporary name with its mode and renamed into place),
       ``put`` (a regular file, atomically), ``link`` (a symlink, atomically);
       each replaces what is there, a directory <-> non-directory change
       included (an exchange, see the module docstring);
    3. ``chmod`` of files whose mode alone changed, then of directories whose
       mode changed or whose new mode lacks ``u+rwx`` (created writable so
       their entries can be added), deepest first.
    """
    removals: list[list[object]] = []
    creations: list[list[object]] = []
    file_modes: list[list[object]] = []
    dir_modes: list[list[object]] = []
    for c in changes:
        if c.kind == "unsupported":
            continue
        if c.kind == "deleted":
            removals.append(["rmdir" if c.old_type == "dir" else "rm", c.path])
            continue
        if c.kind == "renamed" and c.old_path is not None:
            removals.append(["rm", c.old_path])
        if c.new_type == "dir":
            mode = c.new_mode if c.new_mode is not None else 0o755
            creations.append(["mkdir", c.path, mode | 0o700])
            if c.mode_changed or mode & 0o700 != 0o700:
                dir_modes.append(["chmod", c.path, mode])
        elif c.new_type == "symlink":
            creations.append(["link", c.path, c.new_target])
        elif c.new_type == "file":
            if c.content_changed or c.kind in ("added", "renamed") or c.type_changed:
                creations.append(["put", c.path, c.source, c.new_mode, c.new_mtime_ns])
            elif c.mode_changed:
                file_modes.append(["chmod", c.path, c.new_mode])
    removals.sort(key=lambda op: (-_depth(str(op[1])), _key(str(op[1]))))
    creations.sort(key=lambda op: _key(str(op[1])))
    dir_modes.sort(key=lambda op: (-_depth(str(op[1])), _key(str(op[1]))))
    return [*removals, *creations, *file_modes, *dir_modes]


# ---------------------------------------------------------------- journal
def write_journal(state_dir: str, journal: dict[str, object]) -> str:
    """Write *journal* durably (temp, fsync, rename, fsync dir); return its path."""
    from .._jsonfast import dumps

    directory = journal_dir(state_dir)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, f"{journal['preview']}.json")
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        data = dumps(journal).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    _step("journal-rename")
    os.rename(tmp, path)
    _fsync_dir(directory)
    _step("journal-written")
    return path


def remove_journal(path: str) -> None:
    """Delete a completed journal (durably)."""
    _step("journal-remove")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    _fsync_dir(os.path.dirname(path))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- roll forward
def roll_forward(journal: dict[str, object]) -> list[tuple[str, str]]:
    """Carry out every operation of *journal* (again); return ``(path, error)`` failures.

    Safe to call any number of times, after a crash at any point.
    """
    workspace = str(journal["workspace"])
    preview_id = str(journal["preview"])
    ops = journal["ops"]
    assert isinstance(ops, list)
    failures: list[tuple[str, str]] = []
    touched_dirs: set[str] = set()
    pending: list[_Staged] = []
    ws_fd = os.open(workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for number, op in enumerate(ops):
            name = str(op[0])
            rel = str(op[1])
            temp = f"{_TEMP_PREFIX}{preview_id}-{number}"
            if pending and (name == "chmod" or len(pending) >= _BATCH):
                _land_staged(pending, failures)
            try:
                staged = _run_op(ws_fd, name, rel, op, temp, number)
            except OSError as exc:
                failures.append((rel, f"{name}: {exc.strerror or exc}"))
                _remove_temp(ws_fd, rel, temp)
            else:
                if staged is not None:
                    pending.append(staged)
            touched_dirs.add(rel.rpartition("/")[0])
        _land_staged(pending, failures)
        for rel_dir in sorted(touched_dirs):
            try:
                fd = _walk(ws_fd, rel_dir.split("/") if rel_dir else [])
                try:
                    dir_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                    try:
                        os.fsync(dir_fd)
                    finally:
                        os.close(dir_fd)
                finally:
                    os.close(fd)
            except OSError:
                pass  # durability of a directory that is gone: nothing to do
    finally:
        for (
            item
        ) in pending:  # only after an unexpected error: the temporaries stay, the targets are old
            item.close()
        os.close(ws_fd)
    return failures


class _Staged:
    """A file written under its temporary name, waiting for fsync and rename."""

    __slots__ = ("base", "data_fd", "number", "parent_fd", "rel", "temp")

    def __init__(
        self, parent_fd: int, base: str, temp: str, data_fd: int, rel: str, number: int
    ) -> None:
        self.parent_fd = parent_fd
        self.base = base
        self.temp = temp
        self.data_fd = data_fd
        self.rel = rel
        self.number = number

    def close(self) -> None:
        for fd in (self.data_fd, self.parent_fd):
            if fd >= 0:
                os.close(fd)
        self.data_fd = self.parent_fd = -1


def _land_staged(pending: list[_Staged], failures: list[tuple[str, str]]) -> None:
    """fsync every staged file, then rename each over its target, in order."""
    try:
        for item in pending:
            try:
                os.fsync(item.data_fd)
            except OSError as exc:
                failures.append((item.rel, f"put: {exc.strerror or exc}"))
                _remove_temp_at(item.parent_fd, item.temp)
                item.close()
        for item in pending:
            if item.parent_fd < 0:
                continue
            try:
                os.close(item.data_fd)
                item.data_fd = -1
                _step(f"op{item.number}-rename")
                _replace(
                    item.parent_fd,
                    item.temp,
                    item.base,
                    _lstat_at(item.parent_fd, item.base),
                    item.number,
                )
            except OSError as exc:
                failures.append((item.rel, f"put: {exc.strerror or exc}"))
                try:
                    _remove_temp_at(item.parent_fd, item.temp)
                except OSError:
                    pass
            finally:
                item.close()
    finally:
        pending.clear()


def _walk(ws_fd: int, parts: list[str]) -> int:
    """An O_PATH fd of the directory *parts* below the workspace, never through a symlink."""
    fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=ws_fd)
    for part in parts:
        if part in ("", ".", ".."):
            os.close(fd)
            raise OSError(errno.EINVAL, f"bad path component {part!r}")
        try:
            nxt = os.open(
                part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _parent(ws_fd: int, rel: str) -> tuple[int, str]:
    parent, _, name = rel.rpartition("/")
    if name in ("", ".", ".."):
        raise OSError(errno.EINVAL, f"bad path {rel!r}")
    return _walk(ws_fd, parent.split("/") if parent else []), name


def _lstat_at(fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _run_op(
    ws_fd: int, name: str, rel: str, op: list[object], temp: str, number: int
) -> _Staged | None:
    """Carry out one operation; a ``put`` is only staged (returned, to be landed in a batch)."""
    try:
        fd, base = _parent(ws_fd, rel)
    except (FileNotFoundError, NotADirectoryError):
        if name in ("rm", "rmdir"):
            # its directory is gone or no longer a directory (removed or replaced by an
            # earlier attempt): the name cannot exist, there is nothing to remove
            return None
        raise
    staged = None
    try:
        if name in ("put", "link", "mkdir"):
            _remove_temp_at(fd, temp)  # left by an interrupted attempt (or an exchanged-out object)
        st = _lstat_at(fd, base)
        if name == "rm":
            if st is not None and not stat.S_ISDIR(st.st_mode):
                _step(f"op{number}-rm")
                os.unlink(base, dir_fd=fd)
        elif name == "rmdir":
            if st is not None and stat.S_ISDIR(st.st_mode):
                _step(f"op{number}-rmdir")
                os.rmdir(base, dir_fd=fd)
        elif name == "mkdir":
            if st is None or not stat.S_ISDIR(st.st_mode):
                os.mkdir(temp, 0o700, dir_fd=fd)
                if os.geteuid() == 0:
                    owner = st or os.fstat(fd)
                    os.chown(temp, owner.st_uid, owner.st_gid, dir_fd=fd, follow_symlinks=False)
                _chmod_at(fd, temp, int(op[2]) if len(op) > 2 else 0o755)  # type: ignore[call-overload]
                _step(f"op{number}-mkdir")
                _replace(fd, temp, base, st, number)
        elif name == "put":
            source, mode, mtime_ns = str(op[2]), int(op[3]), int(op[4])  # type: ignore[call-overload]
            data_fd = _stage(fd, temp, source, mode, mtime_ns, st, number)
            staged = _Staged(fd, base, temp, data_fd, rel, number)
        elif name == "link":
            target = str(op[2])
            os.symlink(target, temp, dir_fd=fd)
            _step(f"op{number}-rename")
            _replace(fd, temp, base, st, number)
        elif name == "chmod":
            mode = int(op[2])  # type: ignore[call-overload]
            if st is not None and not stat.S_ISLNK(st.st_mode):
                _step(f"op{number}-chmod")
                _chmod_at(fd, base, mode)
        else:
            raise OSError(errno.EINVAL, f"unknown operation {name!r}")
    finally:
        if staged is None:
            os.close(fd)  # a staged put keeps its directory open until it lands
    return staged


def _stage(
    fd: int,
    temp: str,
    source: str,
    mode: int,
    mtime_ns: int,
    st: os.stat_result | None,
    number: int,
) -> int:
    """Write the preview's version of a file to *temp* in *fd*; return its open fd (not fsynced)."""
    src = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise OSError(errno.EINVAL, "the preview's version is not a regular file")
        _step(f"op{number}-temp")
        dst = os.open(
            temp,
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=fd,
        )
        try:
            _copy_data(src, dst)
            _step(f"op{number}-copied")
            _keep_owner(dst, fd, st)
            os.fchmod(dst, mode & 0o1777)
            os.utime(dst, ns=(mtime_ns, mtime_ns))
        except BaseException:
            os.close(dst)
            raise
        return dst
    finally:
        os.close(src)


def _keep_owner(dst: int, parent_fd: int, st: os.stat_result | None) -> None:
    """As root, give the new version the owner of the old one (or of its directory).

    Without this, an apply by root would hand the user's files to root. Other
    users cannot change owners and keep their own.
    """
    if os.geteuid() != 0:
        return
    owner = st if st is not None and not stat.S_ISDIR(st.st_mode) else os.fstat(parent_fd)
    os.fchown(dst, owner.st_uid, owner.st_gid)


def _replace(fd: int, temp: str, base: str, st: os.stat_result | None, number: int) -> None:
    """Put *temp* in place of *base*: ``rename`` over a non-directory, else exchange.

    A directory <-> non-directory replacement cannot be one ``rename``: the
    two are exchanged atomically (``RENAME_EXCHANGE``) and the old object,
    now under the temporary name, is removed. The directory being replaced
    must be empty by then (its entries were removed first); if it is not,
    nothing is exchanged.
    """
    new_is_dir = stat.S_ISDIR(os.stat(temp, dir_fd=fd, follow_symlinks=False).st_mode)
    old_is_dir = st is not None and stat.S_ISDIR(st.st_mode)
    if st is None or (not old_is_dir and not new_is_dir):
        os.rename(temp, base, src_dir_fd=fd, dst_dir_fd=fd)
        return
    if old_is_dir and os.listdir(_fd_path(fd, base)):
        raise OSError(errno.ENOTEMPTY, "the directory to be replaced is not empty")
    try:
        _exchange(fd, temp, base)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        # no RENAME_EXCHANGE here: remove, then rename (the name is briefly absent)
        if old_is_dir:
            os.rmdir(base, dir_fd=fd)
        else:
            os.unlink(base, dir_fd=fd)
        os.rename(temp, base, src_dir_fd=fd, dst_dir_fd=fd)
        return
    _step(f"op{number}-exchanged")
    _remove_temp_at(fd, temp)


def _fd_path(fd: int, name: str) -> str:
    return f"/proc/self/fd/{fd}/{name}"


_RENAME_EXCHANGE = 2
_libc: object = None


def _exchange(fd: int, a: str, b: str) -> None:
    """``renameat2(fd, a, fd, b, RENAME_EXCHANGE)``."""
    import ctypes

    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(_libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(fd, os.fsencode(a), fd, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _copy_data(src: int, dst: int) -> None:
    """Copy the whole of *src* into *dst*: reflink, else in-kernel copy, else read/write."""
    import fcntl

    try:
        fcntl.ioctl(dst, _FICLONE, src)
        return
    except OSError:
        pass
    try:
        while os.copy_file_range(src, dst, 1 << 30):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    os.lseek(src, 0, os.SEEK_SET)
    os.ftruncate(dst, 0)
    os.lseek(dst, 0, os.SEEK_SET)
    while chunk := os.read(src, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view) :]


def _chmod_at(fd: int, name: str, mode: int) -> None:
    """chmod a file or directory by name in *fd*, never through a symlink."""
    target = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    try:
        os.chmod(f"/proc/self/fd/{target}", mode & 0o1777)
    finally:
        os.close(target)


def _remove_temp_at(fd: int, temp: str) -> None:
    """Remove a temporary name: a file, a symlink, or an (empty) exchanged-out directory."""
    st = _lstat_at(fd, temp)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        os.rmdir(temp, dir_fd=fd)
    else:
        os.unlink(temp, dir_fd=fd)


def _remove_temp(ws_fd: int, rel: str, temp: str) -> None:
    try:
        fd, _base = _parent(ws_fd, rel)
    except OSError:
        return
    try:
        _remove_temp_at(fd, temp)
    except OSError:
        pass
    finally:
        os.close(fd)
