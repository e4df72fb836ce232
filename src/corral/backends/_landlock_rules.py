"""Landlock rulesets as data: access rights per ABI, the read split, the spec encoding.

Everything here is pure: :mod:`corral.backends.landlock` feeds it facts
gathered beforehand (the kernel's ABI, the listings of a few directories)
and hands the encoded spec to the exec helper (``--landlock-fd``), which
applies it right before ``exec`` (see ``native/exec/common.c`` for the
binary format).

**Hiding a path inside a readable tree.** A Landlock rule grants access to a
directory *and everything beneath it*; there is no "deny" rule. To keep
``~/.ssh`` unreadable while the rest of the system stays readable, read
access is granted on every *sibling* along the way instead of on the
ancestors themselves::

    /            no rule (an ancestor of a hidden path)
    ├── usr      read          (sibling)
    ├── etc      read          (sibling)
    └── root     no rule (ancestor)
        ├── src      read      (sibling)
        └── .ssh     hidden: no rule

Consequences (documented in ``docs/backends/landlock.md``): the ancestors
themselves cannot be listed (``ls ~`` fails with EACCES; files in them are
still reachable through their granted siblings), and entries created in an
ancestor after the sandbox started are not readable. Symbolic links among
the siblings get no rule: access through them is decided where they point.
"""

from __future__ import annotations

import struct

__all__ = [
    "FS_READ",
    "FS_WRITE_V1",
    "LandlockRule",
    "encode_spec",
    "fs_rights",
    "handled_net",
    "scoped",
    "split_readable",
]

# Filesystem rights (include/uapi/linux/landlock.h), with the ABI that added them.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5

FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
FS_WRITE_V1 = (
    FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_CHAR
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SOCK
    | FS_MAKE_FIFO
    | FS_MAKE_BLOCK
    | FS_MAKE_SYM
)
#: Rights that apply to non-directories (the helper masks file rules to these).
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

_KIND_PATH = 1
_KIND_PORT = 2


def fs_rights(abi: int) -> tuple[int, int]:
    """``(read, write)`` right masks the kernel with Landlock *abi* knows.

    Every right the ABI knows is *handled* (denied unless granted), so a newer
    kernel never leaves a kind of access unrestricted by omission.
    """
    write = FS_WRITE_V1
    if abi >= 2:
        write |= FS_REFER
    if abi >= 3:
        write |= FS_TRUNCATE
    if abi >= 5:
        write |= FS_IOCTL_DEV
    return FS_READ, write


def handled_net(abi: int) -> int:
    """The TCP rights handled (all of them from ABI 4 on; 0 before)."""
    return NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0


def scoped(abi: int) -> int:
    """IPC scopes: abstract unix sockets and signals stay inside the sandbox (ABI 6)."""
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


class LandlockRule:
    """One rule: *access* beneath *path* (kind ``"path"``) or on TCP *port* (``"port"``).

    *reason* says which part of the policy the allowance comes from; it is
    shown by ``corral explain`` and checked non-empty by the tests.
    """

    __slots__ = ("access", "kind", "path", "port", "reason")

    def __init__(
        self, kind: str, access: int, reason: str, *, path: str = "", port: int = 0
    ) -> None:
        self.kind = kind
        self.access = access
        self.reason = reason
        self.path = path
        self.port = port

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LandlockRule) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[object, ...]:
        return (self.kind, self.access, self.path, self.port, self.reason)

    def __repr__(self) -> str:
        target = self.path if self.kind == "path" else f"tcp:{self.port}"
        return f"LandlockRule({target!r}, {self.access:#x}, {self.reason!r})"


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


def split_readable(
    root: str,
    hidden: tuple[str, ...],
    listings: dict[str, tuple[tuple[str, str], ...]],
    reason: str,
) -> list[LandlockRule]:
    """Read rules covering *root* except the *hidden* paths beneath it.

    Args:
        root: a directory to make readable.
        hidden: absolute paths that must stay unreadable (existing or not).
        listings: ``{directory: ((name, kind), ...)}`` for every ancestor of a
            hidden path below *root* (kind ``"dir"``, ``"file"``,
            ``"symlink"`` or ``"other"``); a directory missing here is treated
            as empty (nothing granted: the restrictive choice).
        reason: the reason recorded on each rule.

    Returns the rules, sorted by path; *root* itself gets a rule only when
    nothing hidden lies beneath it.
    """
    if any(_under(root, h) for h in hidden):
        return []  # the root itself is hidden (or inside a hidden path)
    inside = [h for h in hidden if _under(h, root)]
    if not inside:
        return [LandlockRule("path", FS_READ, reason, path=root)]
    rules: list[LandlockRule] = []
    for name, kind in listings.get(root, ()):
        child = root.rstrip("/") + "/" + name
        if kind == "symlink":
            continue  # decided where it points
        if any(_under(h, child) for h in inside):
            if kind == "dir":
                rules += split_readable(child, tuple(inside), listings, reason)
            continue
        rules.append(LandlockRule("path", FS_READ, reason, path=child))
    return sorted(rules, key=lambda r: r.path)


def ancestors_to_list(root: str, hidden: tuple[str, ...]) -> set[str]:
    """The directories :func:`split_readable` needs listed for *root* and *hidden*."""
    needed: set[str] = set()
    for h in hidden:
        if h == root or not _under(h, root):
            continue
        parent = h.rsplit("/", 1)[0] or "/"
        while True:
            needed.add(parent)
            if parent == root or parent == "/":
                break
            parent = parent.rsplit("/", 1)[0] or "/"
    return needed


def encode_spec(
    *, handled_fs: int, handled_net: int, scoped: int, rules: list[LandlockRule]
) -> bytes:
    """The spec the exec helper reads from ``--landlock-fd`` (little-endian).

    Header ``u64 handled_fs, u64 handled_net, u64 scoped``; then per rule
    ``u32 kind, u32 payload length, u64 access, payload`` where the payload is
    a NUL-terminated path (kind 1) or a ``u64`` port (kind 2).
    """
    out = bytearray(struct.pack("<QQQ", handled_fs, handled_net, scoped))
    for rule in rules:
        if rule.kind == "path":
            payload = rule.path.encode("utf-8", "surrogateescape") + b"\0"
            out += struct.pack("<IIQ", _KIND_PATH, len(payload), rule.access) + payload
        else:
            out += struct.pack("<IIQ", _KIND_PORT, 8, rule.access) + struct.pack("<Q", rule.port)
    return bytes(out)
