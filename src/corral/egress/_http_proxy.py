"""The HTTP front-end of the egress proxy: ``CONNECT`` tunnels and absolute-form requests.

Parsing is :mod:`h11`'s, on both sides: the client side as an HTTP/1.1
server, each upstream as an HTTP/1.1 client. For each request head:

1. the target is parsed and canonicalised: ``CONNECT host:port`` (port
   required), or an absolute ``http://`` URL without user info; ``https://``
   URLs (the proxy is not a TLS client) and origin-form targets are refused
   with 400;
2. the per-sandbox credential is checked (``Proxy-Authorization: Basic``,
   any user name, the token as password): 407 without it;
3. :func:`~corral.egress._upstream.open_upstream` decides and connects:
   403 for a denial, 502 when an allowed destination cannot be reached.
   Refusals carry ``X-Corral-Decision``, ``X-Corral-Reason`` (a stable code)
   and ``X-Corral-Rule`` headers and a one-line body naming the rule, and
   close the connection;
4. ``CONNECT``: ``200 Connection established``, then bytes are relayed as
   they are (TLS stays end to end; any bytes the client sent early go first);
5. absolute-form: the request is sent upstream in origin form with ``Host``
   set from the target (a different ``Host`` header cannot pick another
   virtual host), hop-by-hop headers dropped (``Proxy-Authorization`` never
   leaves), ``Expect: 100-continue`` answered by the proxy itself; the
   response is streamed back. Keep-alive works on both sides; an upstream
   connection is reused only for the same host and port. ``Upgrade`` is
   dropped (WebSockets use ``CONNECT``).

Every request becomes one attempt in the log, with its bytes and duration.

When the run has request rules or masked credentials
(:mod:`corral.egress._rules`), plain-HTTP requests are checked against the
rules and get their placeholders replaced, and a ``CONNECT`` to a host the
rules or masks name is *terminated*: after ``200`` the proxy speaks TLS to
the client with a certificate of the per-run CA for that host, TLS to the
real host (verified), and serves the HTTP/1.1 requests inside through the
same path as plain HTTP (a second :class:`_Session` whose target is fixed).
A refused request gets a ``403`` inside the tunnel and is recorded as a
violation. See docs/egress.md.
"""

from __future__ import annotations

import asyncio
import binascii
from hmac import compare_digest

import h11

from ..policy._hosts import Host, parse_host, split_authority
from ._context import Attempt, printable
from ._relay import Counter, relay
from ._sni import NameRefused, first_flight
from ._upstream import Refused, Upstream, connect_local, open_upstream

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Iterable

    from ._context import ProxyContext
    from ._tls import TLSChannel

__all__ = ["serve_http"]

_CHUNK = 65536
_STATUS_TEXT = {
    400: "Bad Request",
    403: "Forbidden",
    421: "Misdirected Request",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
}
#: Headers that describe one hop, never forwarded (plus any the Connection header names).
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"upgrade",
        b"expect",
        b"host",
    }
)
#: Never dropped even when a Connection header names them (message framing).
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
AUTH_RULE = "missing or wrong proxy credential"


class _BadTarget(Exception):
    """The request target cannot be proxied (answered with 400)."""


def error_response(
    status: int,
    *,
    reason: str,
    rule: str,
    message: str,
    decision: str = "deny",
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A complete ``Connection: close`` response whose headers and body explain the refusal."""
    body = f"corral: {message}\n".encode()
    headers = [
        ("Content-Type", "text/plain; charset=utf-8"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        ("X-Corral-Decision", decision),
        ("X-Corral-Reason", reason),
        ("X-Corral-Rule", printable(rule, 500)),
        *extra,
    ]
    head = f"HTTP/1.1 {status} {_STATUS_TEXT[status]}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers)
    return head.encode("latin-1", "replace") + b"\r\n" + body


def _authorized(request: h11.Request, token: str) -> bool:
    """Whether the request carries ``Proxy-Authorization: Basic`` with *token* as password."""
    for name, value in request.headers:
        if name != b"proxy-authorization":
            continue
        scheme, _, encoded = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            decoded = binascii.a2b_base64(encoded.strip())
        except binascii.Error:
            return False
        _user, sep, password = decoded.partition(b":")
        return bool(sep) and compare_digest(password, token.encode())
    return False


def _parse_target(request: h11.Request) -> tuple[Host, int, bytes]:
    """(host, port, origin-form target) of a request; raises _BadTarget."""
    try:
        target = request.target.decode("ascii")
    except UnicodeDecodeError:
        raise _BadTarget("the request target is not ASCII") from None
    try:
        if request.method == b"CONNECT":
            host_text, port = split_authority(target)
            if port is None:
                raise _BadTarget(f"CONNECT {target} names no port")
            return parse_host(host_text), port, b""
        scheme, sep, rest = target.partition("://")
        if not sep or not scheme.isalpha():
            raise _BadTarget(
                "only absolute-form requests (http://host/...) and CONNECT are proxied"
            )
        if scheme.lower() == "https":
            raise _BadTarget(
                "https:// URLs are tunnelled with CONNECT (set HTTPS_PROXY), not forwarded"
            )
        if scheme.lower() != "http":
            raise _BadTarget(f"the {scheme}:// scheme is not proxied")
        cut = min(
            (i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0),
            default=len(rest),
        )
        authority, path = rest[:cut], rest[cut:].partition("#")[0]
        if "@" in authority:
            raise _BadTarget("user info in the URL is not allowed")
        host_text, port = split_authority(authority, default_port=80)
        assert port is not None
        if not path.startswith("/"):
            path = "/" + path
        return parse_host(host_text), port, path.encode("ascii")
    except ValueError as exc:
        raise _BadTarget(str(exc)) from None


def _forwardable(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The end-to-end headers: hop-by-hop ones and those the Connection header names dropped."""
    headers = list(headers)
    named: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            named.update(token.strip().lower() for token in value.split(b","))
    named -= _FRAMING
    return [
        (name, value) for name, value in headers if name not in _HOP_BY_HOP and name not in named
    ]


class _SockChannel:
    """A plain socket with the interface of :class:`~corral.egress._tls.TLSChannel`."""

    __slots__ = ("_loop", "sock")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self._loop = loop
        self.sock = sock

    async def recv(self, size: int = _CHUNK) -> bytes:
        return await self._loop.sock_recv(self.sock, size)

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        await self._loop.sock_sendall(self.sock, data)


class _Terminated:
    """The fixed destination of a session whose requests the proxy reads.

    A terminated tunnel (TLS both ways), or a forwarded local service
    (*forward*: the rule that forwards it; plain or TLS as the client speaks,
    always to the host's ``127.0.0.1:port``).
    """

    __slots__ = ("forward", "host", "port", "tls")

    def __init__(self, host: Host, port: int, *, tls: bool = True, forward: str = "") -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.forward = forward


def _same_host(value: bytes, host: Host, port: int) -> bool:
    """Whether a ``Host`` header *value* names *host* (with *port* or the HTTPS default)."""
    try:
        text, named_port = split_authority(value.decode("ascii").strip(), default_port=443)
        return parse_host(text) == host and named_port == port
    except (UnicodeDecodeError, ValueError):
        return False


async def _upstream_tls(ctx: ProxyContext, upstream: Upstream, host: Host) -> TLSChannel:
    """TLS to the real *host* over *upstream*, its certificate and name verified."""
    from ._tls import TLSChannel

    assert ctx.terminator is not None
    channel = TLSChannel(
        asyncio.get_running_loop(),
        upstream.sock,
        ctx.terminator.upstream_context,
        server_side=False,
        server_hostname=host.text,
    )
    async with asyncio.timeout(ctx.limits.connect_timeout):
        await channel.handshake()
    return channel


class _Session:
    """One client connection, possibly carrying several requests (keep-alive).

    *client* is the channel requests arrive on (the socket, or TLS over it
    in a terminated tunnel, where *terminated* names the destination).
    """

    def __init__(
        self,
        ctx: ProxyContext,
        sock: socket.socket,
        *,
        client: _SockChannel | TLSChannel | None = None,
        terminated: _Terminated | None = None,
    ) -> None:
        self.ctx = ctx
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self.client = client if client is not None else _SockChannel(self.loop, sock)
        self.terminated = terminated
        self.conn = h11.Connection(
            h11.SERVER, max_incomplete_event_size=ctx.limits.max_header_bytes
        )
        self.upstream: Upstream | None = None
        self.upstream_io: _SockChannel | TLSChannel | None = None
        self.upstream_conn: h11.Connection | None = None

    async def run(self, initial: bytes, deadline: float) -> None:
        if initial:  # (h11 takes b"" for the end of the stream)
            self.conn.receive_data(initial)
        try:
            while True:
                request = await self._read_head(deadline)
                if request is None or not await self._handle(request):
                    return
                if self.conn.our_state is not h11.DONE or self.conn.their_state is not h11.DONE:
                    return
                self.conn.start_next_cycle()
                deadline = self.loop.time() + self.ctx.limits.header_timeout
        finally:
            self._drop_upstream()

    # ------------------------------------------------------------ client side
    async def _recv(self, deadline: float | None) -> bytes:
        if deadline is None:
            return await self.client.recv(_CHUNK)
        async with asyncio.timeout_at(deadline):
            return await self.client.recv(_CHUNK)

    async def _read_head(self, deadline: float) -> h11.Request | None:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint if exc.error_status_hint in _STATUS_TEXT else 400
                await self._send_error(
                    status,
                    reason="malformed-request",
                    rule="malformed request",
                    message=f"malformed request: {exc}",
                )
                return None
            if event is h11.NEED_DATA:
                try:
                    data = await self._recv(deadline)
                except TimeoutError:
                    await self._send_error(
                        408,
                        reason="header-timeout",
                        rule="request head timeout",
                        message="the request head did not arrive in time",
                    )
                    return None
                self.conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                return event
            return None  # ConnectionClosed (or PAUSED after an unsupported switch)

    async def _send_error(
        self,
        status: int,
        *,
        reason: str,
        rule: str,
        message: str,
        decision: str = "deny",
        extra: tuple[tuple[str, str], ...] = (),
    ) -> None:
        response = error_response(
            status, reason=reason, rule=rule, message=message, decision=decision, extra=extra
        )
        try:
            await self.client.sendall(response)
        except OSError:
            pass

    async def _send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            await self.client.sendall(data)

    # ------------------------------------------------------------ one request
    async def _handle(self, request: h11.Request) -> bool:
        """Serve one request; return whether the connection may carry another."""
        method = request.method.decode("ascii", "replace")
        if self.terminated is not None:
            return await self._handle_inside(request, method, self.terminated)
        try:
            host, port, path = _parse_target(request)
        except _BadTarget as exc:
            raw = printable(request.target.decode("ascii", "replace"))
            rule = f"invalid destination: {exc}"
            self.ctx.log.add(Attempt(raw, 0, method).finish(decision="deny", rule=rule))
            await self._send_error(
                400, reason="bad-target", rule=rule, message=f"cannot proxy {raw}: {exc}"
            )
            return False
        attempt = Attempt(host.text, port, method)
        presented = any(name == b"proxy-authorization" for name, _value in request.headers)
        if not presented or not _authorized(request, self.ctx.token):
            # no credential at all is the first leg of HTTP proxy authentication
            # (libcurl with CURLAUTH_ANY asks first): logged, not a violation
            self.ctx.log.add(
                attempt.finish(decision="deny" if presented else "challenge", rule=AUTH_RULE)
            )
            await self._send_error(
                407,
                reason="proxy-auth-required",
                rule=AUTH_RULE,
                message=f"blocked connection to {host.authority(port)} ({AUTH_RULE}; use the "
                "proxy URL from HTTP_PROXY/HTTPS_PROXY, with its credential)",
                extra=(("Proxy-Authenticate", 'Basic realm="corral"'),),
            )
            return False
        if request.method == b"CONNECT":
            await self._tunnel(host, port, attempt)
            return False
        if await self._request_refused(method, host, path, attempt):
            return False
        return await self._forward(request, host, port, path, attempt)

    async def _handle_inside(
        self, request: h11.Request, method: str, terminated: _Terminated
    ) -> bool:
        """Serve one request read inside a terminated tunnel (origin-form target)."""
        host, port = terminated.host, terminated.port
        attempt = Attempt(host.text, port, method)
        target = request.target
        if request.method == b"CONNECT" or not target.startswith(b"/") or b"#" in target:
            # (a fragment is never sent: the rules would judge the path before it, and
            # a server that does not cut there would read another one)
            rule = (
                "invalid request inside a tunnel: an origin-form target (/path, no #fragment)"
                " is required"
            )
            self.ctx.log.add(attempt.finish(decision="deny", rule=rule))
            await self._send_error(400, reason="bad-target", rule=rule, message=rule)
            return False
        for name, value in request.headers:
            # the tunnel is for this host only: another Host is domain fronting
            # (a forward always goes to the local port, whatever Host says)
            if name == b"host" and not terminated.forward and not _same_host(value, host, port):
                rule = f"the Host header names another host than the tunnel ({host.text})"
                self.ctx.log.add(attempt.finish(decision="deny", rule=rule))
                await self._send_error(421, reason="host-mismatch", rule=rule, message=rule)
                return False
        if await self._request_refused(method, host, target, attempt):
            return False
        return await self._forward(request, host, port, target, attempt)

    async def _request_refused(
        self, method: str, host: Host, path: bytes, attempt: Attempt
    ) -> bool:
        """Refuse (403, a violation) a request the request rules deny; True if refused."""
        rules = self.ctx.requests
        if rules is None:
            return False
        rule = rules.decide(method, host.text, path.decode("latin-1"))
        if rule is None:
            return False
        self.ctx.log.add(attempt.finish(decision="deny", rule=rule))
        where = printable(host.text + path.decode("latin-1"), 200)
        await self._send_error(
            403,
            reason="denied-by-request-rule",
            rule=rule,
            message=f"blocked request {method} {where} ({rule})",
        )
        return True

    async def _refuse(self, refused: Refused, host: Host, port: int, attempt: Attempt) -> None:
        self.ctx.log.add(
            attempt.finish(decision=refused.decision, rule=refused.rule, error=refused.error)
        )
        target = host.authority(port)
        if refused.decision == "deny":
            message = f"blocked connection to {target} ({refused.rule})"
        else:
            message = f"could not connect to {target}: {refused.error}"
        await self._send_error(
            refused.status,
            reason=refused.reason,
            rule=refused.rule,
            message=message,
            decision=refused.decision,
        )

    async def _tunnel(self, host: Host, port: int, attempt: Attempt) -> None:
        try:
            upstream = await open_upstream(self.ctx, host, port)
        except Refused as refused:
            await self._refuse(refused, host, port, attempt)
            return
        if self.ctx.terminates(host, port):
            await self._terminate(host, port, upstream, attempt)
            return
        counter = Counter()
        mismatch: NameRefused | None = None
        try:
            await self._send(
                h11.Response(status_code=200, headers=[], reason=b"Connection established")
            )
            early = bytes(self.conn.trailing_data[0])
            up, down = await first_flight(self.ctx, self.sock, upstream.sock, host, port, early)
            await relay(self.sock, upstream.sock, counter, to_upstream=up, to_client=down)
        except NameRefused as exc:
            mismatch = exc
        except OSError:
            pass
        finally:
            upstream.sock.close()
            self.ctx.log.add(
                attempt.finish(decision="deny", rule=mismatch.rule)
                if mismatch is not None
                else attempt.finish(
                    decision="allow",
                    rule=upstream.decision.rule,
                    bytes_up=counter.up,
                    bytes_down=counter.down,
                )
            )

    async def _terminate(self, host: Host, port: int, upstream: Upstream, attempt: Attempt) -> None:
        """Open up a tunnel to *host*: TLS to the client and to the host, requests read."""
        from ._tls import TLSChannel

        terminator = self.ctx.terminator
        error = ""
        try:
            if terminator is None:
                raise OSError("no TLS terminator for this proxy")
            await self._send(
                h11.Response(status_code=200, headers=[], reason=b"Connection established")
            )
            early = bytes(self.conn.trailing_data[0])
            client = TLSChannel(
                self.loop,
                self.sock,
                terminator.server_context(host.text),
                server_side=True,
                initial=early,
            )
            async with asyncio.timeout(self.ctx.limits.header_timeout):
                await client.handshake()
            inner = _Session(self.ctx, self.sock, client=client, terminated=_Terminated(host, port))
            inner.upstream = upstream
            try:
                inner.upstream_io = await _upstream_tls(self.ctx, upstream, host)
            except (OSError, TimeoutError) as exc:
                error = f"TLS to {host.authority(port)} failed: {exc}"
                inner.upstream = None
                await inner._send_error(
                    502,
                    reason="upstream-tls-failed",
                    rule=upstream.decision.rule,
                    message=error,
                    decision="allow",
                )
                return
            inner.upstream_conn = h11.Connection(h11.CLIENT)
            await inner.run(b"", self.loop.time() + self.ctx.limits.header_timeout)
            await client.close()
        except (OSError, TimeoutError) as exc:
            error = error or f"TLS with the client failed: {exc}"
        finally:
            upstream.sock.close()
            self.ctx.log.add(
                attempt.finish(
                    decision="allow",
                    rule=upstream.decision.rule + " (TLS terminated: requests checked)",
                    error=error,
                )
            )

    # ------------------------------------------------------------ forwarding
    def _drop_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.sock.close()
        self.upstream = None
        self.upstream_io = None
        self.upstream_conn = None

    async def _open_upstream(self, host: Host, port: int) -> None:
        """Connect (and, in a terminated tunnel, speak TLS) to *host*:*port*. Raises Refused."""
        fixed = self.terminated
        if fixed is not None and fixed.forward:
            upstream = await connect_local(self.ctx, host, port, fixed.forward)
        else:
            upstream = await open_upstream(self.ctx, host, port)
        if fixed is None or not fixed.tls:
            io: _SockChannel | TLSChannel = _SockChannel(self.loop, upstream.sock)
        else:
            try:
                io = await _upstream_tls(self.ctx, upstream, host)
            except (OSError, TimeoutError) as exc:
                upstream.sock.close()
                raise Refused(
                    status=502,
                    socks_reply=0,
                    reason="upstream-tls-failed",
                    rule=upstream.decision.rule,
                    decision="allow",
                    error=f"TLS failed: {exc}",
                ) from None
        self.upstream, self.upstream_io = upstream, io
        self.upstream_conn = h11.Connection(h11.CLIENT)

    async def _forward(
        self, request: h11.Request, host: Host, port: int, path: bytes, attempt: Attempt
    ) -> bool:
        current = self.upstream
        if current is not None and (current.host != host or current.port != port):
            self._drop_upstream()
        if self.upstream is None:
            try:
                await self._open_upstream(host, port)
            except Refused as refused:
                await self._refuse(refused, host, port, attempt)
                return False
        upstream, upstream_conn = self.upstream, self.upstream_conn
        assert upstream is not None
        assert upstream_conn is not None
        counter = Counter()
        complete = False
        try:
            complete = await self._exchange(
                request, host, port, path, upstream, upstream_conn, counter
            )
        except (OSError, h11.ProtocolError, TimeoutError):
            complete = False
        finally:
            self.ctx.log.add(
                attempt.finish(
                    decision="allow",
                    rule=upstream.decision.rule,
                    bytes_up=counter.up,
                    bytes_down=counter.down,
                )
            )
        if not complete:
            return False
        if upstream_conn.our_state is h11.DONE and upstream_conn.their_state is h11.DONE:
            upstream_conn.start_next_cycle()
        else:
            self._drop_upstream()
        return True

    async def _exchange(
        self,
        request: h11.Request,
        host: Host,
        port: int,
        path: bytes,
        upstream: Upstream,
        upstream_conn: h11.Connection,
        counter: Counter,
    ) -> bool:
        """Send one request upstream and stream the response back; True if both completed."""
        authority = host.authority(port)
        if port == (443 if self.terminated is not None and self.terminated.tls else 80):
            authority = authority.rpartition(":")[0]
        headers = [(b"host", authority.encode("ascii")), *_forwardable(request.headers)]
        fixed = self.terminated
        if (
            fixed is not None
            and (fixed.tls or fixed.forward)
            and self.ctx.requests is not None
            and self.ctx.requests.masks
        ):
            # secrets go out inside TLS (or to a forwarded service on the host's own
            # loopback), never in clear text on the network
            headers, _used = self.ctx.requests.substitute(host, port, headers)
            path = self.ctx.requests.substitute_query(host, port, path)
        io = self.upstream_io
        assert io is not None

        async def send_up(event: h11.Event) -> None:
            data = upstream_conn.send(event)
            if data:
                await io.sendall(data)
                counter.up += len(data)

        await send_up(h11.Request(method=request.method, target=path, headers=headers))
        if self.conn.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        while True:  # the request body
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self._recv(None))
                continue
            if isinstance(event, (h11.Data, h11.EndOfMessage)):
                await send_up(event)
                if isinstance(event, h11.EndOfMessage):
                    break
                continue
            return False  # the client went away mid-body
        responded = False
        while True:  # the response
            answer: object
            try:
                answer = upstream_conn.next_event()
            except h11.RemoteProtocolError as exc:
                answer = exc
            if answer is h11.NEED_DATA:
                data = await io.recv(_CHUNK)
                counter.down += len(data)
                upstream_conn.receive_data(data)
                continue
            if isinstance(answer, h11.InformationalResponse):
                continue  # optional hints (103 ...); 100 was answered by the proxy
            if isinstance(answer, h11.Response):
                responded = True
                await self._send(
                    h11.Response(
                        status_code=answer.status_code,
                        reason=answer.reason,
                        headers=_forwardable(answer.headers),
                    )
                )
                continue
            if isinstance(answer, h11.Data):
                await self._send(answer)
                continue
            if isinstance(answer, h11.EndOfMessage):
                await self._send(answer)
                return True
            # a protocol error, or the upstream closed: a 502 if nothing was relayed yet
            if not responded:
                target = host.authority(port)
                silent = counter.down == 0
                await self._send_error(
                    502,
                    reason="upstream-closed" if silent else "upstream-protocol-error",
                    rule=upstream.decision.rule,
                    message=f"{target} closed the connection without a response"
                    if silent
                    else f"bad response from {target}: {answer}",
                    decision="allow",
                )
            return False


async def serve_forwarded(
    ctx: ProxyContext, sock: socket.socket, host: Host, port: int, rule: str
) -> None:
    """Serve a connection to a forwarded local service whose requests must be read.

    Request rules or a masked credential name the service, so its bytes are
    not relayed blindly: a client that starts with a TLS handshake gets TLS
    terminated (the per-run CA's certificate for *host*; the service is
    verified like any terminated host), anything else is parsed as HTTP/1.1.
    Either way each request is checked and its placeholders replaced, exactly
    as in a terminated tunnel; what is not HTTP is refused (fails closed).
    """
    from ._tls import TLSChannel

    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.limits.header_timeout
    try:
        async with asyncio.timeout_at(deadline):
            first = await loop.sock_recv(sock, _CHUNK)
        if not first:
            return
        tls = first[0] == 0x16
        session = _Session(ctx, sock, terminated=_Terminated(host, port, tls=tls, forward=rule))
        if tls:
            if ctx.terminator is None:
                return
            client = TLSChannel(
                loop, sock, ctx.terminator.server_context(host.text), server_side=True,
                initial=first,
            )  # fmt: skip
            async with asyncio.timeout_at(deadline):
                await client.handshake()
            session.client = client
            first = b""
        await session.run(first, deadline)
    except (OSError, TimeoutError, h11.ProtocolError):
        pass


async def serve_http(
    ctx: ProxyContext, sock: socket.socket, initial: bytes, deadline: float
) -> None:
    """Serve one client connection whose first bytes (*initial*) look like HTTP.

    *deadline* (event-loop time) bounds the arrival of the first request head.
    Never raises for anything the client or upstream does; socket errors end
    the connection.
    """
    try:
        await _Session(ctx, sock).run(initial, deadline)
    except (OSError, h11.ProtocolError):
        pass
