"""The server watches each run's client from its serve loop, on worker threads it keeps.

A raw client (this file's ``_CLIENT``, speaking the wire protocol by hand in a
process of its own, so that it passes the peer checks as any client does)
sends a run, then a signal frame or bytes that are no frame: the real server
must forward the one and kill the command for the other, and after a burst
of runs it holds no more threads than before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import World, client_command, needs_bwrap
from tests.integration.server.conftest import status, stop

pytestmark = needs_bwrap

# argv[1]: "signal" (SIGTERM's frame once the command runs), "early" (the same at once, before
# the sandbox is up) or "garbage" (a frame longer than any allowed, once the command runs)
_CLIENT = r"""
import _socket, json, os, sys, time
from corral._state import state_dir
from corral.server._wire import PROTOCOL, FrameReader, code_stamp, connect_unix, encode, socket_path

sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
connect_unix(sock, socket_path(state_dir()))
request = encode({"op": "run", "protocol": PROTOCOL, "code": code_stamp(),
                  "argv": ["-c", "echo started > started; exec sleep 30"],
                  "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid()})
fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
sock.sendmsg([request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
reader = FrameReader()
answers = []
sent = False
while True:
    data = sock.recv(65536)
    if not data:
        break
    answers += reader.feed(data)
    if answers and answers[-1].get("exit") is not None:
        break
    if not sent and answers[0].get("accepted"):
        while sys.argv[1] != "early" and not os.path.exists("started"):
            time.sleep(0.01)
        sock.sendall(b"\xff" * 8 if sys.argv[1] == "garbage" else encode({"signal": 15}))
        sent = True
print(json.dumps(answers))
"""


def _raw_run(world: World, how: str) -> list[dict[str, object]]:
    try:
        os.unlink(world.ws("started"))
    except FileNotFoundError:
        pass
    result = subprocess.run(
        [sys.executable, "-c", _CLIENT, how],
        cwd=world.workspace,
        env=world.environ,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    answers: list[dict[str, object]] = json.loads(result.stdout)
    return answers


@pytest.mark.parametrize("when", ["signal", "early"])
def test_a_signal_frame_reaches_the_command(served: World, when: str) -> None:
    """SIGTERM stops the sandbox as a timeout would; held until the start, the TERM may
    meet a sandbox not yet able to take it, and the grace period's KILL ends it (137)."""
    started = time.monotonic()
    answers = _raw_run(served, when)
    expected = (143,) if when == "signal" else (143, 137)
    assert answers[0] == {"accepted": True} and answers[1]["exit"] in expected, answers
    assert len(answers) == 2 and time.monotonic() - started < 20  # not the 30 s sleep


def test_bytes_that_are_no_frame_kill_the_command(served: World) -> None:
    answers = _raw_run(served, "garbage")
    assert answers == [{"accepted": True}, {"exit": 137}]
    with open(os.path.join(served.state_dir, "server", "server.log"), encoding="utf-8") as f:
        assert "killing its command" in f.read()


#: A worker goes back to the idle list only after its client has the exit status (it
#: compares its thread's state first), so a client connecting at once can race it and be
#: given a new thread. The tests of worker reuse pause this long between sequential runs:
#: what they test is that a worker is kept and reused, not how fast it gets back to the
#: idle list on a loaded machine.
_SETTLE = 0.2


def _workers(world: World) -> dict[str, int]:
    data = status(world)
    assert data is not None
    workers: dict[str, int] = data["workers"]
    return workers


def test_runs_reuse_kept_workers_and_idle_workers_are_bounded(unwarmed: World) -> None:
    """Sequential runs are served by one kept worker thread; after a burst of concurrent
    runs at most 4 workers stay."""
    served = unwarmed
    client = client_command("corral-client")

    def run_true(n: int) -> None:
        procs = [
            subprocess.Popen(
                [*client, "run", "--", "true"], cwd=served.workspace, env=served.environ
            )
            for _ in range(n)
        ]
        assert [p.wait(timeout=60) for p in procs] == [0] * n

    for _ in range(5):
        run_true(1)
        time.sleep(_SETTLE)
    # the one worker serves this status request too: none is idle while it answers
    assert _workers(served) == {"started": 1, "idle": 0}
    run_true(8)
    workers = _workers(served)
    assert workers["idle"] <= 3, workers  # 4 kept, one of them answering
    data = status(served)
    assert data is not None and data["served"] == 13


def test_an_idle_server_ends_its_idle_workers(world: World) -> None:
    """After ``CORRAL_SERVER_POOL_IDLE`` without a client no worker waits: the next
    connection starts one."""
    del world.environ["CORRAL_SERVER"]
    world.environ["CORRAL_SERVER_POOL_IDLE"] = "0.5"
    result = world.corral("server", "--detach")
    assert result.returncode == 0, result.stderr
    try:
        client = client_command("corral-client")
        procs = [
            subprocess.Popen([*client, "run", "--", "true"], cwd=world.workspace, env=world.environ)
            for _ in range(3)
        ]
        assert [p.wait(timeout=60) for p in procs] == [0] * 3
        started = _workers(world)["started"]  # this status request took an idle worker
        time.sleep(1.5)  # no client for longer than the idle time
        assert _workers(world) == {"started": started + 1, "idle": 0}
    finally:
        stop(world)


_SERVER = r"""
import os, signal, sys, threading
from corral.server._server import Server

def handler(request, relay, pool):
    with open("/proc/thread-self/status") as f:
        blocked = [line.split()[1] for line in f if line.startswith("SigBlk:")][0]
    os.write(request.stdio[1], f"{threading.get_native_id()} {blocked}\n".encode())
    if request.argv == ["change"]:  # what a run must never leave to the next one
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    return 0

server = Server(sys.argv[1], handler=handler, idle=60)
server.start()
print("ready", flush=True)
server.serve()
"""


def test_a_worker_whose_thread_a_run_changed_is_not_kept(world: World) -> None:
    """A run that leaves its thread changed (here: a blocked signal) ends that worker: the
    next connection gets a new thread with a clean state, which is then kept."""
    client = client_command("corral-client")
    del world.environ["CORRAL_SERVER"]
    state = world.state_dir
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, state], env=world.environ, stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == b"ready\n"
        seen = []
        for word in ("change", "look", "look"):
            result = subprocess.run(
                [*client, "run", word], env=world.environ, capture_output=True, check=False
            )
            assert result.returncode == 0, result.stderr
            thread, blocked = result.stdout.split()
            seen.append((thread, int(blocked, 16)))
            time.sleep(_SETTLE)
    finally:
        server.terminate()
        server.communicate(timeout=30)
    assert [blocked for _, blocked in seen] == [0, 0, 0]
    assert seen[1][0] != seen[0][0]  # the changed thread was not kept
    assert seen[2][0] == seen[1][0]  # the clean one was
    with open(os.path.join(state, "server", "server.log"), encoding="utf-8") as f:
        assert "a worker thread's state changed (SigBlk): not kept" in f.read()
