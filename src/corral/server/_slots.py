"""How many corral servers one user may run at once, and what a client does when none may start.

The state directories of one configuration share one server
(:mod:`._hub`), but servers of different configurations (other
environments, other installations) are separate processes, each with its
interpreter, launcher pool and inotify instance; hundreds of them would
exhaust the user's inotify instances. A server therefore holds one of :data:`MAX_SERVERS`
**slots** of its user for its whole life: an abstract unix socket named
``corral-server/<uid>/<n>`` (Linux frees it when the process exits, however
it exits, and it needs no file anywhere). A server that finds every slot
taken does not start; it records that in ``server/busy`` and clients of
that state directory run their commands in their own process (with one
warning each) without trying to start a server again for
:data:`BUSY_RETRY` seconds.

A slot name is only a counter, never a way in: nothing connects to it, and
a process that binds slot names first (another user, or a sandboxed process
sharing the host's network namespace) can only make corral's clients run
commands in their own process - slower, never less confined.
"""

from __future__ import annotations

import _socket
import errno
import os
import time

from .._exceptions import ServerError

__all__ = [
    "BUSY",
    "BUSY_RETRY",
    "MAX_SERVERS",
    "busy_reason",
    "mark_busy",
    "take_slot",
    "write_record",
]

#: servers one user may run at once (over all state directories)
MAX_SERVERS = 16
#: seconds a state directory's clients wait before they try to start a server again
BUSY_RETRY = 60.0
BUSY = "busy"  # in server/: why the last server start failed, and when


def take_slot() -> tuple[_socket.socket, int]:
    """Bind the first free slot of this user; the socket (hold it open) and its number.

    Raises:
        ServerError: all :data:`MAX_SERVERS` slots are taken.
    """
    uid = os.getuid()
    for number in range(MAX_SERVERS):
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        try:
            sock.bind(f"\0corral-server/{uid}/{number}")
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                continue
            raise ServerError(f"Failed to take a server slot: {exc.strerror}") from exc
        return sock, number
    raise ServerError(
        f"Failed to start: {MAX_SERVERS} corral servers already run for uid {uid} "
        "(one per configuration in use)",
        hint="stop some with corral server --stop, or wait until they are idle",
    )


def mark_busy(directory: str, problem: str | None) -> None:
    """Record in *directory* (``<state>/server``) why no server could start now; None: clear it."""
    text = None if problem is None else f"{time.time() + BUSY_RETRY:.3f}\n{problem}\n"
    write_record(os.path.join(directory, BUSY), text)


def write_record(path: str, text: str | None) -> None:
    """Write *text* to the record *path*, or remove it (None); best effort: errors are ignored."""
    try:
        if text is None:
            os.unlink(path)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    except OSError:
        pass


def busy_reason(directory: str) -> str | None:
    """Why the last server start in *directory* failed, while clients should not retry; else None."""
    try:
        with open(os.path.join(directory, BUSY), "rb") as f:
            until, _, problem = f.read(4096).partition(b"\n")
        if time.time() < float(until):
            return problem.decode("utf-8", "replace").strip() or "unknown"
    except (OSError, ValueError):
        pass
    return None
