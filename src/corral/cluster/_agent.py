"""The node agent: one Ray actor per node that runs corral's sandboxes there.

The agent is a plain class; :mod:`corral.cluster._client` turns it into a Ray
actor (``ray.remote``) when a cluster is used, so importing this module costs
nothing of Ray. It holds the node's sandbox sessions (local
:class:`corral.AsyncSandbox` objects, loaded with the node's own settings and
checked by the node's own backends), serves many of them at once (an async
actor), and answers each command with its :class:`~corral.Outcome` and the
audit record it wrote to the node's own log, with the node named.

Every sandbox process on the node is a descendant of the agent's worker
process and dies with it (the backends' ``--die-with-parent``): a killed
agent - its node lost, its raylet killed, or the caller that owns it gone -
leaves no sandbox running.

Warm pool: where the node's own settings set ``integrations.cluster.warmVms``
to N, the agent owns a :class:`~corral.backends._microvm_pool.VmPool` that
keeps N booted micro-VMs per VM configuration; it boots N for the node's
default microvm configuration when the agent starts, and runs with the
microvm backend on this node take a VM from it (one run per VM, the
workspace attached when the run takes it, a fresh one booted in the
background). The VMs are children of the agent's process
(``PR_SET_PDEATHSIG``): :meth:`NodeAgent.stop` powers them off, and a killed
agent takes them with it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .._sandbox import AsyncSandbox
    from ..backends._microvm_pool import VmPool
    from ..pipeline._outcome import Outcome

__all__ = ["EXEC_METHODS", "SESSION_METHODS", "NodeAgent"]

_UNCHECKED = object()

#: methods that run a command and so produce an Outcome and an audit record
EXEC_METHODS = frozenset({"exec", "run_code"})
#: other methods of :class:`corral.AsyncSandbox` the agent forwards as they are
SESSION_METHODS = frozenset(
    {"write_file", "read_file", "list_files", "remove", "make_dir", "diff", "apply", "discard"}
)


class NodeAgent:
    """Runs sandboxes on one node; made a Ray actor by the client.

    Args:
        node_id: the Ray node id the agent was placed on (checked at start).
        state_dir: the node's corral state directory (default: the node's own,
            ``$XDG_STATE_HOME/corral`` of the Ray worker).
    """

    def __init__(self, node_id: str, state_dir: str | None = None, launches: int = 8) -> None:
        import asyncio
        import socket

        import ray

        here = ray.get_runtime_context().get_node_id()
        if here != node_id:
            raise RuntimeError(f"the corral agent for node {node_id} was placed on node {here}")
        self._node = {"id": node_id, "hostname": socket.gethostname(), "pid": os.getpid()}
        self._state_dir = state_dir
        self._sandboxes: dict[str, AsyncSandbox] = {}
        self._problem: Any = _UNCHECKED
        self._vm_pool: VmPool | None = None
        self._warm_problem: str | None = None  # why the warm pool the settings ask for is off
        # sandboxes being set up at once: a thousand set-ups at the same moment starve each
        # other past the engine's set-up deadline; a running command holds no slot
        self._launches = asyncio.Semaphore(launches)

    async def info(self) -> dict[str, Any]:
        """The node's name, whether corral works on it, and the sandboxes open on it.

        ``problem`` is ``None`` when a smoke run (``true`` under the node's
        default policy, in a scratch workspace) succeeded on this node, else why
        not; the client places no sandbox on a node with a problem. ``warm`` is
        :meth:`warm`; the first call also starts the warm pool (:meth:`_start_pool`).
        """
        import asyncio

        if self._problem is _UNCHECKED:
            self._problem = await self._smoke()
            if self._problem is None:
                await asyncio.to_thread(self._start_pool)
        info = dict(self._node)
        info["problem"] = self._problem
        info["sandboxes"] = len(self._sandboxes)
        info["warm"] = self.warm()
        return info

    def warm(self) -> dict[str, Any]:
        """The node's warm pools: ``{"microvm": {"size", "idle", "served", "problem"}}``.

        ``idle`` lists the booted VMs waiting (:meth:`VmPool.members
        <corral.backends._microvm_pool.VmPool.members>`: qemu and virtiofsd
        pids, when each became ready); ``served`` the qemu pids of pooled VMs
        runs took, oldest first; ``problem`` why the pool the settings ask for
        is not running (``size`` is then 0). Empty without a pool.
        """
        pool = self._vm_pool
        if pool is None:
            if self._warm_problem is None:
                return {}
            return {"microvm": {"size": 0, "idle": [], "served": [], "problem": self._warm_problem}}
        return {
            "microvm": {
                "size": pool.size,
                "idle": pool.members(),
                "served": list(pool.served),
                "problem": None,
            }
        }

    def _start_pool(self) -> None:
        """Start the micro-VM pool the node's settings ask for, booting the default config.

        The size is ``integrations.cluster.warmVms`` of the node's own settings
        (defaults, user file, environment). The first VMs are booted for the
        configuration a run with ``backend="microvm"`` and the node's defaults
        gets (planned here as such a run is); a run whose configuration
        differs (another memory limit, an allowlist network device, another
        image) boots its own VM, and from then on the pool keeps that
        configuration warm too. Where the pool cannot start (the VM image is
        not built, no qemu), ``warm()`` says why and runs boot their VMs cold.
        """
        import json
        import shutil
        import tempfile

        from .._exceptions import CorralError
        from ..backends._microvm_pool import VmPool
        from ..backends.microvm import FD_CONFIG, set_pool, vm_config_of
        from ..pipeline._request import ExecRequest
        from ..pipeline._runner import prepare
        from ..policy import load_settings

        scratch = tempfile.mkdtemp(prefix="corral-node-warm-")
        try:
            resolved = load_settings(cwd=scratch, workspace=scratch)
            size = resolved.integrations.get("cluster.warmVms")
            if not size:
                return
            try:
                # read-only, as a run without a preview must be there: how the workspace is
                # shared (read-only, or a preview's view) is attached per run, not booted
                flags = {"backend": "microvm", "filesystem": {"readOnly": True}}
                policy = load_settings(cwd=scratch, workspace=scratch, flags=flags).policy
                request = ExecRequest.from_argv(["true"], cwd=scratch)
                plan = prepare(request, policy, environ=os.environ).plan
            except CorralError as exc:
                self._warm_problem = f"the microvm backend cannot run here: {exc.message}"
                return
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        config = next(f for f in plan.fds if f.number == FD_CONFIG)
        vm_config, _share = vm_config_of(json.loads(config.data))
        pool = VmPool(size=int(size))
        set_pool(pool)  # this process is the agent's: every microvm run here takes from it
        self._vm_pool = pool
        pool.refill(vm_config)

    async def open_many(self, requests: list[tuple[dict[str, Any], Any]]) -> list[Any]:
        """Open one sandbox per ``(options, policy)`` of *requests*: each one's id, or its error.

        A batch placed together arrives in one call (:mod:`corral.cluster._placement`);
        each request is opened on its own, as by :meth:`open`, and a refused one
        fails alone (its exception is its entry).
        """
        opened: list[Any] = []
        for options, policy in requests:
            try:
                opened.append(await self.open(options, policy))
            except Exception as exc:
                opened.append(exc)
        return opened

    async def open(self, options: dict[str, Any], policy: Any = None) -> str:
        """Open a sandbox with *options* (the SDK's keywords) or a complete *policy*; its id.

        The settings are loaded here, on the node, from the node's layers
        (defaults, user file, environment) with *options* as the last layer:
        the node's own policy checks apply.
        """
        from .._sandbox import AsyncSandbox

        if self._state_dir is not None:
            options = {"state_dir": self._state_dir, **options}
        sandbox = AsyncSandbox(policy, **options)
        self._sandboxes[sandbox.id] = sandbox
        return sandbox.id

    async def call(
        self, sandbox_id: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Call *method* of the sandbox; for a command, ``(Outcome, audit record)``."""
        sandbox = self._sandboxes.get(sandbox_id)
        if sandbox is None:
            from .._exceptions import SessionClosed

            raise SessionClosed(f"Failed to use sandbox {sandbox_id}: it is not open on this node")
        if method in EXEC_METHODS:
            outcome = await self._launch(sandbox, method, args, kwargs)
            return outcome, self._record(sandbox, outcome, kwargs.get("cwd"))
        if method not in SESSION_METHODS:
            raise AttributeError(f"a cluster sandbox has no method {method!r}")
        return await getattr(sandbox, method)(*args, **kwargs)

    async def _launch(
        self, sandbox: AsyncSandbox, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Outcome:
        """Run a command as ``exec``/``run_code`` do, holding a set-up slot until it started."""
        import asyncio

        from .._streaming import Cancellation

        if method == "exec":
            request = sandbox._request(*args, **kwargs)
        else:
            code, *rest = args
            language = rest[0] if rest else kwargs.pop("language", "python")
            request = sandbox._code_request(code, language, **kwargs)
        loop = asyncio.get_running_loop()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._launches.release()

        class Launch(Cancellation):
            __slots__ = ()

            def started(self, running: Any) -> None:
                super().started(running)
                loop.call_soon_threadsafe(release)

        await self._launches.acquire()
        try:
            return await sandbox._run(request, None, Launch())
        finally:
            release()

    async def close_opened(self, opened: list[Any], index: int) -> None:
        """Close entry *index* of an :meth:`open_many` result (its caller gave up on it)."""
        if isinstance(opened[index], str):
            await self.close(opened[index])

    async def close(self, sandbox_id: str) -> None:
        """Close the sandbox (stops its commands, removes its ``/tmp``); idempotent."""
        sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is not None:
            await sandbox.aclose()

    async def close_all(self) -> int:
        """Close every sandbox open on this node; how many there were."""
        ids = list(self._sandboxes)
        for sandbox_id in ids:
            await self.close(sandbox_id)
        return len(ids)

    async def stop(self) -> int:
        """Close every sandbox, then power off the warm pool's idle VMs; the sandboxes closed.

        The client kills the actor afterwards; a later sandbox on this node
        starts a new agent, which reads the node's settings again.
        """
        import asyncio

        closed = await self.close_all()
        pool, self._vm_pool = self._vm_pool, None
        if pool is not None:
            from ..backends.microvm import set_pool

            set_pool(None)
            await asyncio.to_thread(pool.close)
        return closed

    async def _smoke(self) -> str | None:
        import tempfile

        from .._exceptions import CorralError
        from .._sandbox import AsyncSandbox

        with tempfile.TemporaryDirectory(prefix="corral-node-check-") as scratch:
            try:
                options: dict[str, Any] = {"workspace": scratch, "cwd": scratch}
                if self._state_dir is not None:
                    options["state_dir"] = self._state_dir
                async with AsyncSandbox(**options) as sandbox:
                    outcome = await sandbox.exec(["true"])
            except CorralError as exc:
                return exc.message
        if outcome.returncode != 0:
            return f"a smoke run of 'true' exited {outcome.returncode}"
        return None

    def _record(self, sandbox: AsyncSandbox, outcome: Outcome, cwd: str | None) -> dict[str, Any]:
        """The audit record of *outcome* as the node wrote it, naming the node."""
        from .._audit import record_for

        where = sandbox.workspace if cwd is None else os.path.join(sandbox.workspace, cwd)
        return record_for(
            outcome,
            cwd=os.path.normpath(where),
            agent_session=sandbox._agent_session,
            extra={"node": dict(self._node)},
        )
