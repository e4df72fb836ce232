"""One corral server for every state directory of a configuration (corral.server._hub).

Servers are started for several state directories of one world (its
environment with another ``XDG_STATE_HOME`` each): one process serves them
all, each run's records land in its own directory, another configuration
gets a server of its own, ``--stop`` through any directory stops the shared
server. Then the attack: a process that is not the user's unsandboxed host
process (one extra seccomp filter, and ``no_new_privs`` when not root) binds
the hub name first; it must receive nothing - no byte, no descriptor - and
every directory is still served, by a server of its own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from corral.server._hub import configuration
from corral.server._server import DEFAULT_IDLE
from tests.conftest import World, corral_command, fast_client_path

from .conftest import gone, wait_for


def _env(world: World, name: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in world.environ.items() if k != "CORRAL_SERVER"}
    env["XDG_STATE_HOME"] = os.path.join(world.root, "states", name)
    env.update(extra)
    return env


def _corral(
    env: dict[str, str], *args: str, cwd: str = "/", client: list[str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """*client* (default: the Python ``corral``) with *args*, output captured."""
    return subprocess.run(
        [*(client or corral_command()), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        timeout=120,
        check=False,
    )


def _clients() -> list[list[str]]:
    """The Python client, and the compiled one when it is built."""
    fast = fast_client_path()
    return [corral_command()] + ([[fast]] if fast else [])


def _status(env: dict[str, str]) -> dict[str, object] | None:
    data = json.loads(_corral(env, "server", "--status", "--json").stdout or b"null")
    assert data is None or isinstance(data, dict)
    return data


def _warnings(stderr: bytes) -> list[str]:
    """corral's lines on stderr, but the degraded limits of an unprivileged run (recorded)."""
    return [
        line
        for line in stderr.decode(errors="replace").splitlines()
        if not line.endswith("was not enforced (allowed by allowDegraded)")
    ]


def _socket_of(env: dict[str, str]) -> str:
    return os.path.join(env["XDG_STATE_HOME"], "corral", "server", "server.sock")


def _stop_all(*envs: dict[str, str]) -> None:
    pids = {s["pid"] for s in map(_status, envs) if s is not None}
    for env in envs:
        assert _corral(env, "server", "--stop").returncode == 0
    for pid in pids:
        assert isinstance(pid, int)
        wait_for(lambda pid=pid: gone(pid), what=f"server {pid} to exit")


def test_state_directories_of_one_configuration_share_one_server(world: World) -> None:
    envs = [_env(world, name) for name in ("a", "b", "c")]
    other = _env(world, "d", CORRAL_WARM_MAX="0")  # another configuration
    try:
        for env in (*envs, other):
            result = _corral(env, "server", "--detach")
            assert result.returncode == 0, result.stderr
        statuses = [_status(env) for env in envs]
        assert all(s is not None for s in statuses)
        pids = {s["pid"] for s in statuses if s is not None}
        assert len(pids) == 1, statuses
        for env, s in zip(envs, statuses, strict=True):
            assert s is not None and s["state_dirs"] == 3
            assert s["state_dir"] == os.path.join(env["XDG_STATE_HOME"], "corral")
        own = _status(other)
        assert own is not None and own["pid"] not in pids and own["state_dirs"] == 1
        b_log = os.path.join(envs[1]["XDG_STATE_HOME"], "corral", "server", "server.log")
        assert f"over to the corral server pid {pids.pop()}" in World.read(b_log)

        # runs through b's socket: served, and recorded in b's state directory only
        served_before = statuses[1]["served"]  # type: ignore[index]
        clients = _clients()
        for client in clients:
            result = _corral(
                envs[1],
                "run",
                "--",
                "sh",
                "-c",
                "echo served-in-b",
                cwd=world.workspace,
                client=client,
            )
            assert result.returncode == 0, result.stderr
            assert result.stdout == b"served-in-b\n"
            assert _warnings(result.stderr) == []
        after = _status(envs[1])
        assert after is not None and after["served"] == served_before + len(clients)
        audit = [
            os.path.join(env["XDG_STATE_HOME"], "corral", "audit.jsonl") for env in (*envs, other)
        ]
        assert os.path.exists(audit[1])
        assert [os.path.exists(p) for p in audit] == [False, True, False, False]
        with open(audit[1], encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        assert [r["argv"] for r in records][-len(clients) :] == [
            ["sh", "-c", "echo served-in-b"]
        ] * len(clients)

        # --stop through one directory stops the server of all three
        shared = after["pid"]
        assert _corral(envs[2], "server", "--stop").returncode == 0
        wait_for(lambda: gone(shared), what="the shared server to exit")
        assert [_status(env) for env in envs] == [None, None, None]
        assert not any(os.path.exists(_socket_of(env)) for env in envs)
        assert _status(other) is not None  # another configuration's server: not stopped
    finally:
        _stop_all(*envs, other)


SQUATTER = r"""
import ctypes, json, os, socket, struct, sys
name, log = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
if os.geteuid() != 0 and libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
    sys.exit("no_new_privs: errno %d" % ctypes.get_errno())
# one allow-everything seccomp filter: the process is otherwise the host's
code = struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000)  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
buf = ctypes.create_string_buffer(code)
prog = struct.pack("HxxxxxxP", 1, ctypes.addressof(buf))
if libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    sys.exit("seccomp: errno %d" % ctypes.get_errno())
hub = socket.socket(socket.AF_UNIX)
hub.bind("\0" + name)
hub.listen(64)
print("ready", flush=True)
while True:
    conn, _ = hub.accept()
    conn.settimeout(5)
    received, fds = 0, 0
    try:
        while True:
            data, anc, _f, _a = conn.recvmsg(65536, socket.CMSG_SPACE(4 * 16))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds += len(payload) // 4
            if not data:
                break
            received += len(data)
    except OSError:
        pass
    conn.close()
    with open(log, "a") as f:
        f.write(json.dumps({"bytes": received, "fds": fds}) + "\n")
"""


def test_a_squatted_hub_name_gets_nothing(world: World) -> None:
    envs = [_env(world, name) for name in ("a", "b")]
    config = configuration(envs[0], DEFAULT_IDLE)
    assert configuration(envs[1], DEFAULT_IDLE) == config
    script = World.write(os.path.join(world.root, "squatter.py"), SQUATTER)
    log = os.path.join(world.root, "squatter.log")
    squatter = subprocess.Popen(
        [sys.executable, script, f"corral-hub/{os.getuid()}/{config}", log],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert squatter.stdout is not None
        assert squatter.stdout.readline() == b"ready\n", squatter.stderr
        for env in envs:
            result = _corral(env, "server", "--detach")
            assert result.returncode == 0, result.stderr
        statuses = [_status(env) for env in envs]
        # each directory is served, by a server of its own
        assert all(s is not None and s["state_dirs"] == 1 for s in statuses), statuses
        assert len({s["pid"] for s in statuses if s is not None}) == 2
        result = _corral(envs[1], "run", "--", "true", cwd=world.workspace)
        assert result.returncode == 0 and _warnings(result.stderr) == [], result.stderr
        deadline = time.monotonic() + 10
        while not os.path.exists(log) and time.monotonic() < deadline:
            time.sleep(0.05)
        # the servers connected (each looked for a running server of its configuration)
        # and sent nothing once the checks failed
        with open(log, encoding="utf-8") as f:
            seen = [json.loads(line) for line in f]
        assert seen and all(s == {"bytes": 0, "fds": 0} for s in seen), seen
        for env in envs:
            text = World.read(os.path.join(env["XDG_STATE_HOME"], "corral", "server", "server.log"))
            # Seccomp differs (root), or NoNewPrivs first (an unprivileged user)
            assert "the process on the hub name failed the peer checks" in text, text
    finally:
        squatter.kill()
        squatter.communicate()
        _stop_all(*envs)


def test_the_hub_name_answers_only_adopt(world: World) -> None:
    env = _env(world, "a")
    try:
        assert _corral(env, "server", "--detach").returncode == 0
        config = configuration(env, DEFAULT_IDLE)
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(f"\0corral-hub/{os.getuid()}/{config}")
        body = json.dumps({"op": "status", "protocol": 1}).encode()
        sock.sendall(len(body).to_bytes(4, "big") + body)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
        sock.close()
        assert b"only 'adopt' is answered here" in reply, reply
    finally:
        _stop_all(env)


def test_the_first_run_in_a_new_state_directory_is_served_by_the_running_server(
    world: World,
) -> None:
    first, new = _env(world, "a"), _env(world, "b")
    try:
        assert _corral(first, "server", "--detach").returncode == 0
        shared = _status(first)
        assert shared is not None
        for number, client in enumerate(_clients()):
            env = _env(world, f"new-{number}")
            result = _corral(
                env, "run", "--", "sh", "-c", "echo first", cwd=world.workspace, client=client
            )
            assert result.returncode == 0 and result.stdout == b"first\n", result.stderr
            status = _status(env)
            # served at once: the directory joined the running server, none was started
            assert status is not None and status["pid"] == shared["pid"], status
            assert status["served"] == shared["served"] + number + 1  # type: ignore[operator]
        assert _status(new) is None  # no run there: not served
    finally:
        _stop_all(first)


def _held_locks(pid: int) -> list[str]:
    """The ``server/lock`` files the process *pid* holds open (``(deleted)`` when removed)."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "/server/lock" in target:
            held.append(target)
    return held


def test_a_deleted_state_directory_is_given_up_when_it_comes_back(world: World) -> None:
    # b is served by a's server, then removed (a test's temporary directory) and made
    # again: the server must serve the new b, not keep the dead one's lock and listener
    # (or every deleted directory would count towards MAX_DIRECTORIES, hold two
    # descriptors, and its successor run a server of its own)
    envs = [_env(world, name) for name in ("a", "b")]
    try:
        for env in envs:
            assert _corral(env, "server", "--detach").returncode == 0
        first = _status(envs[1])
        assert first is not None and first["state_dirs"] == 2
        shared = first["pid"]
        assert isinstance(shared, int)
        subprocess.run(["rm", "-rf", envs[1]["XDG_STATE_HOME"]], check=True)
        result = _corral(envs[1], "server", "--detach")
        assert result.returncode == 0, result.stderr
        again = _status(envs[1])
        assert again is not None
        assert again["pid"] == shared and again["state_dirs"] == 2, again
        assert not any(lock.endswith("(deleted)") for lock in _held_locks(shared))
        result = _corral(envs[1], "run", "--", "true", cwd=world.workspace)
        assert result.returncode == 0 and _warnings(result.stderr) == [], result.stderr
    finally:
        _stop_all(*envs)
