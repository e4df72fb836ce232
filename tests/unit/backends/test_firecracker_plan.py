"""The firecracker backend's plans, refusals and Firecracker config files (pure: no VM boots).

Everything here is what runs unchanged on a host where Firecracker boots:
the config file a policy turns into, the workspace views, the refusals.
"""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from corral._exceptions import BackendUnavailable, EnforcementUnavailable
from corral.backends import HostFacts, PreviewSpec, get_backend
from corral.backends._firecracker_vm import FirecrackerConfig, boot_args, firecracker_config
from corral.backends.microvm import FD_CONFIG
from corral.images._vm import AGENT_VSOCK_PORT, INIT
from corral.images._vmlinux import VmlinuxError, extract_vmlinux
from corral.pipeline._request import ExecRequest
from corral.policy import Policy

WS = "/work/proj"
SECRET = "/work/proj/.env"
LOCKED = "/work/proj/locked"
PREVIEW = PreviewSpec(
    id="pv-1",
    mechanism="overlay",
    workspace=WS,
    upper="/state/previews/pv-1/upper",
    work="/state/previews/pv-1/work",
)


def _facts(uid: int = 0, **details: object) -> HostFacts:
    base: dict[str, object] = {
        "firecracker": "/usr/local/bin/firecracker",
        "firecracker_version": (1, 10),
        "image_name": "python",
        "image_problem": None,
        "vm_kernel": "/cache/vm/vmlinux",
        "vm_initrd": "/cache/vm/initramfs.cpio",
        "vm_disk": "/cache/vm/rootfs.ext4",
        "kvm_problem": None,
        "relay": "/corral/_bin/corral-vm-relay",
        "mkfs": "/usr/sbin/mkfs.ext4",
        "debugfs": "/usr/sbin/debugfs",
        "bwrap": "/usr/bin/bwrap",
    }
    base.update(details)
    return HostFacts(
        uid=uid,
        gid=uid,
        home="/root",
        arch="x86_64",
        helper="/opt/corral-exec",
        path_kinds=((WS, "dir"), (SECRET, "file"), (LOCKED, "dir")),
        environ=(("PATH", "/usr/bin:/bin"), ("SECRET_TOKEN", "x")),
        details=tuple(sorted(base.items())),
    )


def _policy(**fs: object) -> Policy:
    policy = Policy.for_workspace(WS, home="/root").replace(backend="firecracker", isolation="vm")
    return policy.replace(filesystem=policy.filesystem.replace(**fs))


def _request() -> ExecRequest:
    return ExecRequest.from_argv(["python3", "-V"], cwd=WS, sandbox_id="sbx-1")


def _config(plan: object) -> dict[str, object]:
    spec = next(f for f in plan.fds if f.number == FD_CONFIG)  # type: ignore[attr-defined]
    return json.loads(spec.data)  # type: ignore[no-any-return]


def test_a_read_only_run_boots_the_vmlinux_with_a_read_only_workspace_image_and_no_nic() -> None:
    policy = _policy(read_only=True, deny_read=(SECRET,))
    plan = get_backend("firecracker").plan(_request(), policy, _facts())
    config = _config(plan)
    vm, share = config["vm"], config["share"]
    memory = (policy.resources.memory or 0) // (1 << 20) + 160  # the qemu engine's sizing
    assert vm == {
        "firecracker": "/usr/local/bin/firecracker",
        "kernel": "/cache/vm/vmlinux",
        "initrd": "/cache/vm/initramfs.cpio",
        "disk": "/cache/vm/rootfs.ext4",
        "memory_mb": memory,
        "cpus": 1,
    }
    assert share["read_only"] is True and share["back"] == []  # nothing is read back
    build = share["build"]
    assert 'mount -o remount,bind,ro "$v"' in build[2]  # the image is made of the read-only view
    assert build[2].endswith('exec "$@"')  # ... then mkfs.ext4 -d runs in that namespace
    assert ".env" in build[4:]  # masked in the view, so absent from the image
    env = dict(config["exec"]["env"])  # type: ignore[index]
    assert "SECRET_TOKEN" not in env
    document = firecracker_config(
        FirecrackerConfig(**vm),
        workspace_image="/run/ws.ext4",
        read_only=share["read_only"],
        vsock_uds="/run/v.sock",
    )
    assert document["network-interfaces"] == []
    assert document["drives"] == [
        {"drive_id": "root", "path_on_host": "/cache/vm/rootfs.ext4", "is_root_device": False,
         "is_read_only": True},
        {"drive_id": "workspace", "path_on_host": "/run/ws.ext4", "is_root_device": False,
         "is_read_only": True},
    ]  # fmt: skip
    assert document["machine-config"] == {"vcpu_count": 1, "mem_size_mib": memory, "smt": False}
    assert document["vsock"] == {"guest_cid": 3, "uds_path": "/run/v.sock"}
    boot = document["boot-source"]
    assert boot["kernel_image_path"] == "/cache/vm/vmlinux"  # type: ignore[index]
    assert "corral.agent=vsock" in boot["boot_args"] and "corral.ws=ro" in boot["boot_args"]  # type: ignore[index]


def test_a_preview_run_gets_a_writable_image_read_back_without_secrets_or_denied_paths() -> None:
    policy = _policy(deny_read=(SECRET,), deny_write=(LOCKED,))
    policy = policy.replace(resources=policy.resources.replace(memory=256 << 20, cpus=2))
    plan = get_backend("firecracker").plan(_request(), policy, _facts(), PREVIEW)
    config = _config(plan)
    share = config["share"]
    assert share["read_only"] is False
    assert "lowerdir=/work/proj,upperdir=/state/previews/pv-1/upper" in " ".join(share["build"])
    back = share["back"]
    assert back and 'mount -o remount,bind,ro "$v"\n' not in back[2]  # the view is writable
    assert sorted(share["masks"]) == [".env", "locked"]  # neither read nor written back
    assert share["sources"] == [WS, "/state/previews/pv-1/upper"]
    assert (config["vm"]["memory_mb"], config["vm"]["cpus"]) == (256 + 160, 2)  # type: ignore[index]
    assert boot_args(workspace_read_only=False).endswith("corral.ws=rw")


def test_where_nothing_is_there_every_reason_is_given() -> None:
    facts = _facts(
        uid=1000,
        firecracker=None,
        firecracker_version=None,
        kvm_problem="a trial KVM boot hung for 8 s",
        vm_kernel=None,
    )
    with pytest.raises(BackendUnavailable) as info:
        get_backend("firecracker").plan(_request(), _policy(read_only=True), facts)
    message = str(info.value)
    assert "no firecracker binary on PATH" in message
    assert "KVM does not run standard guests here: a trial KVM boot hung" in message
    assert "root only" in message
    assert "corral image build python --vm" in message


def test_an_old_firecracker_or_another_architecture_is_refused() -> None:
    problem = get_backend("firecracker").problem(_facts(firecracker_version=(1, 7)))
    assert problem is not None and "older than 1.8" in problem
    assert get_backend("firecracker").problem(_facts()) is None
    problem = get_backend("firecracker").problem(_facts().replace(arch="aarch64"))
    assert problem is not None and "x86_64 guests only (this is aarch64)" in problem


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"network": "allowlist"}, "network.mode"),
        ({"network": "open"}, "network.mode"),
        ({"writable_without_preview": True}, "filesystem.workspace"),
        ({"credentials": True}, "credentials"),
    ],
)
def test_what_the_engine_cannot_enforce_is_refused(change: dict[str, object], rule: str) -> None:
    policy = _policy(read_only="writable_without_preview" not in change)
    if "network" in change:
        policy = policy.replace(
            network=policy.network.replace(mode=change["network"], allow=("pypi.org",))
        )
    if "credentials" in change:
        from corral.policy._model import Credential

        policy = policy.replace(credentials=(Credential(name="GH", source="env:GH"),))
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("firecracker").plan(_request(), policy, _facts())
    assert info.value.rule == rule  # the CLI exits 125 with it


def test_the_guest_init_selects_the_transport_from_the_kernel_command_line() -> None:
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed")
    subprocess.run([busybox, "sh", "-n", "-c", INIT], check=True)  # the script parses
    assert '*" corral.agent=vsock "*)' in INIT
    assert f"agent=vsock:2:{AGENT_VSOCK_PORT}" in INIT
    assert "/sys/class/virtio-ports/" in INIT  # qemu's virtio-serial port otherwise


def _bzimage(payload: bytes) -> bytes:
    """A minimal bzImage: boot sector and setup header (2.08), then the payload."""
    setup_sects = 1
    head = bytearray((setup_sects + 1) * 512)
    head[0x1F1] = setup_sects
    head[0x202:0x206] = b"HdrS"
    struct.pack_into("<H", head, 0x206, 0x20F)
    struct.pack_into("<II", head, 0x248, 16, len(payload))
    return bytes(head) + b"\0" * 16 + payload


ELF = b"\x7fELF\x02\x01\x01" + b"\0" * 11 + b"\x3e\x00" + b"kernel body" * 100


@pytest.mark.parametrize("kind", ["gzip", "xz", "lz4"])
def test_the_elf_kernel_comes_out_of_a_bzimage(tmp_path: Path, kind: str) -> None:
    size = struct.pack("<I", len(ELF))  # the kernel build appends the size
    if kind == "gzip":
        payload = gzip.compress(ELF)
    elif kind == "xz":
        payload = lzma.compress(ELF, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)
    else:
        if shutil.which("lz4") is None:
            pytest.skip("lz4 is not installed")
        payload = subprocess.run(["lz4", "-l", "-c"], input=ELF, capture_output=True).stdout
    (tmp_path / "vmlinuz").write_bytes(_bzimage(payload + size))
    extract_vmlinux(str(tmp_path / "vmlinuz"), str(tmp_path / "vmlinux"))
    assert (tmp_path / "vmlinux").read_bytes() == ELF


def test_what_is_not_a_bzimage_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vmlinuz").write_bytes(b"\0" * 4096)
    with pytest.raises(VmlinuxError, match="not a bzImage"):
        extract_vmlinux(str(tmp_path / "vmlinuz"), str(tmp_path / "vmlinux"))
    not_elf = gzip.compress(b"MZ" + b"\0" * 100) + b"\0\0\0\0"
    (tmp_path / "vmlinuz").write_bytes(_bzimage(not_elf))
    with pytest.raises(VmlinuxError, match="not an x86_64 ELF"):
        extract_vmlinux(str(tmp_path / "vmlinuz"), str(tmp_path / "vmlinux"))
