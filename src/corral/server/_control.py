"""``corral server --status`` and ``--stop``: the control client."""

from __future__ import annotations

import _socket
import os
import sys

from .._exceptions import ServerError
from ._peers import _SO_PEERCRED
from ._wire import FrameReader, connect_unix, encode, socket_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["request_status", "request_stop"]


def _ask(state_dir: str, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any] | None:
    """Send a control request; the reply, or None when no server listens."""
    path = socket_path(state_dir)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            connect_unix(sock, path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            return None
        cred = sock.getsockopt(_socket.SOL_SOCKET, _SO_PEERCRED, 12)
        if int.from_bytes(cred[4:8], sys.byteorder) != os.getuid():
            raise ServerError(f"Failed to trust {path}: it belongs to another user")
        sock.sendall(encode(message))
        reader = FrameReader()
        while True:
            data = sock.recv(65536)
            if not data:
                raise ServerError(f"Failed to get an answer from the corral server at {path}")
            for reply in reader.feed(data):
                return reply
    except OSError as exc:
        raise ServerError(f"Failed to talk to the corral server at {path}: {exc}") from exc
    finally:
        sock.close()


def request_status(state_dir: str) -> dict[str, Any] | None:
    """The running server's :meth:`Server.statistics`, or None when none runs.

    Raises:
        ServerError: a server is there but refused or did not answer.
    """
    reply = _ask(state_dir, {"op": "status"})
    if reply is None:
        return None
    if "status" not in reply:
        raise ServerError(f"Failed to get the server's status: {reply.get('refused', reply)}")
    status: dict[str, Any] = reply["status"]
    return status


def request_stop(state_dir: str, *, timeout: float = 60.0) -> int | None:
    """Stop the running server and wait for it to exit; its pid, or None when none ran.

    Raises:
        ServerError: it refused, or did not exit within *timeout*.
    """
    reply = _ask(state_dir, {"op": "stop"})
    if reply is None:
        return None
    if not reply.get("stopping"):
        raise ServerError(f"Failed to stop the server: {reply.get('refused', reply)}")
    pid = int(reply["pid"])
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return pid
    try:
        import select

        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        if not poller.poll(timeout * 1000):
            raise ServerError(f"Failed to stop the server: pid {pid} still runs after {timeout:g}s")
    finally:
        os.close(pidfd)
    return pid
