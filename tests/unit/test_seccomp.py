"""The seccomp programs: compiled bytes are executed by a classic-BPF interpreter
written here, so every rule row is checked for the action it must produce."""

from __future__ import annotations

import struct

import pytest

from corral.backends._seccomp import ARCHES, compile_filter
from corral.backends._seccomp_rules import (
    AF_UNIX,
    AF_VSOCK,
    BROKER_RULES,
    CLONE_NAMESPACE_FLAGS,
    DENY_RULES,
    MAX_KNOWN_SYSCALL,
    SYSCALLS,
    unix_socket_rule,
)

ALLOW, KILL, NOTIFY = 0x7FFF0000, 0x80000000, 0x7FC00000
EPERM, ENOSYS = 0x00050000 | 1, 0x00050000 | 38


def run_bpf(program: bytes, *, arch: int, nr: int, args: tuple[int, ...] = (0,) * 6) -> int:
    """Execute a classic-BPF seccomp program on one seccomp_data (the kernel's semantics)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    code = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    acc = 0
    pc = 0
    for _ in range(10_000):
        op, jt, jf, k = code[pc]
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif op == 0x06:  # ret k
            return k
        elif op in (0x15, 0x25, 0x35, 0x45):
            test = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += 1 + (jt if test else jf)
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")
    raise AssertionError("program does not terminate")


X86 = ARCHES["x86_64"][0]
ARM = ARCHES["aarch64"][0]


def nr(name: str, arch: str = "x86_64") -> int:
    value = SYSCALLS[name][ARCHES[arch][1]]
    assert value is not None
    return value


@pytest.fixture(scope="module")
def deny() -> bytes:
    return compile_filter((*DENY_RULES, unix_socket_rule()), arch="x86_64", deny_unknown=True)


@pytest.fixture(scope="module")
def broker() -> bytes:
    return compile_filter(BROKER_RULES, arch="x86_64", deny_unknown=False)


def test_every_rule_row_has_a_reason() -> None:
    for rule in (*DENY_RULES, *BROKER_RULES, unix_socket_rule()):
        assert rule[3].strip(), rule


def test_foreign_architecture_is_killed(deny: bytes) -> None:
    assert run_bpf(deny, arch=0x40000003, nr=1) == KILL  # i386 via int 0x80


def test_x32_numbers_fail(deny: bytes) -> None:
    assert run_bpf(deny, arch=X86, nr=0x40000000 + 1) == ENOSYS


def test_unreviewed_new_syscalls_fail(deny: bytes) -> None:
    assert run_bpf(deny, arch=X86, nr=MAX_KNOWN_SYSCALL + 1) == ENOSYS
    assert run_bpf(deny, arch=X86, nr=MAX_KNOWN_SYSCALL) == ALLOW


@pytest.mark.parametrize(
    "name",
    [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "mount",
        "umount2",
        "unshare",
        "setns",
        "keyctl",
        "bpf",
        "perf_event_open",
        "io_uring_setup",
        "userfaultfd",
        "pidfd_getfd",
        "open_by_handle_at",
        "fsopen",
    ],
)
def test_dangerous_syscalls_fail_with_eperm(deny: bytes, name: str) -> None:
    assert run_bpf(deny, arch=X86, nr=nr(name)) == EPERM


@pytest.mark.parametrize(
    "name", ["read", "write", "openat", "execve", "fork", "socketpair", "mmap"]
)
def test_ordinary_syscalls_are_allowed(deny: bytes, name: str) -> None:
    numbers = {
        "read": 0,
        "write": 1,
        "openat": 257,
        "execve": 59,
        "fork": 57,
        "socketpair": 53,
        "mmap": 9,
    }
    assert run_bpf(deny, arch=X86, nr=numbers[name]) == ALLOW


def test_clone_with_namespace_flags_fails_but_plain_clone_works(deny: bytes) -> None:
    clone = nr("clone")
    assert run_bpf(deny, arch=X86, nr=clone, args=(0x01200011,)) == ALLOW  # fork-like clone
    assert run_bpf(deny, arch=X86, nr=clone, args=(0x00010F00,)) == ALLOW  # thread-like clone
    for flag in (0x10000000, 0x20000000, 0x40000000, 0x00020000):
        assert run_bpf(deny, arch=X86, nr=clone, args=(0x01200011 | flag,)) == EPERM
    assert CLONE_NAMESPACE_FLAGS & 0x10000000
    assert run_bpf(deny, arch=X86, nr=nr("clone3")) == ENOSYS


def test_unix_and_vsock_sockets_fail_but_inet_works(deny: bytes) -> None:
    socket = nr("socket")
    assert run_bpf(deny, arch=X86, nr=socket, args=(AF_UNIX, 1, 0)) == EPERM
    assert run_bpf(deny, arch=X86, nr=socket, args=(AF_VSOCK, 1, 0)) == EPERM
    assert run_bpf(deny, arch=X86, nr=socket, args=(2, 1, 0)) == ALLOW  # AF_INET
    allowed = compile_filter(DENY_RULES, arch="x86_64", deny_unknown=True)
    assert run_bpf(allowed, arch=X86, nr=socket, args=(AF_UNIX, 1, 0)) == ALLOW
    assert run_bpf(allowed, arch=X86, nr=socket, args=(AF_VSOCK, 1, 0)) == EPERM


def test_setid_modes_fail(deny: bytes) -> None:
    assert run_bpf(deny, arch=X86, nr=nr("chmod"), args=(0, 0o4755)) == EPERM
    assert run_bpf(deny, arch=X86, nr=nr("chmod"), args=(0, 0o2755)) == EPERM
    assert run_bpf(deny, arch=X86, nr=nr("chmod"), args=(0, 0o755)) == ALLOW
    assert run_bpf(deny, arch=X86, nr=nr("fchmodat"), args=(0, 0, 0o4755)) == EPERM
    o_creat = 0o100
    assert run_bpf(deny, arch=X86, nr=nr("openat"), args=(0, 0, o_creat | 1, 0o4755)) == EPERM
    assert run_bpf(deny, arch=X86, nr=nr("openat"), args=(0, 0, 0, 0o4755)) == ALLOW  # mode unused
    assert run_bpf(deny, arch=X86, nr=nr("mkdir"), args=(0, 0o2755)) == EPERM


def test_broker_filter_traps_writes_not_reads(broker: bytes) -> None:
    openat = nr("openat")
    assert run_bpf(broker, arch=X86, nr=openat, args=(0, 0, 0)) == ALLOW  # O_RDONLY
    for flags in (0o1, 0o2, 0o100, 0o1000, 0o20200002):
        assert run_bpf(broker, arch=X86, nr=openat, args=(0, 0, flags)) == NOTIFY
    for name in (
        "mkdir",
        "rename",
        "renameat2",
        "unlink",
        "unlinkat",
        "link",
        "symlink",
        "chmod",
        "truncate",
    ):
        assert run_bpf(broker, arch=X86, nr=nr(name)) == NOTIFY, name
    assert run_bpf(broker, arch=X86, nr=nr("openat2")) == ENOSYS
    assert run_bpf(broker, arch=X86, nr=nr("utimensat"), args=(3, 0)) == ALLOW  # futimens: fd-based
    assert run_bpf(broker, arch=X86, nr=nr("utimensat"), args=(3, 0x7FFF_0000_1000)) == NOTIFY


def test_aarch64_program_uses_its_own_numbers() -> None:
    program = compile_filter(DENY_RULES, arch="aarch64", deny_unknown=True)
    assert run_bpf(program, arch=ARM, nr=nr("ptrace", "aarch64")) == EPERM
    assert run_bpf(program, arch=ARM, nr=nr("ptrace")) == ALLOW  # 101 is not ptrace on arm64
    assert run_bpf(program, arch=X86, nr=1) == KILL


def test_unknown_syscall_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown syscall"):
        compile_filter(((("nosuchcall",), "EPERM", None, "r"),), arch="x86_64", deny_unknown=False)
    with pytest.raises(ValueError, match="unsupported architecture"):
        compile_filter(DENY_RULES, arch="sparc", deny_unknown=False)
