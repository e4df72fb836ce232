"""The SOCKS5 front-end of the egress proxy (RFC 1928, with RFC 1929 authentication).

Only what a sandbox needs: ``CONNECT`` over TCP, with the destination as an
IPv4 address, an IPv6 address or a *domain name* resolved by the proxy
(``socks5h://`` in curl's terms; the client never needs DNS). The
username/password method is required and the password must be the
sandbox's token; ``BIND`` and ``UDP ASSOCIATE`` are refused (reply 7).

::

    client                               proxy
    05 n methods...                 ->   05 02            (user/password, or 05 ff)
    01 ulen user plen password      ->   01 00            (or 01 01 and close)
    05 01 00 atyp addr port         ->   05 rep 00 01 0.0.0.0:0, then the relay

Every handshake that names a destination (and every failed authentication)
becomes an attempt in the log. A complete handshake must arrive before the
header deadline (slowloris).
"""

from __future__ import annotations

import asyncio
from hmac import compare_digest

from ..policy._hosts import Host, format_address, parse_host
from ._context import Attempt, printable
from ._relay import Counter, relay
from ._sni import NameRefused, first_flight
from ._upstream import SOCKS_NOT_ALLOWED, Refused, open_upstream

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket

    from ._context import ProxyContext

__all__ = ["SOCKS_VERSION", "serve_socks5"]

SOCKS_VERSION = 5
_AUTH_VERSION = 1
_METHOD_USER_PASSWORD = 2
_NO_ACCEPTABLE_METHOD = 0xFF
_CMD_CONNECT = 1
_ATYP_IPV4, _ATYP_DOMAIN, _ATYP_IPV6 = 1, 3, 4
_REPLY_OK = 0
_REPLY_GENERAL_FAILURE = 1
_REPLY_COMMAND_NOT_SUPPORTED = 7
_REPLY_ADDRESS_TYPE_NOT_SUPPORTED = 8
_METHOD = "SOCKS5"
AUTH_RULE = "missing or wrong proxy credential"


class _Closed(Exception):
    """The client closed (or broke) the handshake."""


class _Reader:
    """Exact-size reads from a socket, starting with bytes already received."""

    __slots__ = ("buffer", "loop", "sock")

    def __init__(self, sock: socket.socket, initial: bytes) -> None:
        self.sock = sock
        self.buffer = bytearray(initial)
        self.loop = asyncio.get_running_loop()

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = await self.loop.sock_recv(self.sock, 4096)
            if not chunk:
                raise _Closed
            self.buffer += chunk
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    async def byte(self) -> int:
        return (await self.exactly(1))[0]


def _reply(code: int) -> bytes:
    """A reply with the bound address 0.0.0.0:0 (nothing about the host is revealed)."""
    return bytes([SOCKS_VERSION, code, 0, _ATYP_IPV4, 0, 0, 0, 0, 0, 0])


async def _handshake(
    ctx: ProxyContext, reader: _Reader, loop: asyncio.AbstractEventLoop, sock: socket.socket
) -> tuple[Host, int] | None:
    """Negotiate and authenticate; return the requested destination, or None after replying."""
    if await reader.byte() != SOCKS_VERSION:
        raise _Closed
    methods = await reader.exactly(await reader.byte())
    if _METHOD_USER_PASSWORD not in methods:
        await loop.sock_sendall(sock, bytes([SOCKS_VERSION, _NO_ACCEPTABLE_METHOD]))
        ctx.log.add(
            Attempt("", 0, _METHOD).finish(
                decision="deny", rule=f"{AUTH_RULE} (the client did not offer username/password)"
            )
        )
        return None
    await loop.sock_sendall(sock, bytes([SOCKS_VERSION, _METHOD_USER_PASSWORD]))
    if await reader.byte() != _AUTH_VERSION:
        raise _Closed
    await reader.exactly(await reader.byte())  # the user name: any
    password = await reader.exactly(await reader.byte())
    if not compare_digest(password, ctx.token.encode()):
        await loop.sock_sendall(sock, bytes([_AUTH_VERSION, 1]))
        ctx.log.add(Attempt("", 0, _METHOD).finish(decision="deny", rule=AUTH_RULE))
        return None
    await loop.sock_sendall(sock, bytes([_AUTH_VERSION, 0]))
    version, command, _reserved, address_type = await reader.exactly(4)
    if version != SOCKS_VERSION:
        raise _Closed
    if address_type == _ATYP_IPV4:
        host_text = format_address(4, int.from_bytes(await reader.exactly(4), "big"))
    elif address_type == _ATYP_IPV6:
        host_text = format_address(6, int.from_bytes(await reader.exactly(16), "big"))
    elif address_type == _ATYP_DOMAIN:
        host_text = (await reader.exactly(await reader.byte())).decode("utf-8", "replace")
    else:
        await loop.sock_sendall(sock, _reply(_REPLY_ADDRESS_TYPE_NOT_SUPPORTED))
        ctx.log.add(
            Attempt("", 0, _METHOD).finish(
                decision="deny", rule=f"invalid destination: SOCKS5 address type {address_type}"
            )
        )
        return None
    port = int.from_bytes(await reader.exactly(2), "big")
    try:
        host = parse_host(host_text)
        if port == 0:
            raise ValueError("port 0")
    except ValueError as exc:
        await loop.sock_sendall(sock, _reply(_REPLY_GENERAL_FAILURE))
        ctx.log.add(
            Attempt(printable(host_text), port, _METHOD).finish(
                decision="deny", rule=f"invalid destination: {exc}"
            )
        )
        return None
    if command != _CMD_CONNECT:
        await loop.sock_sendall(sock, _reply(_REPLY_COMMAND_NOT_SUPPORTED))
        ctx.log.add(
            Attempt(host.text, port, _METHOD).finish(
                decision="deny", rule=f"SOCKS5 command {command} is not supported (only CONNECT)"
            )
        )
        return None
    return host, port


async def serve_socks5(
    ctx: ProxyContext, sock: socket.socket, initial: bytes, deadline: float
) -> None:
    """Serve one client connection whose first byte is 5 (SOCKS5).

    *deadline* (event-loop time) bounds the whole handshake. Never raises for
    anything the client or upstream does.
    """
    loop = asyncio.get_running_loop()
    reader = _Reader(sock, initial)
    try:
        async with asyncio.timeout_at(deadline):
            destination = await _handshake(ctx, reader, loop, sock)
        if destination is None:
            return
        host, port = destination
        attempt = Attempt(host.text, port, _METHOD)
        try:
            if ctx.terminates(host, port):
                # its requests must be read (rules, masked credentials): HTTP proxy only
                raise Refused(
                    status=403,
                    socks_reply=SOCKS_NOT_ALLOWED,
                    reason="terminated-host",
                    rule=f"requests to {host.text} are checked: use HTTPS_PROXY, not SOCKS5",
                )
            upstream = await open_upstream(ctx, host, port)
        except Refused as refused:
            ctx.log.add(
                attempt.finish(decision=refused.decision, rule=refused.rule, error=refused.error)
            )
            await loop.sock_sendall(sock, _reply(refused.socks_reply))
            return
        counter = Counter()
        mismatch: NameRefused | None = None
        try:
            await loop.sock_sendall(sock, _reply(_REPLY_OK))
            up, down = await first_flight(
                ctx, sock, upstream.sock, host, port, bytes(reader.buffer)
            )
            await relay(sock, upstream.sock, counter, to_upstream=up, to_client=down)
        except NameRefused as exc:
            mismatch = exc
        finally:
            upstream.sock.close()
            ctx.log.add(
                attempt.finish(decision="deny", rule=mismatch.rule)
                if mismatch is not None
                else attempt.finish(
                    decision="allow",
                    rule=upstream.decision.rule,
                    bytes_up=counter.up,
                    bytes_down=counter.down,
                )
            )
    except (_Closed, OSError):
        pass  # includes TimeoutError: the handshake did not finish in time
