"""Request rules (``network.allowRequests``/``denyRequests``): parsing and matching. Pure.

A rule is ``"METHOD HOST/PATH"``: METHOD is a method name or ``*``; the rest
is a glob over ``host/path`` (``*`` matches any characters including ``/``,
``?`` one character), matched case-insensitively against the canonical host
and the request path as :func:`normalise_path` gives it. The host part
(before the first ``/``) says which hosts a rule applies to. The egress proxy
applies them (:mod:`corral.egress._rules`); the settings loader parses them
here, so that a bad rule is a located settings error.
"""

from __future__ import annotations

import posixpath
import re
from fnmatch import fnmatchcase
from urllib.parse import unquote_to_bytes

from .._frozen import Record
from ._hosts import parse_host

__all__ = ["RequestRule", "normalise_path", "parse_rule", "path_forms"]

_METHOD = re.compile(r"^([A-Z][A-Z0-9_-]{0,31}|\*)$")


class RequestRule(Record):
    """One parsed rule: ``method`` (upper case or ``*``), ``host`` glob and ``path`` glob."""

    text: str
    method: str
    host: str
    path: str

    def applies_to(self, host: str) -> bool:
        """Whether the rule's host part matches *host* (a canonical host text)."""
        return fnmatchcase(host, self.host)

    def matches(self, method: str, host: str, path: str) -> bool:
        """Whether the rule matches a request (path already :func:`normalise_path`-ed)."""
        if self.method != "*" and self.method != method.upper():
            return False
        return fnmatchcase(f"{host}{path}".lower(), f"{self.host}{self.path}".lower())


def parse_rule(text: str) -> RequestRule:
    """Parse ``"METHOD host/path"``.

    Raises:
        ValueError: with the reason (used for located settings errors).
    """
    method, sep, rest = text.strip().partition(" ")
    rest = rest.strip()
    if not sep or not rest:
        raise ValueError('expected "METHOD host/path", e.g. "POST */git-receive-pack"')
    if not _METHOD.match(method):
        raise ValueError(f"{method!r} is not an HTTP method in upper case or *")
    if any(c.isspace() or not c.isprintable() for c in rest):
        raise ValueError("the host/path part cannot contain spaces or control characters")
    host, slash, path = rest.partition("/")
    if not host:
        raise ValueError('the rule names no host (use "*" for every host)')
    if ":" in host or "[" in host:
        raise ValueError("a request rule's host takes no port and no IPv6 literal")
    if "*" not in host and "?" not in host:
        try:
            host = parse_host(host).text  # canonical: lower case, IDNA, no trailing dot
        except ValueError as exc:
            raise ValueError(f"{host!r} is not a valid host: {exc}") from None
    host = host.lower()
    return RequestRule(
        text=f"{method} {host}{slash}{path}", method=method, host=host, path=slash + path
    )


def normalise_path(target: bytes) -> str:
    """The path of a request target as rules see it (see the module docstring)."""
    raw = target.split(b"?", 1)[0].split(b"#", 1)[0]
    text = unquote_to_bytes(raw).decode("utf-8", "replace")
    if not text.startswith("/"):
        text = "/" + text
    normal = posixpath.normpath(re.sub(r"/+", "/", text))
    normal = "/" + normal.lstrip("/")
    if text.endswith("/") and normal != "/":
        normal += "/"
    return normal


def path_forms(target: bytes) -> tuple[str, ...]:
    """Every path a server may take *target* for, as rules see it (:func:`normalise_path`).

    The literal one, and - when a segment carries ``;parameters`` (RFC 3986
    path parameters, which Tomcat, Jetty and others drop before routing:
    ``/r.git/git-receive-pack;x`` *is* ``git-receive-pack`` there) - the one
    without them. A deny rule refuses when it matches any form, an allow rule
    admits only when it matches every form.
    """
    literal = normalise_path(target)
    raw = target.split(b"?", 1)[0].split(b"#", 1)[0]
    if b";" not in raw:
        return (literal,)
    bare = normalise_path(b"/".join(segment.split(b";", 1)[0] for segment in raw.split(b"/")))
    return (literal,) if bare == literal else (literal, bare)
