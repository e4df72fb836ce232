"""The real Claude Code CLI (``claude -p``) with corral's hook, driven by a scripted model.

Each test installs the hook the way users do (``corral install claude-code``),
scripts the model's tool calls (:mod:`._claude`), runs the real CLI headless
and checks the host afterwards: which files exist, what the tool results
said. Skipped with the reason when the CLI is not installed; ``.ci/run``
installs it from npm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import corral
from tests.conftest import client_command, unreadable_for

from ..conftest import World, corral_executable, needs_bwrap
from ._claude import ScriptedModel, claude_cli, run_claude

pytestmark = needs_bwrap


@pytest.fixture
def claude(world: World) -> str:
    path = claude_cli()
    venv_bin = os.path.dirname(corral_executable())
    world.environ["PATH"] = f"{venv_bin}:{world.environ['PATH']}"
    return path


def install(world: World, *args: str, cwd: str | None = None) -> str:
    result = subprocess.run(
        [corral_executable(), "install", "claude-code", *args],
        env=world.environ,
        cwd=cwd or world.workspace,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def user_permissions(world: World, **permissions: list[str]) -> None:
    path = os.path.join(world.home, ".claude", "settings.json")
    with open(path, encoding="utf-8") as f:
        settings = json.load(f)
    settings["permissions"] = permissions
    World.write(path, json.dumps(settings, indent=2))


def session(
    world: World,
    calls: list[tuple[str, dict[str, object]]],
    cwd: str | None = None,
    args: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
) -> list[tuple[str, bool]]:
    with ScriptedModel(calls) as model:
        result = run_claude(
            world.home,
            cwd or world.workspace,
            model,
            environ=world.environ,
            args=args,
            prefix=prefix,
        )
    assert result.returncode == 0, (result.stdout, result.stderr)
    results = model.tool_results()
    assert len(results) == len(calls), results
    return results


def as_user(world: World, who: str) -> tuple[str, ...]:
    """How to run Claude Code as *who*: ``"caller"``, or ``"nobody"`` (uid 65534, owning the world)."""
    if who == "caller":
        return ()
    if os.geteuid() != 0:
        pytest.skip("already unprivileged: the caller's pass is the unprivileged one")
    problem = unreadable_for(
        65534,
        corral_executable(),
        os.path.realpath(sys.executable),  # the interpreter the corral script runs
        claude_cli(),
        os.path.dirname(corral.__file__),
    )
    if problem is not None:
        pytest.skip(problem)
    # without root there is no writable cgroup v1 here: corral refuses the default limits
    # unless the user's settings accept running without them (as such a user's would)
    World.write(
        os.path.join(world.home, ".config", "corral", "settings.json"),
        '{"allowDegraded": ["resources.memory", "resources.pids"]}',
    )
    for directory, dirs, files in os.walk(world.root):
        for name in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
            os.lchown(name, 65534, 65534)
    return ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")


@pytest.mark.parametrize("who", ["caller", "nobody"])
def test_the_users_deny_ask_and_allow_rules_keep_their_meaning(
    world: World, claude: str, who: str
) -> None:
    for name in ("victim.txt", "asked.txt", "allowed.txt"):
        World.write(world.ws(name), "original\n")
    install(world)
    user_permissions(
        world, deny=["Bash(rm:*)"], ask=["Bash(git push:*)", "Bash(touch *)"], allow=["Bash(mv:*)"]
    )
    prefix = as_user(world, who)
    results = session(
        world,
        [
            ("Bash", {"command": "rm victim.txt"}),
            ("Bash", {"command": "echo ok && rm -f asked.txt"}),
            ("Bash", {"command": "touch new.txt"}),  # ask: refused in -p mode
            ("Bash", {"command": f"mv allowed.txt moved.txt; echo pwned > {world.victim}"}),
        ],
        prefix=prefix,
    )
    assert "deny rule 'Bash(rm:*)'" in results[0][0] and results[0][1]
    assert "deny rule 'Bash(rm:*)'" in results[1][0] and results[1][1]
    assert results[2][1] and "ask rule 'Bash(touch *)'" in results[2][0]
    for name, exists in [
        ("victim.txt", True),
        ("asked.txt", True),
        ("new.txt", False),
        ("allowed.txt", False),
        ("moved.txt", True),
    ]:
        assert os.path.exists(world.ws(name)) is exists, name
    # the allowed command ran, in the sandbox: the write outside the workspace failed
    assert "Read-only file system" in results[3][0]
    assert world.read(world.victim) == "original\n"
    assert world.read(world.ws("victim.txt")) == "original\n"


def test_tools_running_code_outside_the_sandbox_are_refused(world: World, claude: str) -> None:
    install(world)
    results = session(
        world,
        [("Workflow", {"script": "export const meta = {name: 'x', description: 'y', phases: []}"})],
    )
    assert results[0][1]
    assert "Workflow is not allowed" in results[0][0]


def test_read_through_link_dotdot_does_not_reach_a_secret(world: World, claude: str) -> None:
    install(world)
    os.makedirs(os.path.join(world.home, ".ssh", "nested"))
    os.symlink(os.path.join(world.home, ".ssh", "nested"), world.ws("keys"))
    results = session(
        world,
        [
            ("Read", {"file_path": world.ws("keys", "..", "id_rsa")}),
            ("Read", {"file_path": "/proc/self/cwd/../home/.ssh/id_rsa"}),
            ("Read", {"file_path": world.ws("README")}),
        ],
    )
    for text, is_error in results[:2]:
        assert is_error and "SECRET" not in text, text
    # Claude Code 2.1.197 normalizes the path lexically before the hook (it reads ws/id_rsa,
    # which does not exist); the hook would deny the kernel's reading of it as well
    assert "secret path" in results[0][0] or "does not exist" in results[0][0]
    assert "names a different object" in results[1][0], results[1][0]
    assert "hello" in results[2][0] and not results[2][1]


def test_project_install_says_exactly_which_sessions_it_covers(world: World, claude: str) -> None:
    sub = world.ws("src", "pkg")
    os.makedirs(sub)
    out = install(world, "--project", cwd=sub)
    assert f"sessions started in {world.workspace} itself" in out
    assert "corral install claude-code --user" in out
    probe = os.path.join(world.outside, "probe")
    touch = [("Bash", {"command": f"touch {probe}"})]
    # at the project's root: sandboxed
    (result,) = session(world, touch, args=("--permission-mode", "bypassPermissions"))
    assert "Read-only file system" in result[0]
    assert not os.path.exists(probe)
    # in a subdirectory Claude Code does not read the root's settings: what the note says
    session(world, touch, cwd=sub, args=("--permission-mode", "bypassPermissions"))
    assert os.path.exists(probe), (
        "Claude Code now reads the project's settings from subdirectories: "
        "update install.PROJECT_SCOPE_NOTE, docs/integrations.md and this test"
    )


def test_commands_the_bare_cli_accepts_are_accepted_sandboxed(world: World, claude: str) -> None:
    install(world)
    results = session(
        world,
        [
            # 20,000 quotes: quoted twice (corral's word, then Claude Code's) this was E2BIG
            ("Bash", {"command": "echo " + "\\'" * 20000 + " | wc -c"}),
            ("Bash", {"command": "echo $'a\\x00b'; echo \u200b"}),
            ("Bash", {"command": "cat <<'CORRAL_COMMAND_END'\nit's\nCORRAL_COMMAND_END"}),
        ],
    )
    assert results[0] == ("20001", False)
    assert results[1] == ("a\n\u200b", False)
    assert results[2] == ("it's", False)


@pytest.mark.parametrize(
    "args",
    [
        ("--disallowedTools", "Bash(rm:*)", "Edit"),
        ("--settings", '{"permissions": {"deny": ["Bash(rm:*)"]}}'),
        ("--settings", "extra-settings.json"),  # relative to Claude Code's directory
    ],
    ids=["disallowedTools", "settings-json", "settings-file"],
)
def test_deny_rules_on_claude_codes_command_line_hold(
    world: World, claude: str, args: tuple[str, ...]
) -> None:
    install(world)
    World.write(world.ws("extra-settings.json"), '{"permissions": {"deny": ["Bash(rm *)"]}}')
    World.write(world.ws("victim.txt"), "original\n")
    with ScriptedModel([("Bash", {"command": "rm victim.txt"})]) as model:
        result = run_claude(world.home, world.workspace, model, environ=world.environ, args=args)
    assert result.returncode == 0, result.stderr
    ((text, is_error),) = model.tool_results()
    assert is_error and "deny rule" in text and "claude --" in text, text
    assert world.read(world.ws("victim.txt")) == "original\n"


def test_command_line_rules_hold_when_the_server_answers_the_hook(
    world: World, claude: str
) -> None:
    # the fast client's hook is answered by the warm server, which finds Claude Code
    # above the client's pid (SO_PEERCRED), not above its own
    client_command("corral-client")  # skips when it was not built
    del world.environ["CORRAL_SERVER"]
    world.environ["XDG_STATE_HOME"] = os.path.join(world.root, "state")
    install(world)
    World.write(world.ws("victim.txt"), "original\n")

    def server(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [corral_executable(), "server", *args],
            env=world.environ,
            capture_output=True,
            text=True,
            check=False,
        )

    assert server("--detach").returncode == 0
    try:
        with ScriptedModel([("Bash", {"command": "rm victim.txt"})]) as model:
            run_claude(
                world.home,
                world.workspace,
                model,
                environ=world.environ,
                args=("--disallowedTools", "Bash(rm:*)"),
            )
        status = json.loads(server("--status", "--json").stdout)
    finally:
        server("--stop")
    ((text, is_error),) = model.tool_results()
    assert is_error and "(claude --disallowedTools)" in text, text
    assert world.read(world.ws("victim.txt")) == "original\n"
    assert status["hooks"] >= 1  # the server answered it


def test_skills_that_run_shell_commands_when_they_load_are_refused(
    world: World, claude: str
) -> None:
    # Claude Code runs a skill's !`cmd` lines itself, in its own process: no hook sees them
    install(world)
    probe = os.path.join(world.outside, "probe")
    World.write(
        world.ws(".claude", "skills", "setup", "SKILL.md"),
        f"---\nname: setup\ndescription: set up\n---\nState: !`touch {probe}-skill`\n",
    )
    World.write(
        world.ws(".claude", "commands", "deploy.md"),
        f"---\ndescription: deploy\n---\n```!\ntouch {probe}-command\n```\n",
    )
    World.write(
        world.ws(".claude", "skills", "plain", "SKILL.md"),
        "---\nname: plain\ndescription: plain\n---\nRun `make test` with the Bash tool.\n",
    )
    results = session(
        world,
        [
            ("Skill", {"skill": "setup"}),
            ("Skill", {"skill": "deploy"}),
            ("Skill", {"skill": "plain"}),
        ],
        args=("--permission-mode", "bypassPermissions"),
    )
    for text, is_error in results[:2]:
        assert is_error and "runs shell commands" in text, text
    assert results[2] == ("Launching skill: plain", False)
    assert not os.path.exists(f"{probe}-skill") and not os.path.exists(f"{probe}-command")


def test_a_subagents_commands_run_sandboxed(world: World, claude: str) -> None:
    install(world)
    probe = os.path.join(world.outside, "probe")
    with ScriptedModel(
        [
            ("Agent", {"description": "d", "prompt": "go", "subagent_type": "general-purpose"}),
            ("Bash", {"command": f"touch {probe}; echo from-subagent"}),  # the subagent's turn
        ]
    ) as model:
        result = run_claude(
            world.home,
            world.workspace,
            model,
            environ=world.environ,
            args=("--permission-mode", "bypassPermissions"),
        )
    assert result.returncode == 0, result.stderr
    texts = [
        str(block.get("content"))
        for request in model.requests
        for message in request["messages"]
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "tool_result"
    ]
    assert any("from-subagent" in text for text in texts), texts  # the subagent ran it...
    assert not os.path.exists(probe)  # ...in the sandbox


def test_claude_codes_own_cwd_tracking_is_what_the_docs_say(world: World, claude: str) -> None:
    """Claude Code alone (no hook): what a sandboxed ``cd`` would have to match (issue 11 item 6).

    Claude Code runs ``eval '<command>' < /dev/null && pwd -P >| /tmp/claude-...-cwd`` in a
    fresh bash per call: a ``cd`` carries to the next call only when the command exits 0,
    exported variables never carry, and a directory outside the session's allowed working
    directories is reset to the directory the session started in. docs/integrations.md
    ("Limits") relies on these facts; a Claude Code that changes them fails here.
    """
    workspace = os.path.realpath(world.workspace)
    results = session(
        world,
        [
            ("Bash", {"command": "mkdir -p sub other && cd sub && export CORRAL_PROBE=1"}),
            ("Bash", {"command": 'pwd; echo "probe=${CORRAL_PROBE-}"'}),
            ("Bash", {"command": "cd ../other; false"}),
            ("Bash", {"command": "pwd"}),
            ("Bash", {"command": "cd /"}),
            ("Bash", {"command": "pwd"}),
        ],
        args=("--permission-mode", "bypassPermissions"),
    )
    assert results[1] == (f"{workspace}/sub\nprobe=", False)
    assert results[2][1] is True  # the exit status of false reached Claude Code...
    assert results[3] == (f"{workspace}/sub", False)  # ...and its cd did not carry
    assert results[5] == (workspace, False)  # outside the allowed directories: reset


def test_a_sandboxed_cd_carries_to_the_next_call_as_without_corral(
    world: World, claude: str
) -> None:
    """Issue 11 item 6: ``cd`` inside the sandbox moves Claude Code's shell like Claude Code's own
    tracking (exit 0 only; exports never carry); the exit status still reaches Claude Code."""
    install(world)
    workspace = os.path.realpath(world.workspace)
    results = session(
        world,
        [
            ("Bash", {"command": "mkdir -p sub other && cd sub && export CORRAL_PROBE=1"}),
            ("Bash", {"command": 'pwd; echo "probe=${CORRAL_PROBE-}"'}),
            ("Bash", {"command": "cd ../other; false"}),
            ("Bash", {"command": "pwd"}),
            ("Bash", {"command": "exit 7"}),
        ],
    )
    assert results[0] == ("(Bash completed with no output)", False)
    assert results[1] == (f"{workspace}/sub\nprobe=", False)
    assert results[2] == ("Exit code 1", True)
    assert results[3] == (f"{workspace}/sub", False)
    assert results[4] == ("Exit code 7", True)


#: Forge a fresh sandbox's report: replace it by a link out, then write a path outside.
FRESH_FORGERIES = (
    'ln -sfn {outside} "$__corral_d/cwd"; exit 0',
    'printf "%s\\n" {outside} > "$__corral_d/cwd"; exit 0',
)


def test_the_sandbox_cannot_steer_the_next_calls_directory_outside_the_workspace(
    world: World, claude: str
) -> None:
    """The sandbox's report of its directory is untrusted: a link out of the workspace, a
    directory outside it, a forged report file and a name with a newline move nothing."""
    cannot_steer(world, FRESH_FORGERIES)


def cannot_steer(world: World, forgeries: tuple[str, str]) -> None:
    """The calls of the test above, with *forgeries* (``{outside}`` in them: a directory
    outside the workspace) as the two that forge the report."""
    install(world)
    workspace = os.path.realpath(world.workspace)
    outside = os.path.realpath(world.home)
    results = session(
        world,
        [
            ("Bash", {"command": f"ln -s {outside} out && cd out && pwd"}),
            ("Bash", {"command": "pwd"}),
            ("Bash", {"command": f"cd {outside}; cd /"}),
            ("Bash", {"command": "pwd"}),
            # forge the report: overwrite it with a link, then with a path outside
            ("Bash", {"command": forgeries[0].format(outside=outside)}),
            ("Bash", {"command": "pwd"}),
            ("Bash", {"command": forgeries[1].format(outside=outside)}),
            ("Bash", {"command": "pwd"}),
            ("Bash", {"command": "mkdir -p $'a\\n/' && cd $'a\\n/' && pwd | wc -l"}),
            ("Bash", {"command": "pwd"}),
        ],
    )
    # no "Shell cwd was reset": Claude Code's own check never had to catch a claim of corral's
    assert results[0] == (f"{workspace}/out", False)
    assert [results[i] for i in (2, 4, 6)] == [("(Bash completed with no output)", False)] * 3
    assert [results[i] for i in (1, 3, 5, 7, 9)] == [(workspace, False)] * 5, results
    assert results[8] == ("2", False)


def test_monitor_and_background_commands_run_sandboxed(world: World, claude: str) -> None:
    """Issue 11 item 2 with the real CLI: ``Monitor`` (a deferred tool in 2.1.331, loaded with
    ``ToolSearch``) and ``Bash`` with ``run_in_background`` run their commands in corral's sandbox:
    the write outside the workspace fails, the one inside lands."""
    install(world)
    attempt = "{{ echo pwned > {victim}; }} 2> {name}.err; echo ran > {name}.out; echo event"
    wait = "for i in $(seq 300); do [ -e {name}.out ] && break; sleep 0.1; done; cat {name}.out {name}.err"
    results = session(
        world,
        [
            ("ToolSearch", {"query": "select:Monitor", "max_results": 1}),
            (
                "Monitor",
                {
                    "description": "probe",
                    "timeout_ms": 30000,
                    "command": attempt.format(victim=world.victim, name="monitor"),
                },
            ),
            ("Bash", {"command": wait.format(name="monitor")}),
            (
                "Bash",
                {
                    "command": attempt.format(victim=world.victim, name="background"),
                    "run_in_background": True,
                },
            ),
            ("Bash", {"command": wait.format(name="background")}),
        ],
    )
    assert results[0][1] is False and results[1][1] is False, results  # loaded, started
    for name, result in (("monitor", results[2]), ("background", results[4])):
        assert result[0].startswith("ran\n") and "Read-only file system" in result[0], (
            name,
            result,
        )
        assert os.path.exists(world.ws(f"{name}.out"))
    assert world.read(world.victim) == "original\n"


def test_git_works_in_a_worktree_session_and_its_repository_stays_safe(
    world: World, claude: str
) -> None:
    """Issue 11: a Claude Code worktree session (``EnterWorktree`` makes
    ``.claude/worktrees/X``, whose ``.git`` file points into the repository's ``.git``): git
    add and commit work sandboxed; the shared ``.git``'s hooks and config stay closed. Claude
    Code 2.1.331 refuses heredocs and ``-c 'git ...'`` in such a session: the hook hands the
    command over in a file (``--command-file``), so these calls are accepted at all."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for args in (["init", "-q"], ["add", "README"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *args], cwd=world.workspace, env=world.environ, check=True)
    World.write(world.ws(".claude", "settings.json"), '{"worktree": {"baseRef": "head"}}')
    install(world)
    common = world.ws(".git")
    hook = os.path.join(common, "hooks", "post-commit")
    ident = "-c user.name=t -c user.email=t@example.invalid"
    results = session(
        world,
        [
            ("ToolSearch", {"query": "select:EnterWorktree", "max_results": 1}),
            ("EnterWorktree", {"name": "X"}),
            ("Bash", {"command": "echo work > work.txt"}),
            ("Bash", {"command": "git add work.txt"}),
            ("Bash", {"command": f"git {ident} commit -qm sandboxed"}),
            ("Bash", {"command": "git log --format=%s -1"}),
            ("Bash", {"command": f"printf '#!/bin/sh\\ntouch {world.victim}.hook\\n' > {hook}"}),
            ("Bash", {"command": f"git config core.fsmonitor 'touch {world.victim}.fsmonitor'"}),
        ],
    )
    worktree = os.path.realpath(world.ws(".claude", "worktrees", "X"))
    assert results[2:5] == [("(Bash completed with no output)", False)] * 3, results
    assert results[5] == ("sandboxed", False), results
    for text, is_error in results[6:8]:  # refused by the sandbox, not by Claude Code's own guard
        assert is_error and "corral: blocked write to" in text, text
    log = subprocess.run(
        ["git", "log", "--format=%s", "-1", "worktree-X"],
        cwd=world.workspace,
        env=world.environ,
        capture_output=True,
        text=True,
        check=False,
    )
    assert log.stdout == "sandboxed\n", (log.stdout, log.stderr)
    assert not os.path.exists(hook)
    for directory in (world.workspace, worktree):  # the user's next git runs nothing planted
        subprocess.run([*git, "status"], cwd=directory, env=world.environ, capture_output=True)
        subprocess.run(
            [*git, "commit", "-q", "--allow-empty", "-m", "host"],
            cwd=directory,
            env=world.environ,
            capture_output=True,
        )
    assert not [n for n in os.listdir(world.outside) if n.startswith("victim.txt.")]
