"""The microvm backend with real qemu guests: escapes, preview, a killed host side, timeout.

Every test boots real VMs (TCG on this class of machine: seconds each), so
the module boots as few as it can: one VM runs every escape attempt and the
preview round trip, one is killed from the host mid-run, one times out. The
VM artifacts are built once (``corral image build python --vm``, reused
from the cache afterwards) by :func:`vm_cache`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import SECRET_ENV_VALUE, World
from tests.integration.conftest import AnsweringHTTP, needs_microvm

pytestmark = needs_microvm  # vm_cache: tests/integration/conftest.py


def _qemu_processes(root: str) -> list[str]:
    """Live qemu and virtiofsd processes of this test's VMs: started by this process, or
    by a corral working under *root* (the world's; other engineers' VMs run on this host)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        ours = int(fields[1]) == os.getpid() or cwd == root or cwd.startswith(root + "/")
        if ours and fields[0] != "Z" and ("corral-ws" in cmdline or "corral.agent" in cmdline):
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def _run_dirs(pid: int) -> list[str]:
    """The run directories of process *pid*'s VMs (others' VMs may boot on this host)."""
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"corral-vm-{pid}-")]


@pytest.fixture
def vm_world(world: World, vm_cache: str) -> Iterator[World]:
    world.environ["XDG_CACHE_HOME"] = vm_cache
    yield world
    deadline = time.monotonic() + 10
    while _qemu_processes(world.root) and time.monotonic() < deadline:
        time.sleep(0.1)  # a VM powering off after its last frame
    assert not _qemu_processes(world.root), "qemu or virtiofsd outlived the test"


PROBE = r"""
import json, os, platform, socket, sys
r = {"release": platform.release()}
def attempt(name, fn):
    try:
        r[name] = ["ok", fn()]
    except Exception as exc:
        r[name] = ["failed", type(exc).__name__]
def write_outside():
    with open(sys.argv[1], "w") as f:
        f.write("pwned")
    return "written in the guest only"
attempt("write_outside", write_outside)
attempt("read_home_secret", lambda: open(sys.argv[2]).read())
attempt("read_ws_secret", lambda: open(sys.argv[3]).read())
def connect_tcp():
    s = socket.create_connection(("127.0.0.1", int(sys.argv[4])), timeout=3)
    s.sendall(b"leak")
    return "connected"
attempt("tcp", connect_tcp)
# a device node would land on the host's disk (the preview's upper layer), made by root
attempt("mknod", lambda: os.mknod("dev-mem", 0o20666, os.makedev(1, 1)))
def connect_unix():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[5])
    s.sendall(b"leak")
    return "connected"
attempt("unix", connect_unix)
r["cmdlines"] = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            r["cmdlines"].append(open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"))
        except OSError:
            pass
r["env_token"] = os.environ.get("SECRET_TOKEN")
r["net"] = sorted(os.listdir("/sys/class/net"))
with open("made-in-vm.txt", "w") as f:
    f.write("from the guest\n")
print(json.dumps(r))
"""


def test_escapes_fail_and_changes_come_back_only_through_preview(vm_world: World) -> None:
    """One guest: its own kernel; writes outside, secrets, host processes, TCP, unix sockets
    all fail; the workspace change lands only through the preview and `corral apply`."""
    w = vm_world
    ws_secret = w.write(w.ws(".env"), "WS_SECRET=corral-ws-secret\n")
    w.write(w.ws("probe.py"), PROBE)
    before = w.tree()
    marker = f"corral-host-marker-{os.getpid()}"
    host_proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    unix_path = w.ws("host.sock")
    unix_listener = socket.socket(socket.AF_UNIX)
    unix_listener.bind(unix_path)
    unix_listener.listen(4)
    unix_listener.settimeout(0.2)
    received: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            for name, sock in (("tcp", listener), ("unix", unix_listener)):
                try:
                    conn, _ = sock.accept()
                    received.append(name)
                    conn.close()
                except OSError:
                    pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        result = w.corral(
            "preview", "--backend", "microvm", "--deny-read", ws_secret, "--",
            "python3", "probe.py", w.victim, w.secret, ws_secret,
            str(listener.getsockname()[1]), unix_path,
            timeout=300,
        )  # fmt: skip
    finally:
        stop.set()
        thread.join()
        host_proc.kill()
        host_proc.wait()
        listener.close()
        unix_listener.close()
        os.unlink(unix_path)
    assert result.returncode == 0, result.stderr.decode()
    r = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert r["release"] != os.uname().release and r["release"].endswith("-cloud-amd64")
    assert r["write_outside"][0] == "failed" or r["write_outside"][1] == "written in the guest only"
    assert r["read_home_secret"] == ["failed", "FileNotFoundError"]
    assert r["read_ws_secret"][0] == "failed" or r["read_ws_secret"][1] == ""
    assert r["tcp"][0] == "failed" and r["unix"][0] == "failed"
    assert r["mknod"] == ["failed", "PermissionError"]
    assert received == []
    assert not any(marker in c for c in r["cmdlines"])
    assert r["env_token"] is None
    assert r["net"] == ["lo"]  # no NIC (network.mode none)
    # the host: nothing outside changed, the workspace untouched until apply
    after = w.tree()
    assert after == before
    assert not os.path.exists(w.ws("made-in-vm.txt"))
    assert SECRET_ENV_VALUE.encode() not in result.stdout
    preview_id = result.stderr.decode().split("preview ", 1)[1].split()[0]
    applied = w.corral("apply", preview_id)
    assert applied.returncode == 0, applied.stderr.decode()
    assert w.read(w.ws("made-in-vm.txt")) == "from the guest\n"


def test_killing_the_host_side_leaves_no_qemu_socket_or_temp_file(vm_world: World) -> None:
    """SIGKILL to `corral run` mid-command: qemu and virtiofsd die, no run directory stays."""
    w = vm_world
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "run", "--backend", "microvm", "--read-only", "--",
         "sh", "-c", "echo started; exec sleep 60"],
        cwd=w.workspace, env=w.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == b"started\n", proc.stderr.read() if proc.stderr else b""
    assert _qemu_processes(w.root)
    assert _run_dirs(proc.pid) == []  # removed once the agent was ready
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    if proc.stderr is not None:
        proc.stderr.close()
    deadline = time.monotonic() + 10
    while (_qemu_processes(w.root) or _in_directory(w.workspace)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _qemu_processes(w.root) == []
    assert _in_directory(w.workspace) == []  # nothing of the run (relay, daemons) is left
    assert _run_dirs(proc.pid) == []


def test_ctrl_c_reaches_the_guest_command_through_the_relay(vm_world: World) -> None:
    """SIGINT to `corral run` goes to the command's process group in the guest
    (corral-vm-relay's 'S' frame): its trap runs and its exit status comes back."""
    w = vm_world
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "run", "--backend", "microvm", "--read-only", "--",
         "sh", "-c", 'trap "echo got-int; exit 3" INT; echo ready; while :; do sleep 0.1; done'],
        cwd=w.workspace, env=w.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line == b"ready\n", proc.stderr.read() if proc.stderr else b""
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, rest) == (3, b"got-int\n"), err


def _in_directory(path: str) -> list[str]:
    """Processes (zombies included) whose working directory is *path*."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.readlink(f"/proc/{pid}/cwd") == path:
                    found.append(pid)
            except OSError:
                continue
    return found


def test_timeout_stops_the_guest_command(vm_world: World) -> None:
    """resources.timeout counts from the command's start (not the boot) and ends it (124)."""
    started = time.monotonic()
    result = vm_world.corral(
        "run", "--backend", "microvm", "--read-only", "--timeout", "3", "--",
        "sh", "-c", "echo before; sleep 60; echo after",
        timeout=120,
    )  # fmt: skip
    assert time.monotonic() - started < 50  # boot, 3 s, grace
    assert result.returncode == 124, result.stderr.decode()
    assert result.stdout == b"before\n"
    assert b"timed out after 3s" in result.stderr


#: Guest root takes the agent's port from pid 1 (pidfd_getfd) and announces a
#: frame longer than the agent ever sends, then keeps the port open.
FORGE = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
port = next(int(n) for n in os.listdir("/proc/1/fd") if "vport" in os.readlink(f"/proc/1/fd/{n}"))
fd = libc.syscall(438, os.pidfd_open(1), port, 0)
assert fd >= 0, ctypes.get_errno()
os.write(fd, b"1" + (0xFFFFFFFF).to_bytes(4, "big") + b"x" * 65536)
print("forged", flush=True)
time.sleep(60)
"""


def test_a_forged_oversized_agent_frame_is_refused_not_buffered(vm_world: World) -> None:
    """The guest's root can speak on the agent's port; the host relay refuses a frame of
    4 GiB at once (exit 125) instead of buffering guest data without bound until the timeout."""
    started = time.monotonic()
    result = vm_world.corral(
        "run", "--backend", "microvm", "--read-only", "--timeout", "40", "--max-output", "1M",
        "--", "python3", "-c", FORGE,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 125, result.stderr.decode()
    assert b"broke the agent protocol: a frame of 4294967295 bytes" in result.stderr
    assert time.monotonic() - started < 35  # refused at the header, not at the timeout


def _pids_max(pid: int) -> str:
    """``pids.max`` of *pid*'s cgroup (v1 ``pids`` controller or v2), ``"max"`` if none."""
    with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _id, controllers, path in lines:
        where = None
        if "pids" in controllers.split(","):
            where = f"/sys/fs/cgroup/pids{path}"
        elif controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            where = f"/sys/fs/cgroup{path}"
        if where is not None:
            try:
                with open(os.path.join(where, "pids.max"), encoding="utf-8") as f:
                    return f.read().strip()
            except OSError:
                return "max"  # the root cgroup has no limit
    return "max"


CONNECTIONS = r"""
import socket, time
held = [socket.create_connection(("10.0.2.100", 3128), timeout=10) for _ in range(8)]
print("open", len(held), flush=True)
time.sleep(30)
"""


def test_the_host_processes_a_guest_makes_are_bounded(vm_world: World) -> None:
    """qemu's user network starts a host socat per guest connection to the proxy: each is
    born in the VM's own cgroup (pids.max), killed with the VM."""
    w = vm_world
    proc = subprocess.Popen(
        [sys.executable, "-m", "corral", "run", "--backend", "microvm", "--read-only",
         "--net", "allowlist", "--allow-host", "example.test", "--timeout", "60",
         "--", "python3", "-c", CONNECTIONS],
        cwd=w.workspace, env=w.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        line = proc.stdout.readline()
        assert line == b"open 8\n", proc.stderr.read()
        marker = f"corral-vm-{proc.pid}-"
        served: list[int] = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"UNIX-CONNECT:" in cmdline and marker.encode() in cmdline:
                served.append(int(pid))
        assert len(served) >= 8  # a host process per guest connection
        assert [_pids_max(pid) for pid in served if _pids_max(pid) == "max"] == []
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    # corral killed: qemu dies with it, and each forwarder with its connection's end
    deadline = time.monotonic() + 10
    while [p for p in served if os.path.exists(f"/proc/{p}")] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in served if os.path.exists(f"/proc/{p}")] == []


def test_warm_pool_hands_each_vm_out_once(vm_world: World) -> None:
    """Pooled runs: the second run takes a VM booted in the background, never the first's;
    closing the pool destroys the idle VMs."""
    from corral.backends._microvm_pool import VmPool
    from corral.backends.microvm import set_pool
    from corral.pipeline._request import ExecRequest
    from corral.pipeline._runner import launch, prepare
    from corral.policy import load_settings

    w = vm_world
    policy = load_settings(
        cwd=w.workspace,
        workspace=w.workspace,
        environ=w.environ,
        flags={"backend": "microvm", "isolation": "vm", "filesystem": {"readOnly": True}},
    ).policy
    script = "test -e /tmp/used && echo REUSED; touch /tmp/used; cat README"
    pool = VmPool(size=1)
    previous = set_pool(pool)
    try:
        outputs = []
        for _ in range(2):
            request = ExecRequest.from_argv(["sh", "-c", script], cwd=w.workspace)
            prepared = prepare(request, policy, environ=w.environ)
            outcome = launch(prepared, request)
            assert outcome.returncode == 0, outcome.text("stderr")
            outputs.append(outcome.text("stdout"))
        assert outputs == ["hello\n", "hello\n"]  # never the same VM twice
    finally:
        set_pool(previous)
        pool.close()
    deadline = time.monotonic() + 10  # handed-out VMs are destroyed in the background
    while _qemu_processes(w.root) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _qemu_processes(w.root) == []


NET_PROBE = r"""
import json, os, socket, sys, urllib.request
port = int(sys.argv[1])
r = {"proxy": os.environ.get("HTTP_PROXY", "").rsplit("@", 1)[-1]}
r["net"] = sorted(os.listdir("/sys/class/net"))
r["allowed"] = urllib.request.urlopen(f"http://example.test:{port}/ok", timeout=30).read().decode()
try:
    urllib.request.urlopen(f"http://evil.test:{port}/evil", timeout=30)
    r["denied"] = "reached"
except Exception as exc:
    r["denied"] = str(exc)
# direct connections bypassing the proxy: the host (slirp's 10.0.2.2 is its loopback),
# the proxy's address on another port, the guest's own loopback, the internet
for host in ("10.0.2.2", "10.0.2.100", "127.0.0.1", "1.1.1.1"):
    try:
        socket.create_connection((host, port), timeout=3).sendall(b"GET /direct HTTP/1.0\r\n\r\n")
        r[host] = "connected"
    except OSError as exc:
        r[host] = type(exc).__name__
print(json.dumps(r))
"""


def test_allowlist_reaches_only_the_proxy_with_the_attempt_log(vm_world: World) -> None:
    """network.mode=allowlist: the guest's one NIC reaches corral's proxy and nothing else;
    an allowed host answers through it, a not-allowed one is refused and is a violation."""
    from corral.pipeline._request import ExecRequest
    from corral.pipeline._runner import launch, prepare
    from corral.policy import load_settings

    w = vm_world
    server = AnsweringHTTP(b"through the proxy")
    port, paths = server.port, server.paths
    hosts = w.write(os.path.join(w.root, "hosts"), "127.0.0.1 example.test evil.test\n")
    environ = {**w.environ, "CORRAL_EGRESS_HOSTS": hosts}
    w.write(w.ws("net_probe.py"), NET_PROBE)
    policy = load_settings(
        cwd=w.workspace,
        workspace=w.workspace,
        environ=environ,
        flags={
            "backend": "microvm",
            "isolation": "vm",
            "filesystem": {"readOnly": True},
            "network": {"mode": "allowlist", "allow": ["example.test", f"127.0.0.1:{port}"]},
        },
    ).policy
    try:
        request = ExecRequest.from_argv(["python3", "net_probe.py", str(port)], cwd=w.workspace)
        outcome = launch(prepare(request, policy, environ=environ), request)
    finally:
        server.close()
    assert outcome.returncode == 0, outcome.text("stderr")
    r = json.loads(outcome.text("stdout").strip().splitlines()[-1])
    assert r["proxy"] == "10.0.2.100:3128"
    assert r["net"] == ["eth0", "lo"]
    assert r["allowed"] == "through the proxy"
    assert "403" in r["denied"]
    assert all(r[h] != "connected" for h in ("10.0.2.2", "10.0.2.100", "127.0.0.1", "1.1.1.1"))
    assert paths == ["/ok"]  # nothing reached the host's server but the allowed request
    decisions = {(a.host, a.decision) for a in outcome.network}
    assert decisions == {("example.test", "allow"), ("evil.test", "deny")}
    assert [(v.kind, v.target) for v in outcome.violations] == [("network", f"evil.test:{port}")]
    # the proxy's socket and the VM's run directory (named after this process) are gone
    assert _run_dirs(os.getpid()) == []
