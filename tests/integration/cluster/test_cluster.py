"""corral.cluster on a real three-node Ray cluster on this machine.

The sandboxes run on the worker nodes, under each node's own settings and
backends; the security properties of a local run are attempted on a worker
and checked on that node (a Ray task pinned there reads the host). The
node-loss test runs last: it kills a worker's raylet and brings a node back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from corral import _audit
from tests.conftest import PROBE_PYTHON, SECRET_ENV_VALUE
from tests.integration.conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.slow, pytest.mark.timeout(240)]


def on_node(node: str, function, *args):
    """Run *function* in a Ray task pinned to *node*; its result (a check made on that node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0)(function).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
    )
    return ray.get(task.remote(*args), timeout=60)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and "pytest" not in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def _wait_gone(marker: str, limit: float = 30.0) -> list[str]:
    deadline = time.monotonic() + limit
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_runs_on_workers_and_collects_the_audit(ray_cluster):
    w = ray_cluster.world
    cluster = ray_cluster.cluster
    outcomes = [cluster.run(["sh", "-c", "echo hi; pwd"], workspace=w.workspace) for _ in range(3)]
    assert all(o.returncode == 0 and o.stdout == f"hi\n{w.workspace}\n".encode() for o in outcomes)
    with cluster.Sandbox(workspace=w.workspace) as sbx:
        assert sbx.node in ray_cluster.workers  # never the head: it offers no corral resource
        sbx.exec("echo state > /tmp/note")
        assert sbx.exec(["cat", "/tmp/note"]).stdout == b"state\n"  # one session across calls
        assert sbx.exec(["true"]).backend == "bubblewrap"
        last_id = sbx.id
    records = [json.loads(line) for _, line in _audit.iter_records(cluster.state_dir)]
    mine = [r for r in records if r["sandbox_id"] == last_id]
    assert len(mine) == 3
    assert all(r["node"]["id"] == sbx.node and r["node"]["hostname"] for r in mine)
    assert _audit.verify(cluster.state_dir)[0]  # the caller's chain holds the fleet's records
    # the node wrote its own record too, in its own log
    node_log = on_node(sbx.node, _read, _audit.audit_path(w.state_dir))
    assert last_id in node_log


def test_security_properties_hold_on_a_worker(ray_cluster):
    w = ray_cluster.world
    worker = ray_cluster.workers[1]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[object] = []
    finished = threading.Event()

    def accept() -> None:
        while True:
            last = finished.is_set()  # one more accept after the attempts: the backlog is drained
            try:
                accepted.append(listener.accept())
            except OSError:
                if last:
                    return

    thread = threading.Thread(target=accept)
    thread.start()
    planted = os.path.join(w.outside, "planted.txt")
    connect = (
        f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=3); "
        "s.sendall(b'leak')"
    )
    try:
        with ray_cluster.cluster.Sandbox(workspace=w.workspace, node=worker) as sbx:
            wrote = sbx.exec(f"echo pwned > {w.victim}; echo pwned > {planted}")
            read = sbx.exec(["cat", w.secret])
            env = sbx.exec("echo $SECRET_TOKEN")
            dialed = sbx.exec([PROBE_PYTHON, "-c", connect])
    finally:
        finished.set()  # the attempts are over: whatever would arrive has arrived
        thread.join()
        listener.close()
    assert wrote.returncode != 0
    assert read.returncode != 0 and b"SECRET-KEY" not in read.stdout
    assert SECRET_ENV_VALUE.encode() not in env.stdout
    assert dialed.returncode != 0
    assert not accepted  # nothing reached the listener
    # checked on the node that ran them
    assert on_node(worker, _read, w.victim) == "original\n"
    assert not on_node(worker, _exists, planted)


def test_preview_diff_comes_back_and_applies_on_the_node(ray_cluster):
    w = ray_cluster.world
    with ray_cluster.cluster.Sandbox(workspace=w.workspace, preview=True) as sbx:
        assert sbx.exec("echo new > added.txt").returncode == 0
        changes = sbx.diff()
        assert [(c.path, c.kind) for c in changes] == [("added.txt", "added")]
        assert not on_node(sbx.node, _exists, w.ws("added.txt"))  # the real workspace is untouched
        result = sbx.apply()
        assert "added.txt" in result.applied
        assert on_node(sbx.node, _read, w.ws("added.txt")) == "new\n"
    os.remove(w.ws("added.txt"))


def test_async_twin_and_cancellation(ray_cluster):
    w = ray_cluster.world
    marker = f"{uuid.uuid4().int % 10_000}.{os.getpid()}"

    async def main() -> tuple[bytes, list[str]]:
        async with ray_cluster.cluster.AsyncSandbox(workspace=w.workspace) as sbx:
            first = await sbx.exec(["echo", "async"])
            task = asyncio.create_task(sbx.exec(["sleep", marker]))
            for _ in range(100):
                if _processes_with(f"sleep {marker}"):
                    break
                await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return first.stdout, _wait_gone(f"sleep {marker}")

    stdout, left = asyncio.run(main())
    assert stdout == b"async\n"
    assert left == []


def test_concurrent_opens_share_placements_and_stay_separate_sandboxes(ray_cluster):
    """Opens that queue up together are placed by one placement group and opened by one call
    per batch (corral.cluster._placement); each is still its own sandbox with its own
    audit record, and the batch's reservation is released with its last sandbox. 60 at once
    on nodes of 50 slots: a batch no node has room for is split, and every one opens."""
    from ray.util import placement_group_table

    w = ray_cluster.world
    cluster = ray_cluster.cluster
    count = 60
    bad = cluster.AsyncSandbox(workspace=w.workspace, settings={"resources": {"memory": "lots"}})

    async def main() -> tuple[list[object], list[object], BaseException | None]:
        sandboxes = [cluster.AsyncSandbox(workspace=w.workspace) for _ in range(count)]
        # all queued before the placing thread takes any: one batch of 61 is tried first
        with cluster._placer._ready:
            tasks = [asyncio.ensure_future(s.open()) for s in (*sandboxes, bad)]
            await asyncio.sleep(0)  # each open runs up to its first await: its request is queued
            assert len(cluster._placer._queue) == count + 1
        opened = await asyncio.gather(*tasks, return_exceptions=True)
        refused = opened[-1] if isinstance(opened[-1], BaseException) else None
        outcomes = await asyncio.gather(
            *(s.exec(["sh", "-c", "echo $CORRAL_SANDBOX_ID"]) for s in sandboxes)
        )
        return sandboxes, outcomes, refused

    sandboxes, outcomes, refused = asyncio.run(main())
    try:
        assert refused is not None and "memory" in str(refused)  # its own error, alone
        leases = {id(s._lease) for s in sandboxes}
        assert len(leases) < count  # batched: fewer reservations than sandboxes
        assert sorted(o.stdout.decode().strip() for o in outcomes) == sorted(
            s.id for s in sandboxes
        )
        assert all(s.node in ray_cluster.workers for s in sandboxes)
        assert max(s._lease._left for s in sandboxes) <= 50  # split: no batch beyond a node's 50
        # the biggest batch's group reserves its size in one bundle, on one node
        biggest = max(sandboxes, key=lambda s: s._lease._left)
        group_id = biggest._lease._group.id.hex()
        members = [s for s in sandboxes if s._lease is biggest._lease]
        assert len(members) > 1
        table = placement_group_table()[group_id]
        assert table["state"] == "CREATED" and list(table["bundles"]) == [0]
        # k sandboxes, and the refused one when it came in the same batch (its share is back)
        assert table["bundles"][0]["corral"] in (len(members), len(members) + 1)
        for sbx in members[:-1]:
            asyncio.run(sbx.aclose())
        assert placement_group_table()[group_id]["state"] == "CREATED"  # one still holds it
        asyncio.run(members[-1].aclose())
        deadline = time.monotonic() + 30
        while placement_group_table()[group_id]["state"] != "REMOVED":
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        for sbx in sandboxes:
            asyncio.run(sbx.aclose())
    records = [json.loads(line) for _, line in _audit.iter_records(cluster.state_dir)]
    ran = {r.get("sandbox_id") for r in records}
    assert {s.id for s in sandboxes} <= ran  # one record per sandbox, collected by the caller


def test_an_open_cancelled_while_queued_places_nothing(ray_cluster):
    cluster = ray_cluster.cluster
    w = ray_cluster.world

    def open_here() -> int:
        return sum(node["sandboxes"] for node in cluster.nodes())

    before = open_here()

    async def main() -> None:
        sbx = cluster.AsyncSandbox(workspace=w.workspace)
        with cluster._placer._ready:  # the placing thread waits: the request stays queued
            task = asyncio.ensure_future(sbx.open())
            await asyncio.sleep(0)
            assert len(cluster._placer._queue) == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        async with cluster.AsyncSandbox(workspace=w.workspace) as after:  # the queue moves on
            assert (await after.exec(["true"])).returncode == 0

    asyncio.run(main())
    assert open_here() == before  # the cancelled one was never opened anywhere


def test_map_reports_every_item(ray_cluster, tmp_path):
    w = ray_cluster.world
    workspaces = []
    for name, script in (("ok", "exit 0"), ("fails", "exit 3"), ("slow", "sleep 20")):
        ws = os.path.join(w.root, f"map-{name}")
        os.makedirs(ws, exist_ok=True)
        w.write(os.path.join(ws, "run.sh"), script + "\n")
        workspaces.append(ws)
    workspaces.append(os.path.join(w.root, "map-missing"))  # no such workspace
    progress = tmp_path / "progress.txt"
    with open(progress, "w") as out:
        report = ray_cluster.cluster.map(
            "sh run.sh", workspaces, concurrency=2, timeout="2s", progress=out
        )
    assert [item.status for item in report] == ["ok", "failed", "timeout", "error"]
    assert report.items[1].outcome.returncode == 3
    assert report.items[2].outcome.timed_out
    assert report.items[3].error
    assert all(item.node in ray_cluster.workers for item in report.items[:3])
    table = report.table()
    assert "4 items" in table and "1 ok, 1 failed, 1 timeout, 1 error" in table
    assert len(progress.read_text().splitlines()) == 4


def test_map_with_a_policy(ray_cluster):
    from corral.policy import load_settings

    w = ray_cluster.world
    policy = load_settings(workspace=w.workspace, environ=w.environ).policy
    report = ray_cluster.cluster.map(["pwd"], [w.workspace, w.outside], policy, concurrency=2)
    assert report.ok
    assert [item.outcome.stdout for item in report] == [
        f"{w.workspace}\n".encode(),
        f"{w.outside}\n".encode(),
    ]


_DRIVER = """
import sys, time
import corral.cluster
cluster = corral.cluster.connect(sys.argv[1], state_dir=sys.argv[2])
sbx = cluster.Sandbox(workspace=sys.argv[3])
print("ready", flush=True)
sbx.exec(["sleep", sys.argv[4]])
"""


def test_caller_killed_leaves_no_sandbox(ray_cluster, tmp_path):
    w = ray_cluster.world
    marker = f"{uuid.uuid4().int % 10_000}.{os.getpid() + 1}"
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _DRIVER,
            ray_cluster.local.address,
            str(tmp_path),
            w.workspace,
            marker,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HOME": w.home},
    )
    try:
        assert driver.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 30
        while not _processes_with(f"sleep {marker}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_with(f"sleep {marker}"), "the sandbox never started"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        driver.stdout.close()
    assert _wait_gone(f"sleep {marker}", 60) == []


def _warm_vms(cluster, node: str) -> dict:
    pool = _warm_vms_or_none(cluster, node)
    assert pool is not None
    return pool


def _qemu_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"qemu" in cmdline or b"virtiofsd" in cmdline


def test_warm_vm_pool_serves_one_run_and_refills(ray_cluster):
    """The warm worker's pooled VM serves a run, the pool boots the next; the result and
    enforcement equal a cold run's on the other worker; stopping the agent leaves no VM."""
    if ray_cluster.vm_problem:
        pytest.skip(ray_cluster.vm_problem)
    w = ray_cluster.world
    cluster = ray_cluster.cluster
    pools = {node: _warm_vms_or_none(cluster, node) for node in ray_cluster.workers}
    warm = next(node for node, pool in pools.items() if pool is not None)
    cold = next(node for node in ray_cluster.workers if node != warm)
    assert pools[warm]["size"] == 1 and pools[warm]["problem"] is None, pools[warm]
    deadline = time.monotonic() + 120  # the agent boots it when it starts (TCG: seconds)
    while not (pool := _warm_vms(cluster, warm))["idle"] and time.monotonic() < deadline:
        time.sleep(0.2)
    [member] = pool["idle"]
    seen = {member["qemu"], member["virtiofsd"]}
    marker = os.path.join(w.workspace, f"warm-{uuid.uuid4().hex[:8]}.txt")
    with open(marker, "w", encoding="utf-8") as f:
        f.write("in the workspace\n")
    submitted = time.time()
    assert member["ready"] < submitted  # booted before the run was submitted
    command = f"cat {os.path.basename(marker)}; echo pwned > {w.victim}; echo made > made.txt"

    def run(node: str) -> tuple:
        with cluster.Sandbox(
            workspace=w.workspace, backend="microvm", preview=True, node=node
        ) as sbx:
            outcome = sbx.exec(command)
            return outcome, sorted(change.path for change in sbx.diff())

    warm_run, warm_diff = run(warm)
    after = _warm_vms(cluster, warm)
    assert after["served"] == [member["qemu"]]  # the run took the member booted before it
    deadline = time.monotonic() + 120  # the pool boots the next one in the background
    while not (after := _warm_vms(cluster, warm))["idle"] and time.monotonic() < deadline:
        time.sleep(0.2)
    [refill] = after["idle"]
    assert refill["qemu"] != member["qemu"] and refill["ready"] > submitted
    seen |= {refill["qemu"], refill["virtiofsd"]}
    assert not on_node(warm, _qemu_alive, member["qemu"])  # one run per VM: destroyed after it

    cold_run, cold_diff = run(cold)
    assert _warm_vms_or_none(cluster, cold) is None
    assert warm_run.backend == cold_run.backend == "microvm"
    # the same result and enforcement as the cold run: the workspace (attached when the run
    # took the VM) read and written through the preview, the write outside failed on the host
    assert (warm_run.returncode, warm_run.stdout) == (cold_run.returncode, cold_run.stdout)
    assert warm_run.stdout == b"in the workspace\n" and warm_diff == cold_diff == ["made.txt"]
    assert on_node(warm, _read, w.victim) == "original\n"
    assert not on_node(warm, _exists, os.path.join(w.workspace, "made.txt"))  # not applied
    os.remove(marker)

    cluster.stop_agent(warm)  # powers the pool off: no qemu, no virtiofsd left
    deadline = time.monotonic() + 30
    while any(on_node(warm, _qemu_alive, pid) for pid in seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in seen if on_node(warm, _qemu_alive, pid)]


def _warm_vms_or_none(cluster, node: str) -> dict | None:
    return next(n for n in cluster.nodes() if n["id"] == node)["warm"].get("microvm")


def test_node_lost_mid_run(ray_cluster):
    """Runs last: kills a worker's raylet, then brings a node back."""
    w = ray_cluster.world
    cluster = ray_cluster.cluster
    local = ray_cluster.local
    pools = {node["id"]: node["warm"].get("microvm") for node in cluster.nodes()}
    # the warm worker when there is one: its pool's VMs must die with the node
    victim_node = next((n for n in ray_cluster.workers if pools.get(n)), ray_cluster.workers[0])
    survivor = next(n for n in ray_cluster.workers if n != victim_node)
    marker = f"{uuid.uuid4().int % 10_000}.{os.getpid() + 2}"
    from corral.cluster import NodeLost

    sbx = cluster.Sandbox(workspace=w.workspace, node=victim_node)
    agent_pid = next(n for n in cluster.nodes() if n["id"] == victim_node)["pid"]
    # which `ray start` process is that node's: the one the agent descends from
    from corral.cluster._local import _descendants

    node_process = next(p for p in local.nodes if agent_pid in _descendants(p.pid))
    pool_pids: set[int] = set()
    if pools.get(victim_node):
        deadline = time.monotonic() + 120
        while not (idle := _warm_vms(cluster, victim_node)["idle"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        pool_pids = {pid for vm in idle for pid in (vm["qemu"], vm["virtiofsd"])}
        assert pool_pids
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sbx.exec(["sleep", marker])
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while not _processes_with(f"sleep {marker}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(f"sleep {marker}")
    local.kill_raylet(node_process)
    thread.join(120)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], NodeLost), errors
    assert victim_node in str(errors[0]) and "lost" in str(errors[0])
    assert _wait_gone(f"sleep {marker}", 60) == []  # no orphaned sandbox on the lost node
    deadline = time.monotonic() + 30  # nor a VM of its warm pool (same machine: checked here)
    while any(_qemu_alive(pid) for pid in pool_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pool_pids if _qemu_alive(pid)]
    local.stop_node(node_process)
    # new runs go to the remaining node
    for _ in range(3):
        with cluster.Sandbox(workspace=w.workspace) as again:
            assert again.node == survivor
            assert again.exec(["true"]).returncode == 0
    # the node comes back (a new raylet): nothing of the old sandboxes runs, and it serves again
    local.add_node()
    assert _processes_with(f"sleep {marker}") == []
    nodes = {node["id"] for node in cluster.nodes()}
    assert survivor in nodes and len(nodes) == 2
