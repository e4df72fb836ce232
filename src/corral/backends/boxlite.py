"""The ``boxlite`` backend: the command runs in a BoxLite micro-VM (libkrun on KVM).

BoxLite (PyPI ``boxlite``, the extra ``corral[boxlite]``) boots an OCI image
as a small VM with its own kernel. corral maps the policy onto its API and
runs the command through :mod:`corral.backends._boxlite_run`, a relay the
engine supervises like any command (timeout, output cap and digests,
signals, the audit record).

Guarantees (with the default policy), where it runs:
  * the guest boots the image corral built (``corral image build NAME``: its
    OCI layout is BoxLite's ``rootfs_path``); nothing of the host's file
    system is in it but the workspace: read-only (``--read-only``: a
    read-only volume), or a preview's copy (``corral preview``, and plain
    ``corral run``, which runs in a new preview): the VM writes only the
    copy, and changes land only through ``corral apply``, which refuses
    protected paths;
  * no network interface (``NetworkSpec(mode="disabled")``);
  * the host environment passes only through the policy's ``env`` allowlist;
  * the command runs as the caller's uid and gid (the workspace's copy is
    shared with its host owners); ``resources.pids`` (``RLIMIT_NPROC``) and
    ``resources.cpuTime`` (``RLIMIT_CPU``) are set in the guest by a ``sh``
    wrapper that fails the run (126) if it cannot. ``RLIMIT_NPROC`` does not
    bind uid 0, so a root caller's ``resources.pids`` is refused;
  * memory is the VM's size (the limit plus :data:`GUEST_OVERHEAD_MB`, at
    least BoxLite's minimum); CPUs as whole vCPUs;
  * wall clock and output on the host, by corral's engine; the relay and
    everything BoxLite starts for the run (its shim, the VM) run in the
    run's cgroup, which the engine kills when the relay exits.

Refused (exit 125) unless degraded: ``network.mode`` other than ``none``
(BoxLite's own egress filter is not corral's proxy: no attempt log, no
request rules), ``credentials``, ``filesystem.allowWrite`` and ``caches``
(only the workspace is shared), secret paths inside the workspace and
``filesystem.allowRead`` carve-outs (a volume cannot mask a part of itself),
``resources.disk`` and fractional ``cpus``. A writable workspace without a
preview is refused (rule ``filesystem.workspace``).

Where it runs: Linux with KVM that boots standard guests. This build's CI
machines expose ``/dev/kvm`` as a nested PVM that hangs guests (BoxLite's
``create`` does not return); the backend reads the microvm backend's KVM
probe (:func:`corral.backends.microvm.kvm_problem`) and refuses with its
reason, and the relay fails a boot that takes longer than
:data:`BOOT_TIMEOUT` seconds (exit 125). ``auto`` never picks this backend:
it is used when named.
"""

from __future__ import annotations

import json
import os
import sys

from .._exceptions import BackendUnavailable, EnforcementUnavailable, UsageError
from ..pipeline._request import redact
from ._plan import CgroupSpec, FdSpec, LaunchPlan
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
    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._plan import HostFacts, PreviewSpec

__all__ = ["BOOT_TIMEOUT", "GUEST_OVERHEAD_MB", "BoxliteBackend", "boxlite_version"]

FD_STATUS = 3
FD_CONFIG = 4
#: Seconds BoxLite may take to create and start the box before the run fails (exit 125).
BOOT_TIMEOUT = 60.0
#: Guest RAM on top of ``resources.memory`` (guest kernel, BoxLite's guest agent).
GUEST_OVERHEAD_MB = 160
#: BoxLite's smallest VM.
MIN_MEMORY_MB = 128
#: Guest RAM without ``resources.memory``.
DEFAULT_MEMORY_MB = 512
#: Host tasks (threads count) of the relay, BoxLite's runtime, its shim and the VM: a backstop.
HOST_TASKS = 1024
#: The extra that installs BoxLite.
INSTALL_HINT = "pip install 'corral[boxlite]'"


def boxlite_version() -> str | None:
    """The installed PyPI ``boxlite``'s version, or None (reads metadata; imports nothing)."""
    from importlib import metadata

    try:
        return metadata.version("boxlite")
    except metadata.PackageNotFoundError:
        return None


def kvm_state(environ: dict[str, str]) -> str | None:
    """Why KVM cannot boot standard guests here (None: it can).

    The microvm backend's probe answers when qemu and a VM image are there
    (it boots a guest kernel under KVM, bounded, cached per host boot);
    otherwise its cached answer; with neither, KVM counts as unknown and the
    backend refuses: BoxLite hangs, rather than fails, on a KVM that does not
    run guests.
    """
    from .microvm import cached_kvm_problem, find_qemu, kvm_problem

    if not os.path.exists("/dev/kvm"):
        return "/dev/kvm does not exist (no hardware virtualisation exposed to this machine)"
    qemu, _virtiofsd = find_qemu(environ)
    if qemu is not None:
        from ..images import find_built
        from ..images._vm import find_vm_image

        built = find_built("python", environ)
        vm = find_vm_image(built) if built is not None else None
        if vm is not None:
            return kvm_problem(qemu, vm.kernel, environ)
    known, probed = cached_kvm_problem(environ)
    if probed:
        return known
    return (
        "KVM was not probed yet (BoxLite hangs on a KVM that does not run guests): install "
        "qemu-system-x86 and run 'corral image build python --vm' once"
    )


class BoxliteBackend(Backend):
    """BoxLite micro-VMs; see the module docstring."""

    name = "boxlite"
    isolation = "vm"
    cost_ms = 500.0
    explicit_only = True  # never run on the machines corral is tested on (no KVM there)
    preview_mechanisms = ("copy",)
    writes_through_preview = True

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        from ..images import find_built

        version = boxlite_version()
        name = "python"
        image_problem = None
        if policy.image is not None:
            if not policy.image.startswith("corral:"):
                image_problem = (
                    f"the boxlite backend boots images built by corral (corral:NAME), "
                    f"not {policy.image!r}"
                )
            name = policy.image[len("corral:") :]
        built = find_built(name, environ)
        from .. import _state

        return {
            "boxlite": version,
            "image_name": name,
            "image_problem": image_problem,
            "oci_layout": built.oci_layout if built is not None else None,
            "kvm_problem": kvm_state(environ) if version is not None else None,
            "python": sys.executable,
            "home": os.path.join(_state.state_dir(environ), "boxlite"),
        }

    def problem(self, facts: HostFacts) -> str | None:
        if facts.detail("boxlite") is None:
            return f"BoxLite is not installed ({INSTALL_HINT})"
        if facts.helper is None:
            return (
                "corral's exec helper (corral-exec) is missing: reinstall corral with a C compiler "
                "available (apt-get install gcc libc6-dev)"
            )
        kvm = facts.detail("kvm_problem")
        if kvm:
            return f"BoxLite needs KVM that boots guests: {kvm}"
        if facts.cgroup_problem is not None:
            return (
                f"the run's cgroup, which stops whatever BoxLite leaves running, is not "
                f"available: {facts.cgroup_problem}"
            )
        if facts.detail("image_problem"):
            return str(facts.detail("image_problem"))
        if facts.detail("oci_layout") is None:
            name = facts.detail("image_name")
            return f"the image {name!r} is not built; run 'corral image build {name}'"
        return None

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        return paths_of_policy(request, policy)

    def plan(
        self,
        request: ExecRequest,
        policy: Policy,
        facts: HostFacts,
        preview: PreviewSpec | None = None,
    ) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the boxlite backend: {problem}")
        assert facts.helper is not None
        fs, net, res = policy.filesystem, policy.network, policy.resources
        degrade = Degradations(policy.allow_degraded)
        workspace, cwd = vm_workspace(self.name, request, fs, facts)
        if net.mode != "none":
            raise EnforcementUnavailable(
                f"Failed to enforce network.mode={net.mode} on the boxlite backend: the VM gets "
                "no network here (BoxLite's own egress filter is not corral's proxy: no attempt "
                "log, no request rules)",
                rule="network.mode",
                hint="use --net none, or the microvm backend for an allowlist",
            )
        refuse_credentials(self.name, policy)
        if preview is not None and preview.mechanism != "copy":
            raise UsageError(
                f"Failed to run in preview {preview.id} on the boxlite backend: it shares a "
                "copy of the workspace with the VM, and this preview's mechanism is "
                f"{preview.mechanism}",
                hint="create the preview with --mechanism copy",
            )
        require_preview(self.name, preview, fs)
        only_the_workspace(policy, degrade)
        for secret in sorted(fs.deny_read):
            if is_under(secret, workspace) and facts.kind(secret) in ("dir", "file"):
                degrade.cannot(
                    "filesystem.denyRead",
                    f"{secret} lies inside the workspace, which BoxLite shares whole (a volume "
                    "cannot mask a part of itself)",
                    fix="move the secret out of the workspace, or use the microvm backend",
                )
        for carve in fs.allow_read:
            if not is_under(carve, workspace):
                degrade.cannot(
                    "filesystem.allowRead",
                    f"{carve} is outside the workspace; only the workspace is shared with the VM",
                    fix="unset it",
                )
        if res.disk is not None:
            degrade.cannot(
                "resources.disk",
                "workspace writes land in the preview's copy on the host, which has no "
                "per-sandbox quota",
                fix="unset resources.disk",
            )
        cpus = whole_vcpus(res.cpus, degrade)
        memory_mb = (
            max(MIN_MEMORY_MB, res.memory // (1 << 20) + GUEST_OVERHEAD_MB)
            if res.memory
            else DEFAULT_MEMORY_MB
        )
        # the preview's copy, written; or the workspace itself, read-only
        share = (preview.tree, False) if preview is not None else (workspace, True)
        volumes = [(share[0], workspace, share[1])]
        pids = res.pids
        if facts.uid == 0 and pids is not None:
            degrade.cannot(
                "resources.pids",
                "the command is uid 0 in the guest (it writes the workspace's copy as its "
                "owner), and RLIMIT_NPROC does not bind uid 0",
                fix="run corral as a non-root user, or unset resources.pids",
            )
            pids = None
        config = {
            "home": facts.detail("home"),
            "boot_timeout": BOOT_TIMEOUT,
            "box": {
                "rootfs_path": facts.detail("oci_layout"),
                "cpus": cpus,
                "memory_mib": memory_mb,
                "working_dir": workspace,
                "volumes": [list(v) for v in volumes],
            },
            "exec": {
                "argv": list(_limited(request.argv, pids=pids, cpu_time=res.cpu_time)),
                "env": [list(kv) for kv in guest_env(request, policy, facts, home="/tmp")],
                "cwd": cwd,
                "user": f"{facts.uid}:{facts.gid}",
            },
            "stdin": request.stdin_mode != "null",
        }
        relay = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boxlite_run.py")
        helper = [
            facts.helper, "--status-fd", str(FD_STATUS), "--keep-fd", str(FD_CONFIG),
            "--setsid", "--die-with-parent", "0",
        ]  # fmt: skip
        timeout = request.timeout if request.timeout is not None else res.timeout
        return LaunchPlan(
            backend=self.name,
            sandbox_id=request.sandbox_id,
            argv=(*helper, "--", str(facts.detail("python")), "-I", relay, str(FD_CONFIG)),
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
            # not a limit of the command's (those are the VM's): the run's cgroup, whose
            # kill at the end stops whatever BoxLite started for it
            cgroup=CgroupSpec(pids=HOST_TASKS),
            timeout=timeout,
            kill_grace=res.kill_grace,
            output_limit=res.output,
            degraded=degrade.recorded,
            display_argv=redact(request.argv),
        )


def _limited(argv: tuple[str, ...], *, pids: int | None, cpu_time: float | None) -> tuple[str, ...]:
    """*argv* under ``RLIMIT_NPROC``/``RLIMIT_CPU`` set by ``sh`` in the guest (126 if it cannot)."""
    limits = []
    if pids is not None:
        limits.append(f"ulimit -u {int(pids)}")
    if cpu_time is not None:
        limits.append(f"ulimit -t {max(1, int(cpu_time))}")
    if not limits:
        return argv
    script = " && ".join(limits) + ' || exit 126\nexec "$@"'
    return ("/bin/sh", "-c", script, "corral-limits", *argv)
