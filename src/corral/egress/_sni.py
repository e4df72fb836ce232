"""The TLS name check on plain tunnels: the ClientHello must name the host the tunnel is for.

A ``CONNECT example.test:443`` (or SOCKS5) tunnel is relayed without
terminating TLS, but the first flight of a TLS client, the ClientHello, is
in the clear. :func:`first_flight` waits for whichever side speaks first:

* the server (SSH, SMTP ...): not TLS, relayed as it is;
* the client, with something that is not a TLS handshake record: relayed
  as it is (raw TCP through an allowed host:port);
* the client, with a TLS handshake: the ClientHello is read (it may span
  several records and segments, at most 64 KiB, within the head timeout)
  and parsed here, without terminating anything. Then

  - a tunnel to a **name** needs the SNI to be that name (case and one
    trailing dot aside); a ClientHello without SNI, or with another name -
    domain fronting through an allowed host's CDN - is refused;
  - a tunnel to an **IP address** may omit the SNI; a name it does give
    must itself be allowed by ``network.allow``;
  - a ClientHello with Encrypted Client Hello (extension ``0xfe0d``) or the
    older ESNI (``0xffce``) is refused for tunnels to names: the name it
    hides is the one that counts, and it cannot be checked;
  - a malformed handshake is refused.

A refusal closes the tunnel before a byte reaches the upstream, and is
recorded as a violation (``TLS name check: ...``).
"""

from __future__ import annotations

import asyncio

from .._frozen import Record
from ..policy._hosts import Host, parse_host

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket

    from ._context import ProxyContext

__all__ = ["ClientHello", "NameRefused", "check_name", "first_flight", "parse_client_hello"]

_HANDSHAKE = 0x16
_CLIENT_HELLO = 1
_EXT_SNI = 0x0000
_EXT_ECH = 0xFE0D
_EXT_ESNI = 0xFFCE
_MAX_HELLO = 65536


class ClientHello(Record):
    """What the check needs from a ClientHello: the SNI host name and whether it hides one."""

    sni: str | None
    encrypted: bool


class NameRefused(Exception):
    """The tunnel's ClientHello fails the name check; ``rule`` says why."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


def _u16(data: bytes, at: int) -> int:
    if at + 2 > len(data):
        raise ValueError("truncated")
    return int.from_bytes(data[at : at + 2], "big")


def parse_client_hello(data: bytes) -> ClientHello | None:
    """Parse the TLS records at the start of *data*; None while the ClientHello is incomplete.

    Raises:
        ValueError: not a well-formed ClientHello.
    """
    body = b""
    at = 0
    needed = None
    while needed is None or len(body) < needed:
        if at + 5 > len(data):
            return None
        if data[at] != _HANDSHAKE:
            raise ValueError("a record that is not a handshake inside the ClientHello")
        length = _u16(data, at + 3)
        if at + 5 + length > len(data):
            return None
        body += data[at + 5 : at + 5 + length]
        at += 5 + length
        if needed is None and len(body) >= 4:
            if body[0] != _CLIENT_HELLO:
                raise ValueError("the first handshake message is not a ClientHello")
            needed = 4 + int.from_bytes(body[1:4], "big")
    hello = body[4:needed]
    pos = 2 + 32  # version, random
    if pos >= len(hello):
        raise ValueError("truncated")
    pos += 1 + hello[pos]  # session id
    pos += 2 + _u16(hello, pos)  # cipher suites
    if pos >= len(hello):
        raise ValueError("truncated")
    pos += 1 + hello[pos]  # compression methods
    if pos == len(hello):
        return ClientHello(sni=None, encrypted=False)  # no extensions at all
    end = pos + 2 + _u16(hello, pos)
    if end != len(hello):
        raise ValueError("the extensions do not fill the ClientHello")
    pos += 2
    sni: str | None = None
    encrypted = False
    seen: set[int] = set()
    while pos < end:
        kind, length = _u16(hello, pos), _u16(hello, pos + 2)
        value = hello[pos + 4 : pos + 4 + length]
        if len(value) != length:
            raise ValueError("truncated extension")
        if kind in seen:
            raise ValueError(f"extension {kind:#06x} appears twice")
        seen.add(kind)
        pos += 4 + length
        if kind in (_EXT_ECH, _EXT_ESNI):
            encrypted = True
        elif kind == _EXT_SNI:
            sni = _server_name(value)
    return ClientHello(sni=sni, encrypted=encrypted)


def _server_name(value: bytes) -> str:
    """The one host_name of a server_name extension."""
    end = 2 + _u16(value, 0)
    if end != len(value):
        raise ValueError("malformed server_name")
    pos = 2
    names = []
    while pos < end:
        kind = value[pos]
        length = _u16(value, pos + 1)
        name = value[pos + 3 : pos + 3 + length]
        if len(name) != length:
            raise ValueError("malformed server_name")
        if kind == 0:
            names.append(name)
        pos += 3 + length
    if len(names) != 1:
        raise ValueError("server_name must carry exactly one host name")
    try:
        return names[0].decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("the server name is not ASCII") from None


def check_name(ctx: ProxyContext, hello: ClientHello, host: Host, port: int) -> None:
    """Apply the rules of the module docstring. Raises NameRefused."""
    if not host.is_address:
        if hello.encrypted:
            raise NameRefused(
                f"TLS name check: an encrypted ClientHello (ECH/ESNI) hides the name in a "
                f"tunnel to {host.text}"
            )
        if hello.sni is None:
            raise NameRefused(f"TLS name check: no server name (SNI) in a tunnel to {host.text}")
    if hello.sni is None:
        return  # an IP-literal tunnel without a name
    try:
        named = parse_host(hello.sni)
    except ValueError:
        raise NameRefused(f"TLS name check: the server name {hello.sni!r} is invalid") from None
    if host.is_address:
        if not ctx.allowlist.decide(named, port).allowed:
            raise NameRefused(
                f"TLS name check: the server name {named.text} in a tunnel to {host.text} "
                "is not in network.allow"
            )
    elif named != host:
        raise NameRefused(
            f"TLS name check: the server name {named.text} is not the tunnel's host "
            f"{host.text} (domain fronting)"
        )


async def first_flight(
    ctx: ProxyContext,
    client: socket.socket,
    upstream: socket.socket,
    host: Host,
    port: int,
    early: bytes,
) -> tuple[bytes, bytes]:
    """Wait for the first bytes of either side; check a ClientHello; return what to relay first.

    Returns ``(to_upstream, to_client)``: the bytes already read. Raises
    NameRefused (also for a ClientHello that does not arrive in time) and
    OSError.
    """
    loop = asyncio.get_running_loop()
    data, to_client = early, b""
    if not data:
        from_client = asyncio.ensure_future(loop.sock_recv(client, _MAX_HELLO))
        from_upstream = asyncio.ensure_future(loop.sock_recv(upstream, _MAX_HELLO))
        done, _pending = await asyncio.wait(
            {from_client, from_upstream}, return_when=asyncio.FIRST_COMPLETED
        )
        for task in (from_client, from_upstream):
            if task not in done:
                task.cancel()
        await asyncio.gather(from_client, from_upstream, return_exceptions=True)
        to_client = from_upstream.result() if from_upstream in done else b""
        data = from_client.result() if from_client in done else b""
    if not data or data[0] != _HANDSHAKE:
        return data, to_client  # the server spoke first, the client closed, or not TLS
    deadline = loop.time() + ctx.limits.header_timeout
    try:
        while True:
            try:
                hello = parse_client_hello(data)
            except ValueError as exc:
                raise NameRefused(f"TLS name check: malformed ClientHello ({exc})") from None
            if hello is not None:
                break
            if len(data) >= _MAX_HELLO:
                raise NameRefused("TLS name check: the ClientHello is larger than 64 KiB")
            async with asyncio.timeout_at(deadline):
                more = await loop.sock_recv(client, _MAX_HELLO - len(data))
            if not more:
                raise NameRefused("TLS name check: the client closed before its ClientHello ended")
            data += more
    except TimeoutError:
        raise NameRefused("TLS name check: the ClientHello did not arrive in time") from None
    check_name(ctx, hello, host, port)
    return data, to_client
