"""The guest agent's vsock transport (the Firecracker engine's), for real, inside a qemu guest.

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
