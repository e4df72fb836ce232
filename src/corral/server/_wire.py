"""The corral server's protocol: where the socket is, what a code stamp is, frames.

Shared by the server (:mod:`corral.server._server`) and its client
(:mod:`corral.cli._client`, on the ``corral run`` hot path: this module
imports only :mod:`os`, :mod:`sys` and :mod:`corral._jsonfast`).

One connection carries one request. Every message is a *frame*: a 4-byte
big-endian length, then that many bytes of JSON (one object)::

    client -> server   {"op": "run", "protocol": 1, "code": STAMP, "argv": [...],
                        "cwd": "...", "env": {...}, "pid": N}
                       + SCM_RIGHTS: the client's fds 0, 1, 2 (with the frame's first byte)
    server -> client   {"accepted": true}
                  or   {"refused": REASON, "stale": BOOL}       then the server closes
    client -> server   {"signal": N}                            any number, any time
    server -> client   {"exit": STATUS}                         then the server closes
                  or   {"exit": STATUS, "report": {"fd": FD, "text": LINE}}
                       (``corral run --report-fd FD``: the client writes LINE to its fd FD,
                       FD >= 3 and none of the client's own)

    client -> server   {"op": "hook", "protocol": 1, "code": STAMP, "integration": "claude-code",
                        "stdin": "...", "cwd": "...", "env": {...}, "pid": N}     (no fds)
    server -> client   {"hook": {"stdout": "...", "stderr": "...", "exit": N}}
                  or   {"refused": REASON, "stale": BOOL}       then the server closes

    client -> server   {"op": "status"} | {"op": "stop"}        (corral server --status/--stop)
    server -> client   {"status": {...}} | {"stopping": true}

A client that closes its end (killed) makes the server kill the sandbox.

Byte strings (argv, environment, cwd, a hook's input and output) travel as
JSON strings of their ``os.fsdecode`` form: UTF-8, each undecodable byte as
the surrogate escape ``\\udcXX``. The Python client's stamp is
:func:`code_stamp`; the compiled client (``corral-client``) sends ``"c1:"`` and
its own real path (:func:`corral.server._fastclient.client_stamp`).
"""

from __future__ import annotations

import os
import sys

from .._jsonfast import JSONError, dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = [
    "MAX_FRAME",
    "PROTOCOL",
    "FrameReader",
    "WireError",
    "bind_unix",
    "code_stamp",
    "connect_unix",
    "encode",
    "socket_path",
]

PROTOCOL = 1
#: a frame carries argv and the whole environment: bounded well above ARG_MAX (2 MiB)
MAX_FRAME = 16 << 20


class WireError(ValueError):
    """A malformed or oversized frame."""


def socket_path(state_dir: str) -> str:
    """The server's socket for the user whose state directory is *state_dir*."""
    return os.path.join(state_dir, "server", "server.sock")


#: the longest path a ``sockaddr_un`` holds with its terminating NUL (``sun_path`` is 108 bytes)
SUN_PATH_MAX = 107


def _through_directory(sock: Any, path: str, call: str) -> None:
    """``sock.<call>(path)``; a *path* too long for ``sun_path`` goes through a short alias.

    The alias is ``/proc/self/fd/N/NAME``, N an ``O_PATH`` descriptor of the
    socket's directory (opened for this call, closed after it): the kernel
    resolves it to the same directory entry, so the socket file, its owner and
    mode, and the peer checks are those of *path* itself. A missing directory
    raises :class:`FileNotFoundError` (or :class:`NotADirectoryError`), as
    the direct call would.
    """
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        getattr(sock, call)(path)
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        alias = f"/proc/self/fd/{fd}/{name}"
        if len(os.fsencode(alias)) > SUN_PATH_MAX:
            raise OSError(36, f"socket name too long: {name!r}")  # ENAMETOOLONG
        getattr(sock, call)(alias)
    finally:
        os.close(fd)


def connect_unix(sock: Any, path: str) -> None:
    """Connect the ``AF_UNIX`` socket *sock* to *path*, however long (see :func:`bind_unix`)."""
    _through_directory(sock, path, "connect")


def bind_unix(sock: Any, path: str) -> None:
    """Bind the ``AF_UNIX`` socket *sock* to *path*, however long.

    A path longer than :data:`SUN_PATH_MAX` bytes (a deep state directory) is
    bound through ``/proc/self/fd/N/NAME`` with N a descriptor of its
    directory; the socket file is created at *path* all the same. Needs
    ``/proc`` for such paths only.
    """
    _through_directory(sock, path, "bind")


def code_stamp() -> str:
    """Which corral code this process runs: protocol, version, package directory, environment.

    The environment is the interpreter's prefix (a virtualenv, or the
    system's) and version: ``python`` and ``python3`` of one venv are the same.

    A server refuses a client whose stamp differs (another installation or
    version). Edits to the files of the same installation are caught by the
    server itself, which watches its package directories (see
    :mod:`corral.server._server`).
    """
    from .. import __file__ as package_init
    from .._version import __version__

    return (
        f"{PROTOCOL}:{__version__}:{os.path.dirname(package_init)}:{sys.prefix}:{sys.hexversion:x}"
    )


def encode(message: Mapping[str, Any]) -> bytes:
    """One frame."""
    body = dumps(message).encode("ascii")
    if len(body) > MAX_FRAME:
        raise WireError(f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte limit")
    return len(body).to_bytes(4, "big") + body


class FrameReader:
    """Splits a byte stream into messages.

    Example::

        reader = FrameReader()
        for message in reader.feed(sock.recv(65536)):
            ...
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add *data*; return the messages now complete.

        Raises:
            WireError: a frame is oversized, not JSON, or not an object.
        """
        self._buf += data
        messages = []
        while len(self._buf) >= 4:
            size = int.from_bytes(self._buf[:4], "big")
            if size > MAX_FRAME:
                raise WireError(f"frame of {size} bytes exceeds the {MAX_FRAME}-byte limit")
            if len(self._buf) < 4 + size:
                break
            body = bytes(self._buf[4 : 4 + size])
            del self._buf[: 4 + size]
            try:
                message = loads(body)
            except JSONError as exc:
                raise WireError(f"malformed frame: {exc}") from None
            if not isinstance(message, dict):
                raise WireError("malformed frame: not a JSON object")
            messages.append(message)
        return messages

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buf)
