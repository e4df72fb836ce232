"""Host names, IP addresses and host patterns: parsing, canonical forms, matching.

One grammar serves the settings (``network.allow``, ``network.deny``,
``credentials[].hosts``), the egress proxy's decisions
(:mod:`corral.egress.allowlist`) and credential scoping, so a pattern means
the same thing everywhere.

Hosts (what a client asks to connect to) are canonicalised before anything
compares them:

* names are lower-cased, lose one trailing dot, and non-ASCII names become
  their IDNA (``xn--``) form; labels are 1-63 characters of ``a-z 0-9 - _``;
* a name whose last label is numeric is an IPv4 address in any form the C
  library's ``inet_aton`` accepts (``127.1``, ``2130706433``, ``0x7f.0.0.1``,
  ``0177.0.0.1``) and is canonicalised to dotted quad; if it is not a valid
  address it is refused, never looked up as a name (a resolver would read it
  as a number, so a name rule must not get the chance to match it);
* IPv6 addresses are canonicalised per RFC 5952; IPv4-mapped addresses
  (``::ffff:127.0.0.1``) become the IPv4 address they reach;
* NUL, CR, LF, spaces, ``%`` (zone ids and escapes), ``@`` (user info) and
  ``/`` are refused.

Patterns::

    *                    every host (deny lists only)
    example.com          exactly that name
    *.example.com        subdomains of example.com at any depth, not the apex
    10.1.2.3  ::1        exactly that address
    10.0.0.0/8  fd00::/8 addresses in that network (host bits must be zero)
    PATTERN:PORT         only that port; IPv6 needs brackets: [::1]:22, [fd00::/8]:443

An *allow* list refuses patterns that would open too much (:func:`broad_pattern_problem`):
``*``, a wildcard over a single label (``*.com``) or over a public or
multi-tenant suffix (``*.co.uk``, ``*.ngrok.io``: anyone can register a name
or run a server there), and networks wider than /8 (IPv4) or /16 (IPv6).

Nothing here does I/O or imports anything beyond corral's own records; IDNA
conversion (``str.encode("idna")``) loads its codec only for non-ASCII names.

Example::

    pattern = parse_pattern("*.Example.com.:443")    # text "*.example.com:443"
    pattern_matches(pattern, parse_host("api.example.com"), 443)   # True
    pattern_matches(pattern, parse_host("example.com"), 443)       # False (apex)
"""

from __future__ import annotations

from .._frozen import Record

__all__ = [
    "ADDRESS",
    "ANY",
    "BROAD_SUFFIXES",
    "NAME",
    "SUFFIX",
    "Host",
    "HostPattern",
    "broad_pattern_problem",
    "format_address",
    "parse_host",
    "parse_pattern",
    "pattern_covers",
    "pattern_matches",
    "patterns_overlap",
    "split_authority",
]

# Pattern kinds.
ANY = "any"
NAME = "name"
SUFFIX = "suffix"
ADDRESS = "address"  # an address or a network (``prefix`` bits)

_BITS = {4: 32, 6: 128}
_MAX_NAME = 253
_MAX_LABEL = 63
_LABEL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
_HEX = frozenset("0123456789abcdef")
_DIGITS = frozenset("0123456789")
_FORBIDDEN = {
    "\x00": "a NUL byte",
    "\r": "a carriage return",
    "\n": "a line feed",
    "%": "'%' (zone ids and percent escapes are not allowed)",
    "@": "'@' (user info is not allowed)",
    "/": "'/'",
    "\\": "'\\'",
}
#: Narrowest networks an allow list may name (wider ones are refused as over-broad).
_MIN_ALLOW_PREFIX = {4: 8, 6: 16}

#: Suffixes under which anyone can register a name or run a server: an allow
#: pattern ``*.SUFFIX`` would let the sandbox reach hosts its user does not
#: control. (Single-label suffixes such as ``com`` are refused without a row.)
BROAD_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("co.uk", "public suffix: anyone can register a name below it"),
    ("org.uk", "public suffix: anyone can register a name below it"),
    ("me.uk", "public suffix: anyone can register a name below it"),
    ("ac.uk", "public suffix: universities register names below it"),
    ("gov.uk", "public suffix: government bodies register names below it"),
    ("com.au", "public suffix: anyone can register a name below it"),
    ("net.au", "public suffix: anyone can register a name below it"),
    ("org.au", "public suffix: anyone can register a name below it"),
    ("co.nz", "public suffix: anyone can register a name below it"),
    ("co.jp", "public suffix: anyone can register a name below it"),
    ("ne.jp", "public suffix: anyone can register a name below it"),
    ("or.jp", "public suffix: anyone can register a name below it"),
    ("co.kr", "public suffix: anyone can register a name below it"),
    ("com.br", "public suffix: anyone can register a name below it"),
    ("com.cn", "public suffix: anyone can register a name below it"),
    ("com.mx", "public suffix: anyone can register a name below it"),
    ("com.tr", "public suffix: anyone can register a name below it"),
    ("com.tw", "public suffix: anyone can register a name below it"),
    ("com.hk", "public suffix: anyone can register a name below it"),
    ("com.sg", "public suffix: anyone can register a name below it"),
    ("co.in", "public suffix: anyone can register a name below it"),
    ("co.za", "public suffix: anyone can register a name below it"),
    ("co.il", "public suffix: anyone can register a name below it"),
    ("com.ar", "public suffix: anyone can register a name below it"),
    ("com.ua", "public suffix: anyone can register a name below it"),
    ("com.pl", "public suffix: anyone can register a name below it"),
    ("amazonaws.com", "multi-tenant: anyone can run a server or bucket below it"),
    ("s3.amazonaws.com", "multi-tenant: anyone can create a bucket below it"),
    ("cloudfront.net", "multi-tenant CDN: anyone can put a distribution below it"),
    ("azurewebsites.net", "multi-tenant: anyone can run a web app below it"),
    ("cloudapp.net", "multi-tenant: anyone can run a service below it"),
    ("appspot.com", "multi-tenant: anyone can run an App Engine app below it"),
    ("run.app", "multi-tenant: anyone can run a Cloud Run service below it"),
    ("cloudfunctions.net", "multi-tenant: anyone can run a function below it"),
    ("web.app", "multi-tenant: anyone can host a Firebase site below it"),
    ("firebaseapp.com", "multi-tenant: anyone can host a Firebase site below it"),
    ("herokuapp.com", "multi-tenant: anyone can run an app below it"),
    ("vercel.app", "multi-tenant: anyone can run functions below it"),
    ("netlify.app", "multi-tenant: anyone can run functions below it"),
    ("pages.dev", "multi-tenant: anyone can run Cloudflare Pages functions below it"),
    ("workers.dev", "multi-tenant: anyone can run a Cloudflare Worker below it"),
    ("trycloudflare.com", "tunnel service: anyone can expose a server below it"),
    ("ngrok.io", "tunnel service: anyone can expose a server below it"),
    ("ngrok.app", "tunnel service: anyone can expose a server below it"),
    ("ngrok-free.app", "tunnel service: anyone can expose a server below it"),
    ("loca.lt", "tunnel service: anyone can expose a server below it"),
    ("serveo.net", "tunnel service: anyone can expose a server below it"),
    ("onrender.com", "multi-tenant: anyone can run a service below it"),
    ("fly.dev", "multi-tenant: anyone can run an app below it"),
    ("railway.app", "multi-tenant: anyone can run an app below it"),
    ("deno.dev", "multi-tenant: anyone can run code below it"),
    ("glitch.me", "multi-tenant: anyone can run an app below it"),
    ("repl.co", "multi-tenant: anyone can run an app below it"),
    ("github.io", "multi-tenant: anyone can publish a site below it"),
    ("gitlab.io", "multi-tenant: anyone can publish a site below it"),
    ("pipedream.net", "request-capture service: built to receive arbitrary requests"),
    ("requestcatcher.com", "request-capture service: built to receive arbitrary requests"),
    ("burpcollaborator.net", "out-of-band interaction service used for exfiltration"),
    ("oastify.com", "out-of-band interaction service used for exfiltration"),
    ("interact.sh", "out-of-band interaction service used for exfiltration"),
    ("oast.fun", "out-of-band interaction service used for exfiltration"),
    ("oast.pro", "out-of-band interaction service used for exfiltration"),
    ("oast.live", "out-of-band interaction service used for exfiltration"),
    ("oast.site", "out-of-band interaction service used for exfiltration"),
    ("oast.online", "out-of-band interaction service used for exfiltration"),
    ("oast.me", "out-of-band interaction service used for exfiltration"),
)
_BROAD = dict(BROAD_SUFFIXES)


class Host(Record):
    """A canonical destination host.

    Attributes:
        text: the canonical text: a lower-case name, a dotted-quad IPv4 address
            or an RFC 5952 IPv6 address (without brackets).
        version: ``0`` for a name, ``4`` or ``6`` for an address.
        value: the address as an integer (``0`` for a name).
    """

    text: str
    version: int = 0
    value: int = 0

    @property
    def is_address(self) -> bool:
        """True for an IP address, False for a name."""
        return self.version != 0

    def authority(self, port: int) -> str:
        """``host:port``, with brackets around an IPv6 address."""
        return f"[{self.text}]:{port}" if self.version == 6 else f"{self.text}:{port}"


class HostPattern(Record):
    """One parsed host pattern (see the module docstring for the grammar).

    Attributes:
        text: the canonical text, e.g. ``"*.example.com:443"``; used as the
            rule name in decisions and as the settings value.
        kind: :data:`ANY`, :data:`NAME`, :data:`SUFFIX` or :data:`ADDRESS`.
        name: the name (``NAME``) or the suffix without ``*.`` (``SUFFIX``).
        version: ``4`` or ``6`` for ``ADDRESS``.
        value: the network address as an integer (``ADDRESS``).
        prefix: the network's prefix length; 32 or 128 for a single address.
        port: the only port the pattern matches, or ``None`` for every port.
    """

    text: str
    kind: str
    name: str = ""
    version: int = 0
    value: int = 0
    prefix: int = 0
    port: int | None = None


# ----------------------------------------------------------------- addresses
def _ipv4_part(text: str) -> int | None:
    """One part of an inet_aton-style IPv4 address (decimal, 0x hex, 0 octal)."""
    if text[:2] in ("0x", "0X"):
        digits = text[2:].lower()
        if not set(digits) <= _HEX:
            return None
        return int(digits, 16) if digits else 0
    if not text or not set(text) <= _DIGITS:
        return None
    if len(text) > 1 and text[0] == "0":
        if not set(text) <= frozenset("01234567"):
            return None
        return int(text, 8)
    return int(text)


def _looks_numeric(label: str) -> bool:
    """Whether a name's last label makes it an IPv4 address (WHATWG "ends in a number")."""
    if label[:2] in ("0x", "0X"):
        return set(label[2:].lower()) <= _HEX
    return set(label) <= _DIGITS


def _parse_ipv4(text: str) -> int | None:
    """inet_aton semantics: 1-4 parts; the last fills the remaining bytes."""
    parts = text.split(".")
    if len(parts) > 4:
        return None
    numbers = []
    for part in parts:
        number = _ipv4_part(part)
        if number is None:
            return None
        numbers.append(number)
    last = numbers.pop()
    if any(n > 255 for n in numbers) or last >= 1 << (8 * (4 - len(numbers))):
        return None
    value = 0
    for n in numbers:
        value = value << 8 | n
    return value << (8 * (4 - len(numbers))) | last


def _parse_strict_ipv4(text: str) -> int | None:
    """Exactly four decimal parts without leading zeros (inside IPv6 text)."""
    parts = text.split(".")
    if len(parts) != 4:
        return None
    value = 0
    for part in parts:
        if not part or not set(part) <= _DIGITS or (len(part) > 1 and part[0] == "0"):
            return None
        if int(part) > 255:
            return None
        value = value << 8 | int(part)
    return value


def _hex_groups(text: str, *, ipv4_tail: bool) -> list[int] | None:
    """The 16-bit groups of one side of an IPv6 address (an IPv4 tail counts as two)."""
    parts = text.split(":")
    groups: list[int] = []
    for index, part in enumerate(parts):
        if ipv4_tail and index == len(parts) - 1 and "." in part:
            v4 = _parse_strict_ipv4(part)
            if v4 is None:
                return None
            groups += [v4 >> 16, v4 & 0xFFFF]
        elif 1 <= len(part) <= 4 and set(part.lower()) <= _HEX:
            groups.append(int(part, 16))
        else:
            return None
    return groups


def _parse_ipv6(text: str) -> int | None:
    """RFC 4291 text form (``::`` once, 1-4 hex digits per group, optional IPv4 tail)."""
    if text.count("::") > 1:
        return None
    if "::" in text:
        head, tail = text.split("::")
        left = _hex_groups(head, ipv4_tail=False) if head else []
        right = _hex_groups(tail, ipv4_tail=True) if tail else []
        if left is None or right is None or len(left) + len(right) > 7:
            return None
        groups = [*left, *[0] * (8 - len(left) - len(right)), *right]
    else:
        parsed = _hex_groups(text, ipv4_tail=True)
        if parsed is None or len(parsed) != 8:
            return None
        groups = parsed
    value = 0
    for group in groups:
        value = value << 16 | group
    return value


def format_address(version: int, value: int) -> str:
    """The canonical text of an address: dotted quad, or RFC 5952 IPv6."""
    if version == 4:
        return ".".join(str(value >> shift & 0xFF) for shift in (24, 16, 8, 0))
    groups = [value >> (16 * (7 - i)) & 0xFFFF for i in range(8)]
    best_start, best_len = -1, 1  # only runs of two or more zero groups are compressed
    start = -1
    for i, group in enumerate([*groups, 1]):
        if group == 0 and start < 0:
            start = i
        elif group != 0 and start >= 0:
            if i - start > best_len:
                best_start, best_len = start, i - start
            start = -1
    words = [f"{g:x}" for g in groups]
    if best_start < 0:
        return ":".join(words)
    return ":".join(words[:best_start]) + "::" + ":".join(words[best_start + best_len :])


_MAPPED_PREFIX = 0xFFFF << 32  # ::ffff:0:0/96


def _address(version: int, value: int) -> Host:
    """A Host for an address; IPv4-mapped IPv6 addresses become IPv4."""
    if version == 6 and value >> 32 == 0xFFFF:
        version, value = 4, value & 0xFFFFFFFF
    return Host(text=format_address(version, value), version=version, value=value)


# ----------------------------------------------------------------- names
def _check_characters(text: str, what: str) -> None:
    for char, name in _FORBIDDEN.items():
        if char in text:
            raise ValueError(f"{what} contains {name}")
    if not text.isprintable() or " " in text or "\t" in text:
        raise ValueError(f"{what} contains spaces or control characters")


def _canonical_name(text: str, what: str) -> str:
    """Lower case, one trailing dot removed, IDNA for non-ASCII, labels checked."""
    name = text[:-1] if text.endswith(".") else text
    if not name:
        raise ValueError(f"{what} is empty")
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ValueError(f"{what} is not a valid internationalised name ({exc})") from None
    name = name.lower()
    if len(name) > _MAX_NAME:
        raise ValueError(f"{what} is longer than {_MAX_NAME} characters")
    for label in name.split("."):
        if not label:
            raise ValueError(f"{what} has an empty label")
        if len(label) > _MAX_LABEL:
            raise ValueError(f"{what} has a label longer than {_MAX_LABEL} characters")
        if not set(label) <= _LABEL_CHARS:
            raise ValueError(f"{what} may contain only letters, digits, '-', '_' and '.'")
    return name


def parse_host(text: str) -> Host:
    """Canonicalise a destination host (a name, IPv4 or IPv6 address; no port, no brackets).

    Raises:
        ValueError: the text is not a valid host; the message says why.

    Example::

        parse_host("2130706433")      # Host(text="127.0.0.1", version=4, ...)
        parse_host("Example.COM.")    # Host(text="example.com", version=0, ...)
    """
    what = "the host"
    if not text:
        raise ValueError("the host is empty")
    _check_characters(text, what)
    if ":" in text:
        value = _parse_ipv6(text)
        if value is None:
            raise ValueError(f"{what} is not a valid IPv6 address")
        return _address(6, value)
    bare = text[:-1] if text.endswith(".") else text
    last = bare.rpartition(".")[2]
    if last and _looks_numeric(last):
        value = _parse_ipv4(bare)
        if value is None:
            raise ValueError(f"{what} ends in a number but is not a valid IPv4 address")
        return _address(4, value)
    return Host(text=_canonical_name(text, what))


def split_authority(text: str, *, default_port: int | None = None) -> tuple[str, int | None]:
    """Split ``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` into (host text, port).

    A bare IPv6 address (more than one ``:``) is returned whole without a port.

    Raises:
        ValueError: unbalanced brackets, or a port that is not 1-65535.
    """
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("'[' without a closing ']'")
        host, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"unexpected {rest!r} after ']'")
        port_text = rest[1:] if rest else ""
        if not rest:
            return host, default_port
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        return host, default_port
    if not port_text or not set(port_text) <= _DIGITS or len(port_text) > 5:
        raise ValueError(f"the port {port_text!r} is not a number from 1 to 65535")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"the port {port} is not a number from 1 to 65535")
    return host, port


# ----------------------------------------------------------------- patterns
def _with_port(text: str, port: int | None, *, bracket: bool) -> str:
    if port is None:
        return text
    return f"[{text}]:{port}" if bracket else f"{text}:{port}"


def _address_pattern(host_text: str, prefix_text: str | None, port: int | None) -> HostPattern:
    host = parse_host(host_text)
    if not host.is_address:
        raise ValueError("a network needs an IP address before the '/'")
    bits = _BITS[host.version]
    prefix = bits
    mapped = host_text.count(":") > 0 and host.version == 4
    if prefix_text is not None:
        if not prefix_text or not set(prefix_text) <= _DIGITS or len(prefix_text) > 3:
            raise ValueError(f"the prefix length {prefix_text!r} is not a number")
        prefix = int(prefix_text) - (96 if mapped else 0)
        if not 0 <= prefix <= bits:
            raise ValueError(f"the prefix length /{prefix_text} is out of range")
    host_bits = bits - prefix
    if host.value & ((1 << host_bits) - 1):
        network = format_address(host.version, host.value >> host_bits << host_bits)
        raise ValueError(
            f"the address has bits set beyond the /{prefix} prefix (the network is {network})"
        )
    text = host.text if prefix == bits else f"{host.text}/{prefix}"
    return HostPattern(
        text=_with_port(text, port, bracket=host.version == 6),
        kind=ADDRESS,
        version=host.version,
        value=host.value,
        prefix=prefix,
        port=port,
    )


def parse_pattern(text: str) -> HostPattern:
    """Parse one host pattern into its canonical form.

    Raises:
        ValueError: the pattern is malformed; the message says why.

    Example::

        parse_pattern("10.0.0.0/8:443").text   # "10.0.0.0/8:443"
        parse_pattern("[::FFFF:127.0.0.1]").text  # "127.0.0.1"
    """
    if not text:
        raise ValueError("the host pattern is empty")
    if text.startswith("[") and "/" in text:
        # [v6/nn]:port: split off the prefix inside the brackets first
        inner, sep, rest = text.partition("]")
        if not sep:
            raise ValueError("'[' without a closing ']'")
        address, _, prefix_text = inner[1:].partition("/")
        _host, port = split_authority(f"[{address}]{rest}")
        return _address_pattern(address, prefix_text, port)
    host_text, port = split_authority(text)
    if "/" in host_text:
        address, _, prefix_text = host_text.partition("/")
        return _address_pattern(address, prefix_text, port)
    if host_text == "*":
        if port is not None:
            return HostPattern(text=f"*:{port}", kind=ANY, port=port)
        return HostPattern(text="*", kind=ANY)
    if host_text.startswith("*."):
        suffix = host_text[2:]
        if "*" in suffix:
            raise ValueError("'*' may appear only once, as the whole first label ('*.example.com')")
        _check_characters(suffix, "the suffix")
        last = (suffix[:-1] if suffix.endswith(".") else suffix).rpartition(".")[2]
        if last and _looks_numeric(last):
            raise ValueError("'*.' wildcards apply to names, not to IP addresses (use a CIDR)")
        name = _canonical_name(suffix, "the suffix")
        return HostPattern(
            text=_with_port("*." + name, port, bracket=False), kind=SUFFIX, name=name, port=port
        )
    if "*" in host_text:
        raise ValueError("'*' may appear only as the whole first label ('*.example.com') or alone")
    host = parse_host(host_text)
    if host.is_address:
        return _address_pattern(host_text, None, port)
    return HostPattern(
        text=_with_port(host.text, port, bracket=False), kind=NAME, name=host.text, port=port
    )


def broad_pattern_problem(pattern: HostPattern) -> str | None:
    """Why *pattern* is too broad for an allow list, or ``None`` when it is fine.

    Example::

        broad_pattern_problem(parse_pattern("*.com"))
        # "'*.com' allows every name under the top-level domain 'com'"
    """
    if pattern.kind == ANY:
        return f"'{pattern.text}' allows every host"
    if pattern.kind == SUFFIX:
        if "." not in pattern.name:
            return f"'{pattern.text}' allows every name under the top-level domain '{pattern.name}'"
        reason = _BROAD.get(pattern.name)
        if reason is not None:
            return f"'{pattern.text}' allows every name under '{pattern.name}' ({reason})"
        return None
    if pattern.kind == ADDRESS and pattern.prefix < _MIN_ALLOW_PREFIX[pattern.version]:
        return f"'{pattern.text}' is a network wider than /{_MIN_ALLOW_PREFIX[pattern.version]}"
    return None


# ----------------------------------------------------------------- matching
def _in_network(pattern: HostPattern, version: int, value: int) -> bool:
    if version != pattern.version:
        return False
    shift = _BITS[version] - pattern.prefix
    return value >> shift == pattern.value >> shift


def pattern_matches(pattern: HostPattern, host: Host, port: int) -> bool:
    """Whether *pattern* matches a connection to *host* (canonical) on *port*."""
    if pattern.port is not None and pattern.port != port:
        return False
    if pattern.kind == ANY:
        return True
    if pattern.kind == NAME:
        return not host.is_address and host.text == pattern.name
    if pattern.kind == SUFFIX:
        return not host.is_address and host.text.endswith("." + pattern.name)
    return _in_network(pattern, host.version, host.value)


def _names_within(outer: HostPattern, inner: HostPattern) -> bool:
    """Whether every name *inner* (NAME or SUFFIX) matches is matched by *outer*."""
    if outer.kind == NAME:
        return inner.kind == NAME and inner.name == outer.name
    # outer is a SUFFIX
    return inner.name.endswith("." + outer.name) or (
        inner.kind == SUFFIX and inner.name == outer.name
    )


def pattern_covers(outer: HostPattern, inner: HostPattern) -> bool:
    """Whether every (host, port) that *inner* matches is also matched by *outer*."""
    if outer.port is not None and inner.port != outer.port:
        return False
    if outer.kind == ANY:
        return True
    if inner.kind == ANY:
        return False
    if outer.kind == ADDRESS or inner.kind == ADDRESS:
        return (
            outer.kind == inner.kind
            and outer.prefix <= inner.prefix
            and _in_network(outer, inner.version, inner.value)
        )
    return _names_within(outer, inner)


def patterns_overlap(a: HostPattern, b: HostPattern) -> bool:
    """Whether some (host, port) is matched by both *a* and *b*."""
    if a.port is not None and b.port is not None and a.port != b.port:
        return False
    if a.kind == ANY or b.kind == ANY:
        return True
    if a.kind == ADDRESS or b.kind == ADDRESS:
        if a.kind != b.kind:
            return False
        narrow, wide = (a, b) if a.prefix >= b.prefix else (b, a)
        return _in_network(wide, narrow.version, narrow.value)
    return _names_within(a, b) or _names_within(b, a)
