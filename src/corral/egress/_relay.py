"""Copy bytes both ways between two connected sockets, counting them.

Each direction reads into its own buffer (allocated on first use, 16 KiB,
doubled up to 1 MiB while reads keep filling it, so idle tunnels cost
little and bulk transfers make few system calls), writes it on, and
half-closes the destination (``shutdown(SHUT_WR)``) at end of stream; the
relay ends when both directions have ended. An error in either direction
(reset, broken pipe) ends both.
"""

from __future__ import annotations

import asyncio
import socket

__all__ = ["Counter", "relay"]

_FIRST_BUFFER = 16 << 10
_MAX_BUFFER = 1 << 20


class Counter:
    """Bytes moved in each direction so far (readable while the relay runs)."""

    __slots__ = ("down", "up")

    def __init__(self) -> None:
        self.up = 0
        self.down = 0


async def _pump(
    src: socket.socket, dst: socket.socket, initial: bytes, counter: Counter, upward: bool
) -> None:
    loop = asyncio.get_running_loop()
    if initial:
        await loop.sock_sendall(dst, initial)
        _count(counter, upward, len(initial))
    buf = bytearray(_FIRST_BUFFER)
    view = memoryview(buf)
    while True:
        n = await loop.sock_recv_into(src, buf)
        if not n:
            break
        await loop.sock_sendall(dst, view[:n])
        _count(counter, upward, n)
        if n == len(buf) and len(buf) < _MAX_BUFFER:
            view.release()
            buf = bytearray(len(buf) * 2)
            view = memoryview(buf)
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the peer is gone already


def _count(counter: Counter, upward: bool, n: int) -> None:
    if upward:
        counter.up += n
    else:
        counter.down += n


async def relay(
    client: socket.socket,
    upstream: socket.socket,
    counter: Counter,
    *,
    to_upstream: bytes = b"",
    to_client: bytes = b"",
) -> None:
    """Relay until both directions reach end of stream (or one fails).

    *to_upstream* and *to_client* are bytes already read from the other side
    (e.g. pipelined after a CONNECT request) and are sent first. Socket errors
    end the relay quietly; the caller closes both sockets.
    """
    up = asyncio.ensure_future(_pump(client, upstream, to_upstream, counter, True))
    down = asyncio.ensure_future(_pump(upstream, client, to_client, counter, False))
    try:
        pending: set[asyncio.Future[None]] = {up, down}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(not task.cancelled() and task.exception() is not None for task in done):
                break
    finally:
        for task in (up, down):
            task.cancel()
        await asyncio.gather(up, down, return_exceptions=True)
