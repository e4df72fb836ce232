"""Small files read and written carefully: settings, trust records.

* :func:`read_small_file` never blocks on a FIFO or device (``O_NONBLOCK``
  and a regular-file check), never reads more than a bound (a settings path
  pointing at ``/dev/zero`` is an error, not a hang), and reports a missing
  file as ``None``;
* :func:`write_file_atomically` writes a temporary file beside the target,
  fsyncs it and renames it over the target, so readers see the old or the new
  content, never a mix; the file gets mode 0600 and its directory 0700 when
  created.
"""

from __future__ import annotations

import os
import posixpath
import stat

from .._exceptions import SettingsError

__all__ = [
    "MAX_FILE_SIZE",
    "error_reason",
    "read_settings_file",
    "read_small_file",
    "write_file_atomically",
]

#: Settings and trust files larger than this are refused.
MAX_FILE_SIZE = 1 << 20


def read_small_file(path: str, *, limit: int = MAX_FILE_SIZE) -> bytes | None:
    """Return the bytes of the regular file *path*, or ``None`` if it does not exist.

    Raises:
        OSError: the file exists but cannot be read (permissions, I/O).
        ValueError: it is not a regular file, or it is larger than *limit*.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags)
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


def error_reason(exc: BaseException) -> str:
    """The part of an error worth showing: ``Permission denied``, ``not a regular file``."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def read_settings_file(path: str, *, required: bool = False) -> bytes | None:
    """Return the bytes of the settings file *path*, or ``None`` if it is missing.

    Raises:
        SettingsError: the file cannot be read, or it is *required* and missing.
    """
    try:
        data = read_small_file(path)
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
