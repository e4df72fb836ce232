"""A real multi-node Ray cluster on this machine, for the tests and ``corral bench cluster``.

Each node is a ``ray start --block`` process (its own raylet, object store
and worker pool) offering ``corral`` slots; the head's GCS port is picked
free on 127.0.0.1. Ray in cluster mode replaces a loopback node address with
the machine's own interface address (it refuses multi-node clusters
otherwise), so the nodes talk over that address: the traffic never leaves
the machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Self

__all__ = ["LocalCluster"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    """A head and *workers* worker nodes on this machine.

    Args:
        workers: worker nodes besides the head.
        slots: the ``corral`` resource of each node (sandboxes it may hold).
        cpus: CPUs each node offers Ray.
        object_store: bytes of object store per node.
        head_slots: the head's ``corral`` resource (0: no sandboxes on the head).
        env: environment of every node, on top of this process's.
        node_env: per worker, environment on top of *env* (e.g. its own settings file).
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        slots: int = 100,
        cpus: int = 1,
        object_store: int = 80 * 1024 * 1024,
        head_slots: int | None = None,
        env: dict[str, str] | None = None,
        node_env: list[dict[str, str]] | None = None,
    ) -> None:
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self._common = [
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={cpus}",
            f"--object-store-memory={object_store}",
            "--disable-usage-stats",
            "--block",
        ]
        self._slots = slots
        self.nodes: list[subprocess.Popen[bytes]] = []
        head = slots if head_slots is None else head_slots
        self._wait(
            [self._spawn(["--head", f"--port={self.port}", "--include-dashboard=false"], head)]
        )
        extra = list(node_env or [])
        for i in range(workers):  # one at a time: parallel joins time out on a busy machine
            self.add_node(extra[i] if i < len(extra) else None)

    def _ray_cli(self) -> str:
        return os.path.join(os.path.dirname(sys.executable), "ray")

    def _spawn(
        self, args: list[str], slots: int, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen[bytes], Any]:
        import tempfile

        resources = f'{{"corral": {slots}}}' if slots else "{}"
        log = tempfile.TemporaryFile()  # noqa: SIM115 - read while the node starts, then closed
        process = subprocess.Popen(
            [self._ray_cli(), "start", *args, *self._common, f"--resources={resources}"],
            env={**self._env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.nodes.append(process)
        return process, log

    def _wait(self, started: list[tuple[subprocess.Popen[bytes], Any]]) -> None:
        """Wait until every started node printed that it runs; stop all on a failure."""
        deadline = time.monotonic() + 120.0
        try:
            for process, log in started:
                while True:
                    log.seek(0)
                    if b"Ray runtime started" in log.read():
                        break
                    if process.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        tail = log.read()[-2000:].decode(errors="replace")
                        self.shutdown()
                        raise RuntimeError(f"a Ray node did not start: {tail}")
                    time.sleep(0.2)
        finally:
            for _process, log in started:
                log.close()

    def add_node(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start one more worker node (*env* on top of the cluster's); its ``ray start`` process."""
        started = self._spawn([f"--address={self.address}"], self._slots, env)
        self._wait([started])
        return started[0]

    def raylet_pid(self, process: subprocess.Popen[bytes]) -> int:
        """The raylet's pid of the node started by *process*."""
        for pid in _descendants(process.pid):
            try:
                with open(f"/proc/{pid}/comm", encoding="ascii") as f:
                    if f.read().strip() == "raylet":
                        return pid
            except OSError:
                continue
        raise RuntimeError("the node has no raylet")

    def kill_raylet(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the node's raylet (the node is lost), then stop what is left of it."""
        os.kill(self.raylet_pid(process), signal.SIGKILL)

    def stop_node(self, process: subprocess.Popen[bytes]) -> None:
        """Stop the node's processes (its whole session): TERM, then KILL."""
        _stop([process])
        if process in self.nodes:
            self.nodes.remove(process)

    def shutdown(self) -> None:
        """Stop every node at once."""
        _stop(self.nodes)
        self.nodes.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.shutdown()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """TERM the nodes' processes and all their descendants, KILL what is left after 5 s."""
    pids = [pid for process in processes for pid in (process.pid, *_descendants(process.pid))]
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.1)
        for process in processes:
            try:
                process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        if not any(_running(p) for p in pids):
            return


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
