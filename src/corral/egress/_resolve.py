"""Name resolution for the egress proxy: the system resolver, or a static hosts file.

The proxy resolves a name only after :meth:`Allowlist.decide
<corral.egress.allowlist.Allowlist.decide>` allowed it, and connects only to
the addresses :meth:`~corral.egress.allowlist.Allowlist.check_addresses`
accepts; the resolver itself decides nothing.

:class:`StaticResolver` answers from a fixed table and never queries DNS.
``corral`` uses it when ``CORRAL_EGRESS_HOSTS`` names a file in hosts(5)
format (``ADDRESS NAME [NAME...]``, ``#`` comments): tests map their host
names to loopback servers that way, and air-gapped setups can pin names.
"""

from __future__ import annotations

from ..policy._hosts import Host, parse_host

__all__ = ["Resolver", "StaticResolver", "SystemResolver", "read_hosts_file"]

_MAX_HOSTS_FILE = 1 << 20


class Resolver:
    """Turns an allowed name into addresses (base class; see the two implementations)."""

    async def resolve(self, name: str, port: int) -> list[Host]:
        """The addresses of *name* (canonical), best first.

        Raises:
            LookupError: the name does not resolve; the message says why.
        """
        raise NotImplementedError


class SystemResolver(Resolver):
    """The C library's resolver (``getaddrinfo``) in the event loop's executor."""

    async def resolve(self, name: str, port: int) -> list[Host]:
        import asyncio
        import socket

        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise LookupError(f"cannot resolve {name}: {exc.strerror or exc}") from None
        found: list[Host] = []
        for _family, _type, _proto, _canon, sockaddr in infos:
            try:  # AF_INET/AF_INET6 only: anything else is not an address and is skipped
                host = parse_host(str(sockaddr[0]).partition("%")[0])
            except ValueError:
                continue
            if host not in found:
                found.append(host)
        if not found:
            raise LookupError(f"cannot resolve {name}: no IPv4 or IPv6 address")
        return found


class StaticResolver(Resolver):
    """A fixed name -> addresses table; unknown names fail (no DNS at all).

    Example::

        resolver = StaticResolver({"example.test": ["127.0.0.1"]})
    """

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table: dict[str, list[Host]] = {}
        for name, addresses in table.items():
            key = parse_host(name)
            if key.is_address:
                raise ValueError(f"{name!r} is an address, not a name")
            hosts = [parse_host(a) for a in addresses]
            if not all(h.is_address for h in hosts):
                raise ValueError(f"the addresses of {name!r} must be IP addresses")
            self.table.setdefault(key.text, []).extend(hosts)

    async def resolve(self, name: str, port: int) -> list[Host]:
        del port
        hosts = self.table.get(name)
        if not hosts:
            raise LookupError(f"cannot resolve {name}: not in the static hosts table")
        return list(hosts)


def read_hosts_file(path: str) -> StaticResolver:
    """A :class:`StaticResolver` from a hosts(5)-format file.

    Raises:
        OSError: the file cannot be read.
        ValueError: a line is malformed (the message names the line).
    """
    with open(path, "rb") as f:
        data = f.read(_MAX_HOSTS_FILE + 1)
    if len(data) > _MAX_HOSTS_FILE:
        raise ValueError(f"{path}: larger than {_MAX_HOSTS_FILE} bytes")
    table: dict[str, list[str]] = {}
    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        words = raw.partition("#")[0].split()
        if not words:
            continue
        if len(words) < 2:
            raise ValueError(f"{path}:{number}: expected 'ADDRESS NAME [NAME...]'")
        for name in words[1:]:
            table.setdefault(name, []).append(words[0])
    try:
        return StaticResolver(table)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
