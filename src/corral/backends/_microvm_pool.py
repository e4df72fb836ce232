"""A warm pool of booted, idle micro-VMs, owned by whoever serves runs (the corral server).

A VM under TCG takes seconds to boot; a pooled one is handed out at once.
The interface is small on purpose, so the server can own it whatever shape
the server takes::

    pool = VmPool(size=2)               # idle VMs kept per VM configuration
    set_pool(pool)                      # corral.backends.microvm: runs use it
    pool.prefill(configs)               # boot for the likely configurations now, in the background
    vm = pool.acquire(config)           # a booted VM (boots one if none is idle)
    ...                                 # the run attaches its workspace, runs, destroys it
    pool.close()                        # powers every idle VM off

Rules:

* a VM is handed out **once**: the run (or session) destroys it afterwards;
  nothing of one run can reach the next;
* :meth:`VmPool.acquire` starts a background refill for that configuration
  (one booting VM at a time per configuration, up to *size* idle); when no
  VM is idle but one is booting, it waits for that one rather than boot a
  second (which would be ready later, both competing for the CPUs);
* the VMs are booted by the pool's own long-lived worker thread, because
  qemu's ``PR_SET_PDEATHSIG`` fires when the *thread* that started it ends;
  at the lowest CPU priority (nice 19) until they are ready or a run waits
  for one, so booting ahead does not slow the runs served meanwhile;
* each VM runs :data:`WARM_UP` (``sh -c true``, as root, nothing of any run)
  once before it is idle, so a run does not pay the guest's cold caches;
* idle VMs carry nothing of a run: no workspace is mounted before
  :meth:`GuestVM.attach <corral.backends._microvm_vm.GuestVM.attach>`.

Snapshots (``-loadvm``/migration) are not used: with the workspace attached
after boot, a restored VM would save only the boot, which the pool already
hides; see docs/backends/microvm.md.
"""

from __future__ import annotations

import collections
import queue
import threading
import time

from ._microvm_vm import BootFailed, GuestVM

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ._microvm_vm import VmConfig

__all__ = ["VmPool"]


#: Run in every pooled VM before it is handed out: under TCG the first exec in a fresh
#: guest pays for its page cache and qemu's code translation (hundreds of ms).
WARM_UP = ("/bin/sh", "-c", "true")


def _warm_up(vm: GuestVM) -> None:
    from ._microvm_vm import ExecSpec

    assert vm.channel is not None
    spec = ExecSpec(argv=WARM_UP, env=(("PATH", "/usr/bin:/bin"),), cwd="/", uid=0, gid=0)
    for kind, payload in vm.channel.run(spec):
        if kind == b"F":
            raise BootFailed(f"the warm-up command failed: {payload.decode(errors='replace')}")


class VmPool:
    """Booted idle VMs per :class:`VmConfig`; see the module docstring."""

    def __init__(self, size: int = 1) -> None:
        self.size = max(0, size)
        self._idle: dict[VmConfig, list[GuestVM]] = {}
        #: qemu pids of the last pooled VMs handed out, oldest first (what :meth:`members`
        #: showed idle is found here once a run took it)
        self.served: collections.deque[int] = collections.deque(maxlen=256)
        self._ready_at: dict[int, float] = {}  # qemu pid -> wall-clock time it became idle
        self._wanted: set[VmConfig] = set()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)  # a VM became idle, or the pool closed
        self._booting: dict[VmConfig, int] = {}  # boots under way per configuration
        self._in_boot: dict[VmConfig, list[GuestVM]] = {}  # the VMs the worker boots now
        self._jobs: queue.Queue[tuple[VmConfig, queue.Queue[object]] | None] = queue.Queue()
        self._closed = False
        self._booted = 0  # VMs booted into the pool
        self._taken = 0  # runs that took an idle VM
        self._missed = 0  # runs that found none idle and booted their own
        self._worker = threading.Thread(target=self._work, name="corral-vm-pool", daemon=True)
        self._worker.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            config, reply = job
            vm = GuestVM(config, background=True)  # niced until ready, or until a run waits
            with self._lock:
                self._in_boot.setdefault(config, []).append(vm)
            try:
                vm.boot()
                _warm_up(vm)
            except (BootFailed, OSError) as exc:
                vm.close()
                reply.put(exc)
                continue
            finally:
                with self._lock:
                    self._in_boot[config].remove(vm)
            reply.put(vm)

    def _boot(self, config: VmConfig) -> GuestVM:
        """Boot a VM on the worker thread and wait for it."""
        reply: queue.Queue[object] = queue.Queue()
        self._jobs.put((config, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        assert isinstance(result, GuestVM)
        return result

    def statistics(self) -> dict[str, int]:
        """``size``, ``idle`` (every configuration), ``booted``, ``served``, ``missed``."""
        with self._lock:
            idle = sum(len(vms) for vms in self._idle.values())
            return {
                "size": self.size,
                "idle": idle,
                "booted": self._booted,
                "served": self._taken,
                "missed": self._missed,
            }

    def idle(self, config: VmConfig) -> int:
        """How many booted VMs wait for *config*."""
        with self._lock:
            return len(self._idle.get(config, ()))

    def members(self) -> list[dict[str, object]]:
        """The idle VMs: ``qemu`` and ``virtiofsd`` pids, ``ready`` (wall-clock time it
        became idle), and the ``memory_mb``/``cpus``/``net`` of its configuration."""
        with self._lock:
            return [
                {
                    "qemu": vm.qemu.pid if vm.qemu is not None else None,
                    "virtiofsd": vm.virtiofsd.pid if vm.virtiofsd is not None else None,
                    "ready": self._ready_at.get(vm.qemu.pid if vm.qemu is not None else -1),
                    "memory_mb": config.memory_mb,
                    "cpus": config.cpus,
                    "net": bool(config.net),
                }
                for config, vms in self._idle.items()
                for vm in vms
            ]

    def acquire(self, config: VmConfig) -> GuestVM:
        """A booted VM for *config*, never handed out before; refills in the background.

        Raises:
            BootFailed: no VM was idle and one could not be booted.
        """
        with self._lock:
            self._wanted.add(config)
            # a boot under way (the pre-boot at server start, a refill) is ready sooner
            # than one started now, which would also compete with it for the CPUs
            deadline = time.monotonic() + config.boot_timeout
            while not self._idle.get(config) and self._booting.get(config) and not self._closed:
                for booting in self._in_boot.get(config, ()):
                    booting.foreground()  # a run waits for it now
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ready.wait(left)
            idle = self._idle.get(config)
            vm = idle.pop(0) if idle else None
            if vm is not None and vm.qemu is not None:
                self._ready_at.pop(vm.qemu.pid, None)
        if vm is not None and (vm.qemu is None or vm.qemu.poll() is not None):
            vm.close()
            vm = None  # died while idle
        self.refill(config)
        if vm is not None:
            assert vm.qemu is not None
            with self._lock:
                self.served.append(vm.qemu.pid)
                self._taken += 1
            return vm
        with self._lock:
            self._missed += 1
        # none idle: boot on the caller's thread (not behind a refill on the worker); the
        # run destroys this VM anyway, so its qemu may die with the calling thread
        vm = GuestVM(config)
        vm.boot()
        return vm

    def prefill(
        self,
        configs: Callable[[], list[VmConfig]],
        log: Callable[[str], None] | None = None,
    ) -> threading.Thread:
        """Boot VMs for the configurations *configs* returns, in the background, now.

        *configs* runs on that background thread too (working it out may
        probe KVM, seconds the first time), so the caller is never held up;
        an exception it raises is logged and nothing is booted (the pool then
        fills on first use). Returns the thread.
        """

        def work() -> None:
            try:
                wanted = configs()
            except Exception as exc:  # any failure: no pre-boot, and the log says why
                if log is not None:
                    log(f"vm pool: nothing booted ahead: {exc}")
                return
            for config in wanted:
                with self._lock:
                    self._wanted.add(config)
                if log is not None:
                    log(f"vm pool: booting {self.size} VM(s) ahead ({config.memory_mb} MiB)")
                self._refill(config)

        thread = threading.Thread(target=work, name="corral-vm-prefill", daemon=True)
        thread.start()
        return thread

    def refill(self, config: VmConfig) -> None:
        """Boot VMs for *config* in the background until *size* are idle."""
        threading.Thread(target=self._refill, args=(config,), daemon=True).start()

    def _refill(self, config: VmConfig) -> None:
        while True:
            with self._lock:
                if self._closed or len(self._idle.get(config, ())) >= self.size:
                    return
                self._booting[config] = self._booting.get(config, 0) + 1
            try:
                vm = self._boot(config)
            except (BootFailed, OSError):
                with self._lock:
                    self._booting[config] -= 1
                    self._ready.notify_all()
                return
            with self._lock:
                self._booting[config] -= 1
                keep = not self._closed  # close() may have run while it booted
                if keep:
                    self._idle.setdefault(config, []).append(vm)
                    self._booted += 1
                    if vm.qemu is not None:
                        self._ready_at[vm.qemu.pid] = time.time()
                self._ready.notify_all()
            if not keep:
                vm.close()
                return

    def destroy(self, vm: GuestVM) -> None:
        """Destroy a VM that was handed out, off the caller's path (a background thread)."""
        threading.Thread(target=vm.close, daemon=True).start()

    def close(self) -> None:
        """Destroy every idle VM and stop the worker (VMs handed out are their runs')."""
        with self._lock:
            self._closed = True
            vms = [vm for vms in self._idle.values() for vm in vms]
            self._idle.clear()
            self._ready_at.clear()
            self._ready.notify_all()
            booting = [vm for vms in self._in_boot.values() for vm in vms]
        for vm in (*booting, *vms):
            vm.close()  # a VM still booting too: its boot fails at once instead of being awaited
        self._jobs.put(None)
        self._worker.join(timeout=60)
