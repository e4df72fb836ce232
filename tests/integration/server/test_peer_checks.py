"""A sandboxed process must never get the corral server to run something for it.

Each test makes the server's socket reachable on purpose (a hard link into
the workspace, ``--allow-unix-sockets``), has a process speak the real
protocol to it - as a script, or as the compiled ``corral-client`` - asking
for an unsandboxed run (or a hook decision) that writes a host file, and then
checks the refusal, the server's log and the host file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from corral.server._wire import code_stamp
from tests.conftest import PROBE_PYTHON, World, needs_bwrap, needs_root
from tests.integration.server.conftest import status

pytestmark = needs_bwrap

ATTACK = r"""
import json, os, socket, sys
path, target = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
except OSError as exc:
    print("connect failed:", exc.strerror)
    sys.exit(0)
request = {
    "op": "run", "protocol": 1, "code": sys.argv[3],
    "argv": ["--backend", "none", "--allow-write", os.path.dirname(target),
             "-c", "echo pwned > " + target],
    "cwd": sys.argv[5], "env": {"PATH": "/usr/bin:/bin", "HOME": sys.argv[4]}, "pid": os.getpid(),
}
body = json.dumps(request).encode()
fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
s.sendmsg([len(body).to_bytes(4, "big") + body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
reply = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    reply += chunk
print("reply:", reply[4:].decode(errors="replace"))
"""


def _link_socket(world: World, directory: str) -> str:
    """A second name for the server's socket, somewhere a sandbox (or another user) can see."""
    link = os.path.join(directory, "server.sock")
    os.link(os.path.join(world.state_dir, "server", "server.sock"), link)
    return link


def _attack_args(world: World, link: str, target: str) -> list[str]:
    script = World.write(world.ws("attack.py"), ATTACK)
    return [PROBE_PYTHON, script, link, target, code_stamp(), world.home, world.workspace]


#: A root caller's landlock run must accept keeping root's identity (it is refused otherwise).
_LANDLOCK_AS_ROOT = ("--allow-degraded", "isolation") if os.geteuid() == 0 else ()
#: A root caller's bubblewrap sandbox runs as another host uid: the uid check refuses it first.
_BWRAP_REFUSAL = "is not the server's uid" if os.geteuid() == 0 else "namespace differs"


def _log(world: World) -> str:
    return World.read(os.path.join(world.state_dir, "server", "server.log"))


@pytest.mark.parametrize("reach", ["hard link in the workspace", "allow-read of the state dir"])
@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        (("--backend", "bubblewrap"), _BWRAP_REFUSAL),
        (("--backend", "landlock", "--isolation", "process", *_LANDLOCK_AS_ROOT), "differs"),
    ],
)
def test_a_sandboxed_process_cannot_use_the_server(
    served: World, backend: tuple[str, ...], reason: str, reach: str
) -> None:
    before_tree = served.tree()
    server_dir = os.path.join(served.state_dir, "server")
    if reach.startswith("hard link"):
        link = _link_socket(served, served.workspace)
        options: tuple[str, ...] = ()
    else:  # the real path, re-exposed under the hidden state directory
        link = os.path.join(server_dir, "server.sock")
        options = ("--allow-read", server_dir)
    before = status(served)
    assert before is not None
    # the sandboxed command runs in-process: the server is the target, not the vehicle
    result = served.corral(
        "run",
        *backend,
        *options,
        "--allow-unix-sockets",
        "--",
        *_attack_args(served, link, served.victim),
        env={"CORRAL_SERVER": "off"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert out.startswith("reply:") and '"refused"' in out and reason in out, out
    assert World.read(served.victim) == "original\n"
    after = status(served)
    assert after is not None
    assert after["served"] == before["served"] and after["refused"] == before["refused"] + 1
    assert "refused a peer:" in _log(served)
    if reach.startswith("hard link"):
        os.unlink(link)
    tree = served.tree()
    del tree[served.ws("attack.py")]
    assert tree == before_tree


def test_the_same_request_from_the_host_is_served(served: World) -> None:
    """Control: the attack script speaks the protocol correctly; only the checks stop it."""
    link = _link_socket(served, served.outside)
    target = os.path.join(served.outside, "control.txt")
    result = subprocess.run(
        _attack_args(served, link, target),
        capture_output=True,
        env=served.environ,
        cwd="/",
        check=False,
        timeout=60,
    )
    assert b'"accepted":true' in result.stdout, result
    assert World.read(target) == "pwned\n"


@needs_root
def test_another_users_process_is_refused(served: World) -> None:
    link = _link_socket(served, served.outside)
    os.chmod(link, 0o777)  # the inode: the real socket too, for this test only
    target = os.path.join(served.outside, "other-user.txt")
    os.chmod(served.outside, 0o777)
    try:
        result = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                *_attack_args(served, link, target),
            ],
            capture_output=True,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            check=False,
            timeout=60,
        )
    finally:
        os.chmod(link, 0o600)
        os.chmod(served.outside, 0o755)
    out = result.stdout.decode()
    assert '"refused"' in out and "is not the server's uid" in out, (out, result.stderr)
    assert not os.path.exists(target)
    assert "refused a peer: uid 65534" in _log(served)


SECCOMP_FIRST = r"""
import ctypes, struct, sys
# one allow-everything seccomp filter, installed without no_new_privs (root may): the
# process is otherwise the host's, so only its seccomp state tells it apart
code = struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000)  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
buf = ctypes.create_string_buffer(code)
prog = struct.pack("HxxxxxxP", 1, ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    sys.exit("seccomp: errno %d" % ctypes.get_errno())
sys.argv = sys.argv[1:]
exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"))
"""


@needs_root
def test_a_host_process_with_a_seccomp_filter_is_refused(served: World) -> None:
    link = _link_socket(served, served.outside)
    target = os.path.join(served.outside, "filtered.txt")
    wrapper = World.write(served.ws("seccomp_first.py"), SECCOMP_FIRST)
    args = _attack_args(served, link, target)
    result = subprocess.run(
        [args[0], wrapper, *args[1:]],
        capture_output=True,
        env=served.environ,
        cwd="/",
        check=False,
        timeout=60,
    )
    out = result.stdout.decode()
    assert '"refused":"Seccomp differs"' in out, (out, result.stderr)
    assert not os.path.exists(target)


# ---------------------------------------------------------------- the fast client and the hook op
HOOK_ATTACK = r"""
import json, os, socket, sys
path, target, code, cwd = sys.argv[1:5]
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
except OSError as exc:
    print("connect failed:", exc.strerror)
    sys.exit(0)
payload = {"session_id": "s", "cwd": cwd, "hook_event_name": "PreToolUse", "tool_name": "Bash",
           "tool_input": {"command": "echo pwned > " + target}}
request = {"op": "hook", "protocol": 1, "code": code, "integration": "claude-code",
           "stdin": json.dumps(payload), "cwd": cwd, "env": dict(os.environ), "pid": os.getpid()}
body = json.dumps(request).encode()
s.sendall(len(body).to_bytes(4, "big") + body)
reply = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    reply += chunk
print("reply:", reply[4:].decode(errors="replace"))
"""


def _state_link(world: World) -> str:
    """The server's socket under a state directory the sandbox can see (XDG_STATE_HOME)."""
    directory = world.ws("state", "corral", "server")
    os.makedirs(directory)
    _link_socket(world, directory)
    return world.ws("state")


def _reexposed(*paths: str) -> list[str]:
    """``--allow-read`` options for those of *paths* under a directory the sandbox hides.

    The sandbox gets a private /tmp and /var/tmp: a checkout (and its
    virtualenv) under /tmp - e.g. a CI clone - must be re-exposed for the
    corral it contains to run inside.
    """
    options: list[str] = []
    for path in paths:
        real = os.path.realpath(path)
        if any(real == h or real.startswith(h + "/") for h in ("/tmp", "/var/tmp")):
            options += ["--allow-read", real]
    return options


@pytest.mark.parametrize("op", ["run", "hook"])
def test_a_sandboxed_fast_client_is_refused_and_what_it_runs_stays_sandboxed(
    served: World, op: str
) -> None:
    from tests.conftest import client_command

    fast = client_command("corral-client")[0]
    state = _state_link(served)
    before = status(served)
    assert before is not None
    if op == "run":
        inner = [
            fast,
            "run",
            "--backend",
            "none",
            "--allow-write",
            os.path.dirname(served.victim),
            "-c",
            f"echo pwned > {served.victim}",
        ]
        stdin = None
    else:
        inner = [fast, "hook", "claude-code"]
        stdin = json.dumps(
            {
                "session_id": "s",
                "cwd": served.workspace,
                "hook_event_name": "PreToolUse",
                "tool_name": "Write",
                "tool_input": {"file_path": served.victim, "content": "pwned"},
            }
        ).encode()
    checkout = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    result = served.corral(
        "run",
        "--allow-unix-sockets",
        *_reexposed(checkout, sys.prefix),
        "--",
        "/usr/bin/env",
        f"XDG_STATE_HOME={state}",
        *inner,
        env={"CORRAL_SERVER": "off"},  # the outer run: in-process; inside, the client tries
        input=stdin,
    )
    after = status(served)
    assert after is not None
    # the server refused the sandboxed client; its fallback ran inside the sandbox (a root
    # caller's sandbox runs as another uid: the fallback's own attempt is refused too)
    retried = op == "run" and os.geteuid() == 0
    assert after["refused"] == before["refused"] + (2 if retried else 1)
    assert (after["served"], after["hooks"]) == (before["served"], before["hooks"])
    assert "refused a peer:" in _log(served)
    assert World.read(served.victim) == "original\n"
    if op == "hook":  # decided inside the sandbox, by the same policy
        assert result.returncode == 0, result.stderr
        assert b'"permissionDecision":"deny"' in result.stdout
    else:
        assert result.returncode != 0


def test_the_hook_op_from_a_sandbox_is_refused(served: World) -> None:
    link = _link_socket(served, served.workspace)
    script = World.write(served.ws("hook_attack.py"), HOOK_ATTACK)
    before = status(served)
    assert before is not None
    result = served.corral(
        "run",
        "--allow-unix-sockets",
        "--",
        PROBE_PYTHON,
        script,
        link,
        served.victim,
        code_stamp(),
        served.workspace,
        env={"CORRAL_SERVER": "off"},
    )
    out = result.stdout.decode()
    assert '"refused"' in out and _BWRAP_REFUSAL in out, (out, result.stderr)
    after = status(served)
    assert after is not None and after["hooks"] == before["hooks"]
    assert World.read(served.victim) == "original\n"


def test_the_hook_op_answers_but_never_runs_anything(served: World) -> None:
    """From the host (a peer the server accepts): a decision comes back, nothing is executed."""
    link = _link_socket(served, served.outside)
    script = World.write(served.ws("hook_attack.py"), HOOK_ATTACK)
    before = status(served)
    assert before is not None
    result = subprocess.run(
        [PROBE_PYTHON, script, link, served.victim, code_stamp(), served.workspace],
        capture_output=True,
        env=served.environ,
        cwd="/",
        check=False,
        timeout=60,
    )
    answer = json.loads(result.stdout.decode().removeprefix("reply: "))["hook"]
    decision = json.loads(answer["stdout"])["hookSpecificOutput"]
    assert answer["exit"] == 0 and decision["permissionDecision"] == "allow"
    # the original travels in the rewritten command's heredoc (claude_code_hook.rewrite_command)
    assert (
        f"\necho pwned > {served.victim}\nCORRAL_COMMAND_END\n"
        in decision["updatedInput"]["command"]
    )
    assert " run --agent-session s --workspace " in decision["updatedInput"]["command"]
    assert " --keep --report-fd 3 " in decision["updatedInput"]["command"]
    assert World.read(served.victim) == "original\n"
    after = status(served)
    assert after is not None
    assert (after["served"], after["hooks"]) == (before["served"], before["hooks"] + 1)


BAD_HOOK = r"""
import json, os, socket, sys
path, code, kind = sys.argv[1:4]
request = {"op": "hook", "protocol": 1, "code": code, "integration": "claude-code",
           "stdin": "{}", "cwd": "/", "env": {}, "pid": os.getpid()}
fds = []
if kind == "fds":
    fds = [0, 1, 2]
elif kind == "integration":
    request["integration"] = "../../bin/sh"
elif kind == "stdin":
    request["stdin"] = "\ud800"
elif kind == "pid":
    request["pid"] = 1
elif kind == "cwd":
    request["cwd"] = "/tmp\0/etc"
elif kind == "env":
    request["env"] = {"A": "b\0c"}
s = socket.socket(socket.AF_UNIX)
s.connect(path)
body = json.dumps(request).encode()
frame = len(body).to_bytes(4, "big") + body
raw = b"".join(fd.to_bytes(4, sys.byteorder) for fd in fds)
ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, raw)] if fds else []
s.sendmsg([frame], ancillary)
reply = b""
while chunk := s.recv(65536):
    reply += chunk
print(reply[4:].decode())
"""


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("fds", "a hook request carries no file descriptors"),
        ("integration", "unknown hook '../../bin/sh'"),
        ("stdin", "stdin must decode to bytes (UTF-8 with surrogate escapes)"),
        ("pid", "the request's pid is not the connecting process's"),
        ("cwd", "cwd must not contain a NUL byte"),
        ("env", "env must not contain a NUL byte"),
    ],
)
def test_malformed_hook_requests_are_refused(served: World, kind: str, reason: str) -> None:
    link = _link_socket(served, served.outside)
    script = World.write(served.ws("bad_hook.py"), BAD_HOOK)
    result = subprocess.run(
        [PROBE_PYTHON, script, link, code_stamp(), kind],
        capture_output=True,
        env=served.environ,
        cwd="/",
        check=False,
        timeout=60,
    )
    reply = json.loads(result.stdout)
    assert reply["stale"] is False and reply["refused"] == f"bad request: {reason}", reply
    data = status(served)
    assert data is not None and data["hooks"] == 0


HOLDER = r"""
import socket, sys, time
name, count, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
held = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect("\0" + name)
    s.setblocking(False)
    held.append(s)
print("holding", flush=True)
closed = set()
end = time.monotonic() + seconds
while time.monotonic() < end and len(closed) < count:
    for i, s in enumerate(held):
        try:
            s.recv(65536)  # the refusal
        except OSError:
            pass
        try:
            s.send(b"x")  # one byte now and then: a per-recv timeout would never end
        except OSError:
            closed.add(i)
    time.sleep(0.5)
print(len(closed), flush=True)
"""


def _hub_name(pid: int) -> str:
    """The ``corral-hub/...`` abstract name the server *pid* listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/net/unix", encoding="utf-8") as f:
        for line in f:
            words = line.split()
            if len(words) >= 8 and words[6] in inodes and words[7].startswith("@corral-hub/"):
                return words[7][1:]
    raise AssertionError(f"server {pid} listens on no hub name")


@needs_root
def test_another_user_holding_hub_connections_costs_the_server_nothing(served: World) -> None:
    """The hub name is open to every user: 60 connections that trickle a byte every half
    second must not keep the server's threads and descriptors (ATK11: with a per-recv drain
    timeout they were kept forever, and enough of them exhausted the server's descriptors,
    so that every client of the user hung)."""
    info = status(served)
    assert info is not None
    pid = info["pid"]
    assert served.corral("run", "--", "true").returncode == 0  # the baseline has its warm sandbox
    time.sleep(1)
    baseline = len(os.listdir(f"/proc/{pid}/fd"))
    script = World.write(os.path.join(served.outside, "holder.py"), HOLDER)
    os.chmod(script, 0o644)
    holder = subprocess.Popen(
        [
            *("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"),
            *(PROBE_PYTHON, script, _hub_name(pid), "60", "20"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"holding\n", holder.stderr
        time.sleep(4)  # past the 2 s a refused connection may be drained
        held = len(os.listdir(f"/proc/{pid}/fd"))
        assert held < baseline + 20, (baseline, held)
        result = served.corral("run", "--", "sh", "-c", "echo served")
        assert result.returncode == 0 and result.stdout == b"served\n", result.stderr
        out, err = holder.communicate(timeout=60)
        assert out == b"60\n", (out, err)  # the server closed every one of them
    finally:
        holder.kill()
        holder.communicate()
    after = status(served)
    assert after is not None and after["pid"] == pid
    assert "refused a peer: uid 65534" in _log(served)
