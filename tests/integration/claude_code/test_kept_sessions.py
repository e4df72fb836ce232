"""Kept sandboxes for agent sessions (issue 12 item 2): the hook's Bash calls of one Claude
Code session run in one sandbox the corral server keeps (:mod:`corral.server._kept`).

The real CLI (``claude -p`` against a scripted model) checks what a user sees: ``cd`` and
``export`` carry from one call to the next, a background process of one call is gone in the
next, two sessions share nothing, a changed policy gets a new sandbox. The client alone
checks what the server must still do per command: the exit status, signals, timeout and
kill, a kept sandbox that died (the next call gets a fresh one, never none), idle release.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import PROBE_PYTHON, _processes_mentioning, client_command

from ..conftest import World, corral_executable, needs_bwrap
from . import test_real_cli
from ._claude import ScriptedModel, claude_cli, run_claude
from .test_real_cli import install

pytestmark = needs_bwrap

SESSION = ("--agent-session", "s-kept", "--keep")


def _server(world: World, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [corral_executable(), "server", *args],
        env=world.environ,
        capture_output=True,
        check=False,
        timeout=60,
    )


def _sandboxes(world: World) -> list[str]:
    """The kept sandboxes' processes on the host (their bubblewrap and init)."""
    return [p for p in _processes_mentioning(world.root) if "--serve" in p]


@pytest.fixture
def served(world: World, request: pytest.FixtureRequest) -> Iterator[World]:
    """The world with its own corral server (kept sandboxes released after ``idle`` seconds)."""
    idle = getattr(request, "param", "60")
    del world.environ["CORRAL_SERVER"]
    world.environ["CORRAL_KEPT_IDLE"] = idle
    assert _server(world, "--detach").returncode == 0
    try:
        yield world
    finally:
        _server(world, "--stop")  # releases every kept sandbox before it exits
        deadline = time.monotonic() + 10
        while _sandboxes(world) and time.monotonic() < deadline:
            time.sleep(0.05)


def _client(world: World, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    return world.corral("run", *SESSION, *args, client="corral-client", **kwargs)


def _session(
    world: World, calls: list[tuple[str, dict[str, object]]], model: ScriptedModel | None = None
) -> list[tuple[str, bool]]:
    with model or ScriptedModel(calls) as running:
        result = run_claude(world.home, world.workspace, running, environ=world.environ)
    assert result.returncode == 0, (result.stdout, result.stderr)
    # the unprivileged escape pass degrades the limits it cannot hold (recorded, one
    # "corral: warning" line each per call): not the command's output
    results = [
        (
            "\n".join(
                line
                for line in text.splitlines()
                if not line.endswith("was not enforced (allowed by allowDegraded)")
            ),
            error,
        )
        for text, error in running.tool_results()
    ]
    assert len(results) == len(calls), results
    return results


def test_a_sessions_calls_share_cwd_exports_and_tmp_but_no_process(served: World) -> None:
    """Two Bash calls of one session: the second sees the first's ``cd``, ``export`` and
    ``/tmp`` (one kept sandbox); the first's background loop is gone (in the sandbox and on
    the host); another session sees none of it."""
    claude_cli()
    world = served
    world.environ["PATH"] = f"{os.path.dirname(corral_executable())}:{world.environ['PATH']}"
    install(world)
    workspace = os.path.realpath(world.workspace)
    loop = ": kept-loop-marker; while :; do date +%s%N >/tmp/tick; sleep 0.05; done"
    check = (
        'pwd; echo "probe=${CORRAL_PROBE-}"; a=$(cat /tmp/tick); sleep 0.5; b=$(cat /tmp/tick); '
        '[ -s /tmp/tick ] && [ "$a" = "$b" ] && echo loop-gone; cat /proc/1/cmdline | tr "\\0" " "'
    )
    results = _session(
        world,
        [
            (
                "Bash",
                {
                    "command": "mkdir -p sub && cd sub && export CORRAL_PROBE=kept; "
                    f"{{ {loop}; }} >/dev/null 2>&1 & sleep 0.3; echo started"
                },
            ),
            ("Bash", {"command": check}),
        ],
    )
    assert results[0] == ("started", False), results
    lines = results[1][0].splitlines()
    assert lines[:3] == [f"{workspace}/sub", "probe=kept", "loop-gone"], results
    assert "--init --serve" in lines[3]  # run by the kept sandbox's init
    # nothing of the loop on the host either; the kept sandbox itself is still there
    assert not [p for p in _processes_mentioning("kept-loop-marker") if "pytest" not in p]
    assert _sandboxes(world)
    other = _session(world, [("Bash", {"command": 'echo "probe=${CORRAL_PROBE-}"; ls /tmp'})])
    assert other == [("probe=", False)], other  # another session: its own sandbox and /tmp


def test_a_kept_sandbox_cannot_steer_the_next_calls_directory_either(served: World) -> None:
    """The same forged reports as for a fresh sandbox (a link out, ``cd /``, the report
    replaced by a link or a path outside, a newline), through the kept sandbox's report."""
    served.environ["PATH"] = f"{os.path.dirname(corral_executable())}:{served.environ['PATH']}"
    # a kept call's report is the tail of its shell state, after its own id
    tail = "printf 'return\\n%s\\n%s\\n' \"$CORRAL_SANDBOX_ID\" {outside}"
    forgeries = (
        f"{tail} >&63; trap - EXIT; exit 0",
        f"{tail} >/dev/fd/63; trap - EXIT; exit 0",
    )
    claude_cli()
    test_real_cli.cannot_steer(served, forgeries)
    assert _sandboxes(served)  # they ran kept


class _ChangingPolicy(ScriptedModel):
    """Runs *change* before it answers the turn *at* (between two tool calls)."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]], at: int, change: Any) -> None:
        super().__init__(calls)
        self._at, self._change = at, change

    def _answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        if body.get("tools") and len(self.requests) == self._at:
            self._change()
        return super()._answer(body)


def test_a_changed_policy_gets_a_new_sandbox(served: World) -> None:
    """The user's settings change between two calls: the second runs under the new policy in
    a new sandbox (the first's /tmp and exports are not there)."""
    claude_cli()
    world = served
    world.environ["PATH"] = f"{os.path.dirname(corral_executable())}:{world.environ['PATH']}"
    install(world)
    settings = os.path.join(world.home, ".config", "corral", "settings.json")
    calls: list[tuple[str, dict[str, Any]]] = [
        ("Bash", {"command": "export CORRAL_PROBE=1; echo mark >/tmp/mark; echo one"}),
        ("Bash", {"command": 'echo "probe=${CORRAL_PROBE-} policy=${CORRAL_MARK-}"; ls /tmp'}),
    ]
    model = _ChangingPolicy(
        calls, 1, lambda: World.write(settings, '{"env": {"set": {"CORRAL_MARK": "new"}}}')
    )
    results = _session(world, calls, model)
    assert results == [("one", False), ("probe= policy=new", False)], results


def test_exit_status_signals_timeout_and_kill_pass_through(served: World) -> None:
    """Per command, as in a fresh sandbox: the exit status, stdin, a timeout (124), SIGINT
    forwarded to the command, and a killed client stops the command's whole tree."""
    world = served
    client_command("corral-client")
    assert _client(world, "-c", "echo kept >/tmp/mark; exit 3").returncode == 3
    piped = _client(world, "-c", "cat; cat /tmp/mark", input=b"from stdin\n")
    assert (piped.returncode, piped.stdout) == (0, b"from stdin\nkept\n")
    timed = _client(world, "--timeout", "1s", "-c", "sleep 20")
    assert timed.returncode == 124 and b"timed out after 1s" in timed.stderr
    for signum, expected in ((signal.SIGINT, 42), (signal.SIGKILL, None)):
        with subprocess.Popen(
            [
                *client_command("corral-client"),
                "run",
                *SESSION,
                "-c",
                "trap 'exit 42' INT; echo ready; while :; do sleep 0.1; done # kept-kill-marker",
            ],
            cwd=world.workspace,
            env=world.environ,
            stdout=subprocess.PIPE,
        ) as proc:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            proc.send_signal(signum)
            status = proc.wait(timeout=30)
        if expected is not None:
            assert status == expected
        deadline = time.monotonic() + 10
        while _processes_mentioning("kept-kill-marker") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _processes_mentioning("kept-kill-marker")
    # SIGINT reaches the command's process group, as in a fresh sandbox: the shell does not
    # wait for its pipeline's sleep first (it would take 60 s; the wait below allows 20). The
    # sleep is running when "ready" arrives (a pipeline's commands are forked left to right).
    with subprocess.Popen(
        [
            *client_command("corral-client"),
            "run",
            *SESSION,
            "-c",
            "sleep 60 | { echo ready; cat; }; echo after",
        ],
        cwd=world.workspace,
        env=world.environ,
        stdout=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130
        assert proc.stdout.read() == b""
    again = _client(world, "-c", "cat /tmp/mark")  # the same kept sandbox still serves
    assert (again.returncode, again.stdout) == (0, b"kept\n")


def test_a_kept_sandbox_that_died_is_replaced_never_skipped(served: World) -> None:
    """Kill the kept sandbox from the host: the next call runs in a new sandbox (the write
    outside the workspace still fails), not without one."""
    world = served
    client_command("corral-client")
    assert _client(world, "-c", "echo one >/tmp/mark").returncode == 0
    for line in _sandboxes(world):
        if "bwrap" in line.split(":", 1)[1].split()[0]:
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
    result = _client(world, "-c", f"ls /tmp; echo pwned > {world.victim}")
    assert result.returncode != 0 and b"mark" not in result.stdout, result
    assert World.read(world.victim) == "original\n"
    assert b"--serve" in _client(world, "-c", "cat /proc/1/cmdline").stdout  # kept again


@pytest.mark.parametrize("served", ["1"], indirect=True)
def test_an_idle_kept_sandbox_is_released(served: World) -> None:
    """With ``CORRAL_KEPT_IDLE=1`` the kept sandbox and its /tmp are gone a little later; the
    kept /tmp of a server that died (no such pid) is swept when the first one is opened."""
    world = served
    client_command("corral-client")
    dead = World.write(os.path.join(world.state_dir, "sessions", "999999999-kept-1", "x"), "x")
    assert _client(world, "-c", "echo one >/tmp/mark").returncode == 0
    assert not os.path.exists(os.path.dirname(dead))
    assert _sandboxes(world)
    deadline = time.monotonic() + 15
    while _sandboxes(world) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sandboxes(world)
    assert not [n for n in os.listdir(os.path.join(world.state_dir, "sessions")) if "kept" in n]
    result = _client(world, "-c", "ls /tmp")
    assert result.returncode == 0 and b"mark" not in result.stdout


def test_a_policy_with_credentials_runs_fresh_each_call(served: World) -> None:
    """Credentials are injected per command line: no kept sandbox (nothing may carry)."""
    world = served
    client_command("corral-client")
    World.write(
        os.path.join(world.home, ".config", "corral", "settings.json"),
        '{"credentials": [{"name": "KEPT_TOKEN", "from": "env:SECRET_TOKEN", '
        '"commands": ["deploy *"]}]}',
    )
    assert _client(world, "-c", "echo one >/tmp/mark").returncode == 0
    result = _client(world, "-c", "ls /tmp; cat /proc/1/cmdline")
    assert result.returncode == 0 and b"mark" not in result.stdout, result
    assert b"--serve" not in result.stdout and not _sandboxes(world)


def test_each_kept_call_has_its_own_id_and_a_plan_from_the_host_as_it_is(served: World) -> None:
    """The kept sandbox reuses the plan of an earlier call that differed only in its command
    and sandbox id (:meth:`corral.pipeline._resident.Resident._plan`): each call still gets
    its own ``CORRAL_SANDBOX_ID`` (the one its outcome records), and a secret the host
    creates between two calls is hidden from the next one (the host is looked at anew)."""
    world = served
    client_command("corral-client")
    secret = world.ws("later.key")
    deny = ("--deny-read", world.ws("*.key"))
    probe = 'echo "$CORRAL_SANDBOX_ID"; readlink /proc/self/ns/pid; cat later.key'
    seen = []
    for call in range(5):
        if call == 2:
            World.write(secret, "created later\n")
        out = os.path.join(world.root, f"outcome-{call}.json")
        result = _client(world, *deny, "--json-out", out, "-c", probe)
        assert b"created later" not in result.stdout, result
        with open(out) as f:
            recorded = json.load(f)["sandbox_id"]
        sandbox_id, ns = result.stdout.decode().splitlines()[:2]
        assert sandbox_id == recorded, (sandbox_id, recorded)
        seen.append((sandbox_id, ns))
    assert len({sid for sid, _ns in seen}) == 5  # a new id per call
    namespaces = [ns for _sid, ns in seen]
    assert namespaces[0] == namespaces[1]  # kept: the same sandbox (and the cached plan)
    # the host changed: that call runs fresh, the next opens a new kept sandbox from the
    # host as it is now, and the one after runs there again
    assert len({namespaces[1], namespaces[2], namespaces[3]}) == 3
    assert namespaces[4] == namespaces[3]


def _call(world: World, command: str) -> tuple[int, str, str]:
    """One Bash call of session ``s-kept`` as Claude Code runs it: ``bash -c`` the hook's
    rewritten command in the workspace; ``(status, stdout, the host shell's directory after)``."""
    from corral.integrations.claude_code_hook import rewrite_command

    line = rewrite_command(
        command,
        session_id="s-kept",
        corral=client_command("corral-client"),
        workspace=os.path.realpath(world.workspace),
    )
    result = subprocess.run(
        ["bash", "-c", line + '\necho "$?"; pwd -P'],
        capture_output=True,
        cwd=world.workspace,
        env=world.environ,
        timeout=30,
        check=False,
    )
    *out, status, host = result.stdout.decode().split("\n")[:-1]
    return int(status), "\n".join(out), host


def test_the_kept_report_is_this_calls_own_and_cannot_steer_the_host(served: World) -> None:
    """A kept call's cwd report travels on its state channel (descriptor 63), after
    ``return`` and the call's own sandbox id: a call that exits 0 without the script's end
    (``exec``) does not carry the previous call's directory, a tail the command forges with
    its own id (a directory outside the workspace, a link out of it) moves the host shell
    nowhere outside the workspace, and a command that rewinds, truncates, closes or floods
    the channel stops none of the next calls."""
    world = served
    workspace = os.path.realpath(world.workspace)
    outside = os.path.realpath(world.home)
    os.makedirs(world.ws("sub"))
    os.symlink(outside, world.ws("out"))
    assert _call(world, "export KEPT_PROBE=1; cd sub") == (0, "", f"{workspace}/sub")
    # the previous call's report is in the state this call is given: its exec leaves it as
    # it is, and that report is not this call's
    assert _call(world, 'echo "$KEPT_PROBE"; exec true') == (0, "1", workspace)
    forged = (
        "trap - EXIT; "  # the script's own write at exit is gone: only the forged tail is left
        "printf 'return\\n%s\\n%s\\n' \"$CORRAL_SANDBOX_ID\" {target} >&63; "
        "exit 0"
    )
    for target in (outside, world.ws("out"), "/", "$'/tmp\\n'"):
        assert _call(world, forged.format(target=target)) == (0, "", workspace), target
    # a tail naming a directory of the workspace is what the command could do by cd anyway
    assert _call(world, forged.format(target=world.ws("sub"))) == (0, "", f"{workspace}/sub")
    # the channel rewound and truncated (through /proc), closed, or flooded past MAX_STATE
    python = f"{PROBE_PYTHON} -c"
    abuses = (
        f"{python} 'import os; os.ftruncate(63, 0)'; trap - EXIT; exit 0",
        "exec 63>&-; trap - EXIT; exit 0",
        f"{python} 'import os; os.write(63, bytes(2 << 20))'; trap - EXIT; exit 0",
        "mkfifo /tmp/f 2>/dev/null; trap - EXIT; exit 0",
    )
    for abuse in abuses:
        assert _call(world, abuse)[0] == 0, abuse
        assert _call(world, "export KEPT_AGAIN=1; cd sub") == (0, "", f"{workspace}/sub")
        assert _call(world, 'echo "$KEPT_AGAIN"') == (0, "1", workspace)
    assert _sandboxes(world)  # all of it ran kept


def test_a_call_with_another_environment_never_gets_the_kept_sandbox_of_the_first(
    served: World,
) -> None:
    """A kept sandbox was planned from the environment of the call that opened it: a call
    of the same session with another value of a variable the policy passes gets its own."""
    show = ("--env", "KEPT_PROBE", "--", "sh", "-c", 'echo "$KEPT_PROBE"')
    first = _client(served, *show, env={"KEPT_PROBE": "first"})
    again = _client(served, *show, env={"KEPT_PROBE": "first"})
    other = _client(served, *show, env={"KEPT_PROBE": "second"})
    assert [r.stdout.strip() for r in (first, again, other)] == [b"first", b"first", b"second"]
    assert len(_sandboxes(served)) >= 2  # the second value has a kept sandbox of its own


def test_a_kept_call_in_a_forged_worktree_never_makes_the_hosts_git_run_its_config(
    served: World,
) -> None:
    """ATK16, the whole chain: a background call in a linked worktree ``wt`` (its sandbox
    writes the shared ``repo/.git``) makes ``repo/.git/worktrees`` a git directory with the
    admin directory ``worktrees/N`` vouching for a planted ``wt/sub/.git``, and lasts. A
    kept call started in ``sub`` meanwhile gets ``repo/.git/worktrees`` writable with the
    ``.git`` rows re-rooted there, so ``repo/.git/worktrees/wt/commondir`` is not
    protected in it: it builds a git directory with a payload config in its kept ``/tmp``
    (a host directory no broker supervises, named by its own mountinfo) and points the real
    worktree's ``commondir`` at it. Until the call ends, the host's ``git status`` in ``wt``
    (an editor's poll, Claude Code's own) runs the payload's ``core.fsmonitor`` on the
    host."""
    from tests.integration.test_git_persistence import host_git, marker, payload_config

    world = served
    repo = os.path.join(world.root, "repo")
    os.makedirs(repo)
    assert host_git(world, repo, "init", "-q").returncode == 0
    World.write(os.path.join(repo, "README"), "main\n")
    assert host_git(world, repo, "add", "README").returncode == 0
    assert host_git(world, repo, "commit", "-qm", "init").returncode == 0
    worktree = os.path.join(world.root, "wt")
    assert host_git(world, repo, "worktree", "add", "-q", worktree).returncode == 0
    admin = os.path.join(repo, ".git", "worktrees")
    forged = os.path.join(admin, "worktrees", "N")
    sub = os.path.join(worktree, "sub")
    plant = (
        f"mkdir -p {admin}/objects {admin}/refs {forged} && printf '../..\\n' > {forged}/commondir"
        f" && printf '%s\\n' {sub}/.git > {forged}/gitdir"
        f" && mkdir sub && printf 'gitdir: %s\\n' {forged} > sub/.git"
        " && touch sub/planted && sleep 60"
    )
    config = payload_config(world).replace("\thooksPath = payload-hooks\n", "")
    redirect = (
        "mkdir -p /tmp/evil/objects /tmp/evil/refs && cat > /tmp/evil/config <<'CFG'\n"
        f"{config}CFG\n"
        "host=$(awk '$5 == \"/tmp\" { print $4 }' /proc/self/mountinfo | head -n 1)\n"
        f"printf '%s/evil\\n' \"$host\" > {admin}/wt/commondir && touch {sub}/redirected\n"
        "sleep 30"
    )
    spawn: dict[str, Any] = {
        "env": dict(world.environ),
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    planter = subprocess.Popen(
        [*client_command("corral-client"), "run", "-c", plant], cwd=worktree, **spawn
    )
    kept = None
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(sub, "planted")):
            assert planter.poll() is None, planter.communicate()
            assert time.monotonic() < deadline, "the plant never appeared"
            time.sleep(0.05)
        kept = subprocess.Popen(
            [*client_command("corral-client"), "run", *SESSION, "-c", redirect], cwd=sub, **spawn
        )
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(sub, "redirected")) and kept.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        host_git(world, worktree, "status")  # the user's (or an editor's) git, during the call
    finally:
        for process in (kept, planter):
            if process is not None:
                process.kill()
                process.communicate()
    assert not os.path.exists(marker(world)), "the host's git ran the kept call's config"
    assert host_git(world, worktree, "status", "--short").returncode == 0  # wt still works


def _bash(
    world: World, script: str, *options: str, stdin: object = subprocess.DEVNULL, cwd: str = ""
) -> subprocess.CompletedProcess[bytes]:
    """A call as the hook's rewritten command makes it: ``--shell bash -c``, stdin /dev/null."""
    return subprocess.run(
        [
            *client_command("corral-client"),
            "run",
            *SESSION,
            *options,
            "--shell",
            "bash",
            "-c",
            script,
        ],
        cwd=cwd or world.workspace,
        env=world.environ,
        stdin=stdin,  # type: ignore[arg-type]
        capture_output=True,
        timeout=60,
        check=False,
    )


def _waiting_shells(world: World) -> list[int]:
    """The pids of the shells started ahead in this world's kept sandboxes (waiting)."""
    ours = {int(line.split(":", 1)[0]) for line in _sandboxes(world)}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if b"__corral_g" not in f.read():
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            continue
        if parent in ours:
            found.append(int(name))
    return found


def _wait_for_shell(world: World) -> list[int]:
    deadline = time.monotonic() + 20
    while not (shells := _waiting_shells(world)):
        assert time.monotonic() < deadline, "no shell was started ahead of the next call"
        time.sleep(0.02)
    return shells


def test_the_next_calls_shell_waits_ahead_and_runs_exactly_that_call(served: World) -> None:
    """After a call, the shell of the session's next call is started ahead (issue 12): the
    next call runs there - as ``bash -c`` would run it, stdin ``/dev/null``, ``$SECONDS``
    from its start - with the exports and ``/tmp`` of the session, and nothing else of the
    calls before: their processes are gone before the shell is started."""
    world = served
    first = _bash(
        world,
        "export CARRIED=yes; echo t >/tmp/mark; "
        "(setsid sleep 300 & echo $! >/tmp/bg) ; sleep 300 & echo first",
    )
    assert (first.returncode, first.stdout) == (0, b"first\n"), first
    [shell] = _wait_for_shell(world)
    second = _bash(
        world,
        'printf "%s\\n" "${BASH_EXECUTION_STRING%%;*}" "s=$SECONDS" "$(cat /tmp/mark)"; '
        '[ -c /dev/stdin ] && echo null-stdin; ls /proc | grep -c "^[0-9]"; '
        'kill -0 "$(cat /tmp/bg)" 2>/dev/null && echo bg-alive; exit 7',
    )
    lines = second.stdout.decode().splitlines()
    assert second.returncode == 7, second
    # run by the shell started ahead (its loader), whose $SECONDS starts with the call
    assert lines[0] == "read -rn1 __corral_g <&62 || exit 125", lines
    assert lines[1:3] == ["s=0", "t"], lines
    assert lines[3] == "null-stdin"
    # pid 1 (the init), the shell, the pipeline's ls and grep, and $(...) is done: no sleep
    assert int(lines[4]) <= 4, lines
    assert "bg-alive" not in lines
    assert not os.path.exists(f"/proc/{shell}")  # it ended with its call
    assert shell not in _wait_for_shell(world)  # and the next call has a new one


def test_a_call_the_waiting_shell_does_not_fit_runs_as_before(served: World) -> None:
    """The shell started ahead runs only the call it was started for: another stdin,
    directory, program or environment gets a shell of its own (the waiting one is killed),
    with what it asked for."""
    world = served
    os.makedirs(world.ws("sub"))
    assert _bash(world, "echo one").returncode == 0
    _wait_for_shell(world)
    piped = _bash(world, "cat", stdin=subprocess.PIPE)
    assert piped.returncode == 0
    with subprocess.Popen(
        [*client_command("corral-client"), "run", *SESSION, "--shell", "bash", "-c", "cat; pwd"],
        cwd=world.ws("sub"),
        env=world.environ,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as proc:
        out, _err = proc.communicate(b"from stdin\n", timeout=60)
    assert (proc.returncode, out) == (
        0,
        f"from stdin\n{os.path.realpath(world.ws('sub'))}\n".encode(),
    )
    _wait_for_shell(world)
    elsewhere = _bash(world, "pwd", cwd=world.ws("sub"))
    assert elsewhere.stdout == f"{os.path.realpath(world.ws('sub'))}\n".encode()
    _wait_for_shell(world)
    plain = _client(world, "--", "sh", "-c", 'echo "$0"')
    assert (plain.returncode, plain.stdout) == (0, b"sh\n")
    env = _bash(world, 'echo "${CORRAL_PROBE-unset}"')
    assert env.stdout == b"unset\n"


def test_a_shell_waiting_ahead_that_died_is_replaced(served: World) -> None:
    """Killed from the host while it waits, the shell started ahead is not used: the call
    runs in a shell of its own, in the same kept sandbox, and the one after it waits again."""
    world = served
    assert _bash(world, "echo keep >/tmp/mark").returncode == 0
    for pid in _wait_for_shell(world):
        os.kill(pid, signal.SIGKILL)
    after = _bash(world, 'cat /tmp/mark; echo "${BASH_EXECUTION_STRING%%;*}"')
    assert after.returncode == 0, after
    assert after.stdout.splitlines()[0] == b"keep"  # the same kept sandbox
    assert b"__corral_g" not in after.stdout  # not by the dead shell's loader
    assert _wait_for_shell(world)


def test_timeout_and_signals_reach_a_call_in_the_shell_started_ahead(served: World) -> None:
    world = served
    assert _bash(world, "true", "--timeout", "2s").returncode == 0
    _wait_for_shell(world)
    timed = _bash(world, "echo started; sleep 30", "--timeout", "2s")
    assert timed.returncode == 124 and b"timed out after 2s" in timed.stderr, timed
    _wait_for_shell(world)
    with subprocess.Popen(
        [
            *client_command("corral-client"),
            "run",
            *SESSION,
            "--shell",
            "bash",
            "-c",
            "trap 'exit 42' INT; echo ready; while :; do sleep 0.1; done # ahead-int-marker",
        ],
        cwd=world.workspace,
        env=world.environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 42
    deadline = time.monotonic() + 10
    while _processes_mentioning("ahead-int-marker") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes_mentioning("ahead-int-marker")


def test_nothing_a_call_sets_on_the_sandboxs_init_reaches_the_next_call(served: World) -> None:
    """ATK18: every command of a kept sandbox - and the shell started ahead for the next
    call - is forked by its init (pid 1), and inherits the init's resource limits. A command
    runs as the init's uid, and ``prlimit(2)`` on another process of the same uid needs
    nothing more (no ptrace, no dumpable check), so one call lowers the init's limits and
    every later call of the session gets them: a file size limit, or - at 64 descriptors -
    an init that can no longer set up a command's descriptors (``F_DUPFD`` above 63), so
    every later call fails (exit 125) and the sandbox is kept: a Claude Code session's Bash
    tool wedged while it is used."""
    world = served
    show = "ulimit -Hf; ulimit -Hn"
    first = _bash(world, f"{show}; prlimit --pid 1 --fsize=1024:1024; echo set")
    assert first.returncode == 0 and first.stdout.endswith(b"set\n"), first
    before = first.stdout.splitlines()[:2]
    second = _bash(world, f"{show}; echo ran")
    assert second.returncode == 0, second
    assert second.stdout.splitlines() == [*before, b"ran"], "a call's limits reached the next"
    assert _bash(world, "prlimit --pid 1 --nofile=64:64; echo set").returncode == 0
    after = _bash(world, "echo ran")
    assert (after.returncode, after.stdout) == (0, b"ran\n"), after


def test_nothing_a_call_writes_in_the_inits_proc_files_reaches_the_next_call(
    served: World,
) -> None:
    """ATK19: the init is not dumpable, so its ``/proc/1`` files belong to uid 0 of its
    user namespace - and a root caller's sandbox maps uid 0 (to 65533): they are the
    command's own. ``/proc/1/coredump_filter`` is writable by owner and the mm flags it sets
    are inherited by every process the init forks (and kept across exec); the init's check
    (``init_state``) does not read it, so one call sets what every later call's core dumps
    hold, the shell started ahead too."""
    world = served
    fresh = _bash(world, "cat /proc/self/coredump_filter")
    assert fresh.returncode == 0, fresh
    _bash(world, "echo 0x7f > /proc/1/coredump_filter")
    later = _bash(world, "cat /proc/self/coredump_filter")
    assert later.returncode == 0, later
    assert later.stdout == fresh.stdout, "a call's coredump_filter on the init reached the next"
