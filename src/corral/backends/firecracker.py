"""The ``firecracker`` backend: the microvm backend's runs on Firecracker instead of qemu.

A second engine of the micro-VM level (``isolation: "vm"``): the same guest
(the kernel, initramfs and root disk of ``corral image build NAME --vm``,
booted as the uncompressed ``vmlinux``), the same guest agent and frames,
the same relay, plan and refusals as :class:`~corral.backends.microvm.MicrovmBackend`.
What differs (docs/backends/microvm.md, "Firecracker"):

* the engine: ``firecracker --no-api --config-file F`` (a VM per run: no warm
  pool, no session VM), in the VM's own cgroup, killed with the run;
* the transport: the agent connects over virtio-vsock (kernel command line
  ``corral.agent=vsock``), relayed by Firecracker to a unix socket;
* the workspace: Firecracker has no virtiofs, so the run's view (the same
  view the qemu engine serves: preview overlay or copy, or the workspace
  read-only, secrets masked) is written into an ext4 image attached as the
  second disk, read-only unless the run writes through a preview; after a
  writable run the image is read back into the preview
  (:mod:`corral.backends._firecracker_disk`), so ``corral diff``/``apply``/
  ``discard`` work as on qemu;
* network: none, always. ``network.mode = "allowlist"`` is refused (exit
  125): Firecracker has no user-mode network for a proxy-only NIC.

Where it runs: x86_64 Linux, root, a ``firecracker`` binary (1.8 or newer:
its virtio devices are described over ACPI, which Debian's cloud kernel
reads; that kernel cannot take them from the command line), and KVM that
boots standard guests (Firecracker has no software emulation). Elsewhere it
is refused (exit 125) with every reason that applies. ``auto`` never picks
it: it is used when named.
"""

from __future__ import annotations

import json
import os
import re

from .._exceptions import BackendUnavailable, EnforcementUnavailable
from .microvm import FD_CONFIG, MicrovmBackend, relay_path, view_setup

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..pipeline._cgroups import Cgroup, CgroupLayout
    from ..pipeline._engine import Running
    from ..pipeline._outcome import Outcome
    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._firecracker_vm import FirecrackerVM
    from ._plan import HostFacts, LaunchPlan, PreviewSpec

__all__ = ["MIN_VERSION", "FirecrackerBackend", "firecracker_version"]

#: The oldest Firecracker that describes its virtio devices over ACPI on x86_64.
MIN_VERSION = (1, 8)
#: Seconds the guest gets to end a stopped command and flush the workspace disk.
SETTLE_TIMEOUT = 30.0


def firecracker_version(binary: str) -> tuple[int, int] | None:
    """``(major, minor)`` of ``binary --version`` (None: it did not run or say)."""
    import subprocess

    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"v(\d+)\.(\d+)", out)
    return (int(found.group(1)), int(found.group(2))) if found else None


class FirecrackerBackend(MicrovmBackend):
    """Firecracker micro-VMs with corral's guest agent over vsock; see the module docstring."""

    name = "firecracker"
    isolation = "vm"
    cost_ms = 300.0
    explicit_only = True  # used when named (no KVM on the machines corral is tested on)

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        import shutil

        from ._container import find_program
        from .boxlite import kvm_state

        firecracker = find_program("firecracker", environ)
        name, image_problem, vm = self.vm_image(policy, environ)
        return {
            "firecracker": firecracker,
            "firecracker_version": firecracker_version(firecracker) if firecracker else None,
            "image_name": name,
            "image_problem": image_problem,
            "vm_kernel": vm.vmlinux if vm and vm.vmlinux and os.path.isfile(vm.vmlinux) else None,
            "vm_initrd": vm.initrd if vm else None,
            "vm_disk": vm.disk if vm else None,
            "kvm_problem": kvm_state(environ),  # the microvm backend's probe (no TCG here)
            "relay": relay_path(),
            "mkfs": shutil.which("mkfs.ext4", path="/usr/sbin:/sbin:/usr/bin:/bin"),
            "debugfs": shutil.which("debugfs", path="/usr/sbin:/sbin:/usr/bin:/bin"),
            "bwrap": find_program("bwrap", environ),
        }

    def problem(self, facts: HostFacts) -> str | None:
        """Every reason this host cannot run the engine, joined (None: it can)."""
        problems = []
        if facts.arch != "x86_64":
            problems.append(f"this build runs x86_64 guests only (this is {facts.arch})")
        binary = facts.detail("firecracker")
        version = facts.detail("firecracker_version")
        if binary is None:
            problems.append(
                "no firecracker binary on PATH (not packaged by Debian 12; install an upstream "
                f"release, {MIN_VERSION[0]}.{MIN_VERSION[1]} or newer)"
            )
        elif not isinstance(version, (tuple, list)) or tuple(version) < MIN_VERSION:
            problems.append(
                f"{binary} is older than {MIN_VERSION[0]}.{MIN_VERSION[1]} or did not say its "
                "version (older releases pass virtio devices on the kernel command line, which "
                "Debian's cloud kernel does not read)"
            )
        kvm = facts.detail("kvm_problem")
        if kvm:
            problems.append(f"KVM does not run standard guests here: {kvm}")
        if facts.helper is None:
            problems.append("corral's exec helper (corral-exec) is missing")
        if facts.detail("relay") is None:
            problems.append("corral's micro-VM relay (corral-vm-relay) is missing")
        if facts.uid != 0:
            problems.append("this build runs Firecracker VMs as root only")
        if facts.detail("mkfs") is None or facts.detail("debugfs") is None:
            problems.append("e2fsprogs (mkfs.ext4, debugfs) is not installed")
        if facts.detail("bwrap") is None:
            problems.append("bubblewrap is not installed (it confines debugfs)")
        if facts.detail("image_problem"):
            problems.append(str(facts.detail("image_problem")))
        elif facts.detail("vm_kernel") is None:
            name = facts.detail("image_name")
            problems.append(
                f"no VM image of {name!r} with a vmlinux is built (extracting it from "
                f"Debian's kernel needs the lz4 program); run 'corral image build {name} --vm'"
            )
        return "; ".join(problems) or None

    def plan(
        self,
        request: ExecRequest,
        policy: Policy,
        facts: HostFacts,
        preview: PreviewSpec | None = None,
    ) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the firecracker backend: {problem}")
        if policy.network.mode != "none":
            raise EnforcementUnavailable(
                f"Failed to enforce network.mode={policy.network.mode} on the firecracker "
                "backend: its VMs have no network device (Firecracker has no user-mode network "
                "to reach only corral's proxy)",
                rule="network.mode",
                hint="use --backend microvm for --net allowlist",
            )
        # the qemu engine's plan: every check and refusal, the command, the relay
        plan = super().plan(request, policy, facts, preview)
        config = json.loads(next(f for f in plan.fds if f.number == FD_CONFIG).data)
        vm, share = config["vm"], config["share"]
        workspace = share["guest_path"]
        masks = [(str(p), str(k)) for p, k in share["masks"]]
        # the guest's changes to these do not come back (the qemu engine's view has them
        # read-only, so a guest's write there fails; here it is dropped)
        kept = [*(p for p, _k in masks), *share["read_only_paths"]]
        config["vm"] = {
            "firecracker": facts.detail("firecracker"),
            "kernel": facts.detail("vm_kernel"),
            "initrd": vm["initrd"],
            "disk": vm["disk"],
            "memory_mb": vm["memory_mb"],
            "cpus": vm["cpus"],
        }
        writable = preview is not None and not share["read_only"]
        config["share"] = {
            "guest_path": workspace,
            "read_only": not writable,
            "build": list(
                view_setup(
                    workspace=workspace,
                    preview=preview,
                    read_only=not writable,
                    masks=masks,
                    read_only_paths=[],
                    chain=True,
                )
            ),
            # the view the guest's changes are written back into: writable, masks kept
            "back": list(
                view_setup(
                    workspace=workspace,
                    preview=preview,
                    read_only=False,
                    masks=masks,
                    read_only_paths=list(share["read_only_paths"]),
                    chain=True,
                )
            )
            if writable
            else [],
            "masks": [p[len(workspace) + 1 :] for p in kept],
            "sources": [workspace]
            + ([preview.upper or preview.tree] if preview is not None else []),
            "mkfs": facts.detail("mkfs"),
            "debugfs": facts.detail("debugfs"),
            "bwrap": facts.detail("bwrap"),
        }
        from ._plan import FdSpec

        data = json.dumps(config, sort_keys=True).encode()
        fds = tuple(
            FdSpec(number=FD_CONFIG, kind="data", data=data) if f.number == FD_CONFIG else f
            for f in plan.fds
        )
        return plan.replace(fds=fds)

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
        """Build the workspace image, boot the VM, run the relay, read the changes back.

        Raises:
            BackendUnavailable: the image could not be built or read back, or
                the VM did not boot (with firecracker's console tail).
        """
        import tempfile

        from ._firecracker_disk import DiskFailed, build_image, image_size_mb, read_back
        from ._firecracker_vm import FirecrackerConfig, FirecrackerVM
        from ._microvm_vm import RUN_DIR_PREFIX, BootFailed, ShareSpec, sweep_stale_run_dirs

        config = json.loads(next(f for f in plan.fds if f.number == FD_CONFIG).data)
        share = config["share"]
        sweep_stale_run_dirs()
        run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
        vm = FirecrackerVM(FirecrackerConfig(**config["vm"]), run_dir)
        try:
            image = os.path.join(run_dir, "workspace.ext4")
            owner = os.stat(share["guest_path"])
            try:
                build_image(
                    tuple(share["build"]),
                    image,
                    size_mb=image_size_mb(_used_kib(share["sources"])),
                    owner=(owner.st_uid, owner.st_gid),
                    mkfs=share["mkfs"],
                )
            except DiskFailed as exc:
                raise BackendUnavailable(f"Failed to prepare the VM's workspace: {exc}") from None
            try:
                vm.boot(workspace_image=image, read_only=share["read_only"])
                assert vm.channel is not None
                vm.channel.mount_share(
                    ShareSpec(
                        setup=(), guest_path=share["guest_path"], read_only=share["read_only"]
                    )
                )
            except BootFailed as exc:
                raise BackendUnavailable(f"Failed to start the Firecracker VM: {exc}") from None
            marks = bytearray()
            outcome = self.run_in(
                vm,
                plan,
                request,
                cgroup_layout=cgroup_layout,
                on_start=on_start,
                stdio=stdio,
                cgroup=cgroup,
                streams=streams,
                marks=marks,
            )
            if share["back"]:
                _flush(vm, ended=bytes(marks) == b"sx", grace=plan.kill_grace)
                vm.stop()
                try:
                    read_back(
                        image,
                        tuple(share["back"]),
                        masks=tuple(share["masks"]),
                        bwrap=share["bwrap"],
                        debugfs=share["debugfs"],
                    )
                except DiskFailed as exc:
                    raise BackendUnavailable(
                        f"Failed to bring the VM's workspace changes back: {exc}"
                    ) from None
            return outcome
        finally:
            vm.close()


def _used_kib(paths: list[str]) -> int:
    """The apparent size of *paths* in KiB (what the view can hold at most)."""
    import subprocess

    result = subprocess.run(
        ["du", "-sck", "--apparent-size", *paths], capture_output=True, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    try:
        return int(lines[-1].split()[0])
    except (IndexError, ValueError):
        return 0


def _flush(vm: FirecrackerVM, *, ended: bool, grace: float) -> None:
    """Before the workspace image is read: end the command if the relay did not see its end,
    then ``sync`` in the guest so its page cache reaches the image.

    Raises:
        BackendUnavailable: the guest did not answer (its changes would be partial).
    """
    import time

    from ._microvm_vm import BootFailed, ExecSpec

    channel = vm.channel
    if channel is None:
        raise BackendUnavailable("Failed to bring the VM's workspace changes back: the VM is gone")
    deadline = time.monotonic() + grace + SETTLE_TIMEOUT
    try:
        if not ended:
            channel.send(b"K")
            while channel.read_frame(deadline=deadline)[0] not in (b"X", b"F"):
                pass
        channel.start(
            ExecSpec(
                argv=("/bin/sync",),
                env=(("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),),
                cwd="/",
                uid=0,
                gid=0,
                timeout_ms=int(SETTLE_TIMEOUT * 1000),
            )
        )
        channel.send(b"i")
        while True:
            kind, payload = channel.read_frame(deadline=deadline)
            if kind in (b"X", b"F"):
                break
    except (BootFailed, OSError) as exc:
        raise BackendUnavailable(
            f"Failed to bring the VM's workspace changes back: the guest did not flush them ({exc})"
        ) from None
    if kind != b"X" or not payload.startswith(b"exit 0"):
        raise BackendUnavailable(
            "Failed to bring the VM's workspace changes back: 'sync' in the guest failed "
            f"({payload[:200].decode('utf-8', 'replace')})"
        )
