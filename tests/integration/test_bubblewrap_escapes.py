"""Real escape attempts against the bubblewrap backend, through the installed CLI.

Every test runs a hostile command in a real sandbox and then checks the host:
the file is unchanged, the secret did not arrive, the process is gone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from tests.conftest import (
    AWS_CREDENTIALS,
    PROBE_PYTHON,
    SECRET_ENV_VALUE,
    SSH_KEY,
    World,
    needs_bwrap,
    needs_root,
)

pytestmark = [needs_bwrap, pytest.mark.backend("bubblewrap")]


def _py(code: str) -> str:
    """A shell word running *code* with the probe interpreter."""
    return f"{PROBE_PYTHON} -c {_quote(code)}"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# ---------------------------------------------------------------- filesystem
def test_blocks_write_outside_workspace(world: World) -> None:
    before = world.tree()
    target = os.path.join(world.outside, "target.txt")
    new = os.path.join(world.outside, "new.txt")
    etc = f"/etc/corral-test-{os.path.basename(world.root)}"
    result = world.run(
        f"echo pwned > {target}; echo pwned > {new}; echo pwned > {etc}; "
        f"echo pwned > {world.home}/.profile; true"
    )
    assert result.returncode == 0
    assert world.tree() == before
    assert not os.path.exists(etc)


def test_allows_write_inside_workspace_and_tmp(world: World) -> None:
    result = world.run(
        "echo made > made.txt && mkdir -p a/b && echo deep > a/b/c.txt && "
        "t=$(mktemp) && echo tmp > $t && cat $t && echo $TMPDIR"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().split() == ["tmp", "/tmp"]
    assert world.read(world.ws("made.txt")) == "made\n"
    assert world.read(world.ws("a", "b", "c.txt")) == "deep\n"


def test_blocks_write_through_symlink_out_of_workspace(world: World) -> None:
    target = os.path.join(world.outside, "target.txt")
    os.symlink(target, world.ws("planted-link"))  # planted before the run
    result = world.run(
        f"ln -s {target} made-link; echo pwned > made-link; echo pwned > planted-link; "
        f"echo pwned >> planted-link; true"
    )
    assert result.returncode == 0
    assert world.read(target) == "outside original\n"


def test_blocks_write_through_hardlink_out_of_workspace(world: World) -> None:
    target = os.path.join(world.outside, "target.txt")
    os.link(target, world.ws("planted-hardlink"))  # same filesystem, planted before the run
    result = world.run(
        f"ln {target} made-hardlink; echo pwned > planted-hardlink; "
        "echo pwned >> planted-hardlink; chmod 777 planted-hardlink; "
        "truncate -s 0 planted-hardlink; true"
    )
    assert result.returncode == 0
    assert not os.path.exists(world.ws("made-hardlink"))
    assert world.read(target) == "outside original\n"
    assert oct(os.stat(target).st_mode & 0o777) != oct(0o777)
    assert b"hard links" in result.stderr


def test_hides_ssh_keys_and_aws_credentials(world: World) -> None:
    result = world.run(
        f"cat {world.home}/.ssh/id_ed25519; cat ~/.aws/credentials; ls -la ~/.ssh ~/.aws; "
        f"grep -r corral-test {world.home} 2>/dev/null; true"
    )
    out = result.stdout + result.stderr
    assert b"corral-test-key" not in out and SSH_KEY.encode() not in out
    assert b"corral-test-aws-secret" not in out and AWS_CREDENTIALS.encode() not in out


def test_allow_read_reexposes_a_path_under_a_hidden_directory(world: World) -> None:
    public = World.write(
        os.path.join(world.home, ".ssh", "public", "key.pub"), "ssh-ed25519 AAAA\n"
    )
    result = world.run(
        f"cat {public}; ls {world.home}/.ssh; cat {world.secret}; "
        f"echo x > {world.home}/.ssh/new || echo read-only",
        "--allow-read",
        os.path.dirname(public),
    )
    assert result.returncode == 0, result.stderr
    # only the carve-out is visible; the rest of ~/.ssh stays hidden and read-only
    assert result.stdout.decode().split() == ["ssh-ed25519", "AAAA", "public", "read-only"]
    assert not os.path.exists(os.path.join(world.home, ".ssh", "new"))


@pytest.mark.parametrize("rule", ["--allow-read", "--deny-read"])
def test_a_link_in_the_workspace_cannot_steer_a_later_runs_read_rules(
    world: World, rule: str
) -> None:
    """A read rule reached through a link the command can re-point is refused (exit 125).

    Links in a rule are resolved at each start: an ``allowRead`` through a
    workspace link re-pointed at ``~/.ssh`` re-exposed the key to the next run,
    and a ``denyRead`` through one re-pointed elsewhere left the directory it
    hid readable.
    """
    public = os.path.join(world.outside, "public")
    private = os.path.join(world.outside, "private")
    os.makedirs(public)
    World.write(os.path.join(private, "id_ed25519"), "corral-test-private-key\n")
    if rule == "--allow-read":  # shows a public directory; aimed at a hidden one
        first, then, secret = public, os.path.join(world.home, ".ssh"), "corral-test-key"
    else:  # hides a private directory; aimed away from it
        first, then, secret = private, public, "corral-test-private-key"
    os.symlink(first, os.path.join(world.workspace, "deps"))
    # a hostile command re-points the link in its own workspace
    assert world.run(f"rm deps && ln -s {then} deps").returncode == 0
    later = world.run(
        f"cat {world.home}/.ssh/id_ed25519 {private}/id_ed25519 deps/id_ed25519; echo RAN",
        rule,
        os.path.join(world.workspace, "deps"),
    )
    out = later.stdout + later.stderr
    assert secret.encode() not in out
    assert later.returncode == 125, out
    assert b"re-point" in later.stderr


def test_does_not_leak_host_environment(world: World) -> None:
    result = world.run("env; cat /proc/self/environ | tr '\\0' '\\n'")
    assert result.returncode == 0
    assert SECRET_ENV_VALUE.encode() not in result.stdout
    assert b"SECRET_TOKEN" not in result.stdout
    env = dict(line.split("=", 1) for line in result.stdout.decode().splitlines() if "=" in line)
    assert env["HOME"] == world.home and env["TMPDIR"] == "/tmp"


def test_env_option_passes_and_sets_variables(world: World) -> None:
    result = world.run("echo $SECRET_TOKEN/$FOO", "--env", "SECRET_TOKEN", "--env", "FOO=bar")
    assert result.stdout.decode().strip() == f"{SECRET_ENV_VALUE}/bar"


@pytest.mark.parametrize("relpath", [".bashrc", ".git/hooks/pre-commit", ".git/config"])
def test_blocks_changes_to_existing_persistence_points(world: World, relpath: str) -> None:
    world.seed_persistence_points()
    path = world.ws(*relpath.split("/"))
    before = world.read(path)
    result = world.run(
        f"echo pwned > {relpath}; echo pwned >> {relpath}; rm -f {relpath}; "
        f"mv {relpath} moved; chmod 777 {relpath}; touch -d 2001-01-01 {relpath}; "
        f"truncate -s 0 {relpath}; true"
    )
    assert world.read(path) == before
    assert not os.path.exists(world.ws("moved"))
    assert b"corral: blocked write to" in result.stderr


@pytest.mark.parametrize(
    "relpath",
    [
        "sub/.bashrc",
        "a/b/c/d/e/.git/hooks/pre-commit",
        "a/b/c/d/e/.git/config",
        ".vscode/tasks.json",
        ".claude/settings.json",
        "deep/er/.mcp.json",
    ],
)
def test_blocks_creating_persistence_points_at_any_depth(world: World, relpath: str) -> None:
    directory = os.path.dirname(relpath)
    result = world.run(
        f"mkdir -p {directory}; echo pwned > {relpath}; "
        f"echo x > tmpfile && mv tmpfile {relpath}; ln -s README {relpath}; "
        f"ln README {relpath}; true"
    )
    assert not os.path.lexists(world.ws(*relpath.split("/")))
    assert b"corral: blocked write to" in result.stderr


def test_blocks_persistence_points_in_a_nested_repository(world: World) -> None:
    nested = world.ws("vendor", "lib", "x", "y", "z")
    os.makedirs(os.path.join(nested, ".git", "hooks"))
    World.write(os.path.join(nested, ".git", "config"), "[core]\n")
    result = world.run(
        "cd vendor/lib/x/y/z && echo pwned > .git/hooks/post-checkout && "
        "echo pwned >> .git/config; git config core.fsmonitor 'touch /tmp/x'; true"
    )
    assert not os.path.exists(os.path.join(nested, ".git", "hooks", "post-checkout"))
    assert world.read(os.path.join(nested, ".git", "config")) == "[core]\n"
    assert result.returncode == 0


def test_blocks_renaming_a_directory_into_a_persistence_point(world: World) -> None:
    result = world.run(
        "mkdir -p evil/hooks && echo pwned > evil/hooks/pre-push && "
        "mkdir n && mv evil n/.git; mv evil .git/x; ls n; true"
    )
    assert not os.path.exists(world.ws("n", ".git", "hooks", "pre-push"))
    assert b"blocked write" in result.stderr


def test_blocks_renaming_a_persistence_point_away(world: World) -> None:
    world.seed_persistence_points()
    before = world.read(world.ws(".git", "config"))
    world.run("mv .git g2; mv .git/config c; true")
    assert os.path.isdir(world.ws(".git")) and not os.path.exists(world.ws("g2"))
    assert world.read(world.ws(".git", "config")) == before


def test_git_still_works_in_the_workspace(world: World) -> None:
    subprocess.run(["git", "init", "-q", world.workspace], check=True)
    subprocess.run(
        ["git", "-C", world.workspace, "config", "user.email", "t@example.invalid"], check=True
    )
    subprocess.run(["git", "-C", world.workspace, "config", "user.name", "t"], check=True)
    result = world.run(
        "echo change >> README && git add README && git commit -qm change && git log --oneline"
    )
    assert result.returncode == 0, result.stderr
    assert b"change" in result.stdout


def test_read_only_workspace(world: World) -> None:
    result = world.run("echo x > made.txt", "--read-only")
    assert result.returncode != 0
    assert not os.path.exists(world.ws("made.txt"))


# ---------------------------------------------------------------- processes
def test_host_processes_are_invisible_and_unsignallable(world: World) -> None:
    host = subprocess.Popen(["sleep", "60"])
    try:
        result = world.run(
            f"ls /proc | grep -c '^[0-9]' ; kill -0 {host.pid} && echo SIGNALLED; "
            f"kill -9 {host.pid}; ps -e -o pid= | wc -l; true"
        )
        assert b"SIGNALLED" not in result.stdout
        assert host.poll() is None  # still alive
        counts = [int(x) for x in result.stdout.split()]
        assert max(counts) < 10  # only the sandbox's own few processes
    finally:
        host.kill()
        host.wait()


def test_cannot_ptrace_pid_1_or_the_host(world: World) -> None:
    code = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
        "r = libc.ptrace(16, 1, 0, 0); print('attach', r, ctypes.get_errno())"
    )
    result = world.run(
        _py(code) + "; strace -p 1 -e trace=none -o /dev/null & sleep 0.3; "
        "grep TracerPid /proc/1/status"
    )
    out = result.stdout.decode()
    assert "attach -1 1" in out  # EPERM
    assert "TracerPid:\t0" in out


def test_cannot_reach_a_host_unix_socket(world: World) -> None:
    path = os.path.join(world.outside, "agent.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    server.settimeout(3)
    accepted: list[object] = []

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r}); "
        "s.sendall(b'stolen'); print('CONNECTED')"
    )
    result = world.run(
        _py(code) + " ; " + _py("import socket; a, b = socket.socketpair(); print('PAIR-OK')")
    )
    thread.join()
    server.close()
    assert b"CONNECTED" not in result.stdout
    assert not accepted
    assert b"PAIR-OK" in result.stdout


def test_cannot_create_a_user_namespace_or_mount(world: World) -> None:
    result = world.run(
        "unshare -U true && echo USERNS; unshare -r true && echo USERNS2; "
        "mount -t tmpfs none /mnt && echo MOUNTED; "
        + _py(
            "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
            "print('clone-newuser', libc.unshare(0x10000000), ctypes.get_errno())"
        )
        + "; grep -E 'CapEff|NoNewPrivs|Seccomp:' /proc/self/status"
    )
    out = result.stdout.decode()
    assert "USERNS" not in out and "MOUNTED" not in out
    assert "clone-newuser -1 1" in out
    assert "CapEff:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out


def test_cannot_reach_the_network(world: World) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        code = (
            f"import socket\ntry:\n socket.create_connection(('127.0.0.1', {port}), 2); print('REACHED')\n"
            "except OSError as e: print('refused', e.errno)\n"
            "try:\n socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
            "except OSError as e: print('no-dns')"
        )
        result = world.run(_py(code))
        out = result.stdout.decode()
        assert "REACHED" not in out and "RESOLVED" not in out
        assert "refused" in out and "no-dns" in out
    finally:
        server.close()


def test_open_network_mode_reaches_host_loopback(world: World) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        result = world.run(
            _py(
                f"import socket; socket.create_connection(('127.0.0.1', {port}), 2); "
                "print('REACHED')"
            ),
            "--net",
            "open",
        )
        assert b"REACHED" in result.stdout
    finally:
        server.close()


# ---------------------------------------------------------------- limits
@needs_root
def test_fork_bomb_is_contained_by_the_pids_limit(world: World) -> None:
    start = time.monotonic()
    result = world.run(
        "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", "--pids", "64", "--timeout", "20s"
    )
    assert time.monotonic() - start < 25
    assert result.returncode in (0, 124)
    # the host can still fork, and nothing of the bomb is left
    subprocess.run(["true"], check=True)


@needs_root
def test_the_pids_budget_is_the_same_when_the_sandbox_is_born_in_its_group(world: World) -> None:
    # in-process, the sandbox is born in its group (a launcher thread parked there at the
    # start): limits written before the spawn, bubblewrap's outer process counted and
    # compensated - the command's own budget is what it was when the sandbox was moved in
    code = (
        "import os, time\nn = 0\nwhile n < 100:\n"
        "    try:\n        pid = os.fork()\n    except OSError as exc:\n"
        "        print(n, exc.errno)\n        break\n"
        "    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n    n += 1"
    )
    result = world.corral("run", "--pids", "12", "--", PROBE_PYTHON, "-c", code)
    # pids.max 12: the sandbox's init, the command, 10 children; then EAGAIN
    assert result.stdout.split() == [b"10", b"11"], result


@needs_root
def test_memory_limit_kills_with_137(world: World) -> None:
    result = world.run(_py("x = [bytearray(1 << 20) for _ in range(1024)]"), "--memory", "64M")
    assert result.returncode == 137
    assert b"memory limit" in result.stderr


def test_timeout_stops_background_children(world: World) -> None:
    # a duration no other engineer's test uses: the check below scans every host process
    duration = f"300.{os.getpid()}{time.monotonic_ns() % 1000}"
    result = world.run(
        f"sleep {duration} & echo $! > bg.pid; trap '' TERM; sleep {duration}", "--timeout", "1s"
    )
    assert result.returncode == 124
    assert b"timed out after 1s" in result.stderr
    time.sleep(0.2)
    # neither the background child nor the TERM-ignoring shell survived
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    assert f.read() != f"sleep\x00{duration}\x00".encode()
            except OSError:
                continue


def test_exit_status_is_the_commands(world: World) -> None:
    assert world.run("exit 7").returncode == 7
    assert world.run("kill -TERM $$").returncode == 128 + 15


def test_not_found_and_not_executable(world: World) -> None:
    result = world.corral("run", "--", "definitely-not-a-command")
    assert result.returncode == 127
    assert b"corral: definitely-not-a-command: command not found" in result.stderr
    World.write(world.ws("noexec.sh"), "#!/bin/sh\necho hi\n")
    result = world.corral("run", "--", "./noexec.sh")
    assert result.returncode == 126


def test_output_cap_drops_the_rest_and_says_so(world: World) -> None:
    result = world.run("head -c 100000 /dev/zero", "--max-output", "1k")
    assert len(result.stdout) == 1024
    assert b"dropped 98976 bytes" in result.stderr


def test_kernel_attack_surface_syscalls_fail(world: World) -> None:
    code = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
calls = {
    "keyctl": (250, 0, 0, 0, 0, 0),
    "bpf": (321, 0, 0, 0, 0, 0),
    "perf_event_open": (298, 0, 0, -1, -1, 0),
    "io_uring_setup": (425, 8, 0, 0, 0, 0),
    "userfaultfd": (323, 0, 0, 0, 0, 0),
    "process_vm_readv": (310, 1, 0, 0, 0, 0),
    "unshare_newuser": (272, 0x10000000, 0, 0, 0, 0),
    "setns": (308, 0, 0, 0, 0, 0),
    "mount": (165, 0, 0, 0, 0, 0),
    "pidfd_getfd": (438, 0, 0, 0, 0, 0),
}
for name, (nr, *args) in calls.items():
    r = libc.syscall(nr, *args)
    print(name, r, ctypes.get_errno())
"""
    result = world.run(_py(code))
    lines = {line.split()[0]: line.split()[1:] for line in result.stdout.decode().splitlines()}
    assert len(lines) == 10, result.stderr
    for name, (ret, err) in lines.items():
        assert ret == "-1" and err == "1", (
            f"{name} returned {ret} errno {err}"
        )  # EPERM from seccomp


def test_cpu_time_limit_stops_a_busy_process(world: World) -> None:
    start = time.monotonic()
    result = world.run(_py("while True: pass"), "--cpu-time", "1s", "--timeout", "30s")
    assert time.monotonic() - start < 15
    assert result.returncode in (
        128 + 24,
        137,
    )  # SIGXCPU at the soft limit, SIGKILL at the hard one


def test_a_hidden_file_inside_a_hidden_directory_hides_both_and_the_run_starts(
    world: World,
) -> None:
    """``denyRead`` of a directory and of a file in it: the directory's empty tmpfs hides
    both (bubblewrap could not create the file's mount point in it: every run failed)."""
    secret_dir = os.path.join(world.home, "vault")
    secret = world.write(os.path.join(secret_dir, "key"), "VAULT-KEY\n")
    result = world.run(
        f"cat {secret}; ls -A {secret_dir}; echo listed",
        "--deny-read",
        secret_dir,
        "--deny-read",
        secret,
    )
    assert result.returncode == 0, result.stderr
    assert b"VAULT-KEY" not in result.stdout
    assert result.stdout.strip() == b"listed"
