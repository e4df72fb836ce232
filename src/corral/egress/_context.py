"""What every connection handler of one proxy shares: rules, credential, resolver,
limits, and the log of attempts.
"""

from __future__ import annotations

import time

from .._frozen import Record
from ..pipeline._outcome import NetworkAttempt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy._hosts import Host
    from ._resolve import Resolver
    from ._rules import RequestPolicy
    from ._tls import Terminator
    from .allowlist import Allowlist

__all__ = ["Attempt", "AttemptLog", "ProxyContext", "ProxyLimits", "printable"]


class ProxyLimits(Record):
    """Bounds that keep a hostile sandbox from exhausting the proxy.

    Attributes:
        header_timeout: seconds a client has to send a complete request head
            (HTTP) or handshake (SOCKS5) after connecting (slowloris).
        connect_timeout: seconds to connect to an upstream address.
        max_header_bytes: largest request head accepted (431 beyond).
        max_connections: client connections served at once; more are closed
            on accept.
        max_attempts: attempts recorded per sandbox; later ones are counted
            in :attr:`AttemptLog.omitted` only.
    """

    header_timeout: float = 30.0
    connect_timeout: float = 10.0
    max_header_bytes: int = 65536
    max_connections: int = 4096
    max_attempts: int = 10000


class AttemptLog:
    """The connection attempts of one sandbox, in the order they finished."""

    __slots__ = ("attempts", "limit", "omitted")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.attempts: list[NetworkAttempt] = []
        self.omitted = 0

    def add(self, attempt: NetworkAttempt) -> None:
        """Record *attempt* (or count it once :attr:`limit` attempts are recorded)."""
        if len(self.attempts) < self.limit:
            self.attempts.append(attempt)
        else:
            self.omitted += 1


class Attempt:
    """An attempt in progress: where to, by which method, since when.

    Example::

        attempt = Attempt("example.test", 443, "CONNECT")
        ...
        ctx.log.add(attempt.finish(decision="allow", rule="network.allow: example.test",
                                   bytes_up=517, bytes_down=4096))
    """

    __slots__ = ("host", "method", "port", "started", "started_at")

    def __init__(self, host: str, port: int, method: str) -> None:
        self.host = host
        self.port = port
        self.method = method
        self.started = time.monotonic()
        self.started_at = time.time()

    def finish(
        self, *, decision: str, rule: str, bytes_up: int = 0, bytes_down: int = 0, error: str = ""
    ) -> NetworkAttempt:
        """The finished attempt, its duration measured up to now."""
        return NetworkAttempt(
            host=self.host,
            port=self.port,
            method=self.method,
            decision=decision,
            rule=rule,
            bytes_up=bytes_up,
            bytes_down=bytes_down,
            duration=round(time.monotonic() - self.started, 6),
            started_at=self.started_at,
            error=error,
        )


class ProxyContext:
    """The shared state of one proxy (one sandbox).

    ``requests`` holds the request rules and masked credentials (None when
    there are none); ``terminator`` the TLS contexts for the hosts they name
    (None when no tunnel is ever terminated).
    """

    __slots__ = ("allowlist", "limits", "log", "requests", "resolver", "terminator", "token")

    def __init__(
        self,
        *,
        allowlist: Allowlist,
        token: str,
        resolver: Resolver,
        limits: ProxyLimits,
        requests: RequestPolicy | None = None,
        terminator: Terminator | None = None,
    ) -> None:
        self.allowlist = allowlist
        self.token = token
        self.resolver = resolver
        self.limits = limits
        self.requests = requests
        self.terminator = terminator
        self.log = AttemptLog(limits.max_attempts)

    def terminates(self, host: Host, port: int) -> bool:
        """Whether a tunnel to *host*:*port* is opened up (its requests read)."""
        return self.requests is not None and self.requests.terminates(host, port)


def printable(text: str, limit: int = 255) -> str:
    """*text* made safe for logs and terminals: control characters become ``?``, cut at *limit*."""
    cleaned = "".join(c if c.isprintable() and c not in "\r\n" else "?" for c in text[:limit])
    return cleaned + ("..." if len(text) > limit else "")
