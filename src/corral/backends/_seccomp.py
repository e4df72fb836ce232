"""Compile the rows of :mod:`._seccomp_rules` into classic-BPF seccomp programs.

The output is the raw ``struct sock_filter`` array the exec helper hands to
``seccomp(SECCOMP_SET_MODE_FILTER)``. Layout of every program::

    load arch;  arch != native           -> KILL_PROCESS   (blocks i386 via int 0x80)
    load nr;    x86_64 and nr >= 2**30   -> ENOSYS         (x32 ABI numbers)
                nr > MAX_KNOWN_SYSCALL   -> ENOSYS         (unreviewed syscalls; deny filter only)
    for each syscall with rules: nr == N -> test conditions -> return the rule's action
    ALLOW

Arguments are tested on their low 32-bit word (flags and modes), except
``nonzero64`` which tests both words of a pointer.
"""

from __future__ import annotations

import struct

from ._seccomp_rules import MAX_KNOWN_SYSCALL, SYSCALLS, Condition, Rule

__all__ = ["ARCHES", "compile_filter", "native_arch"]

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JGT_K = 0x25
_JSET_K = 0x45
_RET_K = 0x06

_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_USER_NOTIF = 0x7FC00000
_RET_ALLOW = 0x7FFF0000
_ERRNO = {"EPERM": 1, "ENOSYS": 38, "EACCES": 13}

#: machine -> (AUDIT_ARCH value, index into SYSCALLS tuples)
ARCHES: dict[str, tuple[int, int]] = {
    "x86_64": (0xC000003E, 0),
    "aarch64": (0xC00000B7, 1),
}

_OFF_NR = 0
_OFF_ARCH = 4


def _arg_lo(index: int) -> int:
    return 16 + 8 * index


def native_arch() -> str:
    """The machine name used as key of :data:`ARCHES` for this host (``os.uname``)."""
    import os

    return os.uname().machine


def _action(name: str) -> int:
    if name == "NOTIFY":
        return _RET_USER_NOTIF
    if name == "KILL":
        return _RET_KILL_PROCESS
    return _RET_ERRNO | _ERRNO[name]


class _Program:
    """Instructions with symbolic jump targets, resolved at the end."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}
        self._next = 0

    def label(self) -> str:
        self._next += 1
        return f"L{self._next}"

    def place(self, label: str) -> None:
        self.labels[label] = len(self.code)

    def emit(self, op: int, k: int, jt: object = 0, jf: object = 0) -> None:
        self.code.append((op, jt, jf, k))

    def assemble(self) -> bytes:
        out = bytearray()
        for pc, (op, jt, jf, k) in enumerate(self.code):
            offsets = []
            for target in (jt, jf):
                if isinstance(target, str):
                    delta = self.labels[target] - pc - 1
                    if not 0 <= delta <= 255:
                        raise ValueError(f"seccomp jump out of range ({delta})")
                    offsets.append(delta)
                else:
                    offsets.append(int(target))  # type: ignore[call-overload]
            out += struct.pack("<HBBI", op, offsets[0], offsets[1], k & 0xFFFFFFFF)
        return bytes(out)


def _emit_condition(prog: _Program, cond: Condition, on_true: str, on_false: str) -> None:
    """Emit a test of *cond* that jumps to *on_true* or *on_false* (A is clobbered)."""
    if cond is None:  # pragma: no cover - compile_filter returns directly instead
        raise ValueError("unconditional rules have no test")
    kind = cond[0]
    if kind == "eq":
        _, index, value = cond
        prog.emit(_LD_W_ABS, _arg_lo(int(index)))  # type: ignore[call-overload]
        prog.emit(_JEQ_K, int(value), on_true, on_false)  # type: ignore[call-overload]
    elif kind == "any":
        _, index, mask = cond
        prog.emit(_LD_W_ABS, _arg_lo(int(index)))  # type: ignore[call-overload]
        prog.emit(_JSET_K, int(mask), on_true, on_false)  # type: ignore[call-overload]
    elif kind == "nonzero64":
        _, index = cond
        prog.emit(_LD_W_ABS, _arg_lo(int(index)))  # type: ignore[call-overload]
        prog.emit(_JEQ_K, 0, 0, on_true)  # low word non-zero -> true
        prog.emit(_LD_W_ABS, _arg_lo(int(index)) + 4)  # type: ignore[call-overload]
        prog.emit(_JEQ_K, 0, on_false, on_true)
    elif kind == "all":
        parts = cond[1:]
        for i, part in enumerate(parts):
            nxt = on_true if i == len(parts) - 1 else prog.label()
            _emit_condition(prog, part, nxt, on_false)  # type: ignore[arg-type]
            if nxt != on_true:
                prog.place(nxt)
    else:
        raise ValueError(f"unknown seccomp condition {kind!r}")


def compile_filter(rules: tuple[Rule, ...], *, arch: str, deny_unknown: bool) -> bytes:
    """Compile *rules* for *arch* into a BPF program (bytes of ``sock_filter``).

    Args:
        rules: rows ``(syscalls, action, condition, reason)``; the first
            matching row of a syscall decides.
        arch: a key of :data:`ARCHES`.
        deny_unknown: return ENOSYS for syscall numbers above
            :data:`MAX_KNOWN_SYSCALL`.

    Raises:
        ValueError: unknown architecture, syscall name or condition.
    """
    if arch not in ARCHES:
        raise ValueError(f"seccomp: unsupported architecture {arch!r}")
    audit_arch, column = ARCHES[arch]
    by_nr: dict[int, list[tuple[str, Condition]]] = {}
    for names, action, cond, _reason in rules:
        for name in names:
            if name not in SYSCALLS:
                raise ValueError(f"seccomp: unknown syscall {name!r}")
            nr = SYSCALLS[name][column]
            if nr is None:
                continue  # not on this architecture
            by_nr.setdefault(nr, []).append((action, cond))

    # Every jump is local (classic BPF jumps reach at most 255 instructions),
    # so returns are emitted inline right after the test that leads to them.
    prog = _Program()
    prog.emit(_LD_W_ABS, _OFF_ARCH)
    prog.emit(_JEQ_K, audit_arch, 1, 0)
    prog.emit(_RET_K, _RET_KILL_PROCESS)
    prog.emit(_LD_W_ABS, _OFF_NR)
    if arch == "x86_64":
        prog.emit(_JGE_K, 0x40000000, 0, 1)
        prog.emit(_RET_K, _RET_ERRNO | _ERRNO["ENOSYS"])
    if deny_unknown:
        prog.emit(_JGT_K, MAX_KNOWN_SYSCALL, 0, 1)
        prog.emit(_RET_K, _RET_ERRNO | _ERRNO["ENOSYS"])

    for nr in sorted(by_nr):
        next_block = prog.label()
        block = prog.label()
        prog.emit(_JEQ_K, nr, block, next_block)
        prog.place(block)
        for action, cond in by_nr[nr]:
            if cond is None:
                prog.emit(_RET_K, _action(action))
                break
            hit, miss = prog.label(), prog.label()
            _emit_condition(prog, cond, hit, miss)
            prog.place(hit)
            prog.emit(_RET_K, _action(action))
            prog.place(miss)
        # no rule of this syscall matched: fall through to the next block,
        # whose number cannot match, and on to ALLOW
        prog.place(next_block)
        prog.emit(_LD_W_ABS, _OFF_NR)  # conditions clobbered A

    prog.emit(_RET_K, _RET_ALLOW)
    return prog.assemble()
