"""The Firecracker engine's guest side, for real, inside qemu guests of the same kernel.

The image's init, booted with Firecracker's kernel command line and disks,
takes the vsock path. And the guest agent's vsock transport:

This host's kernel has no vsock loopback transport (and CID 2 is this
machine's own VMM, which tests must not contact), so the transport is tested
where a loopback exists: in a microvm guest (qemu, TCG) running the guest
kernel the Firecracker engine boots. The command loads that kernel's
``vsock`` and ``vsock_loopback`` modules (and the transport code they share) (from the same Debian package the
VM image was built from), listens on a vsock port, and starts a second
copy of corral's guest agent with ``vsock:1:PORT`` (CID 1: the guest
itself), in a pid namespace of its own (the agent is a pid 1: its cleanup
``kill(-1)`` and power-off end only that namespace). The agent must
connect, say ready, run a command and stream its output and status over
the socket, exactly as Firecracker's host would see it through
``<uds_path>_PORT``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import needs_microvm

pytestmark = needs_microvm  # vm_cache: tests/integration/conftest.py

GUEST = r"""
import ctypes, os, socket, struct, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
for module in ("vsock.ko", "vmw_vsock_virtio_transport_common.ko", "vsock_loopback.ko"):
    fd = os.open(module, os.O_RDONLY)
    if libc.syscall(313, fd, b"", 0) != 0 and ctypes.get_errno() != 17:  # finit_module
        sys.exit(f"finit_module {module}: {os.strerror(ctypes.get_errno())}")
    os.close(fd)
listener = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
listener.bind((socket.VMADDR_CID_ANY, 5123))
listener.listen(1)
listener.settimeout(30)
agent = subprocess.Popen(["unshare", "--pid", "--fork", "./corral-vm-agent", "vsock:1:5123"])
conn, _ = listener.accept()
conn.settimeout(30)
buf = b""
def frame():
    global buf
    while len(buf) < 5 or len(buf) < 5 + struct.unpack(">I", buf[1:5])[0]:
        chunk = conn.recv(65536)
        if not chunk:
            sys.exit("the agent went away")
        buf += chunk
    n = struct.unpack(">I", buf[1:5])[0]
    kind, payload, buf = buf[:1], buf[5:5 + n], buf[5 + n:]
    return kind, payload
kind, release = frame()
print("ready", kind.decode(), release.decode() == os.uname().release)
fields = ["/", "0", "0", "10000", "1000", "0", "0", "0", "2", "echo", "over vsock", "1", "PATH=/usr/bin:/bin"]
payload = b"".join(f.encode() + b"\0" for f in fields)
conn.sendall(b"E" + struct.pack(">I", len(payload)) + payload + b"i\0\0\0\0")
while True:
    kind, data = frame()
    print("frame", kind.decode(), data.split(b"\0")[0].decode().strip())
    if kind in (b"X", b"F"):
        break
conn.close()
print("agent ended", agent.wait(timeout=30))
"""


@pytest.fixture(scope="module")
def vsock_modules(tmp_path_factory: pytest.TempPathFactory, vm_cache: str) -> Path:
    """The vsock loopback modules of the kernel the VM image was built from (apt)."""
    from corral.images._vm import kernel_package

    package, version = kernel_package()
    scratch = tmp_path_factory.mktemp("kernel")
    got = subprocess.run(
        ["apt-get", "download", "-q", f"{package}={version}"],
        cwd=scratch,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    debs = list(scratch.glob("*.deb"))
    if got.returncode != 0 or not debs:
        pytest.skip(f"the guest kernel's package cannot be downloaded: {got.stderr.strip()[-200:]}")
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(scratch / "x")], check=True)
    found = {p.name: p for p in (scratch / "x").rglob("*.ko") if "vsock" in p.name}
    out = scratch / "modules"
    out.mkdir()
    for name in ("vsock.ko", "vmw_vsock_virtio_transport_common.ko", "vsock_loopback.ko"):
        shutil.copy(found[name], out / name)
    shutil.rmtree(scratch / "x")
    debs[0].unlink()
    return out


def test_the_agent_speaks_its_frames_over_vsock_in_a_real_guest_kernel(
    tmp_path: Path, vm_cache: str, vsock_modules: Path
) -> None:
    from corral.images._vm import agent_path

    agent = agent_path()
    assert agent is not None
    ws = tmp_path / "ws"
    ws.mkdir()
    shutil.copy(agent, ws / "corral-vm-agent")
    for module in vsock_modules.iterdir():
        shutil.copy(module, ws / module.name)
    (ws / "guest.py").write_text(GUEST)
    result = subprocess.run(
        [sys.executable, "-m", "corral", "run", "--backend", "microvm", "--read-only",
         "--timeout", "120", "--", "python3", "guest.py"],
        cwd=ws, env={**os.environ, "XDG_CACHE_HOME": vm_cache},
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "ready R True"  # connected to CID 1, said ready with the kernel's release
    assert "frame 1 over vsock" in lines  # the command's stdout, framed
    assert "frame X exit 0" in lines  # its status
    # the host closed: the agent powered off, which in a pid namespace ends its init as if
    # by SIGINT (pid_namespaces(7)); unshare reports that signal as its own
    assert lines[-1] == "agent ended -2", lines


def test_the_guest_init_takes_the_firecracker_path_from_the_command_line(
    tmp_path: Path, vm_cache: str
) -> None:
    """The image's init under ``corral.agent=vsock corral.ws=rw`` (booted here by qemu with
    two disks, as Firecracker would attach them): it loads the vsock modules, mounts the
    workspace disk and starts the agent on ``vsock:2:1024``."""
    import select
    import time

    from corral.backends.microvm import find_qemu, tsc_khz
    from corral.images import find_built
    from corral.images._vm import find_vm_image

    environ = {**os.environ, "XDG_CACHE_HOME": vm_cache}
    built = find_built("python", environ)
    vm = find_vm_image(built) if built is not None else None
    qemu, _virtiofsd = find_qemu(environ)
    assert vm is not None and qemu is not None
    workspace = tmp_path / "ws.ext4"
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-O", "^has_journal", str(workspace), "16M"], check=True
    )
    cmdline = "console=ttyS0 panic=-1 reboot=t corral.agent=vsock corral.ws=rw"
    if tsc_khz():
        cmdline += f" tsc_early_khz={tsc_khz()} tsc=reliable"
    proc = subprocess.Popen(
        [qemu, "-M", "microvm,x-option-roms=off", "-accel", "tcg", "-cpu", "max", "-m", "256M",
         "-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-no-reboot",
         "-serial", "stdio", "-global", "virtio-mmio.force-legacy=false",
         "-kernel", vm.kernel, "-initrd", vm.initrd, "-append", cmdline,
         "-drive", f"id=root,file={vm.disk},format=raw,if=none,readonly=on",
         "-device", "virtio-blk-device,drive=root",
         "-drive", f"id=ws,file={workspace},format=raw,if=none",
         "-device", "virtio-blk-device,drive=ws"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    console = b""
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while not any(
            line.startswith(b"corral-init: workspace disk mounted")
            for line in console.split(b"\n")[:-1]  # complete lines only
        ):
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, console.decode(errors="replace")[-2000:]
            if select.select([proc.stdout], [], [], min(left, 1.0))[0]:
                console += os.read(proc.stdout.fileno(), 65536)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    text = console.decode(errors="replace")
    assert "corral-init: workspace disk mounted rw; agent on vsock:2:1024" in text
    assert "insmod" not in text  # every module (the vsock ones too) loaded
