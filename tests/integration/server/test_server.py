"""``corral run`` through a real corral server behaves exactly as in-process.

Every test here talks to real server processes (``corral server``) through
the installed ``corral`` command - and, where a test takes the ``client``
fixture, through the compiled ``corral-client`` too - with real bubblewrap
sandboxes.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import (
    PROBE_PYTHON,
    World,
    client_command,
    corral_command,
    needs_bwrap,
    needs_root,
)
from tests.integration.server.conftest import (
    gone,
    held_open,
    server_cgroups,
    sleep_duration,
    sleeping,
    status,
    stop,
    wait_for,
)

pytestmark = needs_bwrap

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__import__("corral").__file__)))


def _served(world: World) -> int:
    data = status(world)
    assert data is not None, "no server"
    served = data["served"]
    assert isinstance(served, int)
    return served


def _all(world: World, *args: str, **kwargs: object) -> list[subprocess.CompletedProcess[bytes]]:
    """Run ``corral ARGS`` in-process, then through the server with each client."""
    before = _served(world)
    results = [world.corral(*args, env={"CORRAL_SERVER": "off"}, **kwargs)]  # type: ignore[arg-type]
    for client in ("corral", "corral-client"):
        client_command(client)  # skips when corral-client was not built
        results.append(world.corral(*args, client=client, **kwargs))  # type: ignore[arg-type]
    assert _served(world) == before + 2, "the runs did not go through the server"
    return results


def _both(
    world: World, *args: str, client: str = "corral", **kwargs: object
) -> tuple[subprocess.CompletedProcess[bytes], ...]:
    """Run ``corral ARGS`` in-process and through the server with *client*; return both results."""
    before = _served(world)
    in_process = world.corral(*args, env={"CORRAL_SERVER": "off"}, **kwargs)  # type: ignore[arg-type]
    served = world.corral(*args, client=client, **kwargs)  # type: ignore[arg-type]
    assert _served(world) == before + 1, "the run did not go through the server"
    return in_process, served


CASES = [
    pytest.param(("run", "-c", "echo out; echo err >&2; exit 3"), 3, id="status-and-streams"),
    pytest.param(("run", "--timeout", "1", "-c", "sleep 20"), 124, id="timeout"),
    pytest.param(("run", "--backend", "nonesuch", "--", "true"), 125, id="bad-backend"),
    pytest.param(("run", "--memroy", "1G", "--", "true"), 125, id="bad-option"),
    pytest.param(("run", "--", "/nonexistent/program"), 127, id="not-found"),
    pytest.param(("run", "--", "./README"), 126, id="not-executable"),
    pytest.param(
        ("run", "-c", "echo x > .bashrc; mkdir -p .git/hooks; echo y > .git/hooks/pre"),
        2,
        id="violations",
    ),
    pytest.param(("run", "--max-output", "10", "-c", "yes | head -c 1000"), 0, id="output-cap"),
    pytest.param(("run", "-c", "kill -TERM $$"), 143, id="killed-by-signal"),
]


@pytest.mark.parametrize(("args", "expected"), CASES)
def test_statuses_and_output_are_byte_for_byte_the_in_process_ones(
    served: World, args: tuple[str, ...], expected: int
) -> None:
    in_process, *via_server = _all(served, *args)
    assert in_process.returncode == expected, in_process.stderr
    for result in via_server:  # the Python client, the compiled client
        assert (result.returncode, result.stdout, result.stderr) == (
            in_process.returncode,
            in_process.stdout,
            in_process.stderr,
        )


@needs_root
def test_memory_limit_kills_with_137_through_a_ready_launcher(served: World) -> None:
    code = "b = bytearray(400 << 20); print(len(b))"
    before = status(served)
    assert before is not None and before["launchers"] is not None, "no launcher pool here"
    in_process, via_server = _both(served, "run", "--memory", "64M", "--", PROBE_PYTHON, "-c", code)
    assert via_server.returncode == in_process.returncode == 137
    assert via_server.stderr == in_process.stderr
    assert b"memory limit" in via_server.stderr
    after = status(served)
    assert after is not None and after["launchers"]["served"] > before["launchers"]["served"]


@needs_root
def test_a_fork_bomb_is_contained_and_its_groups_removed(served: World) -> None:
    data = status(served)
    assert data is not None
    started = time.monotonic()
    duration = sleep_duration(30)
    result = served.run(
        f"i=0; while [ $i -lt 300 ]; do sleep {duration} & i=$((i+1)); done; wait", "--pids", "40"
    )
    assert time.monotonic() - started < 25
    assert b"fork" in result.stderr.lower(), result.stderr  # "Cannot fork" from the shell
    assert not sleeping(duration)
    # only the pool's ready groups remain while the server runs
    assert all("-launch-" in path for path in server_cgroups(data["pid"]))


def test_stdin_is_the_clients(served: World) -> None:
    results = _all(served, "run", "--", "cat", input=b"hello\nworld\n")
    assert [r.stdout for r in results] == [b"hello\nworld\n"] * 3


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # no output cap: the terminal itself is handed to the command (colours, isatty)
        (("--max-output", "none"), [b"in-tty", b"out-tty", b"err-tty"]),
        # with the default cap, output is relayed from corral's own ptys (capped, digested)
        ((), [b"in-tty", b"out-tty", b"err-tty"]),
        # --no-tty: through pipes; stdin stays the terminal
        (("--no-tty",), [b"in-tty"]),
    ],
)
def test_a_terminal_stays_a_terminal(
    served: World, client: str, options: tuple[str, ...], expected: list[bytes]
) -> None:
    script = "test -t 0 && echo in-tty; test -t 1 && echo out-tty; test -t 2 && echo err-tty"

    def on_pty(env: dict[str, str], command: list[str]) -> tuple[int, bytes]:
        pid, fd = pty.fork()
        if pid == 0:  # the child's terminal is the pty
            os.chdir(served.workspace)
            os.execvpe(command[0], [*command, "run", *options, "-c", script], env)
        out = b""
        while True:
            ready, _, _ = select.select([fd], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        _, wait_status = os.waitpid(pid, 0)
        os.close(fd)
        return os.waitstatus_to_exitcode(wait_status), out

    before = _served(served)
    in_process = on_pty({**served.environ, "CORRAL_SERVER": "off"}, corral_command())
    via_server = on_pty(dict(served.environ), client_command(client))
    assert _served(served) == before + 1
    assert via_server == in_process
    assert via_server[1].split() == expected


def test_sigint_reaches_the_commands_handler(served: World, client: str) -> None:
    script = (
        "import os, signal, time\n"
        "def h(*_): os.write(1, b'handled\\n'); os._exit(42)\n"
        "signal.signal(signal.SIGINT, h); os.write(1, b'ready\\n'); time.sleep(30)\n"
    )
    World.write(served.ws("s.py"), script)
    proc = subprocess.Popen(
        [*client_command(client), "run", "--", PROBE_PYTHON, "s.py"],
        cwd=served.workspace,
        env=served.environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (42, b"handled\n"), err
    assert _served(served) == 1


def test_killing_the_client_kills_the_sandbox(served: World, client: str) -> None:
    duration = sleep_duration(300)
    proc = subprocess.Popen(
        [*client_command(client), "run", "-c", f"echo $$ > pid; exec sleep {duration}"],
        cwd=served.workspace,
        env=served.environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(lambda: os.path.exists(served.ws("pid")), what="the command to start")
    assert _served(served) == 1
    proc.kill()
    proc.wait()
    wait_for(
        lambda: not sleeping(duration),
        timeout=10,
        what="the sandbox to die with its client",
    )
    record = wait_for(lambda: served.audit_records(), what="the audit record")[-1]
    assert record["signal"] == 9 or record["exit_status"] == 137


def test_json_out_and_the_audit_record_use_the_clients_cwd(served: World, client: str) -> None:
    sub = served.ws("sub")
    os.makedirs(sub)
    result = served.corral(
        "run",
        "--json-out",
        "out.json",
        "--agent-session",
        "sess-7",
        "-c",
        "pwd; exit 3",
        cwd=sub,
        client=client,
    )
    assert result.returncode == 3 and result.stdout == f"{sub}\n".encode()
    outcome = json.loads(World.read(os.path.join(sub, "out.json")))
    assert outcome["returncode"] == 3 and outcome["backend"] == "bubblewrap"
    record = served.audit_records()[-1]
    assert record["cwd"] == sub and record["agent_session"] == "sess-7"
    assert _served(served) == 1


def test_settings_come_from_each_clients_home_cwd_and_environment(served: World) -> None:
    # One server (XDG_STATE_HOME fixed) serves clients with different homes.
    served.environ["XDG_STATE_HOME"] = os.path.dirname(served.state_dir)
    stop(served)
    assert served.corral("server", "--detach").returncode == 0
    outputs = []
    for n in (1, 2):
        home = os.path.join(served.root, f"home{n}")
        World.write(
            os.path.join(home, ".config", "corral", "settings.json"),
            json.dumps({"env": {"set": {"FROM_HOME": f"home{n}"}}}),
        )
        extra = World.write(
            os.path.join(served.root, f"extra{n}.json"),
            json.dumps({"env": {"set": {"FROM_FILE": f"file{n}"}}}),
        )
        result = served.corral(
            "run",
            "--env",
            "CLIENT_VAR",
            "-c",
            'echo "$FROM_HOME $FROM_FILE $CLIENT_VAR $(pwd)"',
            env={"HOME": home, "CORRAL_SETTINGS": extra, "CLIENT_VAR": f"var{n}"},
            cwd=served.ws(),
        )
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout.decode().strip())
    assert outputs == [
        f"home1 file1 var1 {served.workspace}",
        f"home2 file2 var2 {served.workspace}",
    ]
    assert _served(served) == 2


def test_concurrent_clients(served: World) -> None:
    results: dict[int, subprocess.CompletedProcess[bytes]] = {}

    def one(n: int) -> None:
        results[n] = served.corral("run", "-c", f"sleep 1; echo {n}; exit {n}")

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(n,)) for n in range(1, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - started < 4.5  # ran side by side
    assert {n: (r.returncode, r.stdout) for n, r in results.items()} == {
        n: (n, f"{n}\n".encode()) for n in range(1, 6)
    }
    assert _served(served) == 5


def test_the_server_exits_when_idle(world: World) -> None:
    del world.environ["CORRAL_SERVER"]
    world.environ["CORRAL_SERVER_IDLE"] = "1"
    assert world.corral("server", "--detach").returncode == 0
    data = status(world)
    assert data is not None and data["idle_timeout"] == 1
    assert world.run("true").returncode == 0
    wait_for(lambda: gone(data["pid"]), timeout=10, what="the idle exit")
    assert not os.path.exists(os.path.join(world.state_dir, "server", "server.sock"))
    assert "idle for 1s" in World.read(os.path.join(world.state_dir, "server", "server.log"))


def test_no_server_runs_in_process_then_starts_one(world: World, client: str) -> None:
    del world.environ["CORRAL_SERVER"]
    assert status(world) is None
    result = world.run("echo first", client=client)
    assert (result.returncode, result.stdout) == (0, b"first\n")
    data = wait_for(lambda: status(world), what="the server the client started")
    try:
        assert data["served"] == 0  # the first run was in-process
        assert world.run("echo second", client=client).stdout == b"second\n"
        assert _served(world) == 1
        # it was started detached: its own session, stdio on /dev/null, cwd /
        pid = data["pid"]
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        assert os.getsid(pid) == pid
        assert {os.readlink(f"/proc/{pid}/fd/{n}") for n in (0, 1, 2)} == {"/dev/null"}
    finally:
        stop(world)


def test_corral_server_off_never_starts_one(world: World, client: str) -> None:
    assert world.environ["CORRAL_SERVER"] == "off"
    assert world.run("echo hi", client=client).stdout == b"hi\n"
    time.sleep(0.5)
    assert status(world) is None
    assert not os.path.exists(os.path.join(world.state_dir, "server"))


STALE_SERVER = """
import sys
sys.path.insert(0, sys.argv[2])
from corral.server import _server
from corral.cli.commands.server import handle_run
server = _server.Server(sys.argv[1], handler=handle_run, idle=60)
server.stamp = "0:older-corral"
server.client_stamp = "c1:/older/corral/_bin/corral-client"
server.start()
print("listening", flush=True)
server.serve()
"""


def test_a_server_of_older_code_refuses_and_retires(world: World, client: str) -> None:
    del world.environ["CORRAL_SERVER"]
    old = subprocess.Popen(
        [sys.executable, "-c", STALE_SERVER, world.state_dir, SRC],
        env=world.environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd="/",
    )
    try:
        assert old.stdout is not None and old.stdout.readline() == b"listening\n"
        result = world.run("echo ran; exit 4", client=client)
        assert (result.returncode, result.stdout, result.stderr) == (4, b"ran\n", b"")
        old.wait(timeout=20)  # retired; nothing ran in it, so it exits at once
        log = World.read(os.path.join(world.state_dir, "server", "server.log"))
        assert "another corral code stamp; retiring" in log
        # the client started a current server for the next run
        data = wait_for(lambda: status(world), what="a new server")
        assert data["pid"] != old.pid and data["served"] == 0
        assert world.run("echo again", client=client).stdout == b"again\n"
        assert _served(world) == 1
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()
        assert old.stdout is not None
        old.stdout.close()
        stop(world)


def test_sigterm_stops_the_server_and_its_running_commands(served: World, client: str) -> None:
    data = status(served)
    assert data is not None
    duration = sleep_duration(300)
    proc = subprocess.Popen(
        [*client_command(client), "run", "-c", f"echo started; exec sleep {duration}"],
        cwd=served.workspace,
        env=served.environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
    os.kill(data["pid"], signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert b"the corral server was stopped; so was the command" in err
    wait_for(lambda: gone(data["pid"]), what="the server to exit")
    assert not sleeping(duration)
    assert server_cgroups(data["pid"]) == []


def test_status_and_stop_when_none_runs(world: World) -> None:
    result = world.corral("server", "--status")
    assert result.returncode == 1 and b"no corral server" in result.stdout
    result = world.corral("server", "--stop")
    assert result.returncode == 0 and b"no corral server" in result.stdout


def test_the_server_holds_nothing_of_the_clients_open(unwarmed: World) -> None:
    """Once a run is answered, nothing of it is left open in the server (a warm sandbox
    started behind a run holds its workspace while it waits: see the next test)."""
    served = unwarmed
    data = status(served)
    assert data is not None
    assert served.run("echo x").returncode == 0
    pid = data["pid"]
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    assert not held_open(pid, served.workspace)
    server_dir = os.path.join(served.state_dir, "server")
    assert os.stat(server_dir).st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(server_dir, "server.sock")).st_mode & 0o777 == 0o600


def test_a_client_whose_context_differs_runs_in_process(served: World, client: str) -> None:
    """A umask the server does not share: the server says so, the client runs it itself.

    The fast client hands the refusal on to the Python CLI, which does not ask again
    (the server counts one refusal).
    """
    data = status(served)
    assert data is not None
    command = [*client_command(client), "run", "-c", "touch made; stat -c %a made"]
    result = subprocess.run(
        ["sh", "-c", 'umask 077; exec "$@"', "sh", *command],
        cwd=served.workspace,
        env=served.environ,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, b"600\n", b"")
    after = status(served)
    assert after is not None and after["pid"] == data["pid"]  # no second server either
    assert after["served"] == data["served"] and after["refused"] == data["refused"] + 1
    log = World.read(os.path.join(served.state_dir, "server", "server.log"))
    assert "refused a client: the client's Umask differs from the server's" in log


@needs_root
def test_an_idle_server_releases_its_launcher_pool_and_a_run_starts_it_again(
    world: World,
) -> None:
    del world.environ["CORRAL_SERVER"]
    world.environ["CORRAL_SERVER_POOL_IDLE"] = "0.5"
    result = world.corral("server", "--detach")
    assert result.returncode == 0, result.stderr
    try:
        first = status(world)
        assert first is not None and first["launchers"] is not None, "no launcher pool here"
        pid = first["pid"]
        wait_for(lambda: server_cgroups(pid), what="the pool's prepared cgroups")
        time.sleep(1.5)  # no client for longer than the pool's idle time
        idle = status(world)
        assert idle is not None and idle["pid"] == pid
        assert idle["launchers"] is None
        assert server_cgroups(pid) == []  # nothing parked, no prepared group
        ran = world.run("echo served")
        assert (ran.returncode, ran.stdout) == (0, b"served\n"), ran.stderr
        again = status(world)
        assert again is not None and again["served"] == 1
        assert again["launchers"] is not None  # the run started it again
    finally:
        stop(world)
