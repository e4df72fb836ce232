"""The server's watch on its own code: any change under corral's package directories retires it."""

from __future__ import annotations

import os
import sys

__all__ = ["CodeWatch"]


class CodeWatch:
    """Notices any change under corral's package directories (inotify)."""

    _MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
    _IGNORED_NAMES = frozenset({b"__pycache__"})
    #: the fast client's sidecar (and its temporary files): a record, not code
    _IGNORED_PREFIXES = (b"corral-client.cli",)

    def __init__(self, root: str) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0o4000 | 0o2000000)  # IN_NONBLOCK | IN_CLOEXEC
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.fd = fd
        self.changed = ""
        for directory, dirs, _files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if libc.inotify_add_watch(fd, os.fsencode(directory), self._MASK) < 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, f"inotify_add_watch {directory}: {os.strerror(err)}")

    def poll(self) -> str:
        """Read pending events; return what changed ("" if nothing that matters)."""
        while not self.changed:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            offset = 0
            while offset + 16 <= len(data):
                mask = int.from_bytes(data[offset + 4 : offset + 8], sys.byteorder)
                length = int.from_bytes(data[offset + 12 : offset + 16], sys.byteorder)
                name = data[offset + 16 : offset + 16 + length].rstrip(b"\0")
                offset += 16 + length
                if mask & 0x4000:  # IN_Q_OVERFLOW
                    self.changed = "too many changes to follow"
                elif name not in self._IGNORED_NAMES and not name.startswith(
                    self._IGNORED_PREFIXES
                ):
                    self.changed = os.fsdecode(name) or "a package directory"
        return self.changed

    def close(self) -> None:
        os.close(self.fd)
