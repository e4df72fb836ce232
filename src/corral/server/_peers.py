"""Who may use the corral server: the peer checks (docs/design.md, "Who may connect").

A sandboxed process that reached the server would escape (the server runs
commands with options its client chooses), so every connection is checked
before anything is read or done for it: the peer's uid, every namespace, and
for every thread the credentials, capability sets, ``no_new_privs``, seccomp
mode and filter count - then, for fidelity, the rest of the context a command
inherits (:func:`process_context`). The peer is pinned with ``SO_PEERPIDFD``.
"""

from __future__ import annotations

import _socket
import os
import sys

from .._procfs import read_text, status_fields

__all__ = ["PeerRefused", "check_peer", "process_context", "thread_state"]

_SO_PEERCRED = 17
_SO_PEERPIDFD = 77  # Linux 6.5
# Fields of /proc/PID/status. Security: a sandboxed process differs in at least one
# of these (or of the namespaces) and can never change it back.
_SECURITY_FIELDS = (
    "Uid",
    "Gid",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
)
# The rest of the context a command inherits from the process that starts it.
_CONTEXT_FIELDS = ("Umask", "Groups", "Cpus_allowed_list", "Mems_allowed_list")
_NAMESPACES = ("pid", "mnt", "user", "net", "ipc", "uts", "cgroup", "time")


class PeerRefused(Exception):
    """A connection the server will not serve.

    Attributes:
        reason: what differs, e.g. ``"pid namespace differs"``.
        security: True when the peer may be sandboxed (logged as a refused
            peer); False for a host process whose context merely differs.
    """

    def __init__(self, reason: str, *, security: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.security = security


def process_context(pid: int | str = "self") -> tuple[dict[str, str], dict[str, str]]:
    """``(security, context)`` of a process, as the peer checks compare them.

    *security* holds its namespaces and, per thread, credentials,
    capabilities, no_new_privs and seccomp; *context* the rest of what a
    command started by it would inherit.

    Raises:
        OSError: the process is gone (or not ours to inspect).
    """
    leader = str(os.getpid() if pid == "self" else pid)
    base = f"/proc/{leader}"
    security: dict[str, str] = {}
    for ns in _NAMESPACES:
        try:
            security[f"{ns} namespace"] = os.readlink(f"{base}/ns/{ns}")
        except FileNotFoundError:
            security[f"{ns} namespace"] = ""  # not supported by this kernel
    per_task = set()
    status = ""
    for tid in os.listdir(f"{base}/task"):
        try:
            text = read_text(f"{base}/task/{tid}/status")
        except (FileNotFoundError, ProcessLookupError):
            if tid == leader:
                raise  # the process is gone
            continue  # a thread that ended since the listing: nothing of it is left to check
        per_task.add(tuple(sorted(status_fields(text, _SECURITY_FIELDS).items())))
        if tid == leader:
            status = text
            continue  # the leader's namespaces are the process's, read above
        for ns in ("mnt", "user", "pid"):  # a thread may have setns()ed elsewhere
            try:
                if os.readlink(f"{base}/task/{tid}/ns/{ns}") != security[f"{ns} namespace"]:
                    per_task.add((("thread namespace", ns),))
            except FileNotFoundError:
                pass
    if len(per_task) != 1:
        security["threads"] = "threads differ in credentials, seccomp or namespaces"
    for key, value in next(iter(per_task)):
        security[key] = value
    context = status_fields(status or read_text(f"{base}/status"), _CONTEXT_FIELDS)
    root = os.stat(f"{base}/root")
    context["root directory"] = f"{root.st_dev}:{root.st_ino}"
    context["cgroups"] = read_text(f"{base}/cgroup")
    context["rlimits"] = read_text(f"{base}/limits")
    context["oom_score_adj"] = read_text(f"{base}/oom_score_adj").strip()
    stat = read_text(f"{base}/stat")
    words = stat[stat.rfind(")") + 2 :].split()
    context["nice"] = words[16] if len(words) > 16 else ""
    try:
        context["LSM label"] = read_text(f"{base}/attr/current").strip("\0\n ")
    except OSError:
        context["LSM label"] = ""
    return security, context


#: per-thread fields of /proc/thread-self/status besides the security and context ones
_THREAD_FIELDS = ("SigBlk", "Cpus_allowed_list", "Mems_allowed_list")


def thread_state() -> dict[str, str]:
    """The calling thread's own kernel state that a process it starts would inherit.

    Credentials (with the filesystem ids), capabilities, ``no_new_privs``,
    seccomp, signal mask, affinity (``/proc/thread-self/status``), every namespace,
    the cgroups (per thread on cgroup v1) and the scheduling priority. The
    corral server keeps a worker thread for the next connection only while
    this is unchanged.
    """
    base = "/proc/thread-self"
    state = status_fields(read_text(f"{base}/status"), _SECURITY_FIELDS + _THREAD_FIELDS)
    for ns in _NAMESPACES:
        try:
            state[f"{ns} namespace"] = os.readlink(f"{base}/ns/{ns}")
        except FileNotFoundError:
            state[f"{ns} namespace"] = ""
    state["cgroups"] = read_text(f"{base}/cgroup")
    stat = read_text(f"{base}/stat")
    state["nice"] = " ".join(stat[stat.rfind(")") + 2 :].split()[15:17])  # priority, nice
    return state


def _alive(pidfd: int) -> bool:
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return not poller.poll(0)  # readable: the process has exited


def check_peer(conn: _socket.socket, own: tuple[dict[str, str], dict[str, str]]) -> tuple[int, int]:
    """Check who is on the other end of *conn*; return ``(pid, pidfd)`` of an acceptable peer.

    *own* is :func:`process_context` of this process. The caller closes the pidfd.

    Raises:
        PeerRefused: see the module docstring for every condition.
    """
    cred = conn.getsockopt(_socket.SOL_SOCKET, _SO_PEERCRED, 12)
    pid = int.from_bytes(cred[0:4], sys.byteorder, signed=True)
    uid = int.from_bytes(cred[4:8], sys.byteorder)
    if uid != os.getuid():
        raise PeerRefused(f"uid {uid} is not the server's uid {os.getuid()}", security=True)
    if pid <= 0:
        raise PeerRefused("the peer's pid is not visible here", security=True)
    try:
        pidfd = conn.getsockopt(_socket.SOL_SOCKET, _SO_PEERPIDFD)
    except OSError as exc:
        raise PeerRefused(
            f"SO_PEERPIDFD is not available ({exc.strerror}): the peer cannot be pinned",
            security=True,
        ) from None
    try:
        try:
            security, context = process_context(pid)
        except (OSError, StopIteration) as exc:
            raise PeerRefused(f"cannot inspect the peer: {exc}", security=True) from None
        own_security, own_context = own
        for key, value in own_security.items():
            if security.get(key) != value:
                raise PeerRefused(f"{key} differs", security=True)
        if "threads" in security:
            raise PeerRefused(security["threads"], security=True)
        if not _alive(pidfd):
            raise PeerRefused("the peer exited while being checked", security=True)
        for key, value in own_context.items():
            if context.get(key) != value:
                raise PeerRefused(f"the client's {key} differs from the server's", security=False)
    except BaseException:
        os.close(pidfd)
        raise
    return pid, pidfd
