"""SDK and MCP sessions with ``isolation="vm"``: one real qemu VM kept for the session.

The module boots as few VMs as it can (TCG here: seconds each): one SDK
session shared by the tests of files, processes, timeouts and a killed relay
(then closed and the host checked), one in a process that is killed, one
through the MCP server. The VM artifacts are the cached ones of
``test_microvm.py`` (``corral image build python --vm``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import TEST_ROOT, World, unreadable_for
from tests.integration.conftest import AnsweringHTTP, needs_microvm

pytestmark = needs_microvm  # vm_cache: tests/integration/conftest.py


def _vm_processes() -> dict[int, str]:
    """Live qemu and virtiofsd processes of corral VMs: pid -> command line."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(m in cmdline for m in ("corral-ws", "corral.agent", "virtiofsd")):
            found[int(pid)] = cmdline[:160]
    return found


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")


def _run_dirs(pid: int) -> list[str]:
    """The VM run directories process *pid* made (others' VMs run on this host too)."""
    prefix = f"corral-vm-{pid}-"
    return [n for n in os.listdir(tempfile.gettempdir()) if n.startswith(prefix)]


def _wait_gone(pids: set[int], seconds: float = 10) -> set[int]:
    deadline = time.monotonic() + seconds
    while True:
        left = pids & set(_vm_processes())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.fixture(scope="module")
def world_vm(vm_cache: str) -> Iterator[World]:
    root = os.path.join(TEST_ROOT, f"w-{uuid.uuid4().hex[:12]}")
    os.makedirs(root)
    w = World(root)
    w.environ["XDG_CACHE_HOME"] = vm_cache
    try:
        yield w
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def session(world_vm: World) -> Iterator[Any]:
    """One SDK session in one VM, on a preview of the workspace (closed by the last test)."""
    from corral import Sandbox

    sandbox = Sandbox(
        workspace=world_vm.workspace, isolation="vm", preview=True, environ=world_vm.environ
    )
    try:
        yield sandbox
    finally:
        sandbox.close()


# the guest's processes named sleep (the image has no ps)
COUNT_SLEEPS = (
    'n=0; for c in /proc/[0-9]*/comm; do [ "$(cat $c 2>/dev/null)" = sleep ] && n=$((n+1)); done; '
    "echo sleeps=$n"
)


def test_two_execs_share_files_but_not_processes(session: Any, world_vm: World) -> None:
    first = session.exec(
        "uname -r; sleep 1234 & echo $! > /tmp/bg; echo kept > /tmp/note; echo ws > made.txt"
    )
    assert first.returncode == 0, first.stderr
    release = first.text("stdout").strip()
    assert (
        release.startswith(("5.", "6.")) and release != os.uname().release
    )  # the guest's kernel, not the host's
    vm = session._vm_session.vm
    qemu = vm.qemu.pid
    second = session.exec(
        f"cat /tmp/note made.txt; kill -0 $(cat /tmp/bg) || echo gone; {COUNT_SLEEPS}"
    )
    assert second.text("stdout") == "kept\nws\ngone\nsleeps=0\n", second.stderr
    assert session.read_file("made.txt") == b"ws\n"  # the file calls run in the VM too
    assert not os.path.exists(world_vm.ws("made.txt"))  # in the preview only
    assert session._vm_session.vm.qemu.pid == qemu and session._vm_session.boots == 1


def test_per_exec_timeout_kills_only_that_command(session: Any) -> None:
    boots = session._vm_session.boots
    stopped = session.exec("echo before; sleep 1000; echo after", timeout=1)
    assert stopped.timed_out and stopped.text("stdout") == "before\n"
    after = session.exec(f"echo after; {COUNT_SLEEPS}")
    assert (after.returncode, after.text("stdout")) == (0, "after\nsleeps=0\n")
    assert session._vm_session.boots == boots  # the same VM goes on


def test_stdin_output_and_the_commands_end_pass_the_relay(session: Any) -> None:
    """corral-vm-relay: 2 MiB of stdin through `cat` while its output comes back (neither
    side waits for the other), an exit status, a death by signal, a program not found."""
    data = bytes(range(256)) * 8192
    echoed = session.exec(["cat"], stdin=data, timeout=120)
    assert (echoed.returncode, echoed.timed_out) == (0, False), echoed.stderr
    assert echoed.stdout == data
    status = session.exec("echo out; echo err >&2; exit 7")
    assert (status.returncode, status.stdout, status.stderr) == (7, b"out\n", b"err\n")
    killed = session.exec("kill -USR1 $$")
    assert killed.signal == signal.SIGUSR1
    missing = session.exec(["no-such-program-here"])
    assert missing.returncode == 127 and b"no-such-program-here" in missing.stderr


def test_a_relay_killed_mid_command_leaves_nothing_for_the_next(session: Any) -> None:
    """The host side of one command dies while the guest runs it: the session stops the
    guest command and drains its frames, and the next command gets only its own result."""
    from corral.pipeline._request import ExecRequest

    vm_session = session._vm_session
    upper = session.preview.spec().upper
    marker = os.path.join(upper, "started")

    def kill_when_started(running: Any) -> None:
        def watch() -> None:
            deadline = time.monotonic() + 60
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.02)
            running.kill()  # SIGKILL to the relay: it never sees the command's end

        threading.Thread(target=watch, daemon=True).start()

    request = ExecRequest.from_shell(
        "echo stale-output; touch started; exec sleep 1000", cwd=session.workspace
    )
    outcome = vm_session.run(
        request, session.policy, preview=session.preview, on_start=kill_when_started
    )
    assert outcome is not None and outcome.signal == 9
    boots = vm_session.boots
    after = session.exec(f"echo fresh; {COUNT_SLEEPS}")
    assert (after.returncode, after.text("stdout"), after.stderr) == (0, "fresh\nsleeps=0\n", b"")
    assert vm_session.boots == boots


def test_apply_lands_the_changes_and_destroys_the_vm(session: Any, world_vm: World) -> None:
    """After apply the preview is finished (as on every backend): its VM goes at once."""
    from corral._exceptions import PreviewError

    vm = session._vm_session.vm
    pids = {vm.qemu.pid, vm.virtiofsd.pid}
    assert pids <= set(_vm_processes())
    session.apply()
    assert world_vm.read(world_vm.ws("made.txt")) == "ws\n"
    assert _wait_gone(pids) == set()
    with pytest.raises(PreviewError, match="applied or discarded"):
        session.exec("true")
    assert session._vm_session.vm is None  # and none was booted for it


def test_the_sdk_boots_its_vm_at_construction_and_an_early_close_leaves_nothing(
    world_vm: World,
) -> None:
    """The VM boots from the moment the Sandbox is made (no command needed), and the
    first command runs in it; a Sandbox closed while its VM still boots leaves no qemu,
    virtiofsd, run directory or cgroup behind."""
    import glob

    from corral import Sandbox

    others = {p for p in _vm_processes() if _parent(p) == os.getpid()}  # the module's session

    def our_cgroups() -> set[str]:
        return set(glob.glob(f"/sys/fs/cgroup/**/corral-{os.getpid()}-vm-*", recursive=True))

    groups = our_cgroups()

    def booted_by_us() -> set[int]:
        return {p for p in _vm_processes() if _parent(p) == os.getpid()} - others

    with Sandbox(
        workspace=world_vm.workspace, isolation="vm", read_only=True, environ=world_vm.environ
    ) as sandbox:
        vm_session = sandbox._vm_session
        deadline = time.monotonic() + 180
        while vm_session.vm is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert vm_session.vm is not None and vm_session.boots == 1  # before any command
        qemu = vm_session.vm.qemu.pid
        first = booted_by_us()
        result = sandbox.exec("cat README")
        assert result.text("stdout") == "hello\n", result.stderr
        assert vm_session.vm.qemu.pid == qemu and vm_session.boots == 1
    assert qemu in first and _wait_gone(first) == set()

    early = Sandbox(
        workspace=world_vm.workspace, isolation="vm", read_only=True, environ=world_vm.environ
    )
    deadline = time.monotonic() + 60
    while not any("qemu" in _cmdline(p) for p in booted_by_us()) and time.monotonic() < deadline:
        time.sleep(0.01)
    started = booted_by_us()
    assert any("qemu" in _cmdline(p) for p in started)  # qemu runs, the guest is booting
    vm_session = early._vm_session
    early.close()
    assert vm_session is not None and vm_session.boots == 0  # closed mid-boot
    assert _wait_gone(started) == set()
    for pid in started:  # reaped, not zombies
        assert not os.path.exists(f"/proc/{pid}")
    assert _run_dirs(os.getpid()) == []
    assert our_cgroups() <= groups


def test_a_secret_replaced_on_the_host_stays_hidden_and_closing_leaves_nothing(
    world_vm: World,
) -> None:
    """A masked secret the host replaces by a rename (which detaches a mount on it in
    other mount namespaces, virtiofsd's included) is not shown by the kept VM: the session
    moves to a new VM on the view as it is now. close() then leaves no qemu, virtiofsd or
    run directory."""
    from corral import Sandbox

    secret = world_vm.write(world_vm.ws(".env"), "OLD-SECRET\n")
    with Sandbox(
        workspace=world_vm.workspace,
        isolation="vm",
        read_only=True,
        deny_read=[secret],
        environ=world_vm.environ,
    ) as sandbox:
        first = sandbox.exec("cat README; cat .env")
        assert first.text("stdout") == "hello\n", first.stderr  # .env: masked
        vm = sandbox._vm_session.vm
        old = {vm.qemu.pid, vm.virtiofsd.pid}
        world_vm.write(secret + ".new", "NEW-SECRET\n")
        os.rename(secret + ".new", secret)  # as editors and `aws configure` write
        second = sandbox.exec("cat .env; echo done")
        assert second.text("stdout") == "done\n", second.stderr  # not NEW-SECRET
        assert sandbox._vm_session.boots == 2 and _wait_gone(old) == set()
        vm = sandbox._vm_session.vm
        pids = {vm.qemu.pid, vm.virtiofsd.pid}
        assert pids <= set(_vm_processes())
    assert _wait_gone(pids) == set()
    for pid in old | pids:  # reaped, not zombies
        assert not os.path.exists(f"/proc/{pid}")
    assert _run_dirs(os.getpid()) == []


def test_allowlist_session_each_command_has_its_own_proxy_and_attempt_log(
    world_vm: World,
) -> None:
    """network=allowlist in a kept VM: every command reaches only its own run's proxy, and
    its attempts and violations are its own; the VM's run directory goes with it."""
    from corral import Sandbox

    w = world_vm

    server = AnsweringHTTP(b"through the proxy")
    port = server.port
    hosts = w.write(os.path.join(w.root, "hosts"), "127.0.0.1 example.test evil.test\n")
    fetch = (
        "import sys, urllib.request\n"
        "try:\n"
        f"    print(urllib.request.urlopen(f'http://{{sys.argv[1]}}:{port}/', timeout=30).read())\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
    )
    try:
        with Sandbox(
            workspace=w.workspace,
            isolation="vm",
            read_only=True,
            environ={**w.environ, "CORRAL_EGRESS_HOSTS": hosts},
            settings={
                "network": {"mode": "allowlist", "allow": ["example.test", f"127.0.0.1:{port}"]}
            },
        ) as sandbox:
            allowed = sandbox.exec(["python3", "-c", fetch, "example.test"])
            denied = sandbox.exec(["python3", "-c", fetch, "evil.test"])
            again = sandbox.exec(["python3", "-c", fetch, "example.test"])
            assert sandbox._vm_session.boots == 1
    finally:
        server.close()
    assert allowed.text("stdout") == again.text("stdout") == "b'through the proxy'\n"
    assert "403" in denied.text("stdout")
    assert {(a.host, a.decision) for a in allowed.network} == {("example.test", "allow")}
    assert {(a.host, a.decision) for a in denied.network} == {("evil.test", "deny")}
    assert [(v.kind, v.target) for v in denied.violations] == [("network", f"evil.test:{port}")]
    assert allowed.violations == () and again.violations == ()
    assert _run_dirs(os.getpid()) == []


def test_mcp_sandbox_create_with_vm_isolation_and_the_server_killed(world_vm: World) -> None:
    """Through the MCP SDK's client: a vm sandbox boots at sandbox_create and runs the
    commands and file calls; SIGKILL to the MCP server leaves no qemu, virtiofsd or run dir."""
    pytest.importorskip("mcp", reason="the mcp package (2.x) is not installed")
    import asyncio

    from mcp import Client, StdioServerParameters

    from tests.integration.conftest import corral_executable

    params = StdioServerParameters(
        command=corral_executable(), args=["mcp"], env=world_vm.environ, cwd=world_vm.workspace
    )
    before = set(_vm_processes())
    seen: dict[str, Any] = {}

    async def call(client: Any, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await client.call_tool(tool, arguments)
        assert not result.is_error, result.content[0].text
        data: dict[str, Any] = result.structured_content
        return data

    async def session(client: Any) -> None:
        weaker = await client.call_tool("sandbox_create", {"isolation": "process"})
        assert weaker.is_error and "weaker" in weaker.content[0].text  # tighten only
        created = await call(client, "sandbox_create", isolation="vm")
        sid = created["sandbox_id"]
        assert created["isolation"] == "vm" and created["preview_id"]
        seen["vm"] = set(_vm_processes()) - before  # booted at create
        ran = await call(client, "sandbox_exec", sandbox_id=sid, command="uname -r")
        assert ran["returncode"] == 0 and ran["stdout"].strip() != os.uname().release
        await call(client, "sandbox_write_file", sandbox_id=sid, path="n.txt", content="in vm\n")
        read = await call(client, "sandbox_read_file", sandbox_id=sid, path="n.txt")
        assert read["content"] == "in vm\n"
        # the server is the parent of the sandbox's qemu: kill it as a crash would
        parents = {_parent(pid) for pid in seen["vm"]}
        (server,) = {pid for pid in parents if "mcp" in _cmdline(pid)}
        seen["vm"] = {pid for pid in seen["vm"] if _parent(pid) == server}  # not another's VM
        os.kill(server, signal.SIGKILL)
        seen["killed"] = server

    async def main() -> None:
        try:
            async with Client(params, mode="legacy") as client:
                await session(client)
        except Exception:
            if "killed" not in seen:
                raise  # a failure before the kill; after it, the client's end may complain

    asyncio.run(asyncio.wait_for(main(), 180))
    assert len(seen["vm"]) == 2  # qemu and virtiofsd, while the sandbox was open
    assert _wait_gone(seen["vm"]) == set()
    # the server died holding the run directory of its VM's NIC-less boot: none (removed at
    # ready) - a crash during boot would leave one for the next boot to sweep
    assert _run_dirs(seen["killed"]) == []
    assert not os.path.exists(world_vm.ws("n.txt"))


def test_unprivileged_caller_gets_a_refusal_not_a_weaker_sandbox(world_vm: World) -> None:
    import corral

    uid = 65534
    package = os.path.dirname(os.path.dirname(os.path.abspath(corral.__file__)))
    python = sys.executable
    if unreadable_for(uid, python) is not None:  # e.g. a pyenv interpreter under /root
        python = shutil.which("python3", path="/usr/bin:/bin") or python
    problem = unreadable_for(uid, python, package, world_vm.workspace)
    if problem is not None:
        pytest.skip(problem)
    scratch = tempfile.mkdtemp(prefix="corral-vm-unpriv-", dir=TEST_ROOT)
    try:
        os.chmod(scratch, 0o755)
        os.chown(scratch, uid, uid)
        env = {**world_vm.environ, "HOME": scratch, "PYTHONPATH": package}
        script = textwrap.dedent(
            """
            import json, sys
            from corral import Sandbox
            from corral._exceptions import CorralError
            with Sandbox(workspace=sys.argv[1], isolation="vm", read_only=True) as sb:
                try:
                    out = sb.exec("cat README")
                    print(json.dumps({"ran": out.backend}))
                except CorralError as exc:
                    print(json.dumps({"error": type(exc).__name__, "message": exc.message}))
            """
        )
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        sdk = subprocess.run(
            [*drop, python, "-c", script, world_vm.workspace],
            env=env, cwd=scratch, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        cli = subprocess.run(
            [*drop, python, "-m", "corral", "run", "--isolation", "vm", "--read-only",
             "--workspace", world_vm.workspace, "--", "cat", "README"],
            env=env, cwd=scratch, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    answer = json.loads(sdk.stdout.strip().splitlines()[-1]) if sdk.stdout.strip() else {}
    assert answer.get("error") == "BackendUnavailable", sdk.stdout + sdk.stderr
    assert "root only" in answer["message"]
    assert cli.returncode == 125 and cli.stdout == "", cli.stderr
    assert "root only" in cli.stderr


def test_the_server_boots_its_warm_pool_when_it_starts(world_vm: World) -> None:
    """CORRAL_VM_POOL=1: the server boots a VM before any VM run asks (answering other runs
    meanwhile), the first VM run takes it, and stopping the server leaves no VM."""
    w = world_vm
    env = {"CORRAL_SERVER": "on", "CORRAL_VM_POOL": "1"}

    def status() -> dict[str, Any]:
        result = w.corral("server", "--status", "--json", env=env)
        data: dict[str, Any] = json.loads(result.stdout or b"null") or {}
        return data

    def wait_for(predicate: Any, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    started = w.corral("server", "--detach", env=env)
    assert started.returncode == 0, started.stderr
    server = status()["pid"]
    try:
        other = w.corral("run", "--", "echo", "hi", env=env)  # no VM: not held up by the boot
        assert (other.returncode, other.stdout) == (0, b"hi\n"), other.stderr
        assert status()["served"] >= 1
        wait_for(lambda: status()["vm_pool"]["idle"] == 1, 120, "the pool's VM to boot")
        pool = status()["vm_pool"]
        assert (pool["booted"], pool["served"], pool["missed"]) == (1, 0, 0)  # before any VM run
        ran = w.corral("run", "--backend", "microvm", "--read-only", "--", "cat", "README", env=env)
        assert (ran.returncode, ran.stdout) == (0, b"hello\n"), ran.stderr
        pool = status()["vm_pool"]
        assert (pool["served"], pool["missed"]) == (1, 0)  # it took the VM booted ahead
    finally:
        stopped = w.corral("server", "--stop", env=env)
        assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: not os.path.exists(f"/proc/{server}"), 30, "the server to exit")
    left = {pid for pid in _vm_processes() if os.path.exists(f"/proc/{pid}")}
    orphans = set()
    for pid in left:  # VMs of this server (re-parented after its exit: by their run dir name)
        try:
            if f"corral-vm-{server}-" in _cmdline(pid):
                orphans.add(pid)
        except OSError:
            continue
    assert _wait_gone(orphans) == set()
    assert _run_dirs(server) == []
