"""The seccomp rules corral applies inside every sandbox, as data rows.

Each row is ``(syscalls, action, condition, reason)``. ``tests/repo`` fails on
an empty reason, and ``docs/policy-reference.md`` renders this table. The rows
are compiled to classic BPF by :mod:`corral.backends._seccomp`.

Two filters exist:

* :data:`DENY_RULES` - always installed. Syscalls that reach other processes,
  change the filesystem view, create namespaces or widen the kernel attack
  surface fail with ``EPERM`` (or ``ENOSYS`` where callers must fall back).
* :data:`BROKER_RULES` - installed when the write broker supervises a writable
  root (see :mod:`corral.backends._broker`). Syscalls that create, change,
  rename or delete names are handed to the broker (``SECCOMP_RET_USER_NOTIF``),
  which checks ``filesystem.protect``/``denyWrite`` at any depth and performs
  the allowed ones. The supervised roots are mounted read-only, so anything
  the broker lets continue untouched still cannot write there.

Conditions look at syscall arguments (only the low 32 bits, which hold flags
and modes on both supported architectures):

* ``None`` - always;
* ``("eq", i, v)`` - argument *i* equals *v*;
* ``("any", i, mask)`` - argument *i* has a bit of *mask* set;
* ``("nonzero64", i)`` - argument *i* (a pointer, all 64 bits) is not NULL;
* ``("all", c1, c2, ...)`` - every condition holds.
"""

from __future__ import annotations

__all__ = [
    "AF_UNIX",
    "AF_VSOCK",
    "BROKER_RULES",
    "CLONE_NAMESPACE_FLAGS",
    "CONNECT_BROKER_RULES",
    "DENY_RULES",
    "INET_SOCKET_RULES",
    "MAX_KNOWN_SYSCALL",
    "METADATA_BROKER_RULES",
    "PROCESS_LEVEL_DENY_RULES",
    "PTY_PEER_BROKER_RULES",
    "SYSCALLS",
    "unix_datagram_rule",
    "unix_socket_rule",
]

# ---------------------------------------------------------------- constants
AF_UNIX = 1
AF_VSOCK = 40
O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_TMPFILE_BIT = 0o1, 0o2, 0o100, 0o1000, 0o20000000
SETID_BITS = 0o6000
CLONE_NAMESPACE_FLAGS = (
    0x00020000  # CLONE_NEWNS
    | 0x02000000  # CLONE_NEWCGROUP
    | 0x04000000  # CLONE_NEWUTS
    | 0x08000000  # CLONE_NEWIPC
    | 0x10000000  # CLONE_NEWUSER
    | 0x20000000  # CLONE_NEWPID
    | 0x40000000  # CLONE_NEWNET
    | 0x00000080  # CLONE_NEWTIME
)

#: Highest syscall number these tables were reviewed against (Linux 6.17,
#: ``file_setattr``). Newer syscalls fail with ENOSYS until reviewed.
MAX_KNOWN_SYSCALL = 469

#: Syscall numbers: name -> (x86_64, aarch64); ``None`` where the syscall does
#: not exist on that architecture.
SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "move_mount": (429, 429),
    "open_tree": (428, 428),
    "open_tree_attr": (467, 467),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "clone": (56, 220),
    "clone3": (435, 435),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "userfaultfd": (323, 282),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "syslog": (103, 116),
    "lookup_dcookie": (212, 18),
    "uselib": (134, None),
    "ioperm": (173, None),
    "iopl": (172, None),
    "modify_ldt": (154, None),
    "vhangup": (153, 58),
    "nfsservctl": (180, 42),
    "_sysctl": (156, None),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "clock_adjtime": (305, 266),
    "adjtimex": (159, 171),
    "open_by_handle_at": (304, 265),
    "fanotify_init": (300, 262),
    "move_pages": (279, 239),
    "migrate_pages": (256, 238),
    "socket": (41, 198),
    "connect": (42, 203),
    # file creation and metadata
    "open": (2, None),
    "openat": (257, 56),
    "openat2": (437, 437),
    "creat": (85, None),
    "mkdir": (83, None),
    "mkdirat": (258, 34),
    "mknod": (133, None),
    "mknodat": (259, 33),
    "symlink": (88, None),
    "symlinkat": (266, 36),
    "link": (86, None),
    "linkat": (265, 37),
    "rename": (82, None),
    "renameat": (264, 38),
    "renameat2": (316, 276),
    "unlink": (87, None),
    "unlinkat": (263, 35),
    "rmdir": (84, None),
    "chmod": (90, None),
    "fchmod": (91, 52),
    "fchmodat": (268, 53),
    "fchmodat2": (452, 452),
    "chown": (92, None),
    "lchown": (94, None),
    "fchownat": (260, 54),
    "truncate": (76, 45),
    "utime": (132, None),
    "utimes": (235, None),
    "futimesat": (261, None),
    "utimensat": (280, 88),
    "setxattr": (188, 5),
    "lsetxattr": (189, 6),
    "removexattr": (197, 14),
    "lremovexattr": (198, 15),
    "fchown": (93, 55),
    "fsetxattr": (190, 7),
    "fremovexattr": (199, 16),
    "setxattrat": (463, 463),
    "removexattrat": (466, 466),
    "file_setattr": (469, 469),
    "ioctl": (16, 29),
}

Condition = tuple[object, ...] | None
Rule = tuple[tuple[str, ...], str, Condition, str]

_WRITE_OPEN = O_WRONLY | O_RDWR | O_CREAT | O_TRUNC
_MODE_USED = O_CREAT | O_TMPFILE_BIT

# ------------------------------------------------ the user's terminal (issue 10, engineer C)
# ``corral run`` on a terminal hands the command the user's tty (docs/threat-model.md,
# "The terminal"). The sandbox runs in a new session, so the tty is not its
# controlling terminal; these rows also deny the ioctls that act on the host
# through a terminal whatever the session: the kernel compares ``cmd`` as an
# ``unsigned int``, as the "eq" test (low 32 bits) does. TIOCSCTTY stays
# allowed (pty.fork, tmux and expect need it on ptys they open); the kernel
# refuses it for the user's terminal, the controlling tty of another session.
TIOCSTI, TIOCLINUX, TIOCCONS, TIOCSETD = 0x5412, 0x541C, 0x541D, 0x5423
TERMINAL_RULES: tuple[Rule, ...] = (
    (("ioctl",), "EPERM", ("eq", 1, TIOCSTI), "typing into a terminal shared with the host"),
    (
        ("ioctl",),
        "EPERM",
        ("eq", 1, TIOCLINUX),
        "virtual console control: paste the selection (keystrokes), console state",
    ),
    (("ioctl",), "EPERM", ("eq", 1, TIOCCONS), "redirecting the host's console output"),
    (("ioctl",), "EPERM", ("eq", 1, TIOCSETD), "line disciplines (kernel attack surface)"),
)


DENY_RULES: tuple[Rule, ...] = (
    (
        ("ptrace",),
        "EPERM",
        None,
        "inspect or control other processes (and escape seccomp through them)",
    ),
    (
        ("process_vm_readv", "process_vm_writev"),
        "EPERM",
        None,
        "read or write other processes' memory",
    ),
    (("pidfd_getfd",), "EPERM", None, "steal open files from other processes"),
    (
        (
            "mount",
            "umount2",
            "pivot_root",
            "chroot",
            "move_mount",
            "open_tree",
            "open_tree_attr",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
        ),
        "EPERM",
        None,
        "change the filesystem view the policy is built on",
    ),
    (
        ("unshare", "setns"),
        "EPERM",
        None,
        "enter or create namespaces (nested user namespaces expose root-only kernel code)",
    ),
    (
        ("clone",),
        "EPERM",
        ("any", 0, CLONE_NAMESPACE_FLAGS),
        "create namespaces while forking (same reason as unshare)",
    ),
    (
        ("clone3",),
        "ENOSYS",
        None,
        "its flags live in memory seccomp cannot read; libc falls back to clone, which is checked",
    ),
    (
        ("keyctl", "add_key", "request_key"),
        "EPERM",
        None,
        "the kernel keyring is not isolated by namespaces",
    ),
    (("bpf",), "EPERM", None, "eBPF programs widen the kernel attack surface"),
    (
        ("perf_event_open",),
        "EPERM",
        None,
        "performance counters: kernel attack surface and side channels",
    ),
    (
        ("io_uring_setup", "io_uring_enter", "io_uring_register"),
        "EPERM",
        None,
        "io_uring performs file and network operations that seccomp cannot see",
    ),
    (("userfaultfd",), "EPERM", None, "a common kernel-exploitation primitive"),
    (
        (
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "syslog",
            "lookup_dcookie",
            "uselib",
            "ioperm",
            "iopl",
            "modify_ldt",
            "vhangup",
            "nfsservctl",
            "_sysctl",
            "settimeofday",
            "clock_settime",
            "clock_adjtime",
            "adjtimex",
            "open_by_handle_at",
            "fanotify_init",
        ),
        "EPERM",
        None,
        "host administration; denied outright to shrink the kernel surface",
    ),
    (
        ("move_pages", "migrate_pages"),
        "EPERM",
        None,
        "move other processes' memory between NUMA nodes",
    ),
    (
        ("socket",),
        "EPERM",
        ("eq", 0, AF_VSOCK),
        "vsock is not network-namespaced: it reaches the hypervisor host",
    ),
    (
        ("chmod", "fchmod"),
        "EPERM",
        ("any", 1, SETID_BITS),
        "set-user-ID/set-group-ID files would run with their owner's rights on the host",
    ),
    (
        ("fchmodat", "fchmodat2"),
        "EPERM",
        ("any", 2, SETID_BITS),
        "set-user-ID/set-group-ID files would run with their owner's rights on the host",
    ),
    (
        ("open",),
        "EPERM",
        ("all", ("any", 1, _MODE_USED), ("any", 2, SETID_BITS)),
        "create set-user-ID/set-group-ID files",
    ),
    (
        ("openat",),
        "EPERM",
        ("all", ("any", 2, _MODE_USED), ("any", 3, SETID_BITS)),
        "create set-user-ID/set-group-ID files",
    ),
    (
        ("creat", "mkdir", "mknod"),
        "EPERM",
        ("any", 1, SETID_BITS),
        "create set-user-ID/set-group-ID files",
    ),
    (
        ("mkdirat", "mknodat"),
        "EPERM",
        ("any", 2, SETID_BITS),
        "create set-user-ID/set-group-ID files",
    ),
    *TERMINAL_RULES,
)


def unix_socket_rule() -> Rule:
    """The row that denies ``socket(AF_UNIX, ...)`` unless ``network.allowUnixSockets``."""
    return (
        ("socket",),
        "EPERM",
        ("eq", 0, AF_UNIX),
        "host unix sockets (docker.sock, ssh-agent, D-Bus) are reachable by path; "
        "socketpair() still works",
    )


def unix_datagram_rule() -> Rule:
    """The row that denies datagram ``socket(AF_UNIX, ...)`` when sockets are named.

    With ``network.allowUnixSockets`` as a list, the broker performs every
    ``connect()`` (:data:`CONNECT_BROKER_RULES`); a datagram socket reaches a
    path without one (``sendto``/``sendmsg`` with an address), so it is not
    allowed. ``SOCK_RAW`` is a datagram socket for ``AF_UNIX``; both have the
    value-2 bit of the type set, ``SOCK_STREAM`` (1) and ``SOCK_SEQPACKET`` (5)
    do not (the flags ``SOCK_NONBLOCK``/``SOCK_CLOEXEC`` lie far above).
    """
    return (
        ("socket",),
        "EPERM",
        ("all", ("eq", 0, AF_UNIX), ("any", 1, 0x2)),
        "a datagram unix socket reaches a path by sendto() without connect(), which the "
        "broker judges for the named sockets; socketpair() still works",
    )


#: Handed to the broker when ``network.allowUnixSockets`` names sockets: it reads the
#: address once and performs the connect itself on the target's socket (see
#: :mod:`corral.backends._broker_connect`), so what the kernel connects to is what was
#: judged.
CONNECT_BROKER_RULES: tuple[Rule, ...] = (
    (
        ("connect",),
        "NOTIFY",
        None,
        "a pathname unix socket is allowed only when it is one of the named sockets "
        "(by inode, in the sandbox's view); the broker connects, so the address cannot change "
        "after the check",
    ),
)


TIOCGPTPEER = 0x5441
#: Handed to the broker on the landlock backend, which does not grant ``/dev/pts``
#: (the user's other terminals live there): the broker opens the peer of a pty
#: master the command holds and hands the descriptor over (see
#: :mod:`corral.backends._broker_pty`), so ``openpty()`` keeps working.
PTY_PEER_BROKER_RULES: tuple[Rule, ...] = (
    (
        ("ioctl",),
        "NOTIFY",
        ("eq", 1, TIOCGPTPEER),
        "opening the other end of a pseudo-terminal the command created (Landlock would refuse "
        "the /dev/pts entry)",
    ),
)


BROKER_RULES: tuple[Rule, ...] = (
    (
        ("openat2",),
        "ENOSYS",
        None,
        "its flags live in memory seccomp cannot read; libc and runtimes fall back to openat",
    ),
    (("open",), "NOTIFY", ("any", 1, _WRITE_OPEN), "opening for writing or creating a file"),
    (("openat",), "NOTIFY", ("any", 2, _WRITE_OPEN), "opening for writing or creating a file"),
    (("utimensat",), "NOTIFY", ("nonzero64", 1), "changing timestamps by path"),
    (
        (
            "creat",
            "mkdir",
            "mkdirat",
            "mknod",
            "mknodat",
            "symlink",
            "symlinkat",
            "link",
            "linkat",
            "rename",
            "renameat",
            "renameat2",
            "unlink",
            "unlinkat",
            "rmdir",
            "chmod",
            "fchmodat",
            "fchmodat2",
            "chown",
            "lchown",
            "fchownat",
            "truncate",
            "utime",
            "utimes",
            "futimesat",
            "setxattr",
            "lsetxattr",
            "removexattr",
            "lremovexattr",
        ),
        "NOTIFY",
        None,
        "creating, renaming, deleting or changing a file by path",
    ),
)


AF_INET, AF_INET6, AF_PACKET = 2, 10, 17
FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_FSSETXATTR = (0x40086602, 0x40046602, 0x401C5820)

#: Rows for ``network.mode = "none"`` where no network namespace exists
#: (landlock): Landlock governs TCP ports only, so sockets of the IP families
#: are not created at all.
INET_SOCKET_RULES: tuple[Rule, ...] = (
    (
        ("socket",),
        "EACCES",
        ("eq", 0, AF_INET),
        "network.mode none without a network namespace: no IPv4 sockets",
    ),
    (
        ("socket",),
        "EACCES",
        ("eq", 0, AF_INET6),
        "network.mode none without a network namespace: no IPv6 sockets",
    ),
    (
        ("socket",),
        "EACCES",
        ("eq", 0, AF_PACKET),
        "raw link-layer sockets reach the host's interfaces",
    ),
)

#: Extra deny rows for process-level backends (no namespaces, no read-only
#: mounts): calls that would change host state Landlock does not govern.
PROCESS_LEVEL_DENY_RULES: tuple[Rule, ...] = (
    (
        ("setxattrat", "removexattrat", "file_setattr"),
        "EPERM",
        None,
        "metadata changes by path that Landlock does not govern; libc uses setxattr, which the broker checks",
    ),
    (("ioctl",), "EPERM", ("eq", 1, FS_IOC_SETFLAGS), "inode flags of host files (chattr)"),
    (
        ("ioctl",),
        "EPERM",
        ("eq", 1, FS_IOC32_SETFLAGS),
        "inode flags of host files (chattr, 32-bit)",
    ),
    (("ioctl",), "EPERM", ("eq", 1, FS_IOC_FSSETXATTR), "extended inode attributes of host files"),
)

#: Broker rows added where the broker must also confine metadata changes
#: through file descriptors (see ``BrokerSpec.confine_metadata``).
METADATA_BROKER_RULES: tuple[Rule, ...] = (
    (
        ("fchmod", "fchown", "fsetxattr", "fremovexattr"),
        "NOTIFY",
        None,
        "changing metadata through a file descriptor: Landlock does not govern it",
    ),
    (("utimensat",), "NOTIFY", None, "changing timestamps through a file descriptor (futimens)"),
)
