"""Micro-VM artifacts for a built image: kernel, initramfs and a read-only root disk.

``corral image build NAME --vm`` (:func:`build_vm_image`) turns the rootfs of
``corral image build NAME`` into what the ``microvm`` backend boots, from apt
alone:

* ``vmlinuz``: the kernel of Debian's ``linux-image-cloud-<arch>`` package,
  downloaded with ``apt-get download`` and unpacked with ``dpkg-deb -x`` in a
  scratch directory (never installed: the host's ``/boot`` and module tree
  are not touched);
* ``initramfs.cpio``: busybox (``busybox-static``), the kernel modules the
  guest needs (virtio over MMIO, the console port, the block device,
  virtiofs, overlayfs), the init script :data:`INIT` and corral's guest agent
  (``corral-vm-agent``, static C);
* ``vmlinux``: the same kernel uncompressed (an ELF file, extracted from
  the bzImage by :func:`corral.images._vmlinux.extract_vmlinux`), which the
  Firecracker engine boots;
* ``rootfs.ext4``: the image's rootfs as an ext4 file system
  (``mkfs.ext4 -d``), which qemu attaches read-only; the guest puts a tmpfs
  overlay on top, so every VM starts from the same pristine root.

The artifacts live in ``<image dir>/vm-KEY/``, keyed by the image's key, the
kernel package's version and the agent's and init's digests; the same inputs
reuse them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time

from .._exceptions import UsageError
from .._frozen import Record
from ._build import ImageBuildFailed, _write_json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ._build import BuiltImage

__all__ = [
    "AGENT_VSOCK_PORT",
    "INIT",
    "MODULES",
    "VSOCK_MODULES",
    "VmImage",
    "build_vm_image",
    "find_vm_image",
    "kernel_package",
]

#: Bumped when the procedure changes what it produces (part of the key).
VM_BUILDER_VERSION = 4

#: Kernel modules loaded by the guest's init, in load order (paths below
#: ``lib/modules/<release>/kernel``). virtio_ring must precede virtio.
MODULES: tuple[str, ...] = (
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_mmio",
    "drivers/char/virtio_console",
    "drivers/block/virtio_blk",
    "fs/fuse/fuse",
    "fs/fuse/virtiofs",
    "fs/overlayfs/overlay",
    "net/core/failover",
    "drivers/net/net_failover",
    "drivers/net/virtio_net",
)

#: Kernel modules the guest's init loads only for the Firecracker engine (kernel command
#: line ``corral.agent=vsock``): the agent talks to the host over virtio-vsock there.
VSOCK_MODULES: tuple[str, ...] = (
    "net/vmw_vsock/vsock",
    "net/vmw_vsock/vmw_vsock_virtio_transport_common",
    "net/vmw_vsock/vmw_vsock_virtio_transport",
)
#: The vsock port the guest agent connects to on the host (CID 2) under Firecracker.
AGENT_VSOCK_PORT = 1024

#: The guest's /init (busybox sh): the read-only root disk under a tmpfs
#: overlay, then the agent as pid 1 on the virtio-serial port "corral.agent".
INIT = r"""#!/bin/sh
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules); do insmod "/lib/modules/$m.ko" || echo "corral-init: insmod $m failed"; done
mkdir -p /ro /rw /newroot
n=0; while [ ! -b /dev/vda ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done
mount -t ext4 -o ro,noload /dev/vda /ro || { echo "corral-init: no root disk"; poweroff -f; }
mount -t tmpfs -o mode=755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/ro,upperdir=/rw/upper,workdir=/rw/work /newroot
mkdir -p /newroot/.corral /newroot/dev /newroot/proc /newroot/sys /newroot/tmp
cp /agent /newroot/.corral/agent
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /newroot/tmp
agent=
case " $(cat /proc/cmdline) " in
*" corral.agent=vsock "*)
  # Firecracker: the agent connects to the host over vsock; the workspace is the
  # second disk (an ext4 image of the run's view), which the agent's 'M' binds
  for m in $(cat /modules-vsock); do insmod "/lib/modules/$m.ko" || echo "corral-init: insmod $m failed"; done
  agent=vsock:2:@AGENT_VSOCK_PORT@
  for ws in ro rw; do
    case " $(cat /proc/cmdline) " in *" corral.ws=$ws "*)
      n=0; while [ ! -b /dev/vdb ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done
      mkdir -p /newroot/.corral/share/ws
      mount -t ext4 -o "$ws,nosuid,nodev" /dev/vdb /newroot/.corral/share/ws ||
        { echo "corral-init: no workspace disk"; poweroff -f; }
      echo "corral-init: workspace disk mounted $ws; agent on $agent"
    esac
  done ;;
*)
  n=0
  while [ -z "$agent" ] && [ $n -lt 500 ]; do
    for p in /sys/class/virtio-ports/*; do
      [ "$(cat "$p/name" 2>/dev/null)" = corral.agent ] && agent=/dev/${p##*/}
    done
    [ -z "$agent" ] && { sleep 0.01; n=$((n+1)); }
  done ;;
esac
[ -n "$agent" ] || { echo "corral-init: no agent port"; poweroff -f; }
ip link set lo up
if grep -qx 0x0001 /sys/bus/virtio/devices/*/device 2>/dev/null; then
  # a NIC (network.mode allowlist): qemu's restricted user network, no route
  n=0; while [ ! -e /sys/class/net/eth0 ] && [ $n -lt 500 ]; do sleep 0.01; n=$((n+1)); done
  ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up || echo "corral-init: no eth0"
fi
hostname corral
mount --move /dev /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
if grep -qx 0x001a /newroot/sys/bus/virtio/devices/*/device 2>/dev/null; then
  # the workspace share (virtio-fs), mounted now rather than on the run's path; the
  # agent binds the run's view from it (its "ws") once the host has mounted that
  mkdir -p -m 700 /newroot/.corral/share
  mount -t virtiofs -o nosuid,nodev corral-ws /newroot/.corral/share || echo "corral-init: no share"
fi
exec switch_root /newroot /.corral/agent "$agent"
""".replace("@AGENT_VSOCK_PORT@", str(AGENT_VSOCK_PORT))


class VmImage(Record):
    """The boot artifacts of one image (see the module docstring).

    Attributes:
        name: the image name.
        directory: ``<image dir>/vm-KEY``.
        kernel, initrd, disk: the three files qemu boots.
        vmlinux: the uncompressed kernel (ELF) Firecracker boots instead of *kernel*.
        release: the guest kernel's release (``uname -r`` inside).
        key: 16 hex digits of the inputs' digest.
        agent: the sha256 of the guest agent in the initramfs.
        builder: the :data:`VM_BUILDER_VERSION` that built them (0: older than 3).
    """

    name: str
    directory: str
    kernel: str
    initrd: str
    disk: str
    release: str
    key: str
    agent: str = ""
    builder: int = 0
    vmlinux: str = ""


def agent_path() -> str | None:
    """Absolute path of the built guest agent, or None."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "_bin", "corral-vm-agent")
    return path if os.access(path, os.X_OK) else None


def kernel_package() -> tuple[str, str]:
    """``(package, version)`` of the kernel Debian's cloud meta-package depends on now.

    Raises:
        UsageError: this architecture has no cloud kernel, or apt does not know it
            (run ``apt-get update``).
    """
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "")
    if arch != "amd64":
        raise UsageError(
            f"Failed to build a VM image: the microvm backend runs x86_64 guests only "
            f"(this is {os.uname().machine})"
        )
    meta = f"linux-image-cloud-{arch}"
    out = subprocess.run(
        ["apt-cache", "depends", meta], capture_output=True, text=True, check=False
    ).stdout
    package = ""
    for line in out.splitlines():
        word = line.strip()
        if word.startswith("Depends: linux-image-"):
            package = word.split()[1]
            break
    if not package:
        raise UsageError(
            f"Failed to build a VM image: apt does not know {meta}",
            hint="run 'apt-get update' (the kernel comes from Debian's apt repositories)",
        )
    policy = subprocess.run(
        ["apt-cache", "policy", package], capture_output=True, text=True, check=False
    ).stdout
    version = ""
    for line in policy.splitlines():
        if line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
    return package, version


#: ``path -> ((device, inode, size, mtime), sha256)``: the agent is digested on every
#: plan (a session's every command); once per version of the file is enough.
_digests: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def _digest(path: str) -> str:
    st = os.stat(path)
    stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    known = _digests.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    _digests[path] = (stamp, h.hexdigest())
    return h.hexdigest()


def _load_vm_record(path: str) -> VmImage | None:
    try:
        with open(path, encoding="utf-8") as f:
            vm = VmImage(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None
    if not all(os.path.isfile(p) for p in (vm.kernel, vm.initrd, vm.disk)):
        return None
    return vm


def find_vm_image(image: BuiltImage) -> VmImage | None:
    """The VM artifacts of *image* built with this corral's guest agent and procedure.

    The last ones built (``vm.json``, any kernel) when they match, else the
    newest ``vm-KEY`` directory that does: two corral installations sharing
    one image cache (two versions, two checkouts) each find their own
    artifacts instead of the other's last build. None when none holds this
    corral's agent (an upgrade changed the protocol) and procedure (e.g.
    without the virtio-net module): ``corral image build NAME --vm`` again.
    """
    agent = agent_path()
    if agent is None:
        return None
    digest = _digest(agent)

    def fits(vm: VmImage | None) -> bool:
        return vm is not None and vm.agent == digest and vm.builder == VM_BUILDER_VERSION

    last = _load_vm_record(os.path.join(image.directory, "vm.json"))
    if fits(last):
        return last
    try:
        names = [n for n in os.listdir(image.directory) if n.startswith("vm-")]
    except OSError:
        return None
    found = [_load_vm_record(os.path.join(image.directory, n, "vm.json")) for n in names]
    fitting = [vm for vm in found if vm is not None and fits(vm)]
    return max(fitting, key=lambda vm: os.stat(vm.initrd).st_mtime_ns, default=None)


def build_vm_image(
    image: BuiltImage,
    *,
    progress: Callable[[str], None] | None = None,
    rebuild: bool = False,
) -> VmImage:
    """Build (or reuse) the micro-VM artifacts of *image*.

    Raises:
        UsageError: a tool is missing (busybox-static, e2fsprogs, the agent).
        ImageBuildFailed: apt-get download, dpkg-deb, cpio or mkfs.ext4 failed.
    """
    say = progress or (lambda _line: None)
    started = time.monotonic()

    def stage(text: str) -> None:
        say(f"[{time.monotonic() - started:6.1f}s] {text}")

    agent = agent_path()
    if agent is None:
        raise UsageError(
            "Failed to build a VM image: corral's guest agent (corral-vm-agent) is missing",
            hint="reinstall corral with a C compiler (apt-get install gcc libc6-dev), or 'make native'",
        )
    busybox = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.path.isfile(p)), None)
    mkfs = shutil.which("mkfs.ext4") or next(
        (p for p in ("/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4") if os.path.isfile(p)), None
    )
    if busybox is None or mkfs is None:
        raise UsageError(
            "Failed to build a VM image: busybox and mkfs.ext4 are needed",
            hint="apt-get install busybox-static e2fsprogs",
        )
    package, version = kernel_package()
    inputs = {
        "image": image.key,
        "kernel": f"{package}={version}",
        "agent": _digest(agent),
        "init": hashlib.sha256(INIT.encode()).hexdigest(),
        "modules": [*MODULES, *VSOCK_MODULES],
        "builder": VM_BUILDER_VERSION,
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    directory = os.path.join(image.directory, f"vm-{key}")
    record_path = os.path.join(directory, "vm.json")
    if os.path.isfile(record_path) and not rebuild:
        stage(f"reusing the cached VM artifacts {directory}")
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
    else:
        record = _build(image, directory, key, package, version, agent, busybox, mkfs, stage)
    _write_json(os.path.join(image.directory, "vm.json"), record)
    stage("done")
    return VmImage(**record)


def _run(argv: list[str], what: str, **kwargs: object) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        raise ImageBuildFailed(
            f"Failed to build the VM image: {what} exited {result.returncode}: "
            f"{(result.stderr or result.stdout).strip()[-500:]}"
        )


def _build(
    image: BuiltImage,
    directory: str,
    key: str,
    package: str,
    version: str,
    agent: str,
    busybox: str,
    mkfs: str,
    stage: Callable[[str], None],
) -> dict[str, object]:
    scratch = f"{directory}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    try:
        downloads = os.path.join(scratch, "deb")
        os.mkdir(downloads)
        stage(f"apt-get download {package} ({version})")
        _run(["apt-get", "download", "-q", package], "apt-get download", cwd=downloads)
        debs = [f for f in os.listdir(downloads) if f.endswith(".deb")]
        if not debs:
            raise ImageBuildFailed(f"Failed to build the VM image: apt-get fetched no {package}")
        unpacked = os.path.join(scratch, "kernel")
        stage(f"unpacking {debs[0]} (not installed)")
        _run(["dpkg-deb", "-x", os.path.join(downloads, debs[0]), unpacked], "dpkg-deb -x")
        boot = os.path.join(unpacked, "boot")
        vmlinuz = next(f for f in sorted(os.listdir(boot)) if f.startswith("vmlinuz-"))
        release = vmlinuz[len("vmlinuz-") :]
        shutil.copy(os.path.join(boot, vmlinuz), os.path.join(scratch, "vmlinuz"))
        stage("extracting the uncompressed kernel (vmlinux, for Firecracker)")
        from ._vmlinux import VmlinuxError, extract_vmlinux

        vmlinux = os.path.join(directory, "vmlinux")
        try:
            extract_vmlinux(os.path.join(scratch, "vmlinuz"), os.path.join(scratch, "vmlinux"))
        except (VmlinuxError, OSError) as exc:
            # qemu boots the bzImage itself: only the firecracker backend needs this one
            stage(f"no vmlinux, so no firecracker backend for this image: {exc}")
            vmlinux = ""

        stage("writing the initramfs (busybox, modules, init, agent)")
        root = os.path.join(scratch, "initramfs")
        for d in ("bin", "dev", "proc", "sys", "tmp", "lib/modules"):
            os.makedirs(os.path.join(root, d))
        shutil.copy(busybox, os.path.join(root, "bin", "busybox"))
        applets = subprocess.run(
            [busybox, "--list"], capture_output=True, text=True, check=False
        ).stdout.split()
        for applet in applets:
            if applet != "busybox":
                os.symlink("busybox", os.path.join(root, "bin", applet))
        modules = os.path.join(unpacked, "lib", "modules", release, "kernel")
        names: list[str] = []
        vsock_names: list[str] = []
        for module in (*MODULES, *VSOCK_MODULES):
            name = os.path.basename(module)
            source = os.path.join(modules, module + ".ko")
            if os.path.isfile(source):
                shutil.copy(source, os.path.join(root, "lib", "modules", name + ".ko"))
                (vsock_names if module in VSOCK_MODULES else names).append(name)
            elif not os.path.isfile(source + ".xz"):
                continue  # built into this kernel
            else:
                raise ImageBuildFailed(
                    f"Failed to build the VM image: {module}.ko is compressed in {package}"
                )
        with open(os.path.join(root, "modules"), "w", encoding="utf-8") as f:
            f.write("\n".join(names) + "\n")
        with open(os.path.join(root, "modules-vsock"), "w", encoding="utf-8") as f:
            f.write("\n".join(vsock_names) + "\n")
        with open(os.path.join(root, "init"), "w", encoding="utf-8") as f:
            f.write(INIT)
        os.chmod(os.path.join(root, "init"), 0o755)  # noqa: S103 - the guest's init program
        shutil.copy(agent, os.path.join(root, "agent"))
        listing = subprocess.run(
            ["find", ".", "-mindepth", "1"], cwd=root, capture_output=True, check=True
        ).stdout
        with open(os.path.join(scratch, "initramfs.cpio"), "wb") as out:
            result = subprocess.run(
                [busybox, "cpio", "-o", "-H", "newc"],
                cwd=root,
                input=listing,
                stdout=out,
                stderr=subprocess.PIPE,
                check=False,
            )
        if result.returncode != 0:
            raise ImageBuildFailed(f"Failed to build the VM image: cpio: {result.stderr!r}")
        shutil.rmtree(root)
        shutil.rmtree(unpacked)
        shutil.rmtree(downloads)

        stage(f"mkfs.ext4 -d {image.rootfs} (read-only root disk)")
        used = int(
            subprocess.run(
                ["du", "-sk", "--apparent-size", image.rootfs],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()[0]
        )
        size_mb = used * 13 // 10 // 1024 + 64
        disk = os.path.join(scratch, "rootfs.ext4")
        _run(
            [
                mkfs,
                "-q",
                "-F",
                "-t",
                "ext4",
                "-L",
                "corral-root",
                "-d",
                image.rootfs,
                "-E",
                "root_owner=0:0",
                "-O",
                "^has_journal",
                disk,
                f"{size_mb}M",
            ],
            "mkfs.ext4",
            env=dict(os.environ, E2FSPROGS_FAKE_TIME="1700000000"),
        )
        record = {
            "name": image.name,
            "directory": directory,
            "kernel": os.path.join(directory, "vmlinuz"),
            "vmlinux": vmlinux,
            "initrd": os.path.join(directory, "initramfs.cpio"),
            "disk": os.path.join(directory, "rootfs.ext4"),
            "release": release,
            "key": key,
            "agent": _digest(agent),
            "builder": VM_BUILDER_VERSION,
        }
        _write_json(os.path.join(scratch, "vm.json"), record)
        shutil.rmtree(directory, ignore_errors=True)
        os.rename(scratch, directory)
        return record
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
