"""The Sessions page: live SDK and MCP sandboxes, what they use, and destroying one.

A session (:class:`corral.Sandbox`, or one ``sandbox_create`` of ``corral mcp``)
lives in the process that opened it and owns a private ``TMPDIR`` named
``<state dir>/sessions/<pid>-<sandbox id>``; that directory is the registry
read here. A session is live while its process exists (the SDK sweeps the
directories of dead ones). Its sandboxed processes are the descendants of the
owning process that have that directory mounted as ``/tmp`` (read from
``/proc/PID/mountinfo``; the mount's root ends in ``/sessions/<pid>-<id>``,
which names one session only). A launcher (``bwrap``) outside the sandbox
exits with the sandbox's first process.

*Destroy* kills those processes and removes the directory: the commands
stop, the files they left in ``/tmp`` are gone, and later commands of the
session fail to start (their ``/tmp`` no longer exists). The object in the
owning process is not closed - only that process can do it - and nothing
outside the session is touched (only processes inside its sandboxes, so
never the owner itself).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

__all__ = ["Session", "destroy", "sessions"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class Session:
    """One live session."""

    sandbox_id: str
    pid: int
    owner: str  # the owning process's command line
    kind: str  # "MCP" or "SDK"
    started: float
    tmp_bytes: int
    processes: int  # processes running in its sandboxes now
    rss_bytes: int  # their resident memory
    cpu_seconds: float  # their CPU time

    @property
    def owner_short(self) -> str:
        """The owner's command line with programs and paths by their last name, at most 60 characters."""
        words = [
            word.rsplit("/", 1)[-1] if word.startswith("/") else word for word in self.owner.split()
        ]
        shown = " ".join(words)
        return shown if len(shown) <= 60 else shown[:59] + "\u2026"


def _sessions_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "sessions")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _stat(pid: int) -> tuple[int, int, float] | None:
    """``(ppid, rss bytes, cpu seconds)`` of *pid*."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return (
            int(fields[1]),
            int(fields[21]) * _PAGE,
            (int(fields[11]) + int(fields[12])) / _TICKS,
        )
    except (IndexError, ValueError):
        return None


def _processes() -> dict[int, tuple[int, int, float]]:
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (info := _stat(int(name))) is not None:
            found[int(name)] = info
    return found


def _sandboxed(name: str, owner: int, table: dict[int, tuple[int, int, float]]) -> list[int]:
    """The descendants of *owner* that run in session *name*'s sandboxes."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    suffix = f"/sessions/{name}"
    found, todo, seen = [], list(children.get(owner, ())), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
                mounts = f.read()
        except OSError:
            continue
        for line in mounts.splitlines():
            fields = line.split(" ", 5)
            if len(fields) > 4 and fields[4] == "/tmp" and fields[3].endswith(suffix):
                found.append(pid)
                break
    return found


def _du(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _entries(state_dir: str) -> list[tuple[str, int, str]]:
    """``(name, owner pid, sandbox id)`` of the live sessions' directories."""
    try:
        names = os.listdir(_sessions_dir(state_dir))
    except OSError:
        return []
    found = []
    for name in names:
        pid, _, sandbox_id = name.partition("-")
        if pid.isdigit() and sandbox_id and os.path.exists(f"/proc/{pid}"):
            found.append((name, int(pid), sandbox_id))
    return found


def sessions(state_dir: str) -> list[Session]:
    """The live sessions, oldest first."""
    entries = _entries(state_dir)
    if not entries:
        return []
    table = _processes()
    found = []
    for name, pid, sandbox_id in entries:
        directory = os.path.join(_sessions_dir(state_dir), name)
        owner = _cmdline(pid)
        sandboxed = _sandboxed(name, pid, table)
        try:
            started = os.stat(directory).st_mtime
        except OSError:
            continue
        found.append(
            Session(
                sandbox_id=sandbox_id,
                pid=pid,
                owner=owner,
                kind="MCP" if " mcp" in f" {owner} " or "mcp_server" in owner else "SDK",
                started=started,
                tmp_bytes=_du(directory),
                processes=len(sandboxed),
                rss_bytes=sum(table[p][1] for p in sandboxed),
                cpu_seconds=sum(table[p][2] for p in sandboxed),
            )
        )
    found.sort(key=lambda s: s.started)
    return found


def destroy(state_dir: str, sandbox_id: str) -> int:
    """Kill the running commands of session *sandbox_id* and remove its ``TMPDIR``.

    Returns how many processes were killed.

    Raises:
        LookupError: no live session has that id.
    """
    from ..preview._mechanism import remove_tree

    match = [(n, p) for n, p, s in _entries(state_dir) if s == sandbox_id]
    if not match:
        raise LookupError(f"no live session {sandbox_id!r}")
    name, owner = match[0]
    directory = os.path.join(_sessions_dir(state_dir), name)
    killed = 0
    for _ in range(3):  # a command may fork while the tree is walked
        pids = [p for p in _sandboxed(name, owner, _processes()) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    remove_tree(directory)
    return killed
