"""Which credentials a command receives (DESIGN §4 ``credentials``). Pure.

A credential is injected into the sandbox only when both hold:

* one of its ``commands`` globs matches the command line
  (:meth:`ExecRequest.command_line <corral.ExecRequest.command_line>`: the
  ``-c`` string, or the argv joined with spaces), and
* every one of its ``hosts`` is reachable under the network policy: with
  ``mode = "open"`` every host is; with ``"none"`` none is; with
  ``"allowlist"`` a host pattern is reachable when some ``network.allow``
  pattern covers it entirely and no ``network.deny`` pattern overlaps it.
  A credential without ``hosts`` is not tied to the network.

Otherwise the variable does not exist in the sandbox at all (backends also
drop it from the pass-through environment).

Example::

    applicable_credentials(policy, "npm publish --tag next")
    # (Credential(name="NPM_TOKEN", ...),) when NPM_TOKEN's globs include "npm publish*"
"""

from __future__ import annotations

from ._glob import match_word
from ._hosts import parse_pattern, pattern_covers, patterns_overlap

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._model import Credential, NetworkPolicy, Policy

__all__ = ["applicable_credentials", "credential_names", "hosts_reachable"]


def hosts_reachable(hosts: Iterable[str], network: NetworkPolicy) -> bool:
    """Whether every host pattern in *hosts* is reachable under *network* (see module docstring).

    Raises:
        ValueError: a pattern is malformed (the settings loader refuses those first).
    """
    wanted = [parse_pattern(h) for h in hosts]
    if not wanted or network.mode == "open":
        return True
    if network.mode != "allowlist":
        return False
    allow = [parse_pattern(a) for a in network.allow]
    deny = [parse_pattern(d) for d in network.deny]
    return all(
        any(pattern_covers(a, w) for a in allow) and not any(patterns_overlap(d, w) for d in deny)
        for w in wanted
    )


def applicable_credentials(policy: Policy, command_line: str) -> tuple[Credential, ...]:
    """The credentials to inject for *command_line* under *policy*, in policy order."""
    return tuple(
        credential
        for credential in policy.credentials
        if any(match_word(glob, command_line) for glob in credential.commands)
        and hosts_reachable(credential.hosts, policy.network)
    )


def credential_names(policy: Policy) -> frozenset[str]:
    """The variable names of every credential in *policy* (reserved for injection)."""
    return frozenset(credential.name for credential in policy.credentials)
