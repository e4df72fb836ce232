"""No process outside corral's filter, no host kernel knob within reach.

Each test makes the real attempt from inside a sandbox and then checks the
host: every process the command can see is under corral's seccomp filter and
cannot be written to or traced (``/proc/N/mem``, ``process_vm_writev``,
``ptrace``), and the host-wide kernel interfaces that trust the global uid 0
(``/proc/sys``, ``/proc/sysrq-trigger``, ``/sys``) refuse writes, so a root
caller's command cannot plant a ``core_pattern`` helper.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import PROBE_PYTHON, World, is_root, needs_bwrap

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [needs_bwrap, pytest.mark.backend("bubblewrap")]

#: Tests of what a *root* caller's command can do (the unprivileged pass skips them).
root_caller = pytest.mark.skipif(not is_root(), reason="tests a root caller")

#: Looks at every process it can see and attacks each one; prints one JSON line.
_ATTACK_EVERY_PROCESS = r"""
import ctypes, json, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
# a second process of the command's own, so there is more than pid 1 and us
helper = subprocess.Popen(["sleep", "30"])
found = {}
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    pid = int(name)
    entry = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("Name", "Seccomp", "NoNewPrivs"):
                    entry[key] = value.strip()
    except OSError as exc:
        entry["status_error"] = exc.errno
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    except OSError as exc:
        entry["mem"] = exc.errno
    else:
        entry["mem"] = "opened"
        os.close(fd)
    if pid != os.getpid():
        class iovec(ctypes.Structure):
            _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(8)
        local = iovec(ctypes.cast(buf, ctypes.c_void_p), 8)
        remote = iovec(0x400000, 8)
        libc.process_vm_writev.restype = ctypes.c_ssize_t
        r = libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        entry["vm_writev"] = "ok" if r >= 0 else ctypes.get_errno()
        libc.ptrace.restype = ctypes.c_long
        r = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
        entry["ptrace"] = "attached" if r == 0 else ctypes.get_errno()
    found[pid] = entry
helper.kill()
helper.wait()
print(json.dumps({"self": os.getpid(), "found": found}))
"""


def _attack(world: World, *options: str) -> dict[str, object]:
    result = world.run(f"{PROBE_PYTHON} -c {_quote(_ATTACK_EVERY_PROCESS)}", *options)
    assert result.returncode == 0, result.stderr
    report: dict[str, object] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return report


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@pytest.mark.parametrize(
    "options",
    [
        pytest.param((), id="default"),
        pytest.param(("--timeout", "60s"), id="with-timeout"),
    ],
)
def test_every_visible_process_is_filtered_and_unwritable(
    world: World, options: tuple[str, ...]
) -> None:
    report = _attack(world, *options)
    found = report["found"]
    assert isinstance(found, dict)
    me = str(report["self"])
    # pid 1 is corral's helper, not bubblewrap's unfiltered init
    assert found["1"]["Name"] == ".corral-exec", found
    assert len(found) >= 3, found  # pid 1, the probe, its sleep
    for pid, entry in found.items():
        assert entry["Seccomp"] == "2", (pid, entry)
        assert entry["NoNewPrivs"] == "1", (pid, entry)
        if pid == me:
            continue
        # the sandbox's init is not even openable; the command's own children are,
        # by /proc/N/mem, but run under the same filter: still refused below
        if pid == "1":
            assert entry["mem"] in (1, 13), (pid, entry)  # EPERM / EACCES
        assert entry["vm_writev"] == 1, (pid, entry)  # EPERM: the filter
        assert entry["ptrace"] == 1, (pid, entry)


def test_writing_into_the_init_does_not_survive(world: World) -> None:
    """The attack itself: overwrite pid 1's code through /proc/1/mem."""
    result = world.run(
        f"{PROBE_PYTHON} -c {_quote(_WRITE_INTO_INIT)}; echo after-attack", "--timeout", "30s"
    )
    assert result.stdout.decode().split() == ["refused", "after-attack"], result
    assert result.returncode == 0


_WRITE_INTO_INIT = r"""
import os
try:
    fd = os.open("/proc/1/mem", os.O_RDWR)
except OSError:
    print("refused")
else:
    with open("/proc/1/maps") as f:
        start = int(f.readline().split("-")[0], 16)
    os.lseek(fd, start, 0)
    os.write(fd, b"\xcc" * 64)
    print("written")
"""


def test_exit_status_and_signal_pass_through_the_init(world: World) -> None:
    assert world.run("exit 7").returncode == 7
    killed = world.run("kill -TERM $$")
    assert killed.returncode == 143, killed.stderr
    orphans = world.run("(sleep 0.2; echo orphan) & exit 0")
    assert orphans.returncode == 0


def test_exit_status_and_signal_pass_through_the_landlock_reaper(world: World) -> None:
    """The exec helper stays the command's parent there (--reaper) and reports its fate."""
    assert world.run("exit 7", *_LANDLOCK, *_LANDLOCK_AS_ROOT).returncode == 7
    killed = world.run("kill -TERM $$", *_LANDLOCK, *_LANDLOCK_AS_ROOT)
    assert killed.returncode == 143, killed.stderr


def test_a_terminal_hangup_reaches_the_command_under_the_landlock_reaper(tmp_path: Path) -> None:
    """The helper leads the session: the kernel's SIGHUP at a hang-up goes to it alone,
    and it passes it on to the command (a shell exits as it would without corral)."""
    import pty

    from corral.backends import helper_path
    from corral.backends.landlock import REAP_SIGNAL

    helper = helper_path()
    assert helper is not None
    mark = str(tmp_path / "hup")
    script = f"trap 'echo HUP > {mark}; exit 5' HUP; echo READY; sleep 20 & wait"
    argv = [helper, "--ctty", "--reaper", str(REAP_SIGNAL), "--", "sh", "-c", script]
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execv(helper, argv)
        finally:
            os._exit(127)
    seen = b""
    while b"READY" not in seen:  # the shell has set its trap
        chunk = os.read(fd, 100)
        assert chunk, seen
        seen += chunk
    os.close(fd)  # the terminal hangs up
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 5 and os.path.exists(mark)


# ------------------------------------------------------------- kernel knobs
#: Host-wide files a root sandbox could write if they were not read-only.
_KNOBS = (
    "/proc/sys/kernel/core_pattern",
    "/proc/sys/kernel/core_uses_pid",
    "/proc/sys/vm/overcommit_ratio",
)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


@root_caller
def test_root_caller_cannot_write_host_sysctls_or_sysrq(world: World) -> None:
    before = {path: _read(path) for path in _KNOBS}
    payload = world.ws("helper.sh")
    attempts = "; ".join(
        f"(echo '|{payload}' > {path}) 2>/dev/null && echo WROTE {path}" for path in _KNOBS
    )
    try:
        result = world.run(
            f"{attempts}; (echo h > /proc/sysrq-trigger) 2>/dev/null && echo WROTE sysrq; "
            f"(echo 1 > /sys/kernel/mm/ksm/run) 2>/dev/null && echo WROTE ksm; "
            f"(echo 1 > /proc/sys/net/ipv4/ip_forward) 2>/dev/null && echo WROTE ip_forward; "
            "echo done"
        )
        assert result.stdout.decode().split() == ["done"], result
    finally:
        after = {path: _read(path) for path in _KNOBS}
        for path, value in before.items():
            if after[path] != value:  # put the host back before failing
                with open(path, "w") as f:
                    f.write(value)
    assert after == before


def test_every_kernel_interface_mount_is_read_only(world: World) -> None:
    """The class: every mount of /sys and of /proc's host-wide entries is read-only."""
    result = world.run("cat /proc/self/mountinfo")
    assert result.returncode == 0, result.stderr
    writable = []
    seen = set()
    for line in result.stdout.decode().splitlines():
        fields = line.split()
        point, options = fields[4], fields[5].split(",")
        seen.add(point)
        interface = point == "/sys" or point.startswith("/sys/")
        interface |= point in ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
        if interface and "ro" not in options:
            writable.append(line)
    assert not writable
    expected = {p for p in ("/sys", "/proc/sys", "/proc/sysrq-trigger") if os.path.exists(p)}
    assert expected <= seen


# ------------------------------------------------------------ root identity
@root_caller
def test_landlock_refuses_a_root_caller_and_auto_picks_bubblewrap(world: World) -> None:
    shadow = World.write(os.path.join(world.outside, "root-only"), "ROOT-ONLY-5e1\n")
    os.chmod(shadow, 0o600)
    refused = world.run(f"cat {shadow}", "--isolation", "process", "--backend", "landlock")
    assert refused.returncode == 125
    assert b"Failed to enforce isolation" in refused.stderr
    assert b"--backend bubblewrap" in refused.stderr  # the fix is named
    assert b"ROOT-ONLY" not in refused.stdout
    # auto does not stop at landlock: its pid 1 is corral's init under bubblewrap
    picked = world.run("grep -c Seccomp:.2 /proc/1/status", "--isolation", "process")
    assert picked.returncode == 0, picked.stderr
    assert picked.stdout == b"1\n"
    assert any(r.get("backend") == "bubblewrap" for r in world.audit_records())


@root_caller
def test_root_callers_command_does_not_hold_the_hosts_root_identity(world: World) -> None:
    secret = World.write(os.path.join(world.outside, "root-only"), "ROOT-ONLY-5e1\n")
    os.chmod(secret, 0o600)
    mine = World.write(world.ws("mine"), "MINE-0600\n")
    os.chmod(mine, 0o600)
    result = world.run(
        f"id -u; cat {secret}; head -c 40 /etc/shadow; cat mine; "
        "echo made > made.txt; mkdir -p sub/dir && echo deep > sub/dir/f; chown 0:0 made.txt; "
        "echo done"
    )
    out = result.stdout.decode()
    assert out.split() == ["0", "MINE-0600", "done"], (out, result.stderr)
    assert "ROOT-ONLY" not in out and "root:" not in out
    # what the command made belongs to the caller (root) on disk
    for path in (world.ws("made.txt"), world.ws("sub"), world.ws("sub", "dir", "f")):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == (0, 0), path


def test_the_root_sandbox_id_belongs_to_nobody_on_this_host() -> None:
    from corral.backends.bubblewrap import ROOT_SANDBOX_ID

    with open("/etc/passwd", encoding="utf-8") as f:
        uids = {int(line.split(":")[2]) for line in f if line.count(":") >= 6}
    with open("/etc/group", encoding="utf-8") as f:
        gids = {int(line.split(":")[2]) for line in f if line.count(":") >= 3}
    assert ROOT_SANDBOX_ID not in uids and ROOT_SANDBOX_ID not in gids


_LANDLOCK = ("--isolation", "process", "--backend", "landlock")
_LANDLOCK_AS_ROOT = ("--allow-degraded", "isolation") if is_root() else ()


def test_landlock_keeps_host_processes_unwritable(world: World) -> None:
    """No pid namespace there: Landlock's ptrace scoping and the filter must hold."""
    import subprocess
    import sys

    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        code = (
            "import ctypes, os, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "for pid in (int(sys.argv[1]), os.getppid()):\n"
            "    try:\n"
            "        os.close(os.open(f'/proc/{pid}/mem', os.O_RDWR)); print(pid, 'OPENED')\n"
            "    except OSError as e:\n"
            "        print(pid, 'mem', e.errno)\n"
            "    r = libc.ptrace(16, pid, None, None)\n"
            "    print(pid, 'ptrace', 'ATTACHED' if r == 0 else ctypes.get_errno())\n"
        )
        result = world.run(
            f"{PROBE_PYTHON} -c {_quote(code)} {host.pid}", *_LANDLOCK, *_LANDLOCK_AS_ROOT
        )
        assert result.returncode == 0, result.stderr
        out = result.stdout.decode()
        assert "OPENED" not in out and "ATTACHED" not in out, out
        assert out.count(" mem ") == 2 and out.count(" ptrace ") == 2, out
        assert host.poll() is None  # the host process is untouched
    finally:
        host.kill()
        host.wait()


@pytest.mark.parametrize("end", ["timeout", "exit"])
def test_landlock_without_a_cgroup_leaves_no_process_behind(world: World, end: str) -> None:
    """No pid namespace and no cgroup there: what the command started - also a
    ``setsid``'d double fork out of its process group - ends with the run all the
    same (the exec helper's --reaper), at the timeout and when the command exits; the
    command cannot kill, stop or read that helper (Landlock's signal scope and ptrace rule)."""
    import signal
    import time

    word = "4831"
    writer = "while :; do echo x >> beat; sleep 0.05; done"
    tail = "sleep 60" if end == "timeout" else "exit 3"
    result = world.run(
        f"(setsid sleep {word} &); (setsid sh -c {_quote(writer)} writer-{word} &); "
        "for s in KILL STOP; do kill -$s $PPID 2>/dev/null || echo denied; done; "
        "head -c1 /proc/$PPID/mem >/dev/null 2>&1 || echo denied; "
        f"until [ -s beat ]; do sleep 0.05; done; {tail}",
        *_LANDLOCK,
        *_LANDLOCK_AS_ROOT,
        "--memory",
        "none",
        "--pids",
        "none",
        "--timeout",
        "3",
    )
    assert result.returncode == (124 if end == "timeout" else 3), result.stderr
    # the helper, the command's parent, can be neither killed, stopped nor read
    assert result.stdout.split() == [b"denied"] * 3
    left = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if word.encode() in args or f"writer-{word}".encode() in args:
            left.append(int(pid))
    for pid in left:  # the test's own strays: never left running
        os.kill(pid, signal.SIGKILL)
    assert left == [], "a process of the command outlived the run"
    size = os.path.getsize(world.ws("beat"))
    time.sleep(0.3)
    assert os.path.getsize(world.ws("beat")) == size, "the workspace is still written to"


@root_caller
def test_a_root_callers_command_changes_metadata_of_its_own_files(world: World) -> None:
    """The broker creates root's files; fd-based chmod/utime by the sandbox's uid still work."""
    code = (
        "import os\n"
        "fd = os.open('made', os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "os.fchmod(fd, 0o600); os.utime(fd, (1, 1)); os.close(fd)\n"
        "os.utime('made'); os.chmod('made', 0o640); print('ok')\n"
    )
    result = world.run(f"umask 077; touch t && touch t && {PROBE_PYTHON} -c {_quote(code)}")
    assert result.returncode == 0 and result.stdout == b"ok\n", result.stderr
    st = os.stat(world.ws("made"))
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o640)


# ------------------------------------------------------------ previews
@pytest.mark.parametrize("mechanism", ["overlay", "copy"])
def test_a_preview_never_holds_the_hosts_root_identity(world: World, mechanism: str) -> None:
    """Every mechanism, root and unprivileged callers: no root-only file, no sysctl,
    protected paths refused, and what the command made lands as the caller's."""
    secret = World.write(os.path.join(world.outside, "root-only"), "ROOT-ONLY-7c2\n")
    os.chmod(secret, 0o600 if is_root() else 0o000)  # unreadable to the command either way
    World.write(world.ws("old", "deep", "f"), "old\n")
    before = _read("/proc/sys/kernel/core_pattern")
    result = world.corral(
        "preview",
        "--mechanism",
        mechanism,
        "-c",
        f"cat {secret}; head -c 40 /etc/shadow; "
        "(echo '|/bin/false' > /proc/sys/kernel/core_pattern) 2>/dev/null && echo WROTE; "
        "(echo evil > .git/hooks/pre-commit) 2>/dev/null && echo HOOKED; "
        "echo made > made.txt; mkdir -p sub/dir && echo deep > sub/dir/f; rm -r old; echo done",
    )
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr
    assert out.split() == ["done"], (out, result.stderr)
    assert _read("/proc/sys/kernel/core_pattern") == before
    assert not os.path.exists(world.ws("made.txt"))  # only in the preview so far
    applied = world.corral("apply")
    assert applied.returncode == 0, applied.stderr
    assert not os.path.exists(world.ws(".git", "hooks", "pre-commit"))
    for path in (world.ws("made.txt"), world.ws("sub"), world.ws("sub", "dir", "f")):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid()), path
    assert World.read(world.ws("sub", "dir", "f")) == "deep\n"
    assert not os.path.exists(world.ws("old"))


@root_caller
def test_a_root_callers_fuse_overlayfs_preview_is_refused(world: World) -> None:
    """FUSE cannot be idmapped: that mechanism would keep uid 0, so it is refused (125)."""
    import shutil

    if shutil.which("fuse-overlayfs") is None:
        pytest.skip("fuse-overlayfs is not installed (apt-get install fuse-overlayfs)")
    result = world.corral(
        "preview", "--mechanism", "fuse-overlayfs", "-c", "head -c 40 /etc/shadow"
    )
    assert result.returncode == 125, result
    assert b"Failed to enforce isolation" in result.stderr
    assert b"root:" not in result.stdout


@root_caller
def test_a_root_callers_command_removes_a_tree_through_directory_fds(world: World) -> None:
    """``rm -r`` unlinks relative to a directory fd: the broker must resolve it as root's."""
    World.write(world.ws("tree", "sub", "f"), "x\n")
    result = world.run("rm -r tree && echo gone")
    assert result.returncode == 0 and result.stdout == b"gone\n", result.stderr
    assert not os.path.exists(world.ws("tree"))


# ------------------------------------------------------------ gVisor
@root_caller
def test_a_root_callers_gvisor_command_does_not_hold_uid_0_over_the_hosts_root(
    world: World,
) -> None:
    """Over the host's / (no image), root-only files are not the command's; its files are root's."""
    import shutil

    if shutil.which("runsc") is None:
        pytest.skip("runsc (gVisor) is not installed (apt-get install runsc)")
    secret = World.write(os.path.join(world.outside, "root-only"), "ROOT-ONLY-9d4\n")
    os.chmod(secret, 0o600)
    gvisor = ("--backend", "gvisor", "--allow-degraded", "filesystem.protect")
    result = world.run(
        f"id -u; cat {secret}; head -c 40 /etc/shadow; "
        "echo made > made.txt; mkdir -p sub && echo deep > sub/f; echo more >> README; echo done",
        *gvisor,
    )
    out = result.stdout.decode()
    assert out.split() == [str(65533), "done"], (out, result.stderr)
    assert "ROOT-ONLY" not in out and "root:" not in out
    for path in (world.ws("made.txt"), world.ws("sub"), world.ws("sub", "f"), world.ws("README")):
        st = os.stat(path)
        assert (st.st_uid, st.st_gid) == (0, 0), path
    assert World.read(world.ws("README")) == "hello\nmore\n"
    # the caller's explicit way back to uid 0 is recorded
    kept = world.run("id -u", *gvisor, "--allow-degraded", "isolation")
    assert kept.returncode == 0 and kept.stdout == b"0\n", kept.stderr
