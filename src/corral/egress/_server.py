"""The proxy's lifecycle: one event loop in one background thread per sandbox.

:class:`EgressProxy` serves a listening socket it is given (created inside
the sandbox's network namespace by :mod:`corral.egress._netns`, or on the
host's loopback in tests). Its thread runs one :class:`asyncio.TaskGroup`:
the accept loop and every connection handler live in it, so stopping the
proxy cancels all of them and nothing outlives it. Each accepted connection
is sniffed by its first byte - ``0x05`` is SOCKS5, anything else is HTTP -
and handed to :func:`~corral.egress._socks5.serve_socks5` or
:func:`~corral.egress._http_proxy.serve_http`. A handler's unexpected
exception closes that connection and is counted in :meth:`statistics`,
never stopping the proxy.

The proxy costs nothing until it is used: its thread first just polls the
listener, and imports :mod:`asyncio` and :mod:`h11` (~45 ms here) only when
the first client connects (the kernel completes the TCP handshake and keeps
the connection in the listen backlog meanwhile). A sandbox that never opens
a connection - most commands - stops a proxy that never loaded them. A proxy
that fails closes its listener (the sandbox's connections are refused: fail
closed) and reports the error from :meth:`EgressProxy.close`.

Example::

    proxy = EgressProxy(allowlist=Allowlist(allow=["pypi.org"]), token="s3cret")
    proxy.start(listener_fd)
    ...
    attempts = proxy.close()
"""

from __future__ import annotations

import os
import threading

from ._context import ProxyContext, ProxyLimits

TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    import socket
    from collections.abc import Callable

    from ..pipeline._outcome import NetworkAttempt
    from ._resolve import Resolver
    from ._rules import RequestPolicy
    from ._tls import Terminator
    from .allowlist import Allowlist

__all__ = ["EgressProxy", "raise_fd_limit"]

_NOFILE_WANTED = 65536


def raise_fd_limit() -> None:
    """Raise the soft ``RLIMIT_NOFILE`` towards the hard limit (each tunnel holds two sockets).

    Any process may do this itself, so programs started later inherit nothing
    they could not have had anyway.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(hard, _NOFILE_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass  # keep the current limit; max_connections still bounds the proxy


class EgressProxy:
    """The allowlist proxy of one sandbox (see the module docstring).

    Args:
        allowlist: the decisions.
        token: the credential clients must present (proxy URL password).
        resolver: how allowed names are resolved (default: the system's).
        limits: timeouts and bounds.
        requests: request rules and masked credentials (see
            :mod:`corral.egress._rules`), or None.
        terminator: the TLS contexts for terminated tunnels, or a callable
            that makes them (called in the proxy's thread when the first
            client arrives, off the command's start); required when
            *requests* names any host.
    """

    def __init__(
        self,
        *,
        allowlist: Allowlist,
        token: str,
        resolver: Resolver | None = None,
        limits: ProxyLimits | None = None,
        requests: RequestPolicy | None = None,
        terminator: Terminator | Callable[[], Terminator] | None = None,
    ) -> None:
        if not token:
            raise ValueError("the proxy needs a non-empty token")
        if requests and terminator is None:
            raise ValueError("request rules and masked credentials need a TLS terminator")
        self._requests = requests or None
        self._terminator = terminator
        self._allowlist = allowlist
        self._token = token
        self._resolver = resolver
        self._limits = limits or ProxyLimits()
        self._context: ProxyContext | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._ready = threading.Event()
        self._listener_fd = -1
        self._forward_fds: list[tuple[int, int, str]] = []  # (listener fd, host port, rule)
        self._wake: tuple[int, int] = (-1, -1)  # a pipe that ends the wait for the first client
        self._connections: set[asyncio.Task[None]] = set()
        self._served = 0
        self._rejected = 0
        self._handler_errors = 0
        self.error: BaseException | None = None
        self.address: tuple[str, int] | None = None

    # ------------------------------------------------------------ control (any thread)
    def start(self, listener_fd: int, forwards: tuple[tuple[int, int, str], ...] = ()) -> None:
        """Serve *listener_fd* (a listening TCP or unix socket; the proxy takes ownership).

        *forwards* are ``(listener fd, port, rule)``: listeners (owned from
        now on too) whose connections are relayed to the host's
        ``127.0.0.1:port``, each recorded as a ``FORWARD`` attempt.

        Raises:
            OSError: a fd is not a socket (all of them are closed).
        """
        if self._thread is not None:
            raise RuntimeError("the proxy was started already")
        import _socket

        try:
            for fd in (listener_fd, *(f[0] for f in forwards)):
                _socket.socket(fileno=fd).detach()  # a socket, or ENOTSOCK now
        except OSError:
            for fd in (listener_fd, *(f[0] for f in forwards)):
                os.close(fd)
            raise
        self._listener_fd = listener_fd
        self._forward_fds = list(forwards)
        self._wake = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._thread_main, name="corral-egress", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until the proxy's thread watches the listener (or failed: then raise its error)."""
        if not self._ready.wait(timeout):
            raise TimeoutError("the egress proxy did not start in time")
        if self.error is not None:
            raise self.error

    def close(self, timeout: float = 10.0) -> list[NetworkAttempt]:
        """Stop serving, cancel every connection, and return the attempts (idempotent)."""
        with self._lock:
            self._stopping = True
            loop, stop = self._loop, self._stop
        if self._wake[1] >= 0:
            os.write(self._wake[1], b"x")  # ends the wait for a first client
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop has finished already
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self.error is None:
                self.error = TimeoutError("the egress proxy did not stop in time")
        elif self._listener_fd >= 0:
            os.close(self._listener_fd)
            self._listener_fd = -1
        self._close_forwards()
        for fd in self._wake:
            if fd >= 0:
                os.close(fd)
        self._wake = (-1, -1)
        return list(self._context.log.attempts) if self._context is not None else []

    @property
    def omitted_attempts(self) -> int:
        """Attempts not recorded because the log was full."""
        return self._context.log.omitted if self._context is not None else 0

    def statistics(self) -> dict[str, int]:
        """Counters for tests and benchmarks.

        ``active`` connections now, ``served`` and ``rejected`` (over the
        limit) so far, and ``handler_errors``: connections a bug closed.
        """
        return {
            "active": len(self._connections),
            "served": self._served,
            "rejected": self._rejected,
            "handler_errors": self._handler_errors,
        }

    # ------------------------------------------------------------ the thread
    def _thread_main(self) -> None:
        try:
            if self._wait_for_first_client():
                import asyncio

                raise_fd_limit()
                asyncio.run(self._serve())
        except BaseException as exc:  # reported by wait_ready() and close()
            self.error = exc
        finally:
            if self._listener_fd >= 0:
                os.close(self._listener_fd)  # fail closed: the sandbox's connections are refused
                self._listener_fd = -1
            self._close_forwards()
            self._ready.set()

    def _close_forwards(self) -> None:
        forwards, self._forward_fds = self._forward_fds, []
        for fd, _port, _rule in forwards:
            if fd >= 0:
                os.close(fd)

    def _wait_for_first_client(self) -> bool:
        """Poll the listener and the wake pipe; True when a client is waiting to be accepted."""
        import select

        poller = select.poll()
        listeners = [self._listener_fd, *(f[0] for f in self._forward_fds)]
        for fd in listeners:
            poller.register(fd, select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        self._ready.set()
        while True:
            events = dict(poller.poll())
            if self._wake[0] in events:
                return False
            if any(events.get(fd, 0) & select.POLLIN for fd in listeners):
                return True

    async def _serve(self) -> None:
        import asyncio
        import socket

        from ._resolve import SystemResolver

        context = ProxyContext(
            allowlist=self._allowlist,
            token=self._token,
            resolver=self._resolver or SystemResolver(),
            limits=self._limits,
            requests=self._requests,
            terminator=self._terminator() if callable(self._terminator) else self._terminator,
        )
        self._context = context
        listener = socket.socket(fileno=self._listener_fd)
        self._listener_fd = -1
        listener.setblocking(False)
        name = listener.getsockname()
        self.address = name[:2] if isinstance(name, tuple) else None  # None: a unix socket
        forwards = []
        for fd, port, rule in self._forward_fds:
            forward = socket.socket(fileno=fd)
            forward.setblocking(False)
            forwards.append((forward, port, rule))
        self._forward_fds = []
        stop = asyncio.Event()
        with self._lock:
            self._loop, self._stop = asyncio.get_running_loop(), stop
            if self._stopping:
                stop.set()
        try:
            async with asyncio.TaskGroup() as group:
                accepting = [group.create_task(self._accept(listener, group, context))]
                accepting += [
                    group.create_task(self._accept(sock, group, context, forward=(port, rule)))
                    for sock, port, rule in forwards
                ]
                self._ready.set()
                await stop.wait()
                for task in accepting:
                    task.cancel()
                for task in list(self._connections):
                    task.cancel()
        finally:
            listener.close()
            for sock, _port, _rule in forwards:
                sock.close()

    async def _accept(
        self,
        listener: socket.socket,
        group: asyncio.TaskGroup,
        context: ProxyContext,
        *,
        forward: tuple[int, str] | None = None,
    ) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _address = await loop.sock_accept(listener)
            except OSError:
                # EMFILE/ENFILE/ENOBUFS: back off briefly instead of spinning
                await asyncio.sleep(0.05)
                continue
            if len(self._connections) >= self._limits.max_connections:
                self._rejected += 1
                conn.close()
                continue
            self._served += 1
            if forward is None:
                task = group.create_task(self._connection(conn, context))
            else:
                task = group.create_task(self._forwarded(conn, context, *forward))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _forwarded(
        self, conn: socket.socket, context: ProxyContext, port: int, rule: str
    ) -> None:
        """Relay a connection to a forwarded local service to the host's ``127.0.0.1:port``.

        Raw bytes, unless request rules or a masked credential name the
        service: then its requests are read like a terminated tunnel's.
        """
        import asyncio
        import socket

        from ..policy._hosts import parse_host, split_authority
        from ._context import Attempt
        from ._relay import Counter, relay
        from ._upstream import tune

        # the host the rule names (localhost, 127.0.0.1, ::1): what rules and masks match
        host = parse_host(split_authority(rule.removeprefix("network.allow: "))[0])
        if context.terminates(host, port):  # rules or masks name it: its requests are read
            from ._http_proxy import serve_forwarded

            try:
                tune(conn)
                await serve_forwarded(context, conn, host, port, rule)
            except Exception:  # a bug must cost one connection, never the proxy
                self._handler_errors += 1
            finally:
                conn.close()
            return
        loop = asyncio.get_running_loop()
        attempt = Attempt("127.0.0.1", port, "FORWARD")
        counter = Counter()
        error = ""
        upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            tune(conn)
            tune(upstream)
            try:
                async with asyncio.timeout(context.limits.connect_timeout):
                    await loop.sock_connect(upstream, ("127.0.0.1", port))
            except (OSError, TimeoutError) as exc:
                error = f"127.0.0.1:{port}: " + (
                    os.strerror(exc.errno).lower()
                    if isinstance(exc, OSError) and exc.errno
                    else "timed out"
                )
                return
            await relay(conn, upstream, counter)
        except OSError:
            pass
        except Exception:  # a bug must cost one connection, never the proxy
            self._handler_errors += 1
        finally:
            upstream.close()
            conn.close()
            context.log.add(
                attempt.finish(
                    decision="allow",
                    rule=rule,
                    bytes_up=counter.up,
                    bytes_down=counter.down,
                    error=error,
                )
            )

    async def _connection(self, conn: socket.socket, context: ProxyContext) -> None:
        import asyncio

        from ._http_proxy import serve_http
        from ._socks5 import SOCKS_VERSION, serve_socks5
        from ._upstream import tune

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.header_timeout
        try:
            tune(conn)
            try:
                async with asyncio.timeout_at(deadline):
                    first = await loop.sock_recv(conn, 65536)
            except (OSError, TimeoutError):
                return
            if not first:
                return
            if first[0] == SOCKS_VERSION:
                await serve_socks5(context, conn, first, deadline)
            else:
                await serve_http(context, conn, first, deadline)
        except Exception:  # a bug must cost one connection, never the proxy
            self._handler_errors += 1
        finally:
            conn.close()
