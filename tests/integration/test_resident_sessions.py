"""Resident sessions: an SDK session's commands run in one kept sandbox.

Each test makes the real attempt in a real sandbox and checks both the next
command (inside) and the host: the commands share the namespaces and the
filters, and nothing a command started survives into the next one.
Also run as an unprivileged user (tests/integration/test_escapes_unprivileged.py).
"""

from __future__ import annotations

import os
import time

from corral import Sandbox
from tests.conftest import World, needs_bwrap

pytestmark = needs_bwrap

_NS = "readlink /proc/self/ns/pid /proc/self/ns/mnt"


def _host_processes(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


def test_commands_share_the_sandbox_and_run_under_its_filters(world: World) -> None:
    with Sandbox(workspace=world.workspace, environ=world.environ) as sbx:
        first = sbx.exec(_NS)
        status = sbx.exec("grep -E '^(Seccomp|NoNewPrivs|CapEff):' /proc/self/status")
        second = sbx.exec(_NS)
        assert first.exit_code == second.exit_code == 0, (first.stderr, second.stderr)
        assert first.stdout == second.stdout  # the same pid and mount namespaces
        assert first.stdout != b""
        fields = dict(line.split(":\t", 1) for line in status.stdout.decode().splitlines())
        assert fields["NoNewPrivs"].strip() == "1"
        assert fields["Seccomp"].strip() == "2"  # the seccomp filter is on this command
        assert int(fields["CapEff"], 16) == 0
        # the init holds the filters too; the command can reach neither its memory
        # nor its control socket (fd 4), so it cannot ask it to spawn anything
        for path in ("/proc/1/mem", "/proc/1/fd/4"):
            attempt = sbx.exec(f"exec 7<>{path} && echo opened")
            assert attempt.exit_code != 0, path
            assert b"opened" not in attempt.stdout
            assert b"Permission denied" in attempt.stderr, attempt.stderr
        init = sbx.exec("grep -E '^(Seccomp|NoNewPrivs):' /proc/1/status").stdout.decode()
        assert "Seccomp:\t2" in init and "NoNewPrivs:\t1" in init


def test_nothing_of_a_command_survives_into_the_next(world: World) -> None:
    marker = f"{os.getpid() % 1000 + 4000}"
    with Sandbox(workspace=world.workspace, environ=world.environ) as sbx:
        started = sbx.exec(
            f"sleep {marker} & setsid sleep {marker} & (trap '' TERM HUP; sleep {marker}) & "
            "export LEFT=behind; cd /; echo started"
        )
        assert started.stdout == b"started\n", started.stderr
        after = sbx.exec(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; "
            'echo "left=${LEFT-unset}"; pwd'
        )
        lines = after.stdout.decode().splitlines()
        assert not [line for line in lines if f"sleep {marker}" in line], lines
        assert "left=unset" in lines  # an SDK session carries no shell state
        assert lines[-1] == world.workspace
    # and on the host: nothing is left of them, nor of the session's sandbox
    assert not _host_processes(f"sleep {marker}")
    assert not _host_processes(world.workspace)


def test_each_command_keeps_its_own_timeout_and_output_cap(world: World) -> None:
    with Sandbox(workspace=world.workspace, environ=world.environ, max_output="1KiB") as sbx:
        ns = sbx.exec(_NS).stdout
        began = time.monotonic()
        slow = sbx.exec("trap '' TERM; sleep 60", timeout=0.5)
        assert slow.timed_out
        assert time.monotonic() - began < 30  # TERM ignored: KILL after the grace
        big = sbx.exec("head -c 5000 /dev/zero; echo done >&2")
        assert big.stdout_truncated and big.stdout_size == 5000
        assert len(big.stdout) + len(big.stderr) <= 1024
        fed = sbx.exec("cat", stdin="fed\n")
        assert fed.stdout == b"fed\n"
        missing = sbx.exec("no-such-program-here")
        assert missing.exit_code == 127
        assert sbx.exec(_NS).stdout == ns  # all in the same sandbox


def test_a_failed_resident_command_does_not_poison_the_session(world: World) -> None:
    with Sandbox(workspace=world.workspace, environ=world.environ) as sbx:
        ns = sbx.exec(_NS).stdout
        killed = sbx.exec("kill -9 $$")
        assert killed.signal == 9
        # the init ignores a command's attempt to signal it
        sbx.exec("kill -9 1; kill -TERM 1")
        assert sbx.exec(_NS).stdout == ns
        assert sbx.exec("echo still").stdout == b"still\n"


def test_a_command_with_other_rules_runs_in_a_fresh_sandbox(world: World) -> None:
    # a rules entry gives the matching command another policy: its own sandbox
    rules = [{"match": "cat*", "filesystem": {"denyRead": [world.ws("private")]}}]
    World.write(world.ws("private"), "not for cat\n")
    with Sandbox(
        workspace=world.workspace, environ=world.environ, settings={"rules": rules}
    ) as sbx:
        ns = sbx.exec(_NS).stdout
        assert sbx.exec("head -c 3 private").stdout == b"not"
        denied = sbx.exec("cat private; " + _NS)
        assert b"not for cat" not in denied.stdout
        assert ns not in denied.stdout  # not the resident sandbox's namespaces
        assert sbx.exec(_NS).stdout == ns  # the next ordinary command is resident again


def test_a_secret_the_host_creates_or_replaces_stays_hidden(world: World) -> None:
    # the kept sandbox's masks were decided when it started: a secret the host creates
    # later, a new glob match and a masked file the host replaces by a rename (which
    # detaches the mask in the sandbox's mount namespace) must not be readable there
    World.write(world.ws("replaced.txt"), "old secret\n")
    deny = [world.ws("created.txt"), world.ws("**/*.key"), world.ws("replaced.txt")]
    with Sandbox(workspace=world.workspace, environ=world.environ, deny_read=deny) as sbx:
        ns = sbx.exec(_NS).stdout
        assert sbx.exec("cat replaced.txt").exit_code != 0
        assert sbx.exec(_NS).stdout == ns  # resident
        World.write(world.ws("created.txt"), "created later\n")
        World.write(world.ws("sub/new.key"), "key later\n")
        World.write(world.ws("new.tmp"), "new secret\n")
        os.rename(world.ws("new.tmp"), world.ws("replaced.txt"))
        read = sbx.exec("cat created.txt sub/new.key replaced.txt; " + _NS)
        assert read.stderr.count(b"Permission denied") == 3, read.stderr
        for secret in (b"created later", b"key later", b"new secret"):
            assert secret not in read.stdout
        assert ns not in read.stdout  # the kept sandbox was retired: it ran fresh
        again = sbx.exec("cat created.txt sub/new.key replaced.txt; " + _NS)
        assert b"secret" not in again.stdout and b"later" not in again.stdout
        kept = sbx.exec(_NS).stdout
        assert kept in again.stdout and kept != ns  # a new kept sandbox, from the host as it is


def test_a_secret_reached_through_a_link_the_host_repoints_stays_hidden(world: World) -> None:
    # the look before each command resolves the link anew (one look's answers are never
    # kept for the next): a denyRead entry whose link the host re-points between two
    # commands hides its new target in the very next command
    for name in ("a", "b"):
        World.write(os.path.join(world.outside, name, "secret"), f"secret of {name}\n")
    link = os.path.join(world.outside, "home")
    os.symlink("a", link)
    deny = [os.path.join(link, "secret")]
    with Sandbox(workspace=world.workspace, environ=world.environ, deny_read=deny) as sbx:
        ns = sbx.exec(_NS).stdout
        both = f"cat {world.outside}/a/secret {world.outside}/b/secret; {_NS}"
        read = sbx.exec(both)
        assert b"secret of a" not in read.stdout and b"secret of b" in read.stdout
        assert ns in read.stdout  # resident
        os.unlink(link)
        os.symlink("b", link)
        read = sbx.exec(both)
        assert b"secret of b" not in read.stdout, read.stdout
        assert b"secret of a" in read.stdout  # the policy names home/secret: b's now
        assert ns not in read.stdout  # retired: planned from the host as it is now


def test_a_session_dropped_without_close_ends_its_sandbox(world: World) -> None:
    import gc

    sbx = Sandbox(workspace=world.workspace, environ=world.environ)
    assert sbx.exec("true").exit_code == 0
    assert _host_processes(world.workspace)  # the resident sandbox runs
    del sbx
    gc.collect()
    assert not _host_processes(world.workspace)


def test_a_background_process_runs_in_a_sandbox_of_its_own(world: World) -> None:
    with Sandbox(workspace=world.workspace, environ=world.environ) as sbx:
        ns = sbx.exec(_NS).stdout
        process = sbx.spawn(f"{_NS}; sleep 30")
        try:
            for _stream, chunk in process:
                assert chunk and chunk not in ns  # another sandbox's namespaces
                break
            # meanwhile the session's commands still run resident
            assert sbx.exec(_NS).stdout == ns
        finally:
            process.kill()
        assert process.wait().stdout not in (b"", ns)
