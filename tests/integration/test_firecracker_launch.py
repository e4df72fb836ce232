"""The firecracker backend's host side end to end, with a stand-in for the VMM.

Firecracker cannot boot here (no binary, no working KVM), so a small program
plays its part: it is started exactly as firecracker would be (``--no-api
--config-file F``, in the VM's cgroup), records what it was given, connects
to ``<uds_path>_1024`` as Firecracker does when the guest's agent connects,
and answers the agent's frames; a command's "guest writes" are made with
debugfs on the workspace drive the config file names, as a guest kernel
would write it. Everything else is corral's real code: the plan, the
workspace image, the relay under corral's engine, the flush, the read-back
into the preview, the teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest

from corral._exceptions import BackendUnavailable
from corral.backends import HostFacts, get_backend, helper_path
from corral.backends.microvm import relay_path
from corral.pipeline._request import ExecRequest
from corral.policy import Policy
from corral.preview import Preview

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the firecracker backend runs as root only"),
    pytest.mark.skipif(
        not shutil.which("debugfs", path="/usr/sbin:/sbin")
        or not shutil.which("bwrap")
        or helper_path() is None,
        reason="needs e2fsprogs, bubblewrap and corral's exec helper",
    ),
]

STAND_IN = r"""#!@PYTHON@ -I
import json, os, socket, struct, subprocess, sys
RECORD = "@RECORD@"
config = json.load(open(sys.argv[3]))
uds = config["vsock"]["uds_path"]
with open(RECORD, "w") as f:
    json.dump({"argv": sys.argv[1:], "config": config, "cgroup": open("/proc/self/cgroup").read(),
               "listening": os.path.exists(uds + "_1024"), "pid": os.getpid()}, f)
sock = socket.socket(socket.AF_UNIX)
sock.connect(uds + "_1024")           # the guest agent's vsock connection, relayed
def send(kind, payload=b""):
    sock.sendall(kind + struct.pack(">I", len(payload)) + payload)
def recv_exact(n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data
send(b"R", b"standin-release")
image = config["drives"][1]["path_on_host"]
while True:
    head = recv_exact(5)
    kind, payload = head[:1], recv_exact(struct.unpack(">I", head[1:])[0])
    if kind == b"M":
        send(b"m")
    elif kind == b"E":
        fields = payload.split(b"\0")
        argc = int(fields[8])
        argv = [a.decode() for a in fields[9:9 + argc]]
        with open(RECORD + ".commands", "a") as f:
            f.write(json.dumps(argv) + "\n")
        if argv[0] in ("debugfs-script", "debugfs-then-hang"):   # the "guest" writes its disk
            subprocess.run(["/usr/sbin/debugfs", "-w", "-f", "-", image],
                           input=argv[1].encode(), capture_output=True, check=True)
            send(b"1", b"done\n")
            if argv[0] == "debugfs-then-hang":  # ... and does not stop when asked ('T')
                while True:
                    head = recv_exact(5)
                    recv_exact(struct.unpack(">I", head[1:])[0])
                    if head[:1] == b"K":
                        with open(RECORD + ".killed", "w") as f:
                            f.write("K")
                        break
                send(b"X", b"signal 9\0")
                continue
        elif argv[0] == "debugfs-cat":    # the "guest" reads a file of its workspace disk
            out = subprocess.run(["/usr/sbin/debugfs", "-R", "cat " + argv[1], image],
                                 capture_output=True).stdout
            send(b"1", out or b"(empty)")
        send(b"X", b"exit 0\0")
"""


def _stand_in(tmp: Path) -> tuple[str, Path]:
    record = tmp / "record.json"
    script = tmp / "firecracker"
    script.write_text(STAND_IN.replace("@PYTHON@", sys.executable).replace("@RECORD@", str(record)))
    script.chmod(0o755)
    return str(script), record


def _facts(firecracker: str, workspace: str) -> HostFacts:
    details: dict[str, object] = {
        "firecracker": firecracker,
        "firecracker_version": (1, 10),
        "image_name": "python",
        "image_problem": None,
        "vm_kernel": "/nonexistent/vmlinux",
        "vm_initrd": "/nonexistent/initramfs.cpio",
        "vm_disk": "/nonexistent/rootfs.ext4",
        "kvm_problem": None,
        "relay": relay_path(),
        "mkfs": shutil.which("mkfs.ext4", path="/usr/sbin:/sbin"),
        "debugfs": shutil.which("debugfs", path="/usr/sbin:/sbin"),
        "bwrap": shutil.which("bwrap"),
    }
    return HostFacts(
        uid=0,
        gid=0,
        home="/root",
        arch="x86_64",
        helper=helper_path(),
        path_kinds=((workspace, "dir"),),
        environ=(("PATH", "/usr/bin:/bin"),),
        details=tuple(sorted(details.items())),
    )


def _run_dirs() -> list[str]:
    """The VM run directories of this process (other VMs on the machine have their own)."""
    mine = f"corral-vm-{os.getpid()}-"
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(mine)]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")
    except FileNotFoundError:
        return True


def test_a_preview_run_brings_the_guests_disk_writes_back_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    (ws / "gone.txt").write_text("bye\n")
    firecracker, record = _stand_in(tmp_path)
    blob = tmp_path / "new"
    blob.write_text("new\n")
    writes = f"rm a.txt\nwrite {blob} a.txt\nrm gone.txt\nwrite {blob} b.txt\n"
    policy = Policy.for_workspace(str(ws), home="/root").replace(backend="firecracker")
    request = ExecRequest.from_argv(["debugfs-script", writes], cwd=str(ws), sandbox_id="sbx-fc")
    preview = Preview.create(str(ws), state_dir=str(tmp_path / "state"), mechanism="overlay")
    try:
        backend = get_backend("firecracker")
        plan = backend.plan(request, policy, _facts(firecracker, str(ws)), preview.spec())
        outcome = backend.launch(plan, request)
        assert outcome.exit_code == 0, outcome
        assert outcome.stdout == b"done\n"
        changes = {c.path: c.kind for c in preview.changes()}
        assert changes == {"a.txt": "modified", "b.txt": "added", "gone.txt": "deleted"}
    finally:
        preview.discard()
    assert (ws / "a.txt").read_text() == "old\n" and (ws / "gone.txt").exists()
    seen = json.loads(record.read_text())
    commands = Path(f"{record}.commands").read_text().splitlines()
    assert json.loads(commands[-1]) == ["/bin/sync"]  # flushed before the disk was read
    assert seen["argv"][:2] == ["--no-api", "--config-file"]
    assert seen["listening"], "corral did not listen on <uds_path>_1024 before the VMM started"
    config = seen["config"]
    assert config["network-interfaces"] == []
    assert config["drives"][0]["is_read_only"] is True
    assert config["drives"][1]["is_read_only"] is False  # a preview run: writable image
    assert "corral.ws=rw" in config["boot-source"]["boot_args"]
    assert "-vm-" in seen["cgroup"]  # born in the VM's own cgroup
    assert _gone(seen["pid"])  # killed with the run
    # the run directory (config file, sockets, the workspace image) is gone
    assert _run_dirs() == []
    assert not os.path.exists(config["drives"][1]["path_on_host"])


def test_a_read_only_run_attaches_a_read_only_image_and_reads_nothing_back(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    (ws / "secret").write_text("s3cret\n")
    firecracker, record = _stand_in(tmp_path)
    policy = Policy.for_workspace(str(ws), home="/root").replace(backend="firecracker")
    policy = policy.replace(
        filesystem=policy.filesystem.replace(read_only=True, deny_read=(str(ws / "secret"),))
    )
    facts = _facts(firecracker, str(ws))
    facts = facts.replace(path_kinds=((str(ws), "dir"), (str(ws / "secret"), "file")))
    # the "guest" reads the secret's inode on its workspace disk: the mask must hold
    request = ExecRequest.from_argv(["debugfs-cat", "secret"], cwd=str(ws))
    backend = get_backend("firecracker")
    plan = backend.plan(request, policy, facts)
    outcome = backend.launch(plan, request)
    assert outcome.exit_code == 0, outcome
    assert outcome.stdout == b"(empty)"  # the image holds no byte of it
    config = json.loads(record.read_text())["config"]
    assert config["drives"][1]["is_read_only"] is True
    assert "corral.ws=ro" in config["boot-source"]["boot_args"]
    assert (ws / "a.txt").read_text() == "old\n"
    assert stat.S_ISREG(os.stat(ws / "secret").st_mode)  # the mask was in a private namespace
    assert (ws / "secret").read_text() == "s3cret\n"


def test_a_vmm_that_dies_at_boot_fails_the_run_clearly_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    dying = tmp_path / "firecracker"
    dying.write_text("#!/bin/sh\necho 'no KVM for you' >&2\nexit 3\n")
    dying.chmod(0o755)
    policy = Policy.for_workspace(str(ws), home="/root").replace(backend="firecracker")
    policy = policy.replace(filesystem=policy.filesystem.replace(read_only=True))
    request = ExecRequest.from_argv(["true"], cwd=str(ws))
    backend = get_backend("firecracker")
    plan = backend.plan(request, policy, _facts(str(dying), str(ws)))
    with pytest.raises(BackendUnavailable, match="firecracker exited 3: no KVM for you"):
        backend.launch(plan, request)
    assert _run_dirs() == []


def test_a_command_that_outlives_its_timeout_is_killed_and_its_writes_still_come_back(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    firecracker, record = _stand_in(tmp_path)
    blob = tmp_path / "new"
    blob.write_text("new\n")
    policy = Policy.for_workspace(str(ws), home="/root").replace(backend="firecracker")
    policy = policy.replace(resources=policy.resources.replace(kill_grace=0.5))
    request = ExecRequest.from_argv(
        ["debugfs-then-hang", f"rm a.txt\nwrite {blob} a.txt\n"], cwd=str(ws), timeout=1.0
    )
    preview = Preview.create(str(ws), state_dir=str(tmp_path / "state"), mechanism="overlay")
    try:
        backend = get_backend("firecracker")
        plan = backend.plan(request, policy, _facts(firecracker, str(ws)), preview.spec())
        outcome = backend.launch(plan, request)
        assert outcome.timed_out, outcome
        # the relay was killed before the agent reported the end: corral killed the
        # command in the guest ('K'), had it flush, then read the disk back
        assert Path(f"{record}.killed").exists()
        assert {c.path: c.kind for c in preview.changes()} == {"a.txt": "modified"}
    finally:
        preview.discard()
    assert (ws / "a.txt").read_text() == "old\n"


def test_a_guests_sparse_file_past_the_image_fails_the_run_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """The read-back's bound under the real launch: a guest's file that claims 16 TiB
    (no block behind it) in its ~1 GiB image fails the run naming the bound, with the
    preview unchanged and the run directory gone."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    firecracker, _record = _stand_in(tmp_path)
    writes = "write /dev/null big\nsif big size 0xfffffffffff\n"
    policy = Policy.for_workspace(str(ws), home="/root").replace(backend="firecracker")
    request = ExecRequest.from_argv(["debugfs-script", writes], cwd=str(ws))
    preview = Preview.create(str(ws), state_dir=str(tmp_path / "state"), mechanism="overlay")
    try:
        backend = get_backend("firecracker")
        plan = backend.plan(request, policy, _facts(firecracker, str(ws)), preview.spec())
        with pytest.raises(BackendUnavailable, match=r"read-back's bound of \d+ bytes"):
            backend.launch(plan, request)
        assert not preview.changes()
    finally:
        preview.discard()
    assert _run_dirs() == []
    assert sorted(p.name for p in ws.iterdir()) == ["a.txt"]
