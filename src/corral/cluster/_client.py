"""The caller's side of a corral cluster: placement, the sandbox twins, audit collection.

:class:`Cluster` connects to Ray (``ray.init``), starts one
:class:`~corral.cluster._agent.NodeAgent` actor per node that offers the
custom ``corral`` resource (pinned to its node, created on first use), and
places every sandbox with a Ray placement group that reserves ``{"corral":
1}`` plus the sandbox's ``cpus`` and ``memory`` on one node: Ray picks the
node, corral follows, and whatever else runs on the cluster sees the
reservation. The reservation is released when the sandbox closes.

Each command's Outcome comes back with the audit record the node wrote to its
own log; the caller appends that record (with the node named) to its own log,
so one ``corral audit`` shows the whole fleet.
"""

from __future__ import annotations

import os

from .._exceptions import InvalidRequest, SandboxError, SessionClosed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from concurrent.futures import Future
    from typing import Any, Self

    from ..pipeline._outcome import Outcome
    from ..policy import Policy
    from ._placement import Lease, Placement

__all__ = ["AsyncSandbox", "Cluster", "NoCapacity", "NodeLost", "Sandbox"]

#: how long placement waits for Ray to find a node with room
PLACEMENT_TIMEOUT = 30.0


class NodeLost(SandboxError):
    """The node running a sandbox was lost (its raylet or agent died); the sandbox is gone.

    Attributes:
        node: the lost node's id.
    """

    reference = "node-lost"

    def __init__(self, message: str, *, node: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.node = node


class NoCapacity(SandboxError):
    """No node of the cluster has room (or a working corral) for the sandbox."""

    reference = "no-capacity"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise SandboxError(
            "Failed to use the cluster: Ray is not installed",
            hint="pip install 'corral[ray]'",
        ) from None
    return ray


def _lost(exc: BaseException, node: str, action: str) -> NodeLost:
    return NodeLost(
        f"Failed to {action}: node {node} was lost ({type(exc).__name__}); "
        "its sandboxes and the commands running in them are gone",
        node=node,
        hint="run it again: new sandboxes are placed on the remaining nodes",
    )


class Cluster:
    """A connection to a Ray cluster that runs corral sandboxes on its nodes.

    Args:
        address: the Ray cluster (``"ray://host:10001"``, ``"host:6379"``,
            ``"auto"``); default ``$CORRAL_RAY_ADDRESS``, else ``"auto"``.
            When Ray is already initialised in this process it is used as is.
        state_dir: the caller's corral state directory, where the cluster's
            audit records are collected (default: the user's).
        node_state_dir: the state directory on every node (default: each
            node's own).
        launches_per_node: sandboxes a node sets up at the same time (more
            wait; a running command does not count).
        init_options: extra keywords for ``ray.init``.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        state_dir: str | None = None,
        node_state_dir: str | None = None,
        launches_per_node: int = 8,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        from .. import _state

        ray = _ray()
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            address = address or os.environ.get("CORRAL_RAY_ADDRESS") or "auto"
            ray.init(
                address=address,
                logging_level="WARNING",
                log_to_driver=False,
                **dict(init_options or {}),
            )
        self.state_dir = state_dir or _state.state_dir(os.environ)
        self._node_state_dir = node_state_dir
        self._launches = launches_per_node
        import threading

        self._agents: dict[str, Any] = {}  # node id -> actor handle
        self._agents_lock = threading.Lock()  # the placing thread and callers of nodes() share it
        self._broken: dict[str, str] = {}  # node id -> why corral does not work there
        self._closed = False
        from ._placement import Placer

        self._placer = Placer(self, timeout=PLACEMENT_TIMEOUT)

    # ------------------------------------------------------------ nodes
    def _corral_nodes(self) -> list[str]:
        """Ids of the live nodes that offer the ``corral`` resource."""
        ray = _ray()
        return [
            node["NodeID"]
            for node in ray.nodes()
            if node.get("Alive") and node.get("Resources", {}).get("corral", 0) > 0
        ]

    def _agent(self, node: str) -> Any:
        """The agent actor of *node* (started and smoke-checked on first use)."""
        with self._agents_lock:
            return self._agent_locked(node)

    def _agent_locked(self, node: str) -> Any:
        agent = self._agents.get(node)
        if agent is not None:
            return agent
        if node in self._broken:
            raise NoCapacity(
                f"Failed to place the sandbox: corral does not work on node {node}: {self._broken[node]}"
            )
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from ._agent import NodeAgent

        actor_class = ray.remote(NodeAgent)
        agent = actor_class.options(
            num_cpus=0,
            max_concurrency=100_000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote(node, self._node_state_dir, self._launches)
        try:
            info = ray.get(agent.info.remote())
        except ray.exceptions.RayError as exc:
            raise _lost(exc, node, "start corral on the node") from None
        if info["problem"] is not None:
            self._broken[node] = info["problem"]
            ray.kill(agent)
            raise NoCapacity(
                f"Failed to place the sandbox: corral does not work on node {node}: {info['problem']}"
            )
        self._agents[node] = agent
        return agent

    def stop_agent(self, node: str) -> None:
        """Stop *node*'s agent: close its sandboxes, power off its warm pool, end the actor.

        A later sandbox on that node starts a new agent, which reads the
        node's settings (and so the warm pool's size) again.
        """
        self._check_open()
        with self._agents_lock:
            self._stop_agent(node)

    def _stop_agent(self, node: str) -> None:
        agent = self._agents.pop(node, None)
        if agent is None:
            return
        ray = _ray()
        try:
            ray.get(agent.stop.remote(), timeout=60)
        except Exception:  # noqa: S110 - a lost node has nothing left to close
            pass
        ray.kill(agent)

    def forget(self, node: str) -> None:
        """Drop the agent of a lost *node* (a new one is started if the node comes back)."""
        self._agents.pop(node, None)

    def nodes(self) -> list[dict[str, Any]]:
        """The live corral nodes: id, hostname, agent pid, ``problem``, open ``sandboxes``
        and ``warm`` pools (:meth:`NodeAgent.warm <corral.cluster._agent.NodeAgent.warm>`)."""
        ray = _ray()
        result = []
        for node in self._corral_nodes():
            try:
                agent = self._agent(node)
                result.append(ray.get(agent.info.remote()))
            except NoCapacity:
                result.append({"id": node, "problem": self._broken.get(node)})
            except (NodeLost, ray.exceptions.RayError):
                self.forget(node)
        return result

    def place(
        self,
        options: Mapping[str, Any],
        policy: Policy | None = None,
        *,
        node: str | None = None,
        cpus: float | None = None,
        memory: int | None = None,
    ) -> Future[Placement]:
        """Reserve room for one sandbox and open it there; a future of its :class:`Placement`.

        Requests are placed in batches by one thread (:mod:`corral.cluster._placement`):
        Ray picks the node through a placement group asking for ``corral``
        plus the sandbox's CPUs and memory (one group and one open call per
        batch). With *node*, the sandbox goes to that node without a
        reservation (for tests and debugging).

        The future fails with ``NoCapacity`` when no node had room within
        :data:`PLACEMENT_TIMEOUT`.
        """
        self._check_open()
        return self._placer.submit(dict(options), policy, node=node, cpus=cpus, memory=memory)

    def record(self, record: dict[str, Any]) -> None:
        """Append a node's audit record to the caller's log (a failure is reported, not raised)."""
        from .. import _audit

        try:
            _audit.append(self.state_dir, record)
        except OSError as exc:
            import sys

            sys.stderr.write(
                f"corral: could not write the audit log in {self.state_dir}: {exc.strerror}\n"
            )

    # ------------------------------------------------------------ the SDK's names
    def Sandbox(self, policy: Policy | None = None, **options: Any) -> Sandbox:
        """A :class:`Sandbox` on this cluster (the options of :class:`corral.Sandbox`)."""
        return Sandbox(policy, cluster=self, **options)

    def AsyncSandbox(self, policy: Policy | None = None, **options: Any) -> AsyncSandbox:
        """An :class:`AsyncSandbox` on this cluster (opened on ``async with`` or :meth:`AsyncSandbox.open`)."""
        return AsyncSandbox(policy, cluster=self, **options)

    def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> Outcome:
        """:func:`corral.run` on the cluster: one command in a fresh sandbox placed by Ray."""
        with self.Sandbox(**options) as sandbox:
            return sandbox.exec(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)

    async def arun(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | str | None = None,  # noqa: ASYNC109 - the sandbox's wall-clock limit
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> Outcome:
        """:func:`corral.arun` on the cluster."""
        async with self.AsyncSandbox(**options) as sandbox:
            return await sandbox.exec(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)

    def map(
        self,
        command: str | Sequence[str],
        workspaces: Sequence[str],
        policy: Policy | None = None,
        **kwargs: Any,
    ) -> Any:
        """See :func:`corral.cluster.map`."""
        from ._batch import run_map

        return run_map(self, command, workspaces, policy, **kwargs)

    # ------------------------------------------------------------ lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed("Failed to use the cluster: it was closed")

    def close(self) -> None:
        """Close every sandbox this caller opened, stop the agents; idempotent.

        Disconnects from Ray when this object connected. The agents are owned
        by this process: if it dies instead, Ray kills them, and their
        sandboxes die with them.
        """
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        self._placer.close()
        for node in list(self._agents):
            self._stop_agent(node)
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _reservation(
    options: Mapping[str, Any], policy: Policy | None
) -> tuple[float | None, int | None]:
    """The CPUs and memory a sandbox asks Ray for: its ``cpus`` and ``memory`` limits."""
    from ..policy._units import parse_size

    if policy is not None:
        return policy.resources.cpus, policy.resources.memory
    cpus = options.get("cpus")
    memory = options.get("memory")
    try:
        cpu_value = float(cpus) if cpus not in (None, "none") else None
        memory_value = parse_size(memory) if memory not in (None, "none") else None
    except ValueError as exc:
        raise InvalidRequest(f"Failed to build the sandbox: {exc}") from None
    return cpu_value, memory_value


class _Remote:
    """State shared by the twins: the options, the placement, the remote id."""

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        cluster: Cluster,
        node: str | None = None,
        **options: Any,
    ) -> None:
        if "environ" in options:
            raise InvalidRequest(
                "Failed to build the sandbox: environ= is not accepted on a cluster: "
                "each node uses its own environment",
                hint="pass variables with env= or pass_env=",
            )
        self._cluster = cluster
        self._policy = policy
        self._options = options
        self._node_wanted = node
        self.id = ""
        self.node = ""
        self._agent: Any = None
        self._lease: Lease | None = None
        self._closed = False

    def _submit(self) -> Future[Placement]:
        cpus, memory = _reservation(self._options, self._policy)
        return self._cluster.place(
            self._options, self._policy, node=self._node_wanted, cpus=cpus, memory=memory
        )

    def _placed(self, placement: Placement) -> None:
        """Take the placement (node, agent, lease); the open's result is still to come."""
        self.node, self._agent, self._lease = placement.node, placement.agent, placement.lease

    def _opened(self, opened: list[Any], index: int) -> None:
        value = opened[index]
        if isinstance(value, BaseException):
            raise value
        self.id = value

    def _release(self) -> None:
        """Give back this sandbox's share of its batch's reservation (once)."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    @staticmethod
    def _abandon(future: Future[Placement]) -> None:
        """The caller stopped waiting for *future*: close what it opens, release its share."""

        def done(future: Future[Placement]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            placement = future.result()
            try:
                placement.agent.close_opened.remote(placement.opened, placement.index)
            finally:
                placement.lease.release()

        if not future.cancel():
            future.add_done_callback(done)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed(f"Failed to use sandbox {self.id}: it was closed")
        if self._agent is None or not self.id:
            raise SessionClosed(
                "Failed to use the sandbox: it is not open yet", hint="use 'async with' or open()"
            )

    def _settle(self, method: str, value: Any) -> Any:
        if method in ("exec", "run_code"):
            outcome, record = value
            self._cluster.record(record)
            return outcome
        return value

    def _failed(self, exc: BaseException, action: str) -> BaseException:
        """The error to raise for a failed remote call: the node's own, or NodeLost."""
        ray = _ray()
        if (
            isinstance(exc, ray.exceptions.RayTaskError)
            and isinstance(exc.cause, Exception)
            and not isinstance(exc.cause, ray.exceptions.RayError)
        ):
            return exc.cause
        if isinstance(exc, ray.exceptions.RayError):
            self._cluster.forget(self.node)
            self._release()
            self._closed = True
            return _lost(exc, self.node, action)
        return exc

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.id} on node {self.node[:12]} {state}>"


class Sandbox(_Remote):
    """:class:`corral.Sandbox` on a cluster node: the same methods and results.

    Opened when made; ``exec``/``run_code`` return the node's Outcome and add
    its audit record (with ``node``) to the caller's log. Streaming
    (``spawn``, ``on_stdout``) is not offered on a cluster.

    Raises:
        NodeLost: the node was lost; the sandbox is gone (every later call too).
        NoCapacity: no node had room for it.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        cluster: Cluster,
        node: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(policy, cluster=cluster, node=node, **options)
        ray = _ray()
        future = self._submit()
        try:
            placement = future.result()
        except BaseException as exc:
            if not future.done():  # interrupted while waiting
                self._abandon(future)
            raise self._failed(exc, "open the sandbox") from None
        self._placed(placement)
        try:
            self._opened(ray.get(placement.opened), placement.index)
        except BaseException as exc:
            self._release()
            raise self._failed(exc, "open the sandbox") from None

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self._check_open()
        ray = _ray()
        ref = self._agent.call.remote(self.id, method, args, kwargs)
        try:
            value = ray.get(ref)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                ray.cancel(ref)
            raise self._failed(exc, f"run {method}") from None
        return self._settle(method, value)

    def exec(self, command: str | Sequence[str], **kwargs: Any) -> Outcome:
        """See :meth:`corral.Sandbox.exec` (without the output callbacks)."""
        return self._call("exec", command, **kwargs)  # type: ignore[no-any-return]

    def run_code(self, code: str, **kwargs: Any) -> Outcome:
        """See :meth:`corral.Sandbox.run_code`."""
        return self._call("run_code", code, **kwargs)  # type: ignore[no-any-return]

    def write_file(self, path: str, data: bytes | str, *, parents: bool = False) -> None:
        """See :meth:`corral.Sandbox.write_file`."""
        self._call("write_file", path, data, parents=parents)

    def read_file(self, path: str, **kwargs: Any) -> bytes:
        """See :meth:`corral.Sandbox.read_file`."""
        return self._call("read_file", path, **kwargs)  # type: ignore[no-any-return]

    def list_files(self, path: str = ".") -> Any:
        """See :meth:`corral.Sandbox.list_files`."""
        return self._call("list_files", path)

    def diff(self) -> Any:
        """See :meth:`corral.Sandbox.diff` (the preview lives on the node)."""
        return self._call("diff")

    def apply(self, **kwargs: Any) -> Any:
        """See :meth:`corral.Sandbox.apply`: applies to the workspace on the node."""
        return self._call("apply", **kwargs)

    def discard(self) -> None:
        """See :meth:`corral.Sandbox.discard`."""
        self._call("discard")

    def close(self) -> None:
        """Close the sandbox on its node and release its reservation; idempotent."""
        if self._closed or self._agent is None:
            return
        self._closed = True
        ray = _ray()
        try:
            ray.get(self._agent.close.remote(self.id))
        except ray.exceptions.RayError:
            self._cluster.forget(self.node)  # the node is gone, and the sandbox with it
        finally:
            self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class AsyncSandbox(_Remote):
    """:class:`corral.AsyncSandbox` on a cluster node (the source of truth of the twins).

    Opened by ``async with`` (or ``await open()``). Cancelling an awaiting
    ``exec`` cancels the node's task, which stops the command there (TERM,
    grace, KILL of the whole sandbox), as locally.
    """

    async def open(self) -> Self:
        """Place and open the sandbox; returns it."""
        import asyncio

        if self._agent is not None:
            return self
        future = self._submit()
        try:
            placement = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self._abandon(future)
            raise
        except Exception as exc:
            raise self._failed(exc, "open the sandbox") from None
        self._placed(placement)
        try:
            self._opened(await placement.opened, placement.index)
        except asyncio.CancelledError:
            placement.agent.close_opened.remote(placement.opened, placement.index)
            self._release()
            self._closed = True
            raise
        except Exception as exc:
            self._release()
            raise self._failed(exc, "open the sandbox") from None
        return self

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import asyncio

        self._check_open()
        ray = _ray()
        ref = self._agent.call.remote(self.id, method, args, kwargs)
        try:
            value = await ref
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except Exception as exc:
            raise self._failed(exc, f"run {method}") from None
        return self._settle(method, value)

    async def exec(self, command: str | Sequence[str], **kwargs: Any) -> Outcome:
        """See :meth:`corral.AsyncSandbox.exec` (without the output callbacks)."""
        return await self._call("exec", command, **kwargs)  # type: ignore[no-any-return]

    async def run_code(self, code: str, **kwargs: Any) -> Outcome:
        """See :meth:`corral.AsyncSandbox.run_code`."""
        return await self._call("run_code", code, **kwargs)  # type: ignore[no-any-return]

    async def write_file(self, path: str, data: bytes | str, *, parents: bool = False) -> None:
        """See :meth:`corral.AsyncSandbox.write_file`."""
        await self._call("write_file", path, data, parents=parents)

    async def read_file(self, path: str, **kwargs: Any) -> bytes:
        """See :meth:`corral.AsyncSandbox.read_file`."""
        return await self._call("read_file", path, **kwargs)  # type: ignore[no-any-return]

    async def list_files(self, path: str = ".") -> Any:
        """See :meth:`corral.AsyncSandbox.list_files`."""
        return await self._call("list_files", path)

    async def diff(self) -> Any:
        """See :meth:`corral.AsyncSandbox.diff`."""
        return await self._call("diff")

    async def apply(self, **kwargs: Any) -> Any:
        """See :meth:`corral.AsyncSandbox.apply`."""
        return await self._call("apply", **kwargs)

    async def discard(self) -> None:
        """See :meth:`corral.AsyncSandbox.discard`."""
        await self._call("discard")

    async def aclose(self) -> None:
        """Close the sandbox on its node and release its reservation; idempotent."""
        if self._closed or self._agent is None:
            return
        self._closed = True
        ray = _ray()
        try:
            await self._agent.close.remote(self.id)
        except ray.exceptions.RayError:
            self._cluster.forget(self.node)
        finally:
            self._release()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()
