"""``corral-client``, the compiled client, against real corral servers.

What it must share with the Python CLI - bytes of argv and environment, the
hook's answers, help texts - is compared with the Python CLI's own result;
what it must never do - run a command without a sandbox, run one twice, act
on a sidecar it cannot trust - is attempted and checked on the host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import PROBE_PYTHON, World, client_command, corral_command, needs_bwrap
from tests.integration.server.conftest import (
    gone,
    server_cgroups,
    sleep_duration,
    sleeping,
    status,
    stop,
    wait_for,
)

pytestmark = needs_bwrap

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__import__("corral").__file__)))

ODD_ARGS = [
    b"\xff\xe9a",  # Latin-1, not UTF-8
    b"\xed\xa0\x80",  # an encoded surrogate: not UTF-8 either
    b"\xe2\x82A",  # a truncated sequence
    b"\xc0\xaf",  # overlong
    "é 日本 🎉".encode(),  # valid
    b'tab\tnew\nline \x01 "quote" \\back',
]


def _fast(world: World, *args: str | bytes, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    environ = {**world.environ, **kwargs.pop("env", {})}
    return subprocess.run(
        [*client_command("corral-client"), *args],
        cwd=kwargs.pop("cwd", world.workspace),
        env=environ,
        capture_output=True,
        timeout=60,
        check=False,
        **kwargs,
    )


def _python(world: World, *args: str | bytes, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    environ = {**world.environ, **kwargs.pop("env", {})}
    return subprocess.run(
        [*corral_command(), *args],
        cwd=kwargs.pop("cwd", world.workspace),
        env=environ,
        capture_output=True,
        timeout=60,
        check=False,
        **kwargs,
    )


def _counts(world: World) -> tuple[int, int, int]:
    data = status(world)
    assert data is not None, "no server"
    return data["served"], data["hooks"], data["refused"]


# ---------------------------------------------------------------- bytes in, bytes out
def test_argv_and_environment_bytes_reach_the_command_as_the_python_client_sends_them(
    served: World,
) -> None:
    script = 'printf "%s\\0" "$@"; printf "[%s]" "$ODD"'
    args = ("run", "--env", "ODD", "--", "/bin/sh", "-c", script, "sh", *ODD_ARGS)
    env = {"ODD": b"\xff\xfe caf\xc3\xa9 \xed\xb3\xbf".decode("utf-8", "surrogateescape")}
    in_process = _python(served, *args, env={**env, "CORRAL_SERVER": "off"})
    before = _counts(served)
    python = _python(served, *args, env=env)
    fast = _fast(served, *args, env=env)
    assert _counts(served)[0] == before[0] + 2  # both were served
    expected = b"".join(a + b"\0" for a in ODD_ARGS) + b"[\xff\xfe caf\xc3\xa9 \xed\xb3\xbf]"
    assert in_process.stdout == expected, in_process.stderr
    assert (fast.returncode, fast.stdout, fast.stderr) == (0, expected, b"")
    assert (python.returncode, python.stdout, python.stderr) == (0, expected, b"")
    # the server decoded both requests to the same strings (the audit log shows them)
    *_, from_python, from_fast = served.audit_records()
    assert from_fast["argv"] == from_python["argv"]


def test_the_environment_is_the_one_the_python_cli_would_see(served: World) -> None:
    """No locale set: Python coerces LC_CTYPE=C.UTF-8 into its environment (PEP 538); so does the fast client."""
    env = {k: v for k, v in served.environ.items() if not k.startswith(("LANG", "LC_"))}

    def sandbox_env(command: list[str]) -> bytes:
        result = subprocess.run(
            [*command, "run", "--", "/usr/bin/env"],
            cwd=served.workspace,
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        return b"\n".join(sorted(x for x in lines if not x.startswith(b"CORRAL_SANDBOX_ID=")))

    before = _counts(served)
    python = sandbox_env(corral_command())
    fast = sandbox_env(client_command("corral-client"))
    assert _counts(served)[0] == before[0] + 2
    assert fast == python
    assert b"LC_CTYPE=C.UTF-8" in fast


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--help"),
        ("run", "-h"),
        ("--version",),
        ("hook", "--help"),
        ("doctor", "--nope"),
        (),
    ],
)
def test_everything_else_is_the_python_clis(served: World, args: tuple[str, ...]) -> None:
    before = _counts(served)
    fast = _fast(served, *args)
    python = _python(served, *args)
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        python.returncode,
        python.stdout,
        python.stderr,
    )
    assert _counts(served) == before


# ---------------------------------------------------------------- the hook
def _payload(cwd: str, tool: str, tool_input: dict[str, Any], **extra: Any) -> bytes:
    data = {
        "session_id": "0e1f-fast",
        "transcript_path": "/dev/null",
        "cwd": cwd,
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_use_id": "toolu_fast",
        **extra,
    }
    return json.dumps(data, ensure_ascii=False).encode()


def _hook_inputs(world: World) -> dict[str, bytes]:
    ws = world.workspace
    bad_project = world.ws("bad")
    World.write(os.path.join(bad_project, ".git", "HEAD"), "ref: refs/heads/main\n")
    World.write(
        os.path.join(bad_project, ".corral", "settings.json"), '{"resources": {"memory": "lots"}}'
    )
    return {
        "bash": _payload(ws, "Bash", {"command": "ls -la", "description": "List", "timeout": 5}),
        "bash-unicode-quotes": _payload(ws, "Bash", {"command": "echo 'ü \"x\" $(id)'\nexit 3"}),
        "bash-ask": _payload(ws, "Bash", {"command": "docker build -t app ."}),
        "bash-nul": _payload(ws, "Bash", {"command": "echo \x00"}),
        "write-outside": _payload(ws, "Write", {"file_path": world.victim, "content": "x"}),
        "write-tilde": _payload(ws, "Write", {"file_path": "~/.bashrc", "content": "x"}),
        "write-inside": _payload(ws, "Edit", {"file_path": "src/a.py", "old_string": "a"}),
        "read-secret": _payload(ws, "Read", {"file_path": "~/.ssh/id_rsa"}),
        "grep-home": _payload(ws, "Grep", {"pattern": "KEY", "path": world.home}),
        "glob-escape": _payload(ws, "Glob", {"pattern": "../home/.ssh/*"}),
        "unknown-tool": _payload(ws, "WebFetch", {"url": "https://example.com"}),
        "relative-cwd": _payload("ws", "Bash", {"command": "ls"}),
        "invalid-settings": _payload(bad_project, "Bash", {"command": "ls"}),
        "not-json": b"{not json",
        "empty": b"",
        "invalid-utf8": b'{"cwd": "\xff"}',
        "post-tool-use": json.dumps({"hook_event_name": "PostToolUse"}).encode(),
        "missing-tool-input": json.dumps(
            {"session_id": "s", "cwd": ws, "hook_event_name": "PreToolUse", "tool_name": "Bash"}
        ).encode(),
    }


def test_hook_answers_are_byte_for_byte_the_python_hooks(served: World) -> None:
    World.write(
        os.path.join(served.home, ".config", "corral", "settings.json"),
        json.dumps({"integrations": {"claudeCode": {"unsandboxedCommands": ["docker build*"]}}}),
    )
    inputs = _hook_inputs(served)
    before = _counts(served)
    for name, data in inputs.items():
        python = _python(served, "hook", "claude-code", input=data)
        fast = _fast(served, "hook", "claude-code", input=data)
        assert (fast.returncode, fast.stdout, fast.stderr) == (
            python.returncode,
            python.stdout,
            python.stderr,
        ), name
        assert python.returncode in (0, 2), (name, python.stderr)
    served_, hooks, refused = _counts(served)
    assert (served_, hooks, refused) == (before[0], before[1] + len(inputs), before[2])


def test_tilde_in_a_hook_input_is_the_clients_home_not_the_servers(served: World) -> None:
    other = os.path.join(served.root, "other-home")
    env = {"HOME": other, "XDG_STATE_HOME": os.path.dirname(served.state_dir)}
    data = _payload(served.workspace, "Write", {"file_path": "~/notes.txt", "content": "x"})
    before = _counts(served)
    fast = _fast(served, "hook", "claude-code", input=data, env=env)
    python = _python(served, "hook", "claude-code", input=data, env=env)
    assert _counts(served)[1] == before[1] + 1
    assert fast.stdout == python.stdout
    assert f"Write of {other}/notes.txt is not allowed".encode() in fast.stdout


@pytest.mark.parametrize("size", ["over-the-input-limit", "over-a-frame"])
def test_hook_inputs_too_large_for_the_server_are_decided_by_the_python_cli(
    served: World, size: str
) -> None:
    data = (
        b"x" * ((16 << 20) + 10)
        if size == "over-the-input-limit"
        else b'{"a": "' + b"\x01" * (3 << 20) + b'"}'  # 18 MiB as JSON escapes
    )
    before = _counts(served)
    fast = _fast(served, "hook", "claude-code", input=data)
    python = _python(served, "hook", "claude-code", input=data)
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        python.returncode,
        python.stdout,
        python.stderr,
    )
    assert fast.returncode == 2 and fast.stderr.startswith(b"corral: ")
    assert _counts(served)[1] == before[1]  # decided in-process, with the same input


def test_a_refused_hook_hands_its_input_to_the_python_cli(served: World) -> None:
    """The server refuses a client with another umask after the hook's input was read."""
    data = _payload(served.workspace, "Write", {"file_path": served.victim, "content": ""})
    before = _counts(served)
    command = [*client_command("corral-client"), "hook", "claude-code"]
    fast = subprocess.run(
        ["sh", "-c", 'umask 077; exec "$@"', "sh", *command],
        input=data,
        cwd=served.workspace,
        env=served.environ,
        capture_output=True,
        timeout=60,
        check=False,
    )
    python = _python(served, "hook", "claude-code", input=data)
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        python.returncode,
        python.stdout,
        python.stderr,
    )
    assert b'"permissionDecision":"deny"' in fast.stdout
    assert _counts(served) == (before[0], before[1], before[2] + 1)


def test_a_hook_without_a_server_answers_then_starts_one(world: World) -> None:
    del world.environ["CORRAL_SERVER"]
    data = _payload(world.workspace, "Read", {"file_path": world.secret})
    python = _python(world, "hook", "claude-code", input=data, env={"CORRAL_SERVER": "off"})
    fast = _fast(world, "hook", "claude-code", input=data)
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        python.returncode,
        python.stdout,
        python.stderr,
    )
    try:
        data_ = wait_for(lambda: status(world), what="the server the hook started")
        assert data_["hooks"] == 0
        again = _fast(world, "hook", "claude-code", input=data)
        assert again.stdout == fast.stdout
        assert _counts(world)[1] == 1
    finally:
        stop(world)


# ---------------------------------------------------------------- falling back, failing closed
def _copy_client(world: World, sidecar: bytes | None, mode: int = 0o644) -> str:
    directory = os.path.join(world.root, "bin")
    os.makedirs(directory, exist_ok=True)
    copy = os.path.join(directory, "corral-client")
    shutil.copy2(client_command("corral-client")[0], copy)
    if sidecar is not None:
        World.write(copy + ".cli", sidecar)
        os.chmod(copy + ".cli", mode)
    return copy


@pytest.mark.parametrize(
    ("sidecar", "mode", "message"),
    [
        (None, 0o644, b"corral-client.cli: No such file or directory"),
        (sys.executable.encode() + b"\n", 0o666, b"writable by its owner only"),
        (b"relative/python\n", 0o644, b"does not hold one absolute interpreter path"),
        (b"/nonexistent/python3\n", 0o644, b"cannot start corral's Python command line"),
    ],
    ids=["missing", "world-writable", "relative", "no-interpreter"],
)
@pytest.mark.parametrize("mode_", ["run", "hook"])
def test_without_a_trusted_sidecar_nothing_runs(
    world: World, sidecar: bytes | None, mode: int, message: bytes, mode_: str
) -> None:
    copy = _copy_client(world, sidecar, mode)
    marker = world.ws("marker")
    args = ["run", "--", "touch", marker] if mode_ == "run" else ["hook", "claude-code"]
    data = _payload(world.workspace, "Bash", {"command": f"touch {marker}"})
    result = subprocess.run(
        [copy, *args],
        input=data,
        cwd=world.workspace,
        env=world.environ,  # CORRAL_SERVER=off: straight to the fallback
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == (125 if mode_ == "run" else 2)
    assert result.stdout == b""
    assert result.stderr.startswith(b"corral: ") and message in result.stderr, result.stderr
    assert b"corral: hint: " in result.stderr
    assert not os.path.exists(marker)


def test_a_copy_of_the_fast_client_is_a_foreign_client(served: World) -> None:
    """Another binary than the server's own: refused as stale, the server retires, and the
    copy's fallback (its own sidecar) runs the command and starts a current server."""
    old = status(served)
    assert old is not None
    copy = _copy_client(served, sys.executable.encode() + b"\n")
    result = subprocess.run(
        [copy, "run", "-c", "echo ran; exit 4"],
        cwd=served.workspace,
        env=served.environ,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout, result.stderr) == (4, b"ran\n", b"")
    wait_for(lambda: gone(old["pid"]), what="the old server to retire")
    log = World.read(os.path.join(served.state_dir, "server", "server.log"))
    assert "another corral code stamp; retiring" in log
    new = wait_for(lambda: status(served), what="a new server")
    assert new["pid"] != old["pid"] and new["served"] == 0
    assert _fast(served, "run", "-c", "echo again").stdout == b"again\n"
    assert _counts(served)[0] == 1


@pytest.mark.parametrize("client", ["corral", "corral-client"])
def test_a_server_lost_after_accepting_is_exit_125_and_no_second_run(
    served: World, client: str
) -> None:
    data = status(served)
    assert data is not None
    duration = sleep_duration(300)
    proc = subprocess.Popen(
        [*client_command(client), "run", "-c", f"echo started >> runs; exec sleep {duration}"],
        cwd=served.workspace,
        env=served.environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # its line written, not only its file made: the shell creates `runs` (through the
        # write broker) a moment before it writes to it
        wait_for(
            lambda: os.path.exists(served.ws("runs")) and World.read(served.ws("runs")) != "",
            what="the command to start",
        )
        os.kill(data["pid"], signal.SIGKILL)
        _out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 125
    assert err == (
        b"corral: the corral server stopped during the run; the command was stopped with it\n"
        b"corral: hint: see " + os.path.join(served.state_dir, "server").encode() + b"/"
        b"server.log; CORRAL_SERVER=off runs corral without the server\n"
    )
    wait_for(lambda: not sleeping(duration), what="the sandbox to die with the server")
    assert World.read(served.ws("runs")) == "started\n"  # never a second run
    # a killed server leaves its socket and its ready launcher groups: clean up
    wait_for(lambda: gone(data["pid"]), what="the server to exit")

    def removed() -> bool:
        for path in sorted(set(server_cgroups(data["pid"])), key=len, reverse=True):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass  # listed under two names
            except OSError:
                return False  # EBUSY: its last tasks are still exiting
        return True

    wait_for(removed, what="the killed server's cgroups to empty")
    os.unlink(os.path.join(served.state_dir, "server", "server.sock"))


def test_signals_handed_over_reach_the_command_and_the_handoff_does_not(world: World) -> None:
    """What corral-client passes to the Python CLI: the result, then the signals so far."""
    del world.environ["CORRAL_SERVER"]
    started = time.monotonic()
    result = _python(
        world,
        "run",
        "--",
        PROBE_PYTHON,
        "-c",
        "import time; time.sleep(20); print('not interrupted')",
        env={"CORRAL_HANDOFF": "refused:15"},
    )
    assert result.returncode == 143 and result.stdout == b"", result.stderr
    assert time.monotonic() - started < 15
    shown = _python(
        world, "run", "--env", "CORRAL_*", "--", "/usr/bin/env", env={"CORRAL_HANDOFF": "refused"}
    )
    assert shown.returncode == 0 and b"CORRAL_HANDOFF" not in shown.stdout, shown
    assert status(world) is None  # "refused": no server is started either


def test_a_handoff_without_a_server_starts_one(world: World) -> None:
    del world.environ["CORRAL_SERVER"]
    result = _python(world, "run", "-c", "echo here", env={"CORRAL_HANDOFF": "no-server"})
    assert result.stdout == b"here\n"
    try:
        assert wait_for(lambda: status(world), what="a server")["served"] == 0
    finally:
        stop(world)


# ---------------------------------------------------------------- any bytes
_BYTES = st.binary(max_size=40).filter(lambda b: b"\0" not in b)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(words=st.lists(_BYTES, min_size=1, max_size=4), value=_BYTES)
def test_any_argv_and_environment_bytes_arrive_unchanged(
    served: World, words: list[bytes], value: bytes
) -> None:
    script = 'printf "%s\\0" "$@"; printf "[%s]" "$ODD"'
    env = {"ODD": os.fsdecode(value)}
    result = _fast(
        served, "run", "--env", "ODD", "--", "/bin/sh", "-c", script, "sh", *words, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"".join(w + b"\0" for w in words) + b"[" + value + b"]"


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(command=_BYTES, raw=st.booleans())
def test_any_hook_input_gets_the_python_hooks_answer(
    served: World, command: bytes, raw: bool
) -> None:
    """A Bash command of any bytes inside real hook JSON, or those bytes as the whole input."""
    head = _payload(served.workspace, "Bash", {"command": "@"}).split(b'"@"')
    data = (
        command
        if raw
        else head[0] + b'"' + command.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"' + head[1]
    )
    fast = _fast(served, "hook", "claude-code", input=data)
    python = _python(served, "hook", "claude-code", input=data, env={"CORRAL_SERVER": "off"})
    assert (fast.returncode, fast.stdout, fast.stderr) == (
        python.returncode,
        python.stdout,
        python.stderr,
    )


# ---------------------------------------------------------------- under sanitizers
SANITIZED_SERVER = """
import os, sys
sys.path.insert(0, sys.argv[2])
from corral.server import _server
from corral.cli.commands.server import handle_hook, handle_run
server = _server.Server(sys.argv[1], handler=handle_run, hook_handler=handle_hook, idle=60)
server.client_stamp = "c1:" + os.path.realpath(sys.argv[3])  # accept the sanitized build
server.start()
print("listening", flush=True)
server.serve()
"""


def _sanitized_client(world: World) -> str:
    native = os.path.join(SRC, "corral", "native")
    # the program's main file and its directory's (as setup.py's program_sources)
    rest = sorted(
        name for name in os.listdir(os.path.join(native, "client")) if name.endswith(".c")
    )
    sources = [
        os.path.join(native, "corral-client.c"),
        *(os.path.join(native, "client", name) for name in rest),
    ]
    binary = os.path.join(world.root, "asan", "corral-client")
    os.makedirs(os.path.dirname(binary))
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    built = subprocess.run(
        [
            cc,
            "-O1",
            "-g",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            binary,
            *sources,
        ],
        capture_output=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.skip(
            f"cannot build with -fsanitize=address,undefined: {built.stderr.decode()[-200:]}"
        )
    World.write(binary + ".cli", sys.executable + "\n")
    os.chmod(binary + ".cli", 0o644)
    return binary


def test_the_client_is_memory_safe_under_sanitizers(world: World) -> None:
    """AddressSanitizer and UBSan builds of corral-client through every path: served runs and
    hooks with odd bytes, signals, large and malformed input, every kind of fallback."""
    binary = _sanitized_client(world)
    del world.environ["CORRAL_SERVER"]
    env = {
        **world.environ,
        "ASAN_OPTIONS": "detect_leaks=0:exitcode=99",
        "UBSAN_OPTIONS": "exitcode=98",
    }

    def client(
        *args: str | bytes, stdin: bytes | None = None, **extra: str
    ) -> subprocess.CompletedProcess[bytes]:
        result = subprocess.run(
            [binary, *args],
            input=stdin,
            cwd=world.workspace,
            env={**env, **extra},
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert b"Sanitizer" not in result.stderr and b"runtime error" not in result.stderr, (
            result.stderr
        )
        assert result.returncode not in (98, 99), result.stderr
        return result

    # no server: every call falls back (and a Python CLI starts a regular server)
    assert client("run", "-c", "echo cold").stdout == b"cold\n"
    wait_for(lambda: status(world), what="the server the fallback started")
    # a regular server does not know this build: stale, it retires, the fallback runs it
    assert client("run", "-c", "echo stale; exit 5").returncode == 5
    stop(world)
    server = subprocess.Popen(
        [sys.executable, "-c", SANITIZED_SERVER, world.state_dir, SRC, binary],
        env=world.environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd="/",
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == b"listening\n"
        script = 'printf "%s\\0" "$@"; printf "[%s]" "$ODD"; exit 7'
        odd = client(
            "run",
            "--env",
            "ODD",
            "--",
            "/bin/sh",
            "-c",
            script,
            "sh",
            *ODD_ARGS,
            ODD=b"\xff\xfe \xed\xb3\xbf".decode("utf-8", "surrogateescape"),
        )
        assert odd.returncode == 7 and odd.stdout.endswith(b"[\xff\xfe \xed\xb3\xbf]")
        assert client("run", "--", "cat", stdin=b"x" * 300_000).stdout == b"x" * 300_000
        assert client("run", "--", "/nonexistent").returncode == 127
        assert client("run", "--help").returncode == 0
        long_env = {f"V{i}": "v" * 100 for i in range(3000)}
        assert client("run", "--", "true", **long_env).returncode == 0
        proc = subprocess.Popen(
            [
                binary,
                "run",
                "--",
                PROBE_PYTHON,
                "-c",
                "import signal, sys, time\n"
                "signal.signal(signal.SIGINT, lambda *_: sys.exit(42))\n"
                "print('ready', flush=True); time.sleep(30)",
            ],
            cwd=world.workspace,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 42 and b"Sanitizer" not in err, err
        for name, data in _hook_inputs(world).items():
            result = client("hook", "claude-code", stdin=data)
            assert result.returncode in (0, 2), (name, result.stderr)
        big = b'{"a": "' + b"\x01" * (3 << 20) + b'"}'
        assert client("hook", "claude-code", stdin=big).returncode == 2
        assert client("hook", "claude-code", stdin=b"y" * ((16 << 20) + 1)).returncode == 2
        data = status(world)
        assert data is not None and (data["served"], data["hooks"]) == (5, 18)
    finally:
        stop(world)
        server.wait(timeout=30)
        assert server.stdout is not None
        server.stdout.close()


def test_an_edited_deny_rule_applies_to_the_very_next_served_hook_call(served: World) -> None:
    """The server's settings cache (corral.policy._watched) is in use and exact.

    The answers come from the cache before the edit (its counters say so), and
    the first call after each edit - in place, then by rename - obeys it.
    """
    rules = os.path.join(served.workspace, ".claude", "settings.json")
    World.write(rules, json.dumps({"permissions": {"deny": []}}))
    data = _payload(served.workspace, "Bash", {"command": "rm -rf build"})

    def decision() -> str:
        result = _fast(served, "hook", "claude-code", input=data)
        assert result.returncode == 0, result.stderr
        return str(json.loads(result.stdout)["hookSpecificOutput"]["permissionDecision"])

    for _ in range(4):
        assert decision() == "allow"
    cache = (status(served) or {}).get("settings_cache")
    if cache is None:
        pytest.skip("the server has no inotify instance: no settings cache to test")
    assert cache["reused"] > 0, cache
    with open(rules, "r+") as f:
        f.truncate(0)
        f.write(json.dumps({"permissions": {"deny": ["Bash(rm:*)"]}}))
    assert decision() == "deny"
    for _ in range(3):
        assert decision() == "deny"
    World.write(rules + ".tmp", json.dumps({"permissions": {"deny": []}}))
    os.replace(rules + ".tmp", rules)
    assert decision() == "allow"
