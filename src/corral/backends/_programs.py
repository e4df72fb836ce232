"""Compiled seccomp programs, memoised across runs.

Compiling the rule tables (:mod:`._seccomp_rules`, :mod:`._seccomp`) costs
about 1.5 ms per run, most of it importing them. The output depends only on
the rule rows, the compiler and the architecture, so it is kept in corral's
probe cache, keyed by the identity (size, mtime) of both source files: any
edit to the rules recompiles. The functions are pure from the caller's point
of view: same arguments, same bytes.

The cache lives in corral's state directory, which every sandbox sees as an
empty read-only directory; nothing a sandboxed command does can change it.
"""

from __future__ import annotations

import os

__all__ = ["broker_syscalls", "notify_variant", "seccomp_program"]

_VARIANTS = (
    "deny",
    "deny+unix",
    "deny+unix-dgram",
    "broker",
    "broker+metadata",
    "broker+connect",
    "broker+metadata+connect",
    "connect",
)
_memo: dict[str, object] = {}


def _sources_key() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    parts = []
    for name in ("_seccomp_rules.py", "_seccomp.py", "_programs.py"):
        try:
            st = os.stat(os.path.join(here, name))
            parts.append(f"{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            parts.append("?")
    return "/".join(parts)


def _compile(arch: str) -> dict[str, object]:
    from ._seccomp import compile_filter
    from ._seccomp_rules import (
        BROKER_RULES,
        CONNECT_BROKER_RULES,
        DENY_RULES,
        METADATA_BROKER_RULES,
        SYSCALLS,
        unix_datagram_rule,
        unix_socket_rule,
    )

    column = 0 if arch == "x86_64" else 1
    notify = {
        "broker": BROKER_RULES,
        "broker+metadata": (*BROKER_RULES, *METADATA_BROKER_RULES),
        "broker+connect": (*BROKER_RULES, *CONNECT_BROKER_RULES),
        "broker+metadata+connect": (
            *BROKER_RULES,
            *METADATA_BROKER_RULES,
            *CONNECT_BROKER_RULES,
        ),
        "connect": CONNECT_BROKER_RULES,
    }
    compiled: dict[str, object] = {
        "deny": compile_filter(DENY_RULES, arch=arch, deny_unknown=True).hex(),
        "deny+unix": compile_filter(
            (*DENY_RULES, unix_socket_rule()), arch=arch, deny_unknown=True
        ).hex(),
        "deny+unix-dgram": compile_filter(
            (*DENY_RULES, unix_datagram_rule()), arch=arch, deny_unknown=True
        ).hex(),
    }
    for name, rules in notify.items():
        compiled[name] = compile_filter(rules, arch=arch, deny_unknown=False).hex()
        compiled[f"{name}-syscalls"] = sorted(
            {
                (nr, syscall)
                for rule in rules
                for syscall in rule[0]
                if (nr := SYSCALLS[syscall][column]) is not None
            }
        )
    return compiled


def _programs(arch: str) -> dict[str, object]:
    key = f"seccomp:{arch}:{_sources_key()}"
    cached = _memo.get(key)
    if cached is None:
        from .. import _state

        cached = _state.cache_get(key)
        if not isinstance(cached, dict) or not all(v in cached for v in _VARIANTS):
            cached = _compile(arch)
            _state.cache_put(key, cached)
        _memo[key] = cached
    assert isinstance(cached, dict)
    return cached


def seccomp_program(variant: str, arch: str) -> bytes:
    """The compiled BPF program of *variant* for *arch*.

    Deny programs: ``"deny"``, ``"deny+unix"`` (also denies ``AF_UNIX``
    sockets), ``"deny+unix-dgram"`` (also denies datagram ``AF_UNIX``
    sockets: for named sockets). Broker (notify) programs: ``"broker"``,
    with ``+metadata`` (fd-based metadata changes), with ``+connect``
    (every ``connect()``, for named sockets), and ``"connect"`` alone.

    Raises:
        ValueError: unknown variant or architecture.
    """
    if variant not in _VARIANTS:
        raise ValueError(f"unknown seccomp program {variant!r}")
    return bytes.fromhex(str(_programs(arch)[variant]))


def notify_variant(*, files: bool, metadata: bool, connect: bool) -> str:
    """The name of the broker program that traps what is asked (at least one of them)."""
    if not files:
        if not connect or metadata:
            raise ValueError("a broker program traps files, or connect() alone")
        return "connect"
    return "broker" + ("+metadata" if metadata else "") + ("+connect" if connect else "")


def broker_syscalls(variant: str, arch: str) -> tuple[tuple[int, str], ...]:
    """``(number, name)`` of every syscall the broker program *variant* traps on *arch*."""
    rows = _programs(arch)[f"{variant}-syscalls"]
    assert isinstance(rows, list)
    return tuple((int(nr), str(name)) for nr, name in rows)
