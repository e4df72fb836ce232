"""Decide, resolve, guard and connect: the one path from a requested destination to
an upstream socket, shared by the HTTP and SOCKS5 front-ends.

::

    decide(host, port)            deny rules, then allow rules      -> Refused (403)
    resolve(name)                 only for allowed names            -> Refused (502)
    check_addresses(addresses)    the DNS-rebinding / SSRF guard    -> Refused (403)
    connect(address)              first usable address that answers -> Refused (502)
"""

from __future__ import annotations

import asyncio
import os
import socket

from .allowlist import Decision

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy._hosts import Host
    from ._context import ProxyContext

__all__ = ["Refused", "Upstream", "open_upstream", "tune"]

# SOCKS5 reply codes (RFC 1928 §6)
SOCKS_GENERAL_FAILURE = 1
SOCKS_NOT_ALLOWED = 2
SOCKS_HOST_UNREACHABLE = 4
SOCKS_CONNECTION_REFUSED = 5


class Refused(Exception):
    """The proxy will not (or could not) connect the client to its destination.

    Attributes:
        status: the HTTP status to answer (403 policy, 502 upstream failure).
        socks_reply: the SOCKS5 reply code to answer.
        reason: a stable machine-readable code (``X-Corral-Reason``).
        rule: the rule that refused, or the failure, as users read it.
        decision: ``"deny"`` for a policy refusal, ``"allow"`` when an allowed
            connection failed.
        error: the failure of an allowed connection (empty for a denial).
    """

    def __init__(
        self,
        *,
        status: int,
        socks_reply: int,
        reason: str,
        rule: str,
        decision: str = "deny",
        error: str = "",
    ) -> None:
        super().__init__(rule)
        self.status = status
        self.socks_reply = socks_reply
        self.reason = reason
        self.rule = rule
        self.decision = decision
        self.error = error

    @classmethod
    def denied(cls, decision: Decision) -> Refused:
        """A policy refusal for *decision*."""
        return cls(
            status=403, socks_reply=SOCKS_NOT_ALLOWED, reason=decision.reason, rule=decision.rule
        )


class Upstream:
    """A connected upstream socket and the decision that allowed it."""

    __slots__ = ("decision", "host", "port", "sock")

    def __init__(self, sock: socket.socket, host: Host, port: int, decision: Decision) -> None:
        self.sock = sock
        self.host = host
        self.port = port
        self.decision = decision


def tune(sock: socket.socket) -> None:
    """Non-blocking, no Nagle delay (relayed writes are already coalesced)."""
    sock.setblocking(False)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


async def connect_local(ctx: ProxyContext, host: Host, port: int, rule: str) -> Upstream:
    """Connect to the host's ``127.0.0.1:port``: a local service *rule* forwards. Raises Refused."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tune(sock)
    try:
        async with asyncio.timeout(ctx.limits.connect_timeout):
            await loop.sock_connect(sock, ("127.0.0.1", port))
    except (OSError, TimeoutError) as exc:
        sock.close()
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
        raise Refused(
            status=502,
            socks_reply=SOCKS_CONNECTION_REFUSED,
            reason="connect-failed",
            rule=rule,
            decision="allow",
            error=f"127.0.0.1:{port}: {why}",
        ) from None
    except BaseException:
        sock.close()
        raise
    return Upstream(sock, host, port, Decision(allowed=True, rule=rule, reason="allowed"))


async def open_upstream(ctx: ProxyContext, host: Host, port: int) -> Upstream:
    """Connect to *host*:*port* if the policy allows it.

    Raises:
        Refused: the policy denies it, the name does not resolve, every
            address is refused by the SSRF guard, or no address answers.
    """
    decision = ctx.allowlist.decide(host, port)
    if not decision.allowed:
        raise Refused.denied(decision)
    if host.is_address:
        addresses = [host]
    else:
        try:
            resolved = await ctx.resolver.resolve(host.text, port)
        except LookupError as exc:
            raise Refused(
                status=502,
                socks_reply=SOCKS_HOST_UNREACHABLE,
                reason="resolve-failed",
                rule=decision.rule,
                decision="allow",
                error=str(exc),
            ) from None
        addresses, refusal = ctx.allowlist.check_addresses(resolved, port)
        if refusal is not None:
            raise Refused.denied(refusal)
    loop = asyncio.get_running_loop()
    errors = []
    for address in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        tune(sock)
        try:
            async with asyncio.timeout(ctx.limits.connect_timeout):
                await loop.sock_connect(sock, (address.text, port))
        except (OSError, TimeoutError) as exc:
            sock.close()
            if isinstance(exc, TimeoutError):
                why = "timed out"
            else:  # asyncio's message repeats the address; the errno says what happened
                why = (os.strerror(exc.errno) if exc.errno else str(exc)).lower()
            errors.append(f"{address.authority(port)}: {why}")
            continue
        except BaseException:  # cancelled: the proxy is stopping
            sock.close()
            raise
        return Upstream(sock, host, port, decision)
    raise Refused(
        status=502,
        socks_reply=SOCKS_CONNECTION_REFUSED,
        reason="connect-failed",
        rule=decision.rule,
        decision="allow",
        error="; ".join(errors),
    )
