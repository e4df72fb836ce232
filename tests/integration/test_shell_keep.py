"""``corral shell --keep NAME``: a shell whose sandbox survives detaching, on real ptys.

Each client runs on a fresh pty of its own (``pty.fork``: the pty is its
controlling terminal, as a user's terminal is), types as a keyboard does
(Ctrl-] is byte 0x1d, Ctrl-C 0x03) and reads what the terminal shows. The
shell runs in a real bubblewrap sandbox held by a keeper process.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import termios
import time

import pytest

from tests.conftest import PROBE_PYTHON, World, corral_command, needs_bwrap
from tests.integration.server.conftest import gone

pytestmark = needs_bwrap

PROMPT = b"# " if os.geteuid() == 0 else b"$ "  # bash's default prompt (the sandbox's env)
SHELL = ["--", "/bin/bash", "--norc", "--noprofile", "-i"]


class Client:
    """``corral ARGS`` on a pty of its own, *rows* x *cols*."""

    def __init__(self, world: World, *args: str, rows: int = 33, cols: int = 101) -> None:
        env = world.environ
        argv = [*corral_command(), *args]
        pid, fd = pty.fork()
        if pid == 0:
            try:
                os.chdir(world.workspace)
                os.execvpe(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.mode = termios.tcgetattr(fd)  # the terminal's mode before corral changed it
        self.seen = b""
        self.pos = 0

    def read_until(self, marker: bytes, timeout: float = 30.0) -> bytes:
        """What the terminal showed after the last marker up to *marker* (fails at *timeout*)."""
        start = self.pos
        deadline = time.monotonic() + timeout
        while (found := self.seen.find(marker, start)) < 0:
            assert time.monotonic() < deadline, f"no {marker!r} in {self.seen[start:]!r}"
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                assert chunk, f"the terminal closed before {marker!r}: {self.seen[start:]!r}"
                self.seen += chunk
        self.pos = found + len(marker)
        return self.seen[start : self.pos]

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def command(self, line: str, marker: bytes) -> bytes:
        self.type(line.encode() + b"\n")
        return self.read_until(marker)

    def wait(self, timeout: float = 30.0) -> int:
        """The client's exit status; checks the terminal's mode is as it was before."""
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "the client did not exit"
            select.select([self.fd], [], [], 0.1)
            try:
                self.seen += os.read(self.fd, 4096)
            except OSError:
                pass
        try:  # the terminal stays open while its other end (this test) holds it
            assert termios.tcgetattr(self.fd) == self.mode, "the terminal's mode was not restored"
        finally:
            os.close(self.fd)
        return os.waitstatus_to_exitcode(status)


def _host_file_holds(path: str, content: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read() == content
    except OSError:
        return False


def _keepers() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if not pid.isdigit() or os.stat(f"/proc/{pid}").st_uid != os.getuid():
                continue  # another user's (the unprivileged pass runs beside root's tests)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if b"shell" in words and b"--keeper" in words:
            found.append(int(pid))
    return found


def _host_processes(word: str) -> list[int]:
    """Host pids whose command line is exactly ``sleep WORD`` (the sandbox's own, seen here)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read() == b"sleep\0" + word.encode() + b"\0":
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _started(word: str, timeout: float = 20.0) -> int:
    """The host pid of the sandbox's ``sleep WORD``, once it runs."""
    deadline = time.monotonic() + timeout
    while not (found := _host_processes(word)):
        assert time.monotonic() < deadline, f"sleep {word} did not start"
        time.sleep(0.05)
    [pid] = found
    return pid


def _wait_gone(pids: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while any(not gone(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {pids}"
        time.sleep(0.05)


@pytest.fixture
def kept(world: World) -> World:
    """A world whose kept shells are all stopped after the test (their keepers gone)."""
    before = set(_keepers())
    yield world
    for name in ("work", "other"):
        world.corral("shell", "--stop", name)
    _wait_gone([p for p in _keepers() if p not in before])


def test_a_kept_shell_survives_detaching_and_keeps_its_terminal(kept: World) -> None:
    world = kept
    first = Client(world, "shell", "--keep", "work", *SHELL)
    assert b"started the kept shell work" in first.read_until(PROMPT)
    shown = first.command(
        "cd /tmp; echo kept-$((6*7)) >marker; sleep 4711 & [ -t 0 ] && echo TTY-$((6*7)); "
        "stty size; echo DONE-$((100+1))",
        b"DONE-101\r\n",
    )
    assert b"TTY-42" in shown and b"33 101" in shown  # a real pty, the terminal's size
    first.read_until(PROMPT)
    sleeper = _started("4711")
    first.type(b"\x1d")  # Ctrl-]: detach
    assert b"detached from the kept shell work" in first.read_until(b"ends it")
    assert first.wait() == 0
    assert not gone(sleeper)  # the shell's background job runs on while nobody is attached
    assert not _host_file_holds("/tmp/marker", "kept-42\n")  # the sandbox's /tmp is its own

    second = Client(world, "shell", "--keep", "work", rows=40, cols=120)
    assert b"attached to the kept shell work" in second.read_until(b"Ctrl-] detaches")
    shown = second.command(
        "pwd; jobs; cat /tmp/marker; stty size; echo DONE-$((100+2))", b"DONE-102\r\n"
    )
    # (what the terminal showed before is replayed first: only fresh output counts)
    assert b"/tmp\r\n" in shown and b"Running" in shown and b"kept-42" in shown
    assert b"40 120" in shown  # the new terminal's size reached the pty
    second.read_until(PROMPT)
    # Ctrl-C reaches the foreground job only; the shell lives on
    second.type(b"sleep 4712\n")
    _started("4712")
    second.type(b"\x03")
    second.read_until(PROMPT)
    assert b"status-130" in second.command("echo status-$?", b"status-130")
    # Ctrl-Z stops the foreground job: the shell's job control owns the sandbox's pty
    second.type(b"sleep 4716\n")
    stopped = _started("4716")
    second.type(b"\x1a")
    second.read_until(b"Stopped")
    second.read_until(PROMPT)
    second.command("kill -9 %%; echo DONE-$((100+6))", b"DONE-106\r\n")
    _wait_gone([stopped])
    # the window changes while attached: SIGWINCH to the client passes the size on
    fcntl.ioctl(second.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 25, 90, 0, 0))
    os.kill(second.pid, signal.SIGWINCH)
    time.sleep(0.3)
    assert b"25 90" in second.command("stty size; echo DONE-$((100+3))", b"DONE-103\r\n")

    # another client takes the shell over; the first one is told and exits
    third = Client(world, "shell", "--keep", "work")
    third.read_until(b"Ctrl-] detaches")
    assert b"attached elsewhere" in second.read_until(b"elsewhere")
    assert second.wait() == 0
    # the shell's own exit ends the sandbox, the keeper and the client with its status
    third.command("exit 7", b"exit")
    assert third.wait() == 7
    _wait_gone([sleeper])
    deadline = time.monotonic() + 20
    while _keepers():
        assert time.monotonic() < deadline, "the keeper outlived its shell"
        time.sleep(0.05)
    assert not os.path.exists(os.path.join(world.state_dir, "shells", "work.sock"))
    [record] = [r for r in world.audit_records() if r.get("kept_shell") == "work"]
    assert record["exit_code"] == 7 and record["backend"] != "none" and not record["unsandboxed"]
    assert record["argv"] == SHELL[1:]


def test_stop_refusal_and_a_dead_keeper_are_fail_closed(kept: World) -> None:
    world = kept
    client = Client(world, "shell", "--keep", "other", *SHELL)
    client.read_until(PROMPT)
    client.command(
        "echo planted > /tmp/planted; sleep 4713 & echo DONE-$((100+1))", b"DONE-101\r\n"
    )
    client.read_until(PROMPT)
    sleeper = _started("4713")
    client.type(b"\x1d")
    assert client.wait() == 0

    # another policy (a flag) never reuses the kept sandbox
    refused = world.corral("shell", "--keep", "other", "--timeout", "999", input=b"")
    assert refused.returncode == 125
    assert b"runs under another policy" in refused.stderr and b"--stop other" in refused.stderr
    assert not gone(sleeper)

    # a keeper killed outright takes its sandbox with it; the next --keep starts a new one
    [keeper] = _keepers()
    os.kill(keeper, signal.SIGKILL)
    _wait_gone([keeper, sleeper])
    again = Client(world, "shell", "--keep", "other", *SHELL)
    assert b"started the kept shell other" in again.read_until(PROMPT)
    shown = again.command("cat /tmp/planted; sleep 4714 & echo DONE-$((100+2))", b"DONE-102\r\n")
    assert b"No such file" in shown  # a new sandbox (its own /tmp), never the host's
    again.read_until(PROMPT)
    sleeper = _started("4714")

    # --stop ends the sandbox (the attached client gets the shell's status) and the keeper
    stopped = world.corral("shell", "--stop", "other")
    assert stopped.returncode == 0 and stopped.stdout == b"stopped the kept shell other\n"
    assert again.wait() != 0
    _wait_gone([sleeper])
    assert _keepers() == []
    assert world.corral("shell", "--stop", "other").stdout == b"no kept shell other\n"
    assert not _host_file_holds("/tmp/planted", "planted\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--keep", "../x"], b"invalid kept shell name"),
        (["--keep", ""], b"invalid kept shell name"),
        (["--stop", "x", "--net", "none"], b"--stop NAME takes no other options"),
        (["--idle", "5"], b"--idle applies to a kept shell"),
        (["--keep", "x", "--idle", "-1"], b"expected a positive number"),
    ],
)
def test_bad_keep_options_are_usage_errors(world: World, args: list[str], message: bytes) -> None:
    result = world.corral("shell", *args, input=b"")
    assert result.returncode == 125 and message in result.stderr, result.stderr
    assert not os.path.exists(os.path.join(world.state_dir, "shells", "x.sock"))


def test_a_sandboxed_process_cannot_attach_to_a_kept_shell(kept: World) -> None:
    """A sandbox that reaches the keeper's socket (a hard link, unix sockets allowed) is refused
    by the peer checks: it cannot type into a shell whose policy may be weaker than its own."""
    world = kept
    client = Client(world, "shell", "--keep", "work", *SHELL)
    client.read_until(PROMPT)
    link = os.path.join(world.workspace, "k.sock")  # the state directory itself stays hidden
    os.link(os.path.join(world.state_dir, "shells", "work.sock"), link)
    attack = World.write(
        world.ws("attack.py"),
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        'hello = b\'{"digest": "x", "workspace": "y"}\'\n'
        "line = b'echo INJECTED-$((6*7))\\n'\n"
        "try:\n"
        "    s.sendall(b'H' + len(hello).to_bytes(4, 'big') + hello)\n"
        "    s.sendall(b'D' + len(line).to_bytes(4, 'big') + line)\n"
        "except BrokenPipeError:\n"
        "    pass  # refused before it could say anything\n"
        "print('reply:', s.recv(200))\n",
    )
    result = world.corral("run", "--allow-unix-sockets", "--", PROBE_PYTHON, attack, link)
    assert result.returncode == 0, result.stderr
    assert result.stdout[:10] in (b"reply: b'R", b'reply: b"R'), result.stdout  # refused
    assert b"not a client it may serve" in result.stdout
    shown = client.command("echo DONE-$((100+4))", b"DONE-104\r\n")
    assert b"INJECTED-42" not in client.seen, shown
    client.type(b"exit 0\n")
    assert client.wait() == 0


def test_a_kept_shell_left_detached_past_its_idle_time_is_stopped(kept: World) -> None:
    world = kept
    client = Client(world, "shell", "--keep", "work", "--idle", "1", *SHELL)
    client.read_until(PROMPT)
    client.command("sleep 4715 & echo DONE-$((100+5))", b"DONE-105\r\n")
    sleeper = _started("4715")
    [keeper] = _keepers()
    time.sleep(1.5)  # attached: the idle time does not run
    assert not gone(sleeper)
    client.type(b"\x1d")
    assert client.wait() == 0
    _wait_gone([keeper, sleeper])  # detached for 1 s: the sandbox and the keeper end
    assert not os.path.exists(os.path.join(world.state_dir, "shells", "work.sock"))
    assert any(r.get("kept_shell") == "work" for r in world.audit_records())
