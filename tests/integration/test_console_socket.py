"""The console socket and keyboard relay of gVisor at a terminal, with real sockets and ptys.

A thread plays runsc's part (connect, send a descriptor with ``SCM_RIGHTS``);
a pty pair plays the user's terminal. The whole runs with runsc are in
tests/integration/server/test_run_on_a_terminal.py.
"""

from __future__ import annotations

import os
import select
import socket
import tempfile
import termios
import threading
import time

import pytest

from corral import LaunchFailed
from corral.pipeline._console import ConsoleRelay, ConsoleSocket


def _send(path: str, fds: list[int], seen: dict[str, int]) -> None:
    """Connect to *path* like runsc and send *fds* (noting the directory's mode first)."""
    seen["mode"] = os.stat(os.path.dirname(path)).st_mode & 0o777
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(path)
        socket.send_fds(conn, [b"pty-master"], fds)


def _waiter(deadline: float) -> object:
    def wait_readable(fd: int) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise LaunchFailed("Failed to start the sandbox: set-up did not finish in time")

    return wait_readable


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_console_socket_takes_one_pty_master_in_a_private_directory() -> None:
    console = ConsoleSocket()
    master, slave = os.openpty()
    seen: dict[str, int] = {}
    sender = threading.Thread(target=_send, args=(console.path, [master], seen))
    sender.start()
    try:
        received = console.receive(_waiter(time.monotonic() + 10))  # type: ignore[arg-type]
        sender.join()
        assert seen["mode"] == 0o700  # only corral's user reaches the socket
        assert not os.path.exists(console.directory)  # removed once the master arrived
        assert os.isatty(received) and not os.get_inheritable(received)
        os.write(slave, b"from the command")
        assert os.read(received, 100) == b"from the command"
        os.close(received)
    finally:
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("what", ["a pipe", "two ptys", "nothing"])
def test_anything_but_one_pty_fails_the_run_and_keeps_no_descriptor(what: str) -> None:
    r, w = os.pipe()
    m1, s1 = os.openpty()
    m2, s2 = os.openpty()
    sent = {"a pipe": [r], "two ptys": [m1, m2], "nothing": []}[what]
    before = _open_fds()
    console = ConsoleSocket()
    sender = threading.Thread(target=_send, args=(console.path, sent, {}))
    sender.start()
    try:
        with pytest.raises(LaunchFailed, match="expected one pty"):
            console.receive(_waiter(time.monotonic() + 10))  # type: ignore[arg-type]
        sender.join()
        assert _open_fds() == before  # what came over the socket is closed again
        assert not os.path.exists(console.directory)
    finally:
        for fd in (r, w, m1, s1, m2, s2):
            os.close(fd)


def test_a_runtime_that_never_connects_fails_the_run_at_the_deadline() -> None:
    console = ConsoleSocket()
    started = time.monotonic()
    with pytest.raises(LaunchFailed, match="in time"):
        console.receive(_waiter(started + 0.3))  # type: ignore[arg-type]
    assert time.monotonic() - started < 5
    assert not os.path.exists(console.directory)


def test_the_relay_types_into_the_command_pty_and_pauses_while_stopped() -> None:
    """Keys typed at the user's terminal reach the command's pty; paused (the job stopped)
    they stay for the shell; the terminal is raw but for Ctrl-Z, and the user's own file
    description is never left non-blocking."""
    user_side, terminal = os.openpty()  # the user's keyboard writes to user_side
    command_master, command_slave = os.openpty()
    saved = termios.tcgetattr(terminal)
    relay = ConsoleRelay(command_master, terminal)
    poller = select.poll()
    try:
        mode = termios.tcgetattr(terminal)
        assert not mode[3] & (termios.ICANON | termios.ECHO)
        assert mode[3] & termios.ISIG  # for Ctrl-Z only:
        assert mode[6][termios.VINTR] == mode[6][termios.VQUIT] == b"\0"
        assert mode[6][termios.VSUSP] == saved[6][termios.VSUSP]
        assert os.get_blocking(terminal)

        relay.register(poller)

        def pump(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                relay.sync()
                for fd, _mask in poller.poll(50):
                    assert relay.owns(fd)
                    relay.on_event(fd)

        termios.tcsetattr(command_slave, termios.TCSANOW, _raw(command_slave))
        os.write(user_side, b"ls\x03")
        pump(0.5)
        assert os.read(command_slave, 100) == b"ls\x03"  # Ctrl-C is the command's pty's

        relay.pause(True)
        os.write(user_side, b"for the shell")
        pump(0.3)
        assert select.select([command_slave], [], [], 0)[0] == []
        assert os.read(terminal, 100) == b"for the shell"  # still there for the shell

        relay.pause(False)
        os.write(user_side, b"again")
        pump(0.5)
        assert os.read(command_slave, 100) == b"again"
    finally:
        relay.close()
        termios.tcsetattr(terminal, termios.TCSANOW, saved)
        for fd in (user_side, terminal, command_master, command_slave):
            os.close(fd)


def _raw(fd: int) -> list[object]:
    mode = termios.tcgetattr(fd)
    mode[3] &= ~(termios.ICANON | termios.ECHO | termios.ISIG)
    return mode


def test_a_socket_path_too_long_fails_the_run_with_a_clear_error(tmp_path: object) -> None:
    deep = os.path.join(str(tmp_path), "d" * 120)
    os.makedirs(deep)
    old = tempfile.tempdir
    tempfile.tempdir = deep
    try:
        with pytest.raises(LaunchFailed, match="Failed to listen for the command's terminal"):
            ConsoleSocket()
    finally:
        tempfile.tempdir = old
    assert os.listdir(deep) == []  # the private directory is removed again
