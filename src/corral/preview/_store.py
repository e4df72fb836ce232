"""Where a preview keeps its state: ids, directories, JSON records, the preview lock."""

from __future__ import annotations

import os

from .._exceptions import PreviewError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__: list[str] = []

_META = "preview.json"
_BASE = "base.json"
_MANIFEST = "manifest.json"
_LOCK = "lock"
_ID_PREFIX = "pv-"


def _valid_id(preview_id: str) -> bool:
    rest = preview_id[len(_ID_PREFIX) :]
    return (
        preview_id.startswith(_ID_PREFIX)
        and len(rest) == 12
        and all(c in "0123456789abcdef" for c in rest)
    )


def _previews_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "previews")


def _read_json(path: str) -> Any:
    from .._jsonfast import loads

    with open(path, "rb") as f:
        return loads(f.read())


def _write_json(path: str, data: object, *, durable: bool = False) -> None:
    from .._jsonfast import dumps

    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        payload = memoryview(dumps(data).encode())
        while payload:
            payload = payload[os.write(fd, payload) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class _Lock:
    """An exclusive ``flock`` on a file, released on exit (and by the kernel if we die)."""

    __slots__ = ("_fd", "_path", "_what")

    def __init__(self, path: str, what: str) -> None:
        self._path = path
        self._what = what
        self._fd = -1

    def acquire(self, *, wait: bool) -> bool:
        import fcntl

        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(self._fd)
            self._fd = -1
            return False
        return True

    def __enter__(self) -> _Lock:
        if self._fd < 0 and not self.acquire(wait=False):
            raise PreviewError(
                f"Failed to use {self._what}: another corral command is using it "
                "(a run, an apply or a discard)",
                hint="wait for it to finish",
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
