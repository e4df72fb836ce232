"""Cluster: corral.cluster on a real Ray cluster on this machine, against local runs.

Starts a head (no sandboxes) and two worker nodes (``ray start``), then:

* ``exec true, local`` / ``exec true, cluster``: the median of one
  ``exec(["true"])`` in an open :class:`corral.Sandbox` here and in an open
  cluster sandbox (steady state); the difference is the overhead per run.
  Target: <= 5 ms added.
* ``ray round trip to the agent``: a no-op call of the node's agent, the
  part of the overhead that is Ray's own.
* ``run true, local`` / ``run true, cluster``: one-shot ``corral.run`` against
  ``cluster.run`` (a sandbox opened, placed and closed per run).
* ``N x sleep 30``: N sandboxes (default 1,000) each running ``sleep 30``,
  all started at once across the workers; the row is the seconds until all
  were running at the same time, the note says the most that ran at once,
  how many errors (target: none) and the memory per idle sandbox (the RSS of
  every process of the nodes' agents and their sandboxes at the peak, over
  the same before, divided by the sandboxes running then).

* ``CPU per held sandbox (M x sleep 10)``: M sandboxes (default 200) held
  at once, the CPU time of their whole life (open, start, hold, close)
  across the driver, the node agents, the sandboxes and Ray's processes,
  divided by M, with the breakdown by component in the note
  (:mod:`corral.benchmarks._cpu`; the cluster's idle rate is taken out).
  Wall time depends on the machine's load; CPU time much less. 1,000
  set-ups fit in 30 s on 2 cores only at <= ~50 ms each. The ``N x sleep``
  row gives the same figure for its N.

* ``microvm run, warm pool`` / ``microvm run, cold``: one-shot
  ``cluster.run(["true"], backend="microvm", read_only=True)`` on the worker
  whose settings keep one warm VM (``integrations.cluster.warmVms = 1``,
  its own ``CORRAL_SETTINGS``) against the same run on the other worker
  (no pool: the run boots its VM). Between warm runs the bench waits (not
  timed) until the pool has a VM ready again. Both workers are this machine.
  Needs root, qemu and the python VM image (built once, then cached).

``CORRAL_BENCH_CLUSTER_VM=0`` skips the micro-VM rows,
``CORRAL_BENCH_CLUSTER_N`` changes N, ``CORRAL_BENCH_CLUSTER_CPU_N`` M (0:
no CPU row), ``CORRAL_BENCH_CLUSTER_HOLD`` the seconds each sleeps (on a
small machine N set-ups may take longer than 30 s, so the first sandboxes
end before the last start: the note gives the most that ran at once).
"""

from __future__ import annotations

import os
import time

from . import Context, Row
from ._cpu import CpuMeter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["run"]


def _rss_of_tree(pids: list[int]) -> int:
    """Bytes of resident memory of *pids* and all their descendants."""
    from ..cluster._local import _descendants

    total = 0
    seen: set[int] = set()
    for pid in pids:
        for member in (pid, *_descendants(pid)):
            if member in seen:
                continue
            seen.add(member)
            try:
                with open(f"/proc/{member}/statm", encoding="ascii") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                continue
    return total


def _paired(
    runs: int, local: Callable[[], object], remote: Callable[[], object]
) -> tuple[float, float, float]:
    """Medians of *local* and *remote* timed alternately, and the median of their differences (ms)."""
    import statistics

    for _ in range(2):
        local()
        remote()
    pairs = []
    for _ in range(runs):
        start = time.perf_counter()
        local()
        middle = time.perf_counter()
        remote()
        pairs.append(((middle - start) * 1000, (time.perf_counter() - middle) * 1000))
    return (
        statistics.median(p[0] for p in pairs),
        statistics.median(p[1] for p in pairs),
        statistics.median(p[1] - p[0] for p in pairs),
    )


class _Held:
    """What :func:`_hold` saw: timing, errors, the peak and the CPU it cost."""

    def __init__(self) -> None:
        self.took = float("nan")  # seconds until all ran at the same time (NaN: never)
        self.errors: list[str] = []
        self.most = 0  # the most that ran at the same time
        self.peak_rss = 0  # RSS of the agents' trees at that moment
        self.cpu: dict[str, float] = {}  # CPU seconds by component (_cpu.breakdown), idle removed
        self.cpu_total: float | None = None  # the cpuacct group's total, idle removed


def _hold(
    cluster: object,
    local: object,
    meter: CpuMeter,
    workspace: str,
    count: int,
    seconds: int,
) -> _Held:
    """Run *count* ``sleep SECONDS`` sandboxes at once, from the first open to the last close.

    The CPU time is measured over the whole life of the sandboxes (a
    sandbox's own time is counted once its agent reaped it); the cluster's
    idle rate, measured just before for a few seconds, is taken out, and so
    is the bench's own watching (its scans of ``/proc`` every second).
    """
    import asyncio

    from ._cpu import breakdown, snapshot

    marker = f"{seconds}.{os.getpid()}"
    held = _Held()
    agents = {int(n["pid"]) for n in cluster.nodes()}  # type: ignore[attr-defined]
    roots = [p.pid for p in local.nodes]  # type: ignore[attr-defined]

    def running() -> int:
        found = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if f.read() == f"sleep\0{marker}\0".encode():
                        found += 1
            except OSError:
                continue
        return found

    async def main() -> None:
        sandboxes = [cluster.AsyncSandbox(workspace=workspace) for _ in range(count)]  # type: ignore[attr-defined]
        start = time.monotonic()

        async def one(sbx: object) -> None:
            try:
                async with sbx:  # type: ignore[attr-defined]
                    outcome = await sbx.exec(["sleep", marker])  # type: ignore[attr-defined]
                    if outcome.returncode != 0:
                        held.errors.append(f"exit {outcome.returncode}: {outcome.stderr[-200:]!r}")
            except Exception as exc:
                held.errors.append(f"{type(exc).__name__}: {exc}")

        tasks = [asyncio.create_task(one(s)) for s in sandboxes]
        while not all(t.done() for t in tasks):
            await asyncio.sleep(1.0)
            looking = time.thread_time()  # the bench's own watching is not the sandboxes' cost
            now = running()
            if now > held.most:
                held.most, held.peak_rss = now, _rss_of_tree(list(agents))
            watching[0] += time.thread_time() - looking
            if held.took != held.took and now >= count - len(held.errors):
                held.took = time.monotonic() - start
        await asyncio.gather(*tasks)

    watching = [0.0]  # CPU seconds of the scans above (in the driver's process)
    idle_seconds = 3.0
    idle_before, idle_total = snapshot(roots), meter.total()
    time.sleep(idle_seconds)
    idle = breakdown(idle_before, snapshot(roots), agents)
    idle_cpu = None if idle_total is None else (meter.total() or 0.0) - idle_total
    before, total = snapshot(roots), meter.total()
    started = time.monotonic()
    asyncio.run(main())
    scale = (time.monotonic() - started) / idle_seconds
    spent = breakdown(before, snapshot(roots), agents)
    spent["driver"] -= watching[0]
    held.cpu = {name: max(0.0, value - idle[name] * scale) for name, value in spent.items()}
    if total is not None and idle_cpu is not None:
        held.cpu_total = (meter.total() or 0.0) - total - idle_cpu * scale - watching[0]
    return held


def _cpu_note(held: _Held, count: int) -> tuple[float, str]:
    """CPU ms per sandbox and the breakdown in words (ms per sandbox by component)."""
    attributed = sum(held.cpu.values())
    total = held.cpu_total if held.cpu_total is not None else attributed
    parts = dict(held.cpu)
    if held.cpu_total is not None:
        parts["unattributed"] = max(0.0, held.cpu_total - attributed)
    words = ", ".join(
        f"{name} {value / count * 1000:.1f}"
        for name, value in sorted(parts.items(), key=lambda kv: -kv[1])
    )
    source = "cpuacct group" if held.cpu_total is not None else "sum of the processes"
    return total / count * 1000, f"ms per sandbox: {words} ({source}; idle rate removed)"


def run(ctx: Context) -> list[Row]:
    """The rows described in the module docstring."""
    try:
        import ray
    except ImportError:
        return [
            Row("cluster", float("nan"), note="Ray is not installed: pip install 'corral[ray]'")
        ]
    import corral
    import corral.cluster
    from corral.cluster._local import LocalCluster

    count = int(os.environ.get("CORRAL_BENCH_CLUSTER_N", "1000"))
    hold = int(os.environ.get("CORRAL_BENCH_CLUSTER_HOLD", "30"))
    cpu_count = int(os.environ.get("CORRAL_BENCH_CLUSTER_CPU_N", "200"))
    rows: list[Row] = []
    slots = max(count, cpu_count) // 2 + 10
    vm_problem, node_env = _warm_node_env(ctx)
    with (
        CpuMeter() as meter,  # before the nodes start: they are born in its group
        LocalCluster(workers=2, slots=slots, head_slots=0, node_env=node_env) as local,
        corral.cluster.connect(
            local.address, state_dir=os.path.join(ctx.workspace, "state")
        ) as cluster,
    ):
        with (
            corral.Sandbox(workspace=ctx.workspace) as sbx,
            cluster.Sandbox(workspace=ctx.workspace) as remote,
        ):
            local_exec, cluster_exec, added = _paired(
                ctx.runs, lambda: sbx.exec(["true"]), lambda: remote.exec(["true"])
            )
            agent = cluster._agent(remote.node)
            round_trip = ctx.median_ms(lambda: ray.get(agent.info.remote()))
        rows.append(Row("exec true, local", local_exec, samples=ctx.runs))
        rows.append(
            Row(
                "ray round trip to the agent",
                round_trip,
                samples=ctx.runs,
                note="a no-op call: Ray's share",
            )
        )
        rows.append(
            Row(
                "exec true, cluster",
                cluster_exec,
                samples=ctx.runs,
                baseline="local",
                target="<= 5 ms added",
                note=f"{added:+.2f} ms added per run (median of paired differences)",
            )
        )
        local_run, cluster_run, added = _paired(
            ctx.runs,
            lambda: corral.run(["true"], workspace=ctx.workspace),
            lambda: cluster.run(["true"], workspace=ctx.workspace),
        )
        rows.append(Row("run true, local", local_run, samples=ctx.runs))
        rows.append(
            Row(
                "run true, cluster",
                cluster_run,
                samples=ctx.runs,
                baseline="local",
                note=f"{added:+.2f} ms added per one-shot run (placement group, open, close)",
            )
        )
        rows += _warm_rows(ctx, cluster, vm_problem)
        if cpu_count:
            small = _hold(cluster, local, meter, ctx.workspace, cpu_count, 10)
            per, words = _cpu_note(small, cpu_count)
            rows.append(
                Row(
                    f"CPU per held sandbox ({cpu_count} x sleep 10)",
                    per,
                    samples=1,
                    target="<= 50 ms (1,000 set-ups well under 30 s on 2 cores)",
                    note=f"{words}; at most {small.most} at once; {len(small.errors)} errors",
                )
            )
        before = _rss_of_tree([int(n["pid"]) for n in cluster.nodes()])
        held = _hold(cluster, local, meter, ctx.workspace, count, hold)
        most = held.most
        per_sandbox = (held.peak_rss - before) / most / 2**20 if most else float("nan")
        cpu, words = _cpu_note(held, count)
        samples = held.errors[:3]
        rows.append(
            Row(
                f"{count} x sleep {hold}: all running after",
                held.took,
                unit="s",
                samples=1,
                target="all held at once, no error",
                note=f"at most {most} at once; {len(held.errors)} errors"
                f"{': ' + '; '.join(samples) if samples else ''}; "
                f"{per_sandbox:.2f} MiB per idle sandbox (RSS of the agents' trees, at the peak); "
                f"{cpu:.1f} ms CPU per sandbox ({words})",
            )
        )
    return rows


def _warm_node_env(ctx: Context) -> tuple[str | None, list[dict[str, str]]]:
    """``(why no warm pool, per-worker environments)``: the second worker keeps one warm VM."""
    import json
    import shutil

    if os.environ.get("CORRAL_BENCH_CLUSTER_VM") == "0":
        return "skipped (CORRAL_BENCH_CLUSTER_VM=0)", []
    if os.geteuid() != 0 or not shutil.which("qemu-system-x86_64"):
        return "the microvm backend needs root and qemu-system-x86", []
    from ..images import build_image
    from ..images._build import ImageBuildFailed
    from ..images._vm import build_vm_image

    try:
        build_vm_image(build_image("python", environ=dict(os.environ)))
    except ImageBuildFailed as exc:
        return f"the python VM image cannot be built here: {exc.message}", []
    path = os.path.join(ctx.workspace, "warm-node-settings.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"integrations": {"cluster": {"warmVms": 1}}}, f)
    return None, [{}, {"CORRAL_SETTINGS": path}]


def _warm_rows(ctx: Context, cluster: object, problem: str | None) -> list[Row]:
    """A microvm run served from the warm worker's pool against a cold boot on the other."""
    import statistics

    name = "microvm run true, warm pool (cluster.run)"
    if problem is not None:
        return [Row(name, float("nan"), note=problem)]
    nodes = cluster.nodes()  # type: ignore[attr-defined]
    warm = next(n["id"] for n in nodes if n.get("warm", {}).get("microvm", {}).get("size"))
    cold = next(n["id"] for n in nodes if n["id"] != warm)

    def idle() -> int:
        info = next(n for n in cluster.nodes() if n["id"] == warm)  # type: ignore[attr-defined]
        return len(info["warm"]["microvm"]["idle"])

    def one(node: str) -> float:
        start = time.perf_counter()
        outcome = cluster.run(  # type: ignore[attr-defined]
            ["true"], workspace=ctx.workspace, backend="microvm", read_only=True, node=node
        )
        took = (time.perf_counter() - start) * 1000
        if outcome.returncode != 0:
            raise RuntimeError(f"a microvm run on the cluster exited {outcome.returncode}")
        return took

    runs = max(3, ctx.runs // 10)
    warm_ms, cold_ms = [], []
    for _ in range(runs + 1):  # the first pair warms the guests' code paths and is dropped
        deadline = time.monotonic() + 120
        while idle() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # not timed: the pool boots between runs
        warm_ms.append(one(warm))
        cold_ms.append(one(cold))
    warm_med = statistics.median(warm_ms[1:])
    cold_med = statistics.median(cold_ms[1:])
    return [
        Row("microvm run true, cold boot (cluster.run)", cold_med, samples=runs),
        Row(
            name,
            warm_med,
            samples=runs,
            baseline="cold boot",
            note=f"{cold_med / warm_med:.1f}x faster than a cold boot on the other worker; "
            f"{cold_med - warm_med:.0f} ms saved per run",
        ),
    ]
