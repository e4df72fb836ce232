"""Request-level rules and masked credentials: what the proxy does with a request it can read. Pure.

The proxy reads requests in plain HTTP (absolute-form) and inside the TLS of
the hosts it terminates (:func:`RequestPolicy.terminates`). For each such
request it

1. checks ``network.denyRequests`` (a match is refused: 403, a violation),
   then ``network.allowRequests``: once some allow rule's host part matches
   the host, the request must match one of them (``not in
   network.allowRequests``);
2. replaces each masked credential's placeholder by the secret, in the
   headers the credential names, when one of its ``hosts`` matches the
   destination (never otherwise: a placeholder sent elsewhere stays a
   placeholder).

A rule is ``"METHOD HOST/PATH"``: METHOD is a method name or ``*``; the rest
is a glob over ``host/path`` (``*`` matches any characters including ``/``,
``?`` one character), matched case-insensitively against the canonical host
and the request path with ``%XX`` escapes decoded, ``.``/``..`` segments
resolved, repeated slashes collapsed and the query removed - and, when a
segment has ``;parameters``, also without them - so that
``/org/repo.git/%67it-receive-pack``, ``//x/../git-receive-pack`` or
``/r.git/git-receive-pack;x`` cannot slip past ``POST */git-receive-pack``.
The host part (before the first ``/``) decides which hosts a rule applies
to, and so which HTTPS hosts the proxy terminates.

Example::

    rules = RequestPolicy(deny=("POST */git-receive-pack",))
    rules.decide("POST", "github.com", "/o/r.git/git-receive-pack")
    # -> "network.denyRequests: POST */git-receive-pack"
"""

from __future__ import annotations

import base64
import binascii

from .._frozen import Record
from ..policy._hosts import Host, parse_pattern, pattern_matches
from ..policy._requests import parse_rule, path_forms

__all__ = ["MaskSpec", "RequestPolicy"]


class MaskSpec(Record):
    """A masked credential as the proxy applies it.

    Attributes:
        name: the credential's variable name (for logs).
        placeholder: what the sandbox sees (random per run).
        secret: the real value, substituted only towards ``hosts``.
        hosts: host patterns where the secret may go.
        headers: lower-case header names searched (``authorization`` by default).
        query: also replace the placeholder in the request target's query string.
    """

    name: str
    placeholder: str
    secret: str
    hosts: tuple[str, ...]
    headers: tuple[str, ...] = ("authorization",)
    query: bool = False

    def __repr__(self) -> str:  # never print the secret
        return f"MaskSpec(name={self.name!r}, hosts={self.hosts!r})"


class RequestPolicy:
    """The request rules and masked credentials of one proxy.

    Raises:
        ValueError: a rule or a mask's host pattern is invalid.
    """

    __slots__ = ("_mask_hosts", "allow", "deny", "masks")

    def __init__(
        self,
        *,
        allow: tuple[str, ...] = (),
        deny: tuple[str, ...] = (),
        masks: tuple[MaskSpec, ...] = (),
    ) -> None:
        self.allow = tuple(parse_rule(r) for r in allow)
        self.deny = tuple(parse_rule(r) for r in deny)
        self.masks = masks
        self._mask_hosts = tuple(tuple(parse_pattern(h) for h in m.hosts) for m in masks)

    def __bool__(self) -> bool:
        return bool(self.allow or self.deny or self.masks)

    def terminates(self, host: Host, port: int) -> bool:
        """Whether the proxy terminates TLS for a tunnel to *host*:*port*.

        True when a masked credential's host pattern matches it or any rule's
        host part does.
        """
        if any(rule.applies_to(host.text) for rule in (*self.deny, *self.allow)):
            return True
        return any(
            any(pattern_matches(p, host, port) for p in patterns) for patterns in self._mask_hosts
        )

    def decide(self, method: str, host: str, path: str) -> str | None:
        """The rule refusing the request (``"network.denyRequests: ..."``), or None to allow.

        *path* is normalised here, in every form a server may read it
        (:func:`~corral.policy._requests.path_forms`): a deny rule refuses if
        it matches any, the allow rules must admit each.
        """
        forms = path_forms(path.encode("latin-1", "replace"))
        for rule in self.deny:
            if any(rule.matches(method, host, normal) for normal in forms):
                return f"network.denyRequests: {rule.text}"
        scoped = [rule for rule in self.allow if rule.applies_to(host)]
        if scoped and not all(
            any(rule.matches(method, host, normal) for rule in scoped) for normal in forms
        ):
            return f"not in network.allowRequests for {host}"
        return None

    def substitute(
        self, host: Host, port: int, headers: list[tuple[bytes, bytes]]
    ) -> tuple[list[tuple[bytes, bytes]], tuple[str, ...]]:
        """*headers* with the placeholders of the masks for *host* replaced by their secrets.

        ``Authorization: Basic`` values are decoded, replaced and encoded
        again (git and curl send URL user info that way). Returns the new
        headers and the names of the credentials substituted.
        """
        used: list[str] = []
        out = list(headers)
        for mask, patterns in zip(self.masks, self._mask_hosts, strict=True):
            if not any(pattern_matches(p, host, port) for p in patterns):
                continue
            placeholder, secret = mask.placeholder.encode(), mask.secret.encode()
            for index, (name, value) in enumerate(out):
                if name.lower().decode("latin-1") not in mask.headers:
                    continue
                new = value.replace(placeholder, secret)
                if name.lower() == b"authorization":
                    new = _basic_substitute(new, placeholder, secret)
                if new != value:
                    out[index] = (name, new)
                    if mask.name not in used:
                        used.append(mask.name)
        return out, tuple(used)

    def substitute_query(self, host: Host, port: int, target: bytes) -> bytes:
        """*target* with placeholders in its query replaced, for the masks that allow it."""
        path, sep, query = target.partition(b"?")
        if not sep:
            return target
        for mask, patterns in zip(self.masks, self._mask_hosts, strict=True):
            if mask.query and any(pattern_matches(p, host, port) for p in patterns):
                query = query.replace(mask.placeholder.encode(), _query_escape(mask.secret))
        return path + sep + query


def _query_escape(secret: str) -> bytes:
    from urllib.parse import quote

    return quote(secret, safe="").encode("ascii")


def _basic_substitute(value: bytes, placeholder: bytes, secret: bytes) -> bytes:
    scheme, sep, encoded = value.strip().partition(b" ")
    if not sep or scheme.lower() != b"basic":
        return value
    try:
        decoded = binascii.a2b_base64(encoded.strip())
    except binascii.Error:
        return value
    if placeholder not in decoded:
        return value
    return scheme + b" " + base64.b64encode(decoded.replace(placeholder, secret))
