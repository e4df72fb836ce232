"""Reading ``/proc`` files: the whole text, and fields of a ``/proc/PID/status``.

Shared by the server's peer checks (:mod:`corral.server._peers`) and the write
broker (the target's umask).
"""

from __future__ import annotations

import os

__all__ = ["read_text", "status_fields"]


def read_text(path: str) -> str:
    """The whole of *path* (a ``/proc`` file: read to its end), decoded."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def status_fields(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """The fields *names* of a ``/proc/PID/status`` text, whitespace-normalized; ``""`` if absent.

    Each field is the last line that starts with ``NAME:`` (the kernel writes
    each once, and escapes the one text a process chooses, its ``Name``, so
    no line can be forged), found with one search per field rather than by
    splitting every line: this runs for every server connection and every file
    the write broker creates.
    """
    text = "\n" + text
    found = {}
    for name in names:
        start = text.rfind(f"\n{name}:")
        if start < 0:
            found[name] = ""  # a kernel without the field: both sides read ""
            continue
        start += len(name) + 2
        end = text.find("\n", start)
        found[name] = " ".join(text[start : end if end >= 0 else len(text)].split())
    return found
