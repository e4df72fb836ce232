"""The installed command line: audit, policy, trust, doctor, signals, --json-out, shell."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time

from tests.conftest import World, _processes_mentioning, corral_command, needs_bwrap

pytestmark = needs_bwrap


def test_every_run_is_audited_and_the_chain_verifies(world: World) -> None:
    for i in range(3):
        assert world.run(f"echo {i}; echo x > .bashrc; exit {i}").returncode == i
    records = [json.loads(line) for line in world.corral("audit", "--json").stdout.splitlines()]
    assert [r["exit_status"] for r in records] == [0, 1, 2]
    first = records[0]
    assert first["argv"] == ["/bin/sh", "-c", "echo 0; echo x > .bashrc; exit 0"]
    assert first["backend"] == "bubblewrap" and len(first["policy_digest"]) == 64
    assert first["stdout"]["size"] == 2 and len(first["stdout"]["sha256"]) == 64
    assert first["violations"][0]["rule"] == "filesystem.protect: **/.bashrc"
    assert world.corral("audit", "--verify").returncode == 0
    # edit one record: verify names it
    log = os.path.join(world.state_dir, "audit.jsonl")
    lines = World.read(log).splitlines()
    lines[0] = lines[0].replace('"exit_status":0', '"exit_status":9')
    World.write(log, "\n".join(lines) + "\n")
    result = world.corral("audit", "--verify")
    assert result.returncode == 1 and b"line 2" in result.stderr
    table = world.corral("audit").stdout.decode()
    assert "bubblewrap" in table and "exit=2" in table


def test_agent_session_and_secrets_in_argv_are_recorded_safely(world: World) -> None:
    world.corral("run", "--agent-session", "session-42", "--", "echo", "--token", "hunter22")
    record = json.loads(world.corral("audit", "--json", "-n", "1").stdout)
    assert record["agent_session"] == "session-42"
    assert "hunter22" not in json.dumps(record) and record["argv"] == ["echo", "--token", "***"]


def test_policy_explain_shows_each_values_source(world: World) -> None:
    World.write(
        os.path.join(world.home, ".config", "corral", "settings.json"),
        '{"resources": {"pids": 100}}',
    )
    out = world.corral("policy", "--explain", "--memory", "1G").stdout.decode()
    assert any(
        line.startswith("resources.pids = 100") and "user" in line for line in out.splitlines()
    )
    assert any(
        line.startswith("resources.memory = 1G") and "flags" in line for line in out.splitlines()
    )
    assert any(
        line.startswith("resources.timeout = 1h") and "defaults" in line
        for line in out.splitlines()
    )
    plan = world.corral("policy", "--plan", "--", "true").stdout.decode()
    assert "/dev/.corral-exec" in plan and "--unshare-net" in plan


def test_trust_accepts_a_project_loosening(world: World) -> None:
    World.write(world.ws(".corral", "settings.json"), '{"network": {"mode": "open"}}')
    code = "import socket; s = socket.socket(); print('net', s.connect_ex(('127.0.0.1', 9)))"
    before = world.corral("run", "--", "/usr/bin/python3", "-c", code)
    assert b"ignoring network.mode" in before.stderr
    assert world.corral("trust").returncode == 0
    assert b"trusted" in world.corral("trust", "--status").stdout
    after = world.corral("run", "--", "/usr/bin/python3", "-c", code)
    assert b"ignoring" not in after.stderr
    assert b"net 111" in after.stdout  # ECONNREFUSED from the host's loopback: the host network
    World.write(world.ws(".corral", "settings.json"), '{"network": {"mode": "open"}, "env": {}}')
    assert (
        b"ignoring network.mode" in world.corral("run", "--", "true").stderr
    )  # changed: untrusted again


def test_doctor_reports_every_backend(world: World) -> None:
    result = world.corral("doctor", "--json")
    data = json.loads(result.stdout)
    names = {b["backend"]: b for b in data["backends"]}
    assert names["bubblewrap"]["works"] is True
    assert names["none"]["works"] is True
    assert any(f["name"].startswith("write broker") and f["ok"] for f in data["features"])
    from tests.conftest import fast_client_path

    (fast,) = [f for f in data["features"] if f["name"].startswith("fast client")]
    assert (fast["ok"], fast["detail"] if fast["ok"] else None) == (
        fast_client_path() is not None,
        fast_client_path(),
    )
    text = world.corral("doctor").stdout.decode()
    assert "[ok ] bubblewrap" in text


def test_json_out_writes_the_outcome(world: World) -> None:
    path = os.path.join(world.root, "outcome.json")
    world.corral("run", "--json-out", path, "-c", "echo hi; exit 3")
    data = json.loads(World.read(path))
    assert data["returncode"] == 3 and data["backend"] == "bubblewrap" and data["stdout_size"] == 3


def test_sigint_reaches_the_command_and_its_handler_runs(world: World) -> None:
    script = (
        "import os, signal, time\n"
        "def h(*_): os.write(1, b'handled\\n'); os._exit(42)\n"
        "signal.signal(signal.SIGINT, h); os.write(1, b'ready\\n'); time.sleep(30)\n"
    )
    World.write(world.ws("s.py"), script)
    proc = subprocess.Popen(
        [*corral_command(), "run", "--", "/usr/bin/python3", "s.py"],
        cwd=world.workspace,
        env=world.environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert out == b"handled\n", (proc.returncode, err)
    assert proc.returncode == 42


def test_killing_corral_kills_the_sandbox(world: World) -> None:
    proc = subprocess.Popen(
        [*corral_command(), "run", "-c", "echo $$ > pid; sleep 300"],
        cwd=world.workspace,
        env=world.environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not os.path.exists(world.ws("pid")) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    # both the shell and its sleep: SIGKILLed together, they finish exiting one
    # after the other (the world's teardown fails the test if either is left)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _processes_mentioning(world.workspace):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the sandbox outlived corral")


def test_shell_runs_on_a_private_terminal(world: World) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # child: the user's terminal is this pty
        os.chdir(world.workspace)
        os.execvpe(
            corral_command()[0],
            [
                *corral_command(),
                "shell",
                "--",
                "/bin/sh",
                "-c",
                "tty; test -t 0 && echo ON-A-TTY; echo x > .bashrc; exit 5",
            ],
            world.environ,
        )
    output = b""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 5
    assert b"ON-A-TTY" in output
    assert b"blocked write" in output


def test_audit_follow_prints_new_records(world: World) -> None:
    world.run("echo first-run")
    follower = subprocess.Popen(
        [*corral_command(), "audit", "--follow", "-n", "1"],
        cwd=world.workspace,
        env=world.environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert follower.stdout is not None
        assert b"first-run" in follower.stdout.readline()  # it has read the log: now follow
        world.run("echo followed-run")
        line = b""
        deadline = time.monotonic() + 10
        while b"followed-run" not in line and time.monotonic() < deadline:
            ready, _, _ = select.select([follower.stdout], [], [], 1)
            if ready:
                line = follower.stdout.readline()
        assert b"followed-run" in line
    finally:
        follower.kill()
        follower.communicate()


def test_bench_reports_medians_as_json(world: World) -> None:
    result = world.corral("bench", "--json", "-n", "3", "core", timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)["core"]}
    assert rows["corral run -- true (warm server, default policy)"]["value"] > 0
    assert rows["corral run -- true (warm server, default policy)"]["target"] == "<= 1.3x"
    assert rows["corral run -- true (in-process, default policy)"]["value"] > 0
    assert rows["raw bwrap (agent profile) true"]["value"] > 0


def test_bench_backends_table_has_run_and_session_rows(world: World) -> None:
    result = world.corral("bench", "--json", "-n", "1", "backends", timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)["backends"]}
    assert rows["bare process /bin/true"]["value"] > 0
    unavailable = [r for r in rows.values() if r["note"] == "unavailable here"]
    assert all(r["value"] is None for r in unavailable)  # JSON has no NaN
    assert rows["corral run --backend bubblewrap -- true"]["value"] > 0
    session = rows["bubblewrap session exec true (SDK, in-process)"]
    assert session["value"] > 0 and session["baseline"] == "raw bwrap"


def test_doctor_reports_invalid_settings(world: World) -> None:
    assert b"[ok ] settings: valid" in world.corral("doctor").stdout
    user = os.path.join(world.home, ".config", "corral", "settings.json")
    World.write(user, '{"resources": {"memory": "lots"}}')
    result = world.corral("doctor")
    assert result.returncode == 1
    line = next(x for x in result.stdout.decode().splitlines() if "] settings:" in x)
    assert line.startswith("  [no ] settings:") and user in line and "resources.memory" in line
    assert b"the settings are invalid" in result.stderr
    data = json.loads(world.corral("doctor", "--json").stdout)
    (row,) = [f for f in data["features"] if f["name"] == "settings"]
    assert row["ok"] is False and "resources.memory" in row["detail"]


def test_doctor_matrix_progress_only_when_asked_or_on_a_terminal(world: World) -> None:
    quiet = world.corral("doctor", "--matrix", "--backend", "none", timeout=300)
    assert b"doctor --matrix:" not in quiet.stderr  # stderr is a pipe here
    loud = world.corral("doctor", "--matrix", "--backend", "none", "--progress", timeout=300)
    steps = [
        x for x in loud.stderr.decode().splitlines() if x.startswith("corral: doctor --matrix:")
    ]
    assert steps[0] == "corral: doctor --matrix: smoke-testing every backend"
    assert any(x.startswith("corral: doctor --matrix: backend 1/1 none: ") for x in steps)
    assert loud.stdout == quiet.stdout  # the table itself is unchanged


def test_policy_explain_gives_each_built_in_rows_reason(world: World) -> None:
    from corral.policy._defaults import (
        DEFAULT_RESOURCES,
        ENV_PASS,
        PROTECTED_PATTERNS,
        SECRET_PATHS,
    )

    out = world.corral("policy", "--explain").stdout.decode()
    reasons = {reason for _item, reason in (*SECRET_PATHS, *PROTECTED_PATTERNS, *ENV_PASS)}
    reasons |= {reason for _name, _value, reason in DEFAULT_RESOURCES}
    shown = {
        line.rpartition("(defaults: ")[2][:-1] for line in out.splitlines() if "(defaults: " in line
    }
    assert shown == reasons  # every row's reason, and only the tables' own
    ssh = next(
        line for line in out.splitlines() if line.strip().startswith('"' + world.home + '/.ssh"')
    )
    assert ssh.endswith("(defaults: SSH private keys, agent sockets and known hosts)")


def test_shell_refuses_no_tty(world: World) -> None:
    result = world.corral("shell", "--no-tty", "-c", "echo ran")
    assert result.returncode == 125 and b"ran" not in result.stdout
    assert b"--no-tty does not apply to corral shell" in result.stderr
