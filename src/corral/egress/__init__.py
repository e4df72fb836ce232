"""Network egress through corral's allowlist proxy (``network.mode = "allowlist"``).

The sandbox keeps its own network namespace with nothing but loopback. Inside
it, on ``127.0.0.1:PORT``, listens corral's proxy (HTTP ``CONNECT``,
absolute-form HTTP and SOCKS5 on one port), whose socket corral created in
that namespace from the host side (:mod:`corral.egress._netns`) and serves
from a thread of its own process (:mod:`corral.egress._server`). The proxy
decides every connection with :class:`~corral.egress.allowlist.Allowlist`,
connects from the host, and records every attempt; the engine turns
denials into violations on the Outcome. See docs/egress.md.

Public API::

    handle = start_for_sandbox(plan.egress, sandbox_pid=pid)   # before the command starts
    ...
    attempts = handle.close()                                   # after it exits

or, for a backend that joins a namespace by path (podman's
``--network=ns:PATH``), :func:`start_in_fresh_namespace` before it starts;
``handle.netns_path`` names the namespace.

This module stays light (it is imported on the ``corral run`` path):
:mod:`asyncio` and :mod:`h11` load in the proxy's thread.
"""

from __future__ import annotations

from .._exceptions import ProxyStartFailed
from ._netns import fresh_listener, listen_in, open_listener
from .allowlist import NOT_ALLOWED, Allowlist, Decision, special_range

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..backends._plan import EgressSpec
    from ..pipeline._outcome import NetworkAttempt
    from ._resolve import Resolver
    from ._server import EgressProxy
    from ._tls import Terminator

__all__ = [
    "NOT_ALLOWED",
    "Allowlist",
    "Decision",
    "EgressHandle",
    "special_range",
    "start_for_sandbox",
    "start_in_fresh_namespace",
    "start_on_unix_socket",
]


class EgressHandle:
    """The running proxy of one sandbox; :meth:`close` stops it and returns its attempts.

    Attributes:
        error: why the proxy failed, once :meth:`close` returned (``None``
            when it served normally). A failed proxy refuses every connection.
        omitted: attempts beyond the log's limit, counted but not recorded.
    """

    __slots__ = ("_attempts", "_closed", "_netns_fd", "_proxy", "_unix_path", "error", "omitted")

    def __init__(self, proxy: EgressProxy, *, netns_fd: int = -1, unix_path: str = "") -> None:
        self._proxy = proxy
        self._netns_fd = netns_fd  # a namespace corral created for the sandbox (or -1)
        self._unix_path = unix_path  # a unix socket corral bound for the sandbox (or "")
        self._closed = False
        self._attempts: list[NetworkAttempt] = []
        self.error: BaseException | None = None
        self.omitted = 0

    @property
    def proxy(self) -> EgressProxy:
        """The proxy (for statistics and tests)."""
        return self._proxy

    @property
    def netns_path(self) -> str | None:
        """The path that names the network namespace corral created (while open), else None."""
        if self._netns_fd < 0:
            return None
        import os

        return f"/proc/{os.getpid()}/fd/{self._netns_fd}"

    def close(self) -> list[NetworkAttempt]:
        """Stop the proxy (cancelling open connections) and return every attempt it saw."""
        if not self._closed:
            self._closed = True
            try:
                self._attempts = self._proxy.close()
                self.error = self._proxy.error
                self.omitted = self._proxy.omitted_attempts
            finally:
                import os

                if self._netns_fd >= 0:
                    os.close(self._netns_fd)
                    self._netns_fd = -1
                if self._unix_path:
                    try:
                        os.unlink(self._unix_path)
                    except FileNotFoundError:
                        pass
                    self._unix_path = ""
        return list(self._attempts)


def start_for_sandbox(
    spec: EgressSpec, *, sandbox_pid: int, resolver: Resolver | None = None
) -> EgressHandle:
    """Start the proxy listening on ``127.0.0.1:spec.port`` inside *sandbox_pid*'s network.

    Returns as soon as the listening socket exists (connections queue in its
    backlog while the proxy's thread starts), so the command can be released.

    Args:
        spec: rules, port, token and optional static hosts file (from the plan).
        sandbox_pid: a process in the sandbox's network namespace (host pid).
        resolver: overrides name resolution (default: ``spec.hosts_file`` if
            set, else the system resolver).

    Raises:
        ProxyStartFailed: the namespace cannot be entered, the port is taken,
            the rules are invalid or the hosts file cannot be read.
    """
    proxy = _proxy(spec, resolver)
    fds: list[int] = []
    try:
        fds.append(open_listener(sandbox_pid, spec.port))
        for port, _rule in spec.forwards:  # the host's local services, at the same address
            fds.append(open_listener(sandbox_pid, port))
    except BaseException:
        import os

        for fd in fds:
            os.close(fd)
        raise
    proxy.start(fds[0], _forwards(spec, fds[1:]))
    return EgressHandle(proxy)


def _forwards(spec: EgressSpec, fds: list[int]) -> tuple[tuple[int, int, str], ...]:
    return tuple((fd, port, rule) for fd, (port, rule) in zip(fds, spec.forwards, strict=True))


def start_in_fresh_namespace(spec: EgressSpec, *, resolver: Resolver | None = None) -> EgressHandle:
    """Create an empty network namespace with the proxy listening on its ``127.0.0.1:spec.port``.

    The namespace is for a sandbox that joins it by path (``handle.netns_path``)
    as it starts; it lives until :meth:`EgressHandle.close` (and while the
    sandbox is in it). Root only.

    Raises:
        ProxyStartFailed: as :func:`start_for_sandbox`; also when the
            namespace cannot be created (not root).
    """
    proxy = _proxy(spec, resolver)
    netns_fd, fd = fresh_listener(spec.port)
    import os

    extra: list[int] = []
    try:
        for port, _rule in spec.forwards:
            extra.append(listen_in(netns_fd, port))
    except BaseException:
        for other in (fd, *extra, netns_fd):
            os.close(other)
        raise
    try:
        proxy.start(fd, _forwards(spec, extra))  # owns the listeners from here on
    except BaseException:
        os.close(netns_fd)
        raise
    return EgressHandle(proxy, netns_fd=netns_fd)


def start_on_unix_socket(spec: EgressSpec, *, resolver: Resolver | None = None) -> EgressHandle:
    """Start the proxy listening on the unix socket ``spec.socket`` on the host.

    For the micro-VM backend: qemu's user network forwards each of the guest's
    connections to the proxy's address to this socket (``guestfwd``). The
    socket's directory must be private to corral (it is the VM's run
    directory, mode 0700); :meth:`EgressHandle.close` removes the socket.
    ``spec.forwards`` are not served.

    Raises:
        ProxyStartFailed: as :func:`start_for_sandbox`; also when the socket
            cannot be bound.
    """
    import os
    import socket

    proxy = _proxy(spec, resolver)
    if not spec.socket.startswith("/"):
        raise ProxyStartFailed("Failed to start the egress proxy: no socket path for the VM")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        try:
            os.unlink(spec.socket)  # a previous run's, in the same private directory
        except FileNotFoundError:
            pass
        listener.bind(spec.socket)
        listener.listen(128)
    except OSError as exc:
        listener.close()
        raise ProxyStartFailed(
            f"Failed to start the egress proxy on {spec.socket}: {exc}"
        ) from None
    proxy.start(listener.detach())
    return EgressHandle(proxy, unix_path=spec.socket)


def _proxy(spec: EgressSpec, resolver: Resolver | None) -> EgressProxy:
    """The (not yet started) proxy for *spec*. Raises ProxyStartFailed."""
    from ._server import EgressProxy

    try:
        allowlist = Allowlist(allow=spec.allow, deny=spec.deny)
    except ValueError as exc:
        raise ProxyStartFailed(f"Failed to start the egress proxy: {exc}") from None
    if resolver is None and spec.hosts_file:
        from ._resolve import read_hosts_file

        try:
            resolver = read_hosts_file(spec.hosts_file)
        except (OSError, ValueError) as exc:
            raise ProxyStartFailed(
                "Failed to start the egress proxy: cannot read the hosts file "
                f"{spec.hosts_file}: {exc}"
            ) from None
    import os

    requests = None
    if spec.allow_requests or spec.deny_requests or spec.masks:
        from ._rules import MaskSpec, RequestPolicy

        try:
            requests = RequestPolicy(
                allow=spec.allow_requests,
                deny=spec.deny_requests,
                masks=tuple(
                    MaskSpec(name=n, placeholder=p, secret=v, hosts=h, headers=hd, query=q)
                    for n, p, v, h, hd, q in spec.masks
                ),
            )
            if not spec.ca:
                raise ValueError("no CA was drawn for terminating TLS")
            if spec.upstream_ca is not None and not os.access(spec.upstream_ca, os.R_OK):
                raise ValueError(f"cannot read the upstream CA file {spec.upstream_ca}")
        except (ValueError, ImportError, OSError) as exc:
            raise ProxyStartFailed(f"Failed to start the egress proxy: {exc}") from None
    return EgressProxy(
        allowlist=allowlist,
        token=spec.token,
        resolver=resolver,
        requests=requests,
        terminator=_terminator_maker(spec) if requests is not None else None,
    )


def _terminator_maker(spec: EgressSpec) -> Callable[[], Terminator]:
    """Makes the TLS contexts in the proxy's thread, on first use (``ssl`` loads there)."""
    assert spec.ca, "checked by _proxy"
    ca_cert, ca_key = spec.ca
    upstream_ca = spec.upstream_ca

    def make() -> Terminator:
        from ._tls import Terminator

        return Terminator(ca_cert, ca_key, upstream_ca)

    return make
