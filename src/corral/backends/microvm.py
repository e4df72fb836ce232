"""The ``microvm`` backend: the command runs in a qemu micro-VM with its own kernel.

Each run boots a VM (``-M microvm``) from the VM artifacts of a built image
(``corral image build NAME --vm``: a Debian cloud kernel from apt, an
initramfs, the image's rootfs as a read-only disk with a tmpfs overlay) and
runs the command through corral's guest agent, pid 1 of the guest, over a
virtio-serial port. A kernel exploit in the command attacks the guest
kernel, not the host's (``isolation: "vm"``).

Guarantees (with the default policy):
  * the guest sees the image's root (pristine each run: writes go to a tmpfs
    overlay that dies with the VM) and the workspace at its own path, served
    by virtiofsd from a private mount namespace on the host: read-only
    (``--read-only``: a read-only bind mount there), or a preview's
    copy-on-write view (``corral preview``: the preview's overlay, or its
    copy); secret paths in the workspace are masked there (an empty
    read-only tmpfs, or ``/dev/null`` for files), literal ``denyWrite`` paths
    bound read-only. Nothing else of the host's file system is in the guest;
  * no network device at all (qemu ``-nodefaults``): not even the host's
    loopback is reachable; no host unix socket, no host process is visible;
  * ``network.mode = "allowlist"``: one virtio-net NIC on qemu's user network
    with ``restrict=on`` (no route to the host or anywhere); its only
    destination is corral's egress proxy for the run at
    ``GUEST_PROXY`` (10.0.2.100:3128), which qemu forwards to a unix socket
    on the host, and the proxy variables point there: the same allowlist,
    attempt log and violations as on bubblewrap. The proxy does not terminate
    TLS here (request rules and masked credentials are refused), and
    ``localhost:PORT`` entries do not reach the host's services (the guest's
    loopback is its own, and the proxy refuses loopback destinations);
  * the host environment passes only through the policy's ``env`` allowlist,
    as on every backend; credentials are refused (secrets never enter the guest);
  * memory is the VM's size (guest RAM = the limit plus
    :data:`GUEST_OVERHEAD_MB` for the guest kernel, and the guest cgroup's
    ``memory.max`` = the limit); pids in the guest cgroup (``pids.max``);
    CPUs as whole vCPUs (a fraction is refused); wall clock
    and output enforced by corral on the host and again by the agent in the
    guest (backstops); when the command's first process exits, every other
    guest process is killed.

A writable workspace is written only through a preview: plain
``corral run --backend microvm`` runs in a new preview (the CLI creates it,
prints its id and keeps it when the command changed something). Where the
plan is asked for a writable workspace without a preview it refuses (exit
125, rule ``filesystem.workspace``).

Refused unless degraded: ``network.mode = "open"``, ``credentials``,
``filesystem.allowWrite`` and ``caches`` (only the workspace is shared),
``resources.cpuTime`` and ``resources.disk``.

KVM is used when ``/dev/kvm`` boots a standard guest (probed once per host
boot, with a bounded timeout: see :func:`kvm_problem`); otherwise TCG,
qemu's software emulation, which is one to two orders of magnitude slower
(seconds per boot instead of ~100 ms).
"""

from __future__ import annotations

import json
import os

from .._exceptions import BackendUnavailable, EnforcementUnavailable
from ..pipeline._request import redact
from ._plan import FdSpec, LaunchPlan
from ._vm_plan import (
    guest_env,
    only_the_workspace,
    refuse_credentials,
    require_preview,
    vm_workspace,
    whole_vcpus,
)
from .base import Backend, Degradations, is_under, paths_of_policy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..images._vm import VmImage
    from ..pipeline._cgroups import Cgroup, CgroupLayout
    from ..pipeline._engine import Running
    from ..pipeline._outcome import Outcome
    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._firecracker_vm import FirecrackerVM
    from ._microvm_pool import VmPool
    from ._microvm_vm import GuestVM, ShareSpec, VmConfig
    from ._plan import EgressSpec, HostFacts, PreviewSpec

__all__ = [
    "DEFAULT_IMAGE",
    "GUEST_OVERHEAD_MB",
    "MicrovmBackend",
    "find_qemu",
    "kvm_problem",
    "set_pool",
    "view_setup",
]

FD_STATUS = 3
FD_CONFIG = 4
FD_AGENT = 5
FD_DONE = 6
#: The image a run boots when the policy names none (``corral image build python --vm``).
DEFAULT_IMAGE = "python"
#: Guest RAM on top of ``resources.memory`` (guest kernel, agent, page cache).
GUEST_OVERHEAD_MB = 160
#: Guest RAM without ``resources.memory``.
DEFAULT_MEMORY_MB = 512
#: Seconds a KVM trial boot may take before KVM counts as hanging.
KVM_PROBE_TIMEOUT = 8.0


#: The warm pool runs take their VM from (None: boot one per run); see set_pool.
_pool: VmPool | None = None


def current_pool() -> VmPool | None:
    """The warm pool runs and VM sessions take their VM from (None: each boots its own)."""
    return _pool


def set_pool(pool: VmPool | None) -> VmPool | None:
    """Make runs in this process take VMs from *pool* (the corral server's); return the old one."""
    global _pool
    previous, _pool = _pool, pool
    return previous


def relay_path() -> str | None:
    """Absolute path of the built micro-VM relay (``corral-vm-relay``), or None."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "_bin", "corral-vm-relay")
    return path if os.access(path, os.X_OK) else None


def find_qemu(environ: dict[str, str]) -> tuple[str | None, str | None]:
    """``(qemu-system-x86_64, virtiofsd)`` absolute paths, or None each."""
    from ._container import find_program

    qemu = find_program("qemu-system-x86_64", environ)
    virtiofsd = next(
        (
            p
            for p in ("/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd", "/usr/bin/virtiofsd")
            if os.access(p, os.X_OK)
        ),
        None,
    )
    return qemu, virtiofsd


def tsc_khz() -> int:
    """The host's TSC frequency in kHz (0: unknown), for the guest's ``tsc_early_khz``.

    Without it, about one TCG boot in twenty hangs after a failed TSC
    calibration (shared/notes/machine-recipes.md, section 8.2).
    """
    try:
        with open("/sys/devices/system/cpu/cpu0/tsc_freq_khz", encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return int(float(line.split(":")[1]) * 1000)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def kvm_problem(qemu: str, kernel: str, environ: dict[str, str]) -> str | None:
    """Why KVM cannot run standard guests here, or None when it can; cached per host boot
    (in ``kvm-probe.json`` beside the image cache).

    The trial boots *kernel* under ``-accel kvm`` with no root file system:
    a working KVM panics it in well under a second and qemu exits
    (``panic=-1``, ``-no-reboot``); a KVM that hangs standard guests (the
    nested PVM of Firecracker hosts) is killed after
    :data:`KVM_PROBE_TIMEOUT` seconds.
    """
    if not os.path.exists("/dev/kvm"):
        return "/dev/kvm does not exist (no hardware virtualisation exposed to this machine)"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "/dev/kvm is not accessible to this user (add it to the kvm group)"
    from ._image_ref import image_cache_dir

    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = "unknown"
    # next to the images (shared by every state dir of this user), valid for this boot
    record = os.path.join(os.path.dirname(image_cache_dir(environ)), "kvm-probe.json")
    key = f"{boot}:{qemu}:{os.stat(qemu).st_mtime_ns}"
    try:
        with open(record, encoding="utf-8") as f:
            cached = json.load(f)
        if cached.get("key") == key:
            known = cached.get("problem")
            return str(known) if isinstance(known, str) else None
    except (OSError, ValueError, AttributeError):
        pass
    import subprocess

    argv = [
        qemu, "-M", "microvm", "-accel", "kvm", "-cpu", "host", "-m", "128M", "-nodefaults",
        "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot", "-serial",
        "stdio", "-kernel", kernel, "-append", "console=ttyS0 panic=-1 reboot=t",
    ]  # fmt: skip
    problem: str | None = None
    try:
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=KVM_PROBE_TIMEOUT,
            check=False,
        )
        out = (result.stdout + result.stderr).decode("utf-8", "replace")
        if b"Kernel panic" not in result.stdout:
            last = out.strip().splitlines()[-1:] or [f"exit status {result.returncode}"]
            problem = f"a trial KVM boot failed ({last[0][:200]})"
    except subprocess.TimeoutExpired:
        problem = (
            f"a trial KVM boot hung for {KVM_PROBE_TIMEOUT:.0f} s (a nested KVM that does not "
            "run standard guests, e.g. the PVM of a Firecracker host)"
        )
    except OSError as exc:
        problem = f"qemu could not run: {exc}"
    try:
        os.makedirs(os.path.dirname(record), exist_ok=True)
        with open(f"{record}.tmp-{os.getpid()}", "w", encoding="utf-8") as f:
            json.dump({"key": key, "problem": problem}, f)
        os.replace(f"{record}.tmp-{os.getpid()}", record)
    except OSError:
        pass  # probed again next time
    return problem


def cached_kvm_problem(environ: dict[str, str]) -> tuple[str | None, bool]:
    """``(problem, probed)``: the answer :func:`kvm_problem` recorded for this host, if any.

    ``probed`` is False when no probe ran yet (its record is missing or
    unreadable); then ``problem`` is None and means nothing.
    """
    from ._image_ref import image_cache_dir

    try:
        with open(
            os.path.join(os.path.dirname(image_cache_dir(environ)), "kvm-probe.json"),
            encoding="utf-8",
        ) as f:
            known = json.load(f).get("problem")
    except (OSError, ValueError, AttributeError):
        return None, False
    return (str(known) if known else None), True


def view_setup(
    *,
    workspace: str,
    preview: PreviewSpec | None,
    read_only: bool,
    masks: list[tuple[str, str]],
    read_only_paths: list[str],
    chain: bool = False,
) -> tuple[str, ...]:
    """The argv that mounts a run's workspace view in virtiofsd's namespace (pure).

    It runs there through ``nsenter`` when the VM is handed to the run, and
    mounts at ``VIEW_ROOT/ws``:

    * with a preview: the preview's overlay (kernel overlayfs: the workspace
      as lower layer, the preview's upper and work directories), or its copy;
    * otherwise the workspace, read-only (a writable run always has a preview);
    * each ``(path, "dir"|"file")`` of *masks* hidden (an empty read-only tmpfs,
      or ``/dev/null``), each of *read_only_paths* bound read-only.

    The guest can only ever reach what virtiofsd serves, and the kernel
    enforces these mounts for virtiofsd as for any process. With *chain*, the
    script execs the arguments appended after the returned argv once the view
    is mounted (the Firecracker engine builds its workspace image from the
    view and writes the guest's changes back into it: ``_firecracker_disk``).
    """
    from ._microvm_vm import VIEW_ROOT

    lines = ["set -e", f"v={VIEW_ROOT}/ws"]
    words: list[str] = []

    def arg(value: str) -> str:
        words.append(value)
        return f'"${{{len(words)}}}"'

    if preview is not None and preview.mechanism == "copy":
        lines.append(f'mount --bind -- {arg(preview.tree)} "$v"')
    elif preview is not None:
        opts = f"lowerdir={workspace},upperdir={preview.upper},workdir={preview.work}"
        lines.append(f'mount -t overlay -o {arg(opts)} corral-preview "$v"')
    else:
        lines.append(f'mount --bind -- {arg(workspace)} "$v"')
    if read_only or preview is None:
        lines.append('mount -o remount,bind,ro "$v"')
    for path, kind in masks:
        target = f'"$v"/{arg(path[len(workspace) + 1 :])}'
        if kind == "dir":
            lines.append(f"mount -t tmpfs -o ro,nosuid,nodev,mode=700 corral-mask {target}")
        else:
            lines.append(f"mount --bind /dev/null {target}")
            lines.append(f"mount -o remount,bind,ro {target}")
    for path in read_only_paths:
        target = f'"$v"/{arg(path[len(workspace) + 1 :])}'
        lines.append(f"mount --bind {target} {target}")
        lines.append(f"mount -o remount,bind,ro {target}")
    if chain:
        lines.append(f'shift {len(words)}\nexec "$@"')
    return ("/bin/sh", "-c", "\n".join(lines), "corral-view", *words)


class MicrovmBackend(Backend):
    """qemu micro-VMs with corral's guest agent; see the module docstring."""

    name = "microvm"
    isolation = "vm"
    cost_ms = 2000.0
    preview_mechanisms = ("overlay", "copy")
    writes_through_preview = True

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        from ._container import find_program

        qemu, virtiofsd = find_qemu(environ)
        name, image_problem, vm = self.vm_image(policy, environ)
        kvm = (
            kvm_problem(qemu, vm.kernel, environ)
            if qemu and vm and os.path.exists("/dev/kvm")
            else None
        )
        if kvm is None and not os.path.exists("/dev/kvm"):
            kvm = "/dev/kvm does not exist"
        return {
            "qemu": qemu,
            "virtiofsd": virtiofsd,
            "image_name": name,
            "image_problem": image_problem,
            "vm_kernel": vm.kernel if vm else None,
            "vm_initrd": vm.initrd if vm else None,
            "vm_disk": vm.disk if vm else None,
            "kvm_problem": kvm,
            "tsc_khz": tsc_khz(),
            "relay": relay_path(),
            "socat": find_program("socat", environ),
        }

    def vm_image(
        self, policy: Policy, environ: dict[str, str]
    ) -> tuple[str, str | None, VmImage | None]:
        """``(name, problem, artifacts)`` of the VM image *policy* names (``corral:NAME``,
        default :data:`DEFAULT_IMAGE`): *problem* when it names another kind of image,
        *artifacts* None when no VM image of it is built."""
        from ..images import find_built
        from ..images._vm import find_vm_image

        name = DEFAULT_IMAGE
        problem = None
        if policy.image is not None:
            if not policy.image.startswith("corral:"):
                problem = (
                    f"the {self.name} backend boots images built by corral (corral:NAME), "
                    f"not {policy.image!r}"
                )
            name = policy.image[len("corral:") :]
        built = find_built(name, environ)
        return name, problem, find_vm_image(built) if built is not None else None

    def problem(self, facts: HostFacts) -> str | None:
        if facts.detail("qemu") is None:
            return (
                "qemu is not installed; install it (Debian/Ubuntu: apt-get install qemu-system-x86)"
            )
        if facts.detail("virtiofsd") is None:
            return "virtiofsd is not installed (Debian 12: part of qemu-system-common)"
        if facts.helper is None:
            return (
                "corral's exec helper (corral-exec) is missing: reinstall corral with a C compiler "
                "available (apt-get install gcc libc6-dev)"
            )
        if facts.detail("relay") is None:
            return (
                "corral's micro-VM relay (corral-vm-relay) is missing: reinstall corral with a C "
                "compiler available (apt-get install gcc libc6-dev), or run 'make native'"
            )
        if facts.uid != 0:
            return "this build runs micro-VMs as root only (virtiofsd needs root to serve the workspace)"
        if facts.detail("image_problem"):
            return str(facts.detail("image_problem"))
        if facts.detail("vm_kernel") is None:
            name = facts.detail("image_name")
            return (
                f"no VM image of {name!r} is built (or it is from an older corral); "
                f"run 'corral image build {name} --vm'"
            )
        return None

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        return paths_of_policy(request, policy)

    def accel(self, facts: HostFacts) -> str:
        """``kvm`` when KVM runs standard guests here, else ``tcg``."""
        return "tcg" if facts.detail("kvm_problem") else "kvm"

    def plan(
        self,
        request: ExecRequest,
        policy: Policy,
        facts: HostFacts,
        preview: PreviewSpec | None = None,
    ) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the microvm backend: {problem}")
        assert facts.helper is not None
        fs, net, res = policy.filesystem, policy.network, policy.resources
        degrade = Degradations(policy.allow_degraded)
        workspace, cwd = vm_workspace(self.name, request, fs, facts)
        if net.mode == "open":
            raise EnforcementUnavailable(
                "Failed to enforce network.mode=open on the microvm backend: the VM reaches the "
                "network only through corral's egress proxy",
                rule="network.mode",
                hint="use --net allowlist with --allow-host HOST, or another backend",
            )
        refuse_credentials(self.name, policy)
        egress = None
        if net.mode == "allowlist":
            egress = self._egress(policy, facts, request)
        require_preview(self.name, preview, fs)
        only_the_workspace(policy, degrade)
        if res.cpu_time is not None:
            degrade.cannot(
                "resources.cpuTime",
                "the guest agent does not set RLIMIT_CPU",
                fix="use resources.timeout",
            )
        if res.disk is not None:
            degrade.cannot(
                "resources.disk",
                "workspace writes land in the preview on the host, which has no per-sandbox quota",
                fix="unset resources.disk",
            )
        masks: list[tuple[str, str]] = []
        for secret in sorted(fs.deny_read):
            kind = facts.kind(secret)
            if kind in ("dir", "file") and is_under(secret, workspace) and secret != workspace:
                masks.append((secret, "dir" if kind == "dir" else "file"))
        for carve in fs.allow_read:
            if any(is_under(carve, m) for m, _k in masks):
                degrade.cannot(
                    "filesystem.allowRead",
                    f"{carve} lies inside a masked secret path; the VM's share cannot show it",
                    fix="move it out of the secret path",
                )
        read_only_paths = [
            p.rstrip("/")
            for p in fs.deny_write
            if p.startswith("/")
            and not any(c in p for c in "*?[")
            and facts.kind(p) in ("dir", "file")
            and is_under(p, workspace)
        ]
        if preview is None:
            read_only_paths = []  # the whole share is read-only
        setup = view_setup(
            workspace=workspace,
            preview=preview,
            read_only=fs.read_only,
            masks=masks,
            read_only_paths=read_only_paths,
        )
        memory_mb = res.memory // (1 << 20) + GUEST_OVERHEAD_MB if res.memory else DEFAULT_MEMORY_MB
        cpus = whole_vcpus(res.cpus, degrade)
        timeout = request.timeout if request.timeout is not None else res.timeout
        env = guest_env(request, policy, facts, home="/root" if facts.uid == 0 else "/tmp")
        if egress is not None:
            from ._microvm_vm import GUEST_PROXY
            from ._proxy_env import proxy_environment

            # over any variable of the same name (as on bubblewrap): one value per name
            proxy = proxy_environment(GUEST_PROXY[1], egress.token, host=GUEST_PROXY[0])
            env = tuple({**dict(env), **dict(proxy)}.items())
        config = {
            "vm": {
                "qemu": facts.detail("qemu"),
                "virtiofsd": facts.detail("virtiofsd"),
                "kernel": facts.detail("vm_kernel"),
                "initrd": facts.detail("vm_initrd"),
                "disk": facts.detail("vm_disk"),
                "memory_mb": memory_mb,
                "cpus": cpus,
                "accel": self.accel(facts),
                "tsc_khz": facts.detail("tsc_khz"),
                "net": str(facts.detail("socat")) if egress is not None else "",
            },
            "share": {
                "setup": list(setup),
                "guest_path": workspace,
                "read_only": fs.read_only,
                # what the view is made of (the firecracker engine mounts it again)
                "masks": [list(m) for m in masks],
                "read_only_paths": read_only_paths,
            },
            "exec": {
                "argv": list(request.argv),
                "env": [list(kv) for kv in env],
                "cwd": cwd,
                "uid": facts.uid,
                "gid": facts.gid,
                # backstops inside the guest: corral's engine enforces both first
                "timeout_ms": int((timeout + res.kill_grace + 2) * 1000) if timeout else 0,
                "grace_ms": int(res.kill_grace * 1000),
                "output_cap": (res.output + 1) if res.output is not None else 0,
                "pids": res.pids or 0,
                "memory": res.memory or 0,
            },
            "stdin": request.stdin_mode != "null",
        }
        runner = [str(facts.detail("relay"))]
        helper = [
            facts.helper, "--status-fd", str(FD_STATUS), "--keep-fd", str(FD_CONFIG),
            "--keep-fd", str(FD_AGENT), "--keep-fd", str(FD_DONE), "--setsid",
            "--die-with-parent", "0",
        ]  # fmt: skip
        return LaunchPlan(
            backend=self.name,
            sandbox_id=request.sandbox_id,
            argv=(*helper, "--", *runner, str(FD_CONFIG), str(FD_AGENT), str(FD_DONE)),
            env=(("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), ("LC_ALL", "C.UTF-8")),
            cwd="/",
            fds=(
                FdSpec(number=FD_STATUS, kind="status"),
                FdSpec(
                    number=FD_CONFIG,
                    kind="data",
                    data=json.dumps(config, sort_keys=True).encode(),
                ),
            ),
            timeout=timeout,
            kill_grace=res.kill_grace,
            output_limit=res.output,
            degraded=degrade.recorded,
            display_argv=redact(request.argv),
            egress=egress,
        )

    def _egress(self, policy: Policy, facts: HostFacts, request: ExecRequest) -> EgressSpec:
        """The proxy for ``network.mode = "allowlist"``: on a unix socket on the host, which
        the VM's ``guestfwd`` reaches (the socket's path is the VM's, known at launch).

        Raises:
            EnforcementUnavailable: socat is missing, or request rules (no TLS termination).
        """
        from ._egress import egress_spec

        if not facts.detail("socat"):
            raise EnforcementUnavailable(
                "Failed to enforce network.mode=allowlist on the microvm backend: socat is not "
                "installed (qemu forwards the guest's proxy connections through it)",
                rule="network.mode",
                hint="apt-get install socat",
            )
        spec = egress_spec(policy, facts, request=request, terminating=False, backend=self.name)
        return spec.replace(netns="unix", forwards=())

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
        """Boot the VM (or take one from the warm pool), mount the workspace, then let the
        engine run the relay with the agent's connection; the VM is destroyed afterwards.

        The engine's clock starts when the command does: ``resources.timeout``
        does not count the boot (bounded on its own by ``VmConfig.boot_timeout``).

        Raises:
            BackendUnavailable: the VM did not boot (with qemu's console tail).
        """
        from ._microvm_vm import BootFailed

        config = next(f for f in plan.fds if f.number == FD_CONFIG)
        vm_config, share = vm_config_of(json.loads(config.data))
        pool = _pool
        vm = pool.acquire(vm_config) if pool is not None else boot_vm(vm_config)
        try:
            vm.attach(share)
        except BootFailed as exc:
            vm.close()
            raise BackendUnavailable(f"Failed to start the micro-VM: {exc}") from None
        try:
            return self.run_in(
                vm,
                plan,
                request,
                cgroup_layout=cgroup_layout,
                on_start=on_start,
                stdio=stdio,
                cgroup=cgroup,
                streams=streams,
            )
        finally:
            if pool is not None:
                pool.destroy(vm)  # off the run's path: the server lives on
            else:
                vm.close()

    def run_in(
        self,
        vm: GuestVM | FirecrackerVM,
        plan: LaunchPlan,
        request: ExecRequest,
        *,
        cgroup_layout: CgroupLayout | None = None,
        on_start: Callable[[Running], None] | None = None,
        stdio: tuple[int, int, int] | None = None,
        cgroup: Cgroup | None = None,
        streams: tuple[int, int, int] = (0, 1, 2),
        marks: bytearray | None = None,
    ) -> Outcome:
        """Run *plan*'s command in *vm* (booted, its workspace attached) through the relay.

        *marks* receives what the relay reported on its done fd, also when
        the launch raised: ``b"sx"`` when the agent took the command and
        reported its end, ``b"s"`` when the relay ended in between (the guest
        may still run it), ``b""`` when the agent never got it. The VM is left
        as it is.
        """
        assert vm.channel is not None
        config = next(f for f in plan.fds if f.number == FD_CONFIG)
        if plan.egress is not None:  # the proxy listens where this VM's qemu connects
            plan = plan.replace(egress=plan.egress.replace(socket=vm.egress_socket))
        done_r, done_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            agent = FdSpec(number=FD_AGENT, kind="pass", data=str(vm.channel.fileno()).encode())
            done = FdSpec(number=FD_DONE, kind="pass", data=str(done_w).encode())
            command = FdSpec(number=FD_CONFIG, kind="data", data=exec_data(json.loads(config.data)))
            fds = tuple(f for f in plan.fds if f.number != FD_CONFIG)
            outcome = super().launch(
                plan.replace(fds=(*fds, command, agent, done)),
                request,
                cgroup_layout=cgroup_layout,
                on_start=on_start,
                stdio=stdio,
                cgroup=cgroup,
                streams=streams,
            )
        finally:
            os.close(done_w)
            try:
                reported = os.read(done_r, 16)
            except BlockingIOError:
                reported = b""
            os.close(done_r)
            if marks is not None:
                marks += reported
        return outcome


def vm_config_of(config: dict[str, object]) -> tuple[VmConfig, ShareSpec]:
    """The VM and the workspace view in a plan's configuration (its JSON)."""
    from ._microvm_vm import ShareSpec, VmConfig

    share = dict(config["share"])  # type: ignore[call-overload]
    return VmConfig(**config["vm"]), ShareSpec(  # type: ignore[arg-type]
        setup=tuple(share["setup"]), guest_path=share["guest_path"], read_only=share["read_only"]
    )


def exec_data(config: dict[str, object]) -> bytes:
    """What the relay reads on its first fd: ``1``/``0`` (stdin relayed), then the 'E' payload."""
    from ._microvm_vm import ExecSpec, exec_payload

    ex = dict(config["exec"])  # type: ignore[call-overload]
    spec = ExecSpec(
        **{**ex, "argv": tuple(ex["argv"]), "env": tuple(tuple(kv) for kv in ex["env"])}
    )
    return (b"1" if config.get("stdin") else b"0") + exec_payload(spec)


def boot_vm(config: VmConfig) -> GuestVM:
    """A booted VM for *config* (raises BackendUnavailable when it does not boot)."""
    from ._microvm_vm import BootFailed, GuestVM

    vm = GuestVM(config)
    try:
        vm.boot()
    except BootFailed as exc:
        raise BackendUnavailable(f"Failed to start the micro-VM: {exc}") from None
    except OSError as exc:
        raise BackendUnavailable(f"Failed to start the micro-VM: {exc}") from None
    return vm
