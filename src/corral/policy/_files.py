"""Small files read and written carefully: settings, trust records.

* :func:`read_small_file` never blocks on a FIFO or device (``O_NONBLOCK``
  and a regular-file check), never reads more than a bound (a settings path
  pointing at ``/dev/zero`` is an error, not a hang), and reports a missing
  file as ``None``;
* with ``below=DIR``, the path is opened one component at a time under DIR
  and no symbolic link is followed on the way (a link as the file itself is
  followed only when it names a sibling in the same directory): corral's own
  settings and trust records are never read through a link that leaves their
  directory, because a sandboxed command that could write beside them could
  have planted it (docs/threat-model.md, "corral's own files");
* :func:`write_file_atomically` writes a temporary file beside the target,
  fsyncs it and renames it over the target, so readers see the old or the new
  content, never a mix; the file gets mode 0600 and its directory 0700 when
  created.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from .._exceptions import SettingsError
from ._watched import depends_on

__all__ = [
    "MAX_FILE_SIZE",
    "LinkError",
    "check_confined_dirs",
    "confined_parts",
    "error_reason",
    "read_settings_file",
    "read_small_file",
    "write_file_atomically",
]

#: Settings and trust files larger than this are refused.
MAX_FILE_SIZE = 1 << 20


class LinkError(ValueError):
    """A symbolic link on the way to a confined file (see :func:`read_small_file`)."""


def read_small_file(
    path: str, *, limit: int = MAX_FILE_SIZE, below: str | None = None
) -> bytes | None:
    """Return the bytes of the regular file *path*, or ``None`` if it does not exist.

    Args:
        path: the file.
        limit: the largest size accepted.
        below: a directory above *path*: no component of *path* below it may
            be a symbolic link, except the file itself naming a sibling
            (``settings.json -> settings.work.json``).

    Raises:
        OSError: the file exists but cannot be read (permissions, I/O).
        LinkError: *below* is given and a link leaves the directory.
        ValueError: it is not a regular file, or it is larger than *limit*.
    """
    depends_on(path)
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags) if below is None else _open_confined(path, below, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        chunks = []
        size = 0
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise ValueError(f"larger than {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def confined_parts(path: str, below: str) -> list[str]:
    """The components of *path* under the directory *below* (ValueError if not under it)."""
    base = posixpath.normpath(below)
    path = posixpath.normpath(path)
    if not path.startswith(base.rstrip("/") + "/"):
        raise ValueError(f"{path} is not inside {base}")
    return path[len(base.rstrip("/")) + 1 :].split("/")


def _link_error(directory: str, name: str, dir_fd: int) -> LinkError:
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:
        target = "?"
    return LinkError(
        f"{posixpath.join(directory, name)} is a symbolic link to {target}; corral does not "
        "follow links among its own settings and records (a sandboxed command could have "
        "planted it): replace the link by the real directory or file"
    )


def _open_confined(path: str, below: str, flags: int) -> int:
    """Open *path* under *below* without following links (see :func:`read_small_file`)."""
    parts = confined_parts(path, below)
    directory = posixpath.normpath(below)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            try:
                next_fd = os.open(
                    name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
                )
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(
                    os.lstat(name, dir_fd=dir_fd).st_mode
                ):
                    raise _link_error(directory, name, dir_fd) from None
                raise
            os.close(dir_fd)
            dir_fd = next_fd
            directory = posixpath.join(directory, name)
        name = parts[-1]
        try:
            return os.open(name, flags | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
        target = os.readlink(name, dir_fd=dir_fd)
        if "/" in target or target in (".", ".."):
            raise _link_error(directory, name, dir_fd) from None
        try:  # one hop to a sibling, itself not a link
            return os.open(target, flags | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _link_error(directory, target, dir_fd) from None
            raise
    finally:
        os.close(dir_fd)


def check_confined_dirs(path: str, below: str) -> None:
    """Raise :class:`LinkError` if a directory of *path* under *below* is a symbolic link.

    For writers (``corral trust``): the directories that exist must be real
    directories; missing ones are created later as real directories.
    """
    directory = posixpath.normpath(below)
    for name in confined_parts(path, below)[:-1]:
        directory = posixpath.join(directory, name)
        try:
            mode = os.lstat(directory).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise LinkError(
                f"{directory} is a symbolic link to {os.readlink(directory)}; corral does not "
                "follow links among its own settings and records: replace the link by the "
                "real directory"
            )


def error_reason(exc: BaseException) -> str:
    """The part of an error worth showing: ``Permission denied``, ``not a regular file``."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def read_settings_file(
    path: str, *, required: bool = False, below: str | None = None
) -> bytes | None:
    """Return the bytes of the settings file *path*, or ``None`` if it is missing.

    *below*: see :func:`read_small_file` (no link followed under it).

    Raises:
        SettingsError: the file cannot be read, or it is *required* and missing.
    """
    try:
        data = read_small_file(path, below=below)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"cannot read the file: {error_reason(exc)}", source=path) from exc
    if data is None and required:
        raise SettingsError("settings file not found", source=path)
    return data


def write_file_atomically(path: str, data: bytes, *, mode: int = 0o600) -> None:
    """Replace *path* with *data* atomically (temporary file, fsync, rename).

    Raises:
        OSError: the directory cannot be created or written.
    """
    directory = posixpath.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode
    )
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
