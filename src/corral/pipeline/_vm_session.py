"""One micro-VM kept for a whole session (SDK ``Sandbox``, MCP ``sandbox_create``).

A session whose policy asks for ``isolation: "vm"`` (or ``backend:
"microvm"``) boots one VM (the SDK starts the boot when the session is made:
:meth:`VmSession.start_background`; otherwise the first command boots it)
and runs every command in it, through the guest agent, which runs commands one after
another::

    session = VmSession(environ)
    outcome = session.run(request, policy, preview=preview)   # boots on first use
    outcome = session.run(request2, policy, preview=preview)  # same VM
    session.close()                                            # qemu, virtiofsd gone

What stays per command, exactly as in a fresh ``microvm`` run:

* the plan: each request is prepared as for a fresh run (backend choice,
  host facts, masks, the preview's view); it runs in the kept VM only when
  the VM (``VmConfig``) and the workspace view (``ShareSpec``) it asks for are
  the ones the VM was booted and attached with. Anything else (another
  policy from ``rules``, a secret path that appeared since, a different
  size) returns ``None``: the caller runs it in a fresh VM;
* the command is run by corral's engine through the relay
  (:meth:`MicrovmBackend.run_in <corral.backends.microvm.MicrovmBackend.run_in>`):
  its own timeout, output cap, exit status, signals, egress proxy and
  attempt log, preview hold and record;
* nothing of a command's processes survives into the next: when its first
  process exits the agent kills every other process of the guest. A relay
  that ended before the agent reported the end (killed after a timeout's
  grace) leaves the command to the session, which has the agent kill it and
  drains its frames before the next command; a VM that does not answer is
  destroyed and the next command boots a new one.

Files outside the workspace (the guest's ``/tmp``, ``/root``) live in the
VM's tmpfs overlay: they last as long as the session's VM. Commands of one
session run one after another (a second waits for the first).

The VM is booted by a thread of the session's own (qemu's
``PR_SET_PDEATHSIG`` follows the *thread* that started it; the session's
commands come from short-lived threads), which lives until :meth:`close`.
If the owning process dies, qemu and virtiofsd die with it.
"""

from __future__ import annotations

import json
import threading
import time

from .._exceptions import BackendUnavailable, UsageError
from ..backends.microvm import FD_CONFIG, MicrovmBackend, current_pool, set_pool, vm_config_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ..backends._microvm_pool import VmPool
    from ..backends._microvm_vm import GuestVM, ShareSpec, VmConfig
    from ..backends._plan import LaunchPlan
    from ..policy._model import Policy
    from ..preview import Preview
    from ._cgroups import Cgroup, CgroupLayout
    from ._engine import Running
    from ._outcome import Outcome
    from ._request import ExecRequest
    from ._runner import Prepared

__all__ = ["VmSession", "wants_vm"]

if TYPE_CHECKING:
    #: what a kept VM serves: its configuration, the workspace view, and the host paths
    #: the view was planned from (``pipeline._resident.looked_at``)
    from ._resident_look import _Looked

    _Key = tuple[VmConfig, ShareSpec, _Looked | None]

#: Seconds the agent gets, after the grace period, to report the end of a command
#: the session stopped itself (its relay was gone) before the VM counts as hung.
SETTLE_TIMEOUT = 10.0


def wants_vm(policy: Policy) -> bool:
    """Whether a session under *policy* runs its commands in a micro-VM (cheap, no I/O)."""
    return policy.backend == "microvm" or (policy.backend == "auto" and policy.isolation == "vm")


class VmSession:
    """A VM kept for a session; see the module docstring. Thread-safe."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        self._lock = threading.Lock()  # one command at a time
        self._vm: GuestVM | None = None
        self._key: _Key | None = None
        self._policy: Policy | None = None  # what the VM was started for
        self._stop = threading.Event()  # releases the keeper thread
        self._keeper: threading.Thread | None = None
        self._closed = False
        self._booting: GuestVM | None = None  # the VM being booted for the session, if any
        #: why the boot started at construction (start_background) failed: raised once, by
        #: the command that would otherwise boot again
        self._failure: BaseException | None = None
        #: commands run in the session's VMs, and VMs booted for it (tests, bench)
        self.commands = 0
        self.boots = 0

    @property
    def vm(self) -> GuestVM | None:
        """The VM commands run in now (None before the first command or after close)."""
        return self._vm

    # ------------------------------------------------------------ run
    def run(
        self,
        request: ExecRequest,
        policy: Policy,
        *,
        preview: Preview | None = None,
        on_start: Callable[[Running], None] | None = None,
        streams: tuple[int, int, int] = (0, 1, 2),
    ) -> Outcome | None:
        """Run *request* in the session's VM (booted now if none is); ``None``: run it fresh.

        Raises:
            CorralError: the request cannot be prepared (as a fresh run would
                raise: e.g. not root, no VM image, a refused rule), or the VM
                did not boot.
        """
        if request.tty or request.stdin_mode == "inherit":
            return None
        found = self._prepare(request, policy, preview)
        if found is None:
            return None
        prepared, key = found
        plan = prepared.plan
        with self._lock:
            if self._closed:
                return None
            vm = self._vm
            if vm is not None and (vm.qemu is None or vm.qemu.poll() is not None):
                self._retire()  # it died (a guest power-off, a panic): boot a new one
                vm = None
            if vm is not None and key != self._key:
                if policy is not self._policy and policy != self._policy:
                    return None  # a ``rules`` entry's own policy: a fresh VM runs it
                # the host changed under the view (a secret created, or replaced by a
                # rename, which detaches its mask): a new VM on the view as it is now
                self._retire()
                vm = None
            if vm is None:
                failure, self._failure = self._failure, None
                if failure is not None:
                    raise failure  # the boot begun at construction failed: its error
                if preview is not None:
                    with preview.hold():
                        pass  # an applied or discarded preview: its error, before any boot
                vm = self._start(key)
                self._policy = policy
            kept = _InKeptVm(vm)
            from ._runner import Prepared, launch

            try:
                return launch(
                    Prepared(kept, prepared.facts, prepared.layout, plan, prepared.policy, preview),
                    request,
                    on_start=on_start,
                    streams=streams,
                )
            finally:
                self.commands += 1
                if kept.marks == b"s" and not self._closed:
                    self._settle(vm, plan)  # also when the launch raised

    def open(self, request: ExecRequest, policy: Policy, *, preview: Preview | None = None) -> bool:
        """Boot the session's VM now for requests like *request* (False: not a VM policy).

        Raises:
            CorralError: as :meth:`run` (not root, no VM image, a refused rule,
                the VM did not boot).
        """
        found = self._prepare(request, policy, preview)
        if found is None:
            return False
        with self._lock:
            if self._vm is None and not self._closed:
                failure, self._failure = self._failure, None
                if failure is not None:
                    raise failure
                self._start(found[1])
                self._policy = policy
        return True

    def start_background(
        self, request: ExecRequest, policy: Policy, *, preview: Preview | None = None
    ) -> None:
        """Boot the session's VM as :meth:`open` does, but on a thread of its own, and
        return at once (the SDK calls it at construction). The first command waits for
        that boot, then runs in its VM; if the boot fails, that command raises the error
        (once; a refusal is raised by every command's own plan). A :meth:`close`
        meanwhile stops the boot: nothing of it is left."""

        def boot() -> None:
            with self._lock:  # a first command waits here for this boot
                if self._vm is not None or self._closed:
                    return
                try:
                    found = self._prepare(request, policy, preview)
                except BaseException:
                    return  # a refusal (not root, no VM image): each command's plan raises it
                if found is None:
                    return
                try:
                    self._start(found[1])
                    self._policy = policy
                except BaseException as exc:  # reported by the command that would boot
                    if not self._closed:
                        self._failure = exc

        threading.Thread(target=boot, name="corral-vm-session-open", daemon=True).start()

    def _prepare(
        self, request: ExecRequest, policy: Policy, preview: Preview | None
    ) -> tuple[Prepared, _Key] | None:
        """The prepared run of *request*, and the VM, the view and the host paths the view
        was planned from (the resident look, :func:`._resident_look._looked_at`) it needs; None: not a VM."""
        from ._resident_look import _looked_at as looked_at  # the resident check's rule
        from ._runner import prepare

        prepared = prepare(request, policy, environ=self._environ, preview=preview)
        if not isinstance(prepared.backend, MicrovmBackend):
            return None
        config = next(f for f in prepared.plan.fds if f.number == FD_CONFIG)
        vm_config, share = vm_config_of(json.loads(config.data))
        # the command's cwd is not mounted on its own: only the workspace view is
        looked = looked_at(request.replace(cwd=""), prepared.policy)
        return prepared, (vm_config, share, looked)

    def _start(self, key: _Key) -> GuestVM:
        """Boot a VM for *key* on a keeper thread and attach the workspace view."""
        from ..backends._microvm_vm import BootFailed, GuestVM

        config, share, _looked = key
        pool = current_pool()
        if pool is not None:  # the server's or the node agent's warm pool: a VM booted ahead
            try:
                vm = pool.acquire(config)
            except (BootFailed, OSError) as exc:
                raise BackendUnavailable(f"Failed to start the micro-VM: {exc}") from None
            return self._attach(vm, key, share, threading.Event(), None)
        vm = self._booting = GuestVM(config)
        booted = threading.Event()
        stop = threading.Event()
        failure: list[BaseException] = []

        def keep() -> None:
            try:
                vm.boot()
            except BaseException as exc:  # reported to the caller
                failure.append(exc)
                return
            finally:
                booted.set()
            stop.wait()  # qemu and virtiofsd die with this thread: it lives until close

        keeper = threading.Thread(target=keep, name="corral-vm-session", daemon=True)
        keeper.start()
        booted.wait()
        self._booting = None
        if failure:
            keeper.join()
            raise BackendUnavailable(f"Failed to start the micro-VM: {failure[0]}") from None
        return self._attach(vm, key, share, stop, keeper)

    def _attach(
        self,
        vm: GuestVM,
        key: _Key,
        share: ShareSpec,
        stop: threading.Event,
        keeper: threading.Thread | None,
    ) -> GuestVM:
        """Attach the workspace view to the booted *vm* and make it the session's."""
        from ..backends._microvm_vm import BootFailed

        try:
            vm.attach(share)
        except (BootFailed, OSError) as exc:
            vm.close()
            stop.set()
            if keeper is not None:
                keeper.join()
            raise BackendUnavailable(f"Failed to start the micro-VM: {exc}") from None
        self._vm, self._key, self._stop, self._keeper = vm, key, stop, keeper
        self.boots += 1
        return vm

    def _settle(self, vm: GuestVM, plan: LaunchPlan) -> None:
        """The relay ended before the command did: kill it in the guest, drain its frames.

        A VM whose agent does not report the end in time is destroyed (the
        next command boots a new one).
        """
        from ..backends._microvm_vm import BootFailed

        channel = vm.channel
        if channel is None:
            self._retire()
            return
        deadline = time.monotonic() + plan.kill_grace + SETTLE_TIMEOUT
        try:
            channel.send(b"K")
            while True:
                kind, _payload = channel.read_frame(deadline=deadline)
                if kind in (b"X", b"F"):
                    return
        except (BootFailed, OSError):
            self._retire()

    def _retire(self) -> None:
        vm, self._vm, self._key = self._vm, None, None
        if vm is not None:
            vm.close()
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join()
            self._keeper = None

    def retire(self) -> None:
        """Destroy the VM (after the command running in it, if any); the next command boots
        a new one. For a view that changed under the VM: a preview applied or discarded
        (its layers were rewritten under the mounted view)."""
        with self._lock:
            self._retire()

    # ------------------------------------------------------------ close
    def close(self) -> None:
        """Destroy the VM now (a command still running ends with it); idempotent.

        Leaves nothing on the host: qemu and virtiofsd are killed and reaped,
        the VM's run directory is removed.
        """
        self._closed = True
        for vm in (self._vm, self._booting):
            if vm is not None:
                # without the lock: neither a running command nor a boot under way (started
                # at construction) holds the close up; a VM closed while it boots starts
                # nothing more and its boot fails at once
                vm.close()
        with self._lock:
            self._retire()


class _InKeptVm(MicrovmBackend):
    """The microvm backend whose launch runs in one kept VM (and leaves it running)."""

    def __init__(self, vm: GuestVM) -> None:
        self._vm = vm
        self.marks = bytearray()  # the relay's report (see MicrovmBackend.run_in)

    def launch(
        self,
        plan: LaunchPlan,
        request: ExecRequest,
        *,
        cgroup_layout: CgroupLayout | None = None,
        on_start: Callable[[Running], None] | None = None,
        stdio: tuple[int, int, int] | None = None,
        cgroup: Cgroup | None = None,
        streams: tuple[int, int, int] = (0, 1, 2),
    ) -> Outcome:
        return self.run_in(
            self._vm,
            plan,
            request,
            cgroup_layout=cgroup_layout,
            on_start=on_start,
            stdio=stdio,
            cgroup=cgroup,
            streams=streams,
            marks=self.marks,
        )


# ---------------------------------------------------------------- the server's warm pool
def pool_from_environ(
    environ: dict[str, str], log: Callable[[str], None] | None = None
) -> VmPool | None:
    """The warm pool the corral server owns: ``CORRAL_VM_POOL=N`` idle VMs per VM
    configuration (0 or unset: none); installed with :func:`set_pool`.

    It starts booting *N* VMs of the default configuration
    (:func:`default_vm_configs`) at once, in the background; a run of another
    configuration boots its VM, and from then on the pool keeps *N* of that
    one booted and warmed up too. *log* hears what the pre-boot did.

    Raises:
        UsageError: the value is not a non-negative integer.
    """
    value = environ.get("CORRAL_VM_POOL", "").strip()
    if not value or value == "0":
        return None
    if not value.isdigit():
        raise UsageError(f"CORRAL_VM_POOL={value!r}: expected a number of idle VMs (0: none)")
    from ..backends._microvm_pool import VmPool

    pool = VmPool(size=int(value))
    set_pool(pool)
    pool.prefill(lambda: default_vm_configs(environ), log)
    return pool


def default_vm_configs(environ: dict[str, str]) -> list[VmConfig]:
    """The VM configurations a default ``microvm`` run of this user boots (pure of runs).

    Planned like ``corral run --backend microvm`` with the user's settings
    (not a project's: the server does not know the project yet) in a
    scratch workspace: the VM's size, image and accelerator do not depend on
    the workspace. A run with a project's other memory or CPU setting, or
    with network, is another configuration: its first run boots.

    Raises:
        CorralError: no VM can run here (not root, no VM image, ...).
    """
    import shutil
    import tempfile

    from ..policy import load_settings
    from ._request import ExecRequest
    from ._runner import prepare

    scratch = tempfile.mkdtemp(prefix="corral-pool-plan-")
    try:
        policy = load_settings(
            cwd=scratch,
            workspace=scratch,
            environ=environ,
            flags={"backend": "microvm", "isolation": "vm", "filesystem": {"readOnly": True}},
        ).policy
        request = ExecRequest.from_argv(["true"], cwd=scratch)
        prepared = prepare(request, policy, environ=environ)
        config = next(f for f in prepared.plan.fds if f.number == FD_CONFIG)
        return [vm_config_of(json.loads(config.data))[0]]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
