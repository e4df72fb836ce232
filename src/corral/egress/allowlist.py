"""Egress decisions: may the sandbox connect to this host and port? Pure, no I/O.

Two steps, both made by :class:`Allowlist`:

1. :meth:`Allowlist.decide` judges the destination as the client named it:
   ``network.deny`` patterns first (a match refuses), then ``network.allow``
   (a match allows); anything else is refused as "not in network.allow".
2. :meth:`Allowlist.check_addresses` judges the addresses an allowed *name*
   resolved to, before the proxy connects (the DNS-rebinding / SSRF guard):
   an address matched by a deny pattern is dropped; so is a loopback,
   private, link-local, shared (CGNAT), cloud-metadata or otherwise special
   address (:data:`SPECIAL_RANGES`) unless an allow pattern names that
   address (or its network) explicitly. The proxy connects only to what is
   left; when nothing is left the connection is refused, naming the first
   address and why.

Hosts are canonicalised first (:func:`corral.policy._hosts.parse_host`), so
``127.1``, ``2130706433`` and ``[::ffff:127.0.0.1]`` are all ``127.0.0.1``,
and a *name* pattern never matches an address.

Example::

    rules = Allowlist(allow=["*.example.test", "127.0.0.1:8443"], deny=["evil.example.test"])
    rules.decide(parse_host("api.example.test"), 443).allowed      # True
    rules.decide(parse_host("example.test"), 443).rule             # "not in network.allow"
"""

from __future__ import annotations

from .._frozen import Record
from ..policy._hosts import (
    ADDRESS,
    Host,
    HostPattern,
    broad_pattern_problem,
    parse_pattern,
    pattern_matches,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = [
    "NOT_ALLOWED",
    "SPECIAL_RANGES",
    "Allowlist",
    "Decision",
    "special_range",
]

#: The rule text of a destination no allow pattern matches.
NOT_ALLOWED = "not in network.allow"

# Machine-readable reasons (the proxy's X-Corral-Reason header).
REASON_ALLOWED = "allowed"
REASON_DENIED = "denied-by-rule"
REASON_NOT_ALLOWED = "not-allowed"
REASON_SPECIAL = "special-address"


def _v4(text: str) -> tuple[int, int, int]:
    pattern = parse_pattern(text)
    return 4, pattern.value, pattern.prefix


def _v6(text: str) -> tuple[int, int, int]:
    pattern = parse_pattern(text)
    return 6, pattern.value, pattern.prefix


#: Address ranges an allowed *name* may not resolve to unless the address
#: itself is allowed: (version, network, prefix, label, reason). First match
#: wins, so the narrow metadata rows come before the ranges that contain them.
SPECIAL_RANGES: tuple[tuple[int, int, int, str, str], ...] = tuple(
    (*net, label, reason)
    for net, label, reason in (
        (
            _v4("169.254.169.254"),
            "cloud-metadata",
            "instance metadata (AWS, GCP, Azure, ...): credentials of the machine",
        ),
        (_v4("169.254.170.2"), "cloud-metadata", "ECS task metadata: container credentials"),
        (_v4("168.63.129.16"), "cloud-metadata", "Azure wire server"),
        (_v4("100.100.100.200"), "cloud-metadata", "Alibaba Cloud metadata"),
        (_v6("fd00:ec2::254"), "cloud-metadata", "AWS instance metadata over IPv6"),
        (_v4("0.0.0.0/8"), "unspecified", "'this network': reaches the local host"),
        (_v4("10.0.0.0/8"), "private", "RFC 1918 private network"),
        (_v4("100.64.0.0/10"), "shared (CGNAT)", "RFC 6598 carrier-grade NAT space"),
        (_v4("127.0.0.0/8"), "loopback", "services of the local host"),
        (_v4("169.254.0.0/16"), "link-local", "the local link (and cloud metadata)"),
        (_v4("172.16.0.0/12"), "private", "RFC 1918 private network"),
        (_v4("192.0.0.0/24"), "reserved", "IETF protocol assignments"),
        (_v4("192.0.2.0/24"), "reserved", "documentation (TEST-NET-1)"),
        (_v4("192.88.99.0/24"), "reserved", "6to4 relay anycast"),
        (_v4("192.168.0.0/16"), "private", "RFC 1918 private network"),
        (_v4("198.18.0.0/15"), "reserved", "benchmarking networks"),
        (_v4("198.51.100.0/24"), "reserved", "documentation (TEST-NET-2)"),
        (_v4("203.0.113.0/24"), "reserved", "documentation (TEST-NET-3)"),
        (_v4("224.0.0.0/4"), "multicast", "multicast"),
        (_v4("240.0.0.0/4"), "reserved", "reserved and broadcast"),
        (_v6("::/128"), "unspecified", "the unspecified address: reaches the local host"),
        (_v6("::1/128"), "loopback", "services of the local host"),
        (_v6("::/96"), "reserved", "IPv4-compatible addresses (deprecated)"),
        (_v6("64:ff9b:1::/48"), "reserved", "local-use NAT64"),
        (_v6("100::/64"), "reserved", "discard-only"),
        (_v6("2001::/32"), "reserved", "Teredo tunnels"),
        (_v6("2001:db8::/32"), "reserved", "documentation"),
        (_v6("fc00::/7"), "private", "unique local addresses"),
        (_v6("fe80::/10"), "link-local", "the local link"),
        (_v6("fec0::/10"), "private", "site-local addresses (deprecated)"),
        (_v6("ff00::/8"), "multicast", "multicast"),
    )
)

_NAT64 = parse_pattern("64:ff9b::/96")
_SIX_TO_FOUR = parse_pattern("2002::/16")


def _in(version: int, value: int, net_version: int, network: int, prefix: int) -> bool:
    if version != net_version:
        return False
    shift = (32 if version == 4 else 128) - prefix
    return value >> shift == network >> shift


def special_range(host: Host) -> str | None:
    """The label of the special range *host* (an address) lies in, or ``None`` if public.

    Addresses that embed an IPv4 address (NAT64 ``64:ff9b::/96``, 6to4
    ``2002::/16``) are judged by the IPv4 address they lead to.

    Example::

        special_range(parse_host("169.254.169.254"))   # "cloud-metadata"
        special_range(parse_host("93.184.216.34"))     # None
    """
    version, value = host.version, host.value
    if version == 6 and _in(6, value, 6, _NAT64.value, _NAT64.prefix):
        version, value = 4, value & 0xFFFFFFFF
    elif version == 6 and _in(6, value, 6, _SIX_TO_FOUR.value, _SIX_TO_FOUR.prefix):
        version, value = 4, value >> 80 & 0xFFFFFFFF
    for net_version, network, prefix, label, _reason in SPECIAL_RANGES:
        if _in(version, value, net_version, network, prefix):
            return label
    return None


class Decision(Record):
    """The verdict on one destination.

    Attributes:
        allowed: the connection may proceed.
        rule: the rule that decided, as users read it: ``"network.allow:
            *.example.com"``, ``"network.deny: evil.test"``, ``"not in
            network.allow"``, or why a resolved address was refused.
        reason: a stable machine-readable code: ``allowed``,
            ``denied-by-rule``, ``not-allowed`` or ``special-address``.
    """

    allowed: bool
    rule: str
    reason: str


def _parse_all(patterns: Iterable[str], key: str, *, opening: bool) -> tuple[HostPattern, ...]:
    parsed = []
    for text in patterns:
        try:
            pattern = parse_pattern(text)
        except ValueError as exc:
            raise ValueError(f"{key}: {text!r} is not a valid host pattern: {exc}") from None
        problem = broad_pattern_problem(pattern) if opening else None
        if problem is not None:
            raise ValueError(f"{key}: {text!r} is too broad: {problem}")
        parsed.append(pattern)
    return tuple(parsed)


class Allowlist:
    """Deny-then-allow decisions over canonical hosts (see the module docstring).

    Raises (constructor):
        ValueError: a pattern is malformed, or an allow pattern is over-broad
            (the same checks as the settings loader).
    """

    __slots__ = ("allow", "deny")

    def __init__(self, *, allow: Iterable[str] = (), deny: Iterable[str] = ()) -> None:
        self.allow = _parse_all(allow, "network.allow", opening=True)
        self.deny = _parse_all(deny, "network.deny", opening=False)

    def decide(self, host: Host, port: int) -> Decision:
        """Judge a connection to *host* (canonical) on *port*: deny rules, then allow rules."""
        for pattern in self.deny:
            if pattern_matches(pattern, host, port):
                return Decision(
                    allowed=False, rule=f"network.deny: {pattern.text}", reason=REASON_DENIED
                )
        for pattern in self.allow:
            if pattern_matches(pattern, host, port):
                return Decision(
                    allowed=True, rule=f"network.allow: {pattern.text}", reason=REASON_ALLOWED
                )
        return Decision(allowed=False, rule=NOT_ALLOWED, reason=REASON_NOT_ALLOWED)

    def check_addresses(
        self, addresses: Sequence[Host], port: int
    ) -> tuple[list[Host], Decision | None]:
        """Filter the addresses an allowed name resolved to (the SSRF guard).

        Returns the addresses the proxy may connect to, in order, and ``None``
        when at least one is left; otherwise ``[]`` and the refusal for the
        first address (deny rule, or special range not allowed explicitly).
        """
        usable: list[Host] = []
        refusal: Decision | None = None
        for address in addresses:
            problem = self._address_problem(address, port)
            if problem is None:
                usable.append(address)
            elif refusal is None:
                refusal = problem
        if usable:
            return usable, None
        if refusal is None:
            refusal = Decision(
                allowed=False, rule="the name resolved to no address", reason=REASON_SPECIAL
            )
        return [], refusal

    def _address_problem(self, address: Host, port: int) -> Decision | None:
        for pattern in self.deny:
            if pattern.kind == ADDRESS and pattern_matches(pattern, address, port):
                return Decision(
                    allowed=False,
                    rule=f"resolves to {address.text}, network.deny: {pattern.text}",
                    reason=REASON_DENIED,
                )
        label = special_range(address)
        if label is None:
            return None
        if any(p.kind == ADDRESS and pattern_matches(p, address, port) for p in self.allow):
            return None
        article = "an" if label[0] in "aeiou" else "a"
        return Decision(
            allowed=False,
            rule=f"resolves to {address.text}, {article} {label} address not in network.allow",
            reason=REASON_SPECIAL,
        )
