"""CPU time of a local Ray cluster and its sandboxes, by component (``corral bench cluster``).

Wall time of a thousand set-ups depends on what else the machine runs; the
CPU they cost does not (much). :class:`CpuMeter` puts the bench process - and
so everything it starts afterwards: the cluster's nodes, their Ray workers,
the node agents and every sandbox - into a cgroup v1 ``cpuacct`` group of its
own, whose ``cpuacct.usage`` is the exact total (corral's sandboxes get
``memory``/``pids``/``cpu`` groups, never a ``cpuacct`` one, so they stay
counted). Without root or a v1 ``cpuacct`` hierarchy the total is the sum of
the components below instead.

The breakdown reads ``/proc/PID/stat`` of the bench process and of every
process under the nodes' ``ray start`` processes, before and after:

* ``driver``: the bench process (the caller's Ray driver and corral client);
* ``agents``: the node agents' own time (Ray's worker runtime and corral's
  Python: settings, plans, spawning, supervision);
* ``sandboxes``: the agents' reaped children (bubblewrap, the exec helper,
  the command): a sandbox's time is added to its agent's once it ended;
* ``raylets``, ``gcs``: Ray's node managers and its control store;
* ``other Ray``: the rest of the nodes' long-lived processes (idle Ray
  workers, dashboard agents, log monitors, the ``ray start`` processes);
* ``unattributed``: the cgroup's total minus all of the above (processes that
  came and went in between without being reaped by one of these).
"""

from __future__ import annotations

import os

__all__ = ["CpuMeter", "Snapshot", "breakdown", "snapshot"]

_CPUACCT = "/sys/fs/cgroup/cpuacct"
_TICK = os.sysconf("SC_CLK_TCK")

#: pid -> (command name, own CPU seconds, reaped children's CPU seconds)
Snapshot = dict[int, tuple[str, float, float]]


def _stat(pid: int) -> tuple[str, float, float] | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    comm = head.partition("(")[2]
    own = (int(fields[11]) + int(fields[12])) / _TICK
    children = (int(fields[13]) + int(fields[14])) / _TICK
    return comm, own, children


def snapshot(roots: list[int]) -> Snapshot:
    """The CPU times of *roots* and all their descendants, and of this process."""
    from ..cluster._local import _descendants

    found: Snapshot = {}
    for pid in (os.getpid(), *roots, *(d for root in roots for d in _descendants(root))):
        if pid not in found:
            stat = _stat(pid)
            if stat is not None:
                found[pid] = stat
    return found


def breakdown(before: Snapshot, after: Snapshot, agents: set[int]) -> dict[str, float]:
    """CPU seconds spent between two snapshots, by component (see the module docstring)."""
    parts = dict.fromkeys(("driver", "agents", "sandboxes", "raylets", "gcs", "other Ray"), 0.0)
    me = os.getpid()
    for pid, (comm, own, children) in after.items():
        _comm, own0, children0 = before.get(pid, (comm, 0.0, 0.0))
        spent, reaped = own - own0, children - children0
        if pid == me:
            parts["driver"] += spent  # its reaped children: the bench's local baseline runs
        elif pid in agents:
            parts["agents"] += spent
            parts["sandboxes"] += reaped
        elif comm == "raylet":
            parts["raylets"] += spent
        elif comm == "gcs_server":
            parts["gcs"] += spent
        else:
            parts["other Ray"] += spent
    return parts


class CpuMeter:
    """The total CPU time of this process and everything it starts from now on.

    Made before the cluster starts (the nodes must be born inside). Use as a
    context manager; :meth:`total` is ``None`` where no ``cpuacct`` group can
    be made here (then report the sum of :func:`breakdown`).
    """

    def __init__(self) -> None:
        self._group: str | None = None
        path = os.path.join(_CPUACCT, f"corral-bench-{os.getpid()}")
        try:
            os.mkdir(path)
        except OSError:
            return
        try:
            with open(os.path.join(path, "cgroup.procs"), "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
        except OSError:
            os.rmdir(path)
            return
        self._group = path

    def total(self) -> float | None:
        """CPU seconds used by the group so far, or ``None`` without one."""
        if self._group is None:
            return None
        with open(os.path.join(self._group, "cpuacct.usage"), encoding="ascii") as f:
            return int(f.read()) / 1e9

    def close(self) -> None:
        """Leave the group and remove it (once the cluster is stopped: it must be empty)."""
        group, self._group = self._group, None
        if group is None:
            return
        try:
            with open(os.path.join(_CPUACCT, "cgroup.procs"), "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
            os.rmdir(group)
        except OSError:
            pass  # a straggler still inside: the empty group is left behind, harmless

    def __enter__(self) -> CpuMeter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
