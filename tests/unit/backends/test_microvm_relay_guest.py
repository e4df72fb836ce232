"""The micro-VM relay against a hostile guest: what the agent says a command ended with.

The guest's root can take the agent's port and send any frame (the agent is
not a trust boundary). The relay ends "the same way" as the guest's command:
it must never stop itself (a stopped relay hangs the host's run until its
timeout's SIGKILL - forever for ``corral shell``, which has none) and never
exit with a status the guest made up out of range. The test plays the agent
on a socketpair and runs the real relay.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from corral.backends.microvm import relay_path

RELAY = relay_path()
pytestmark = pytest.mark.skipif(RELAY is None, reason="corral-vm-relay is not built (make native)")


def _frame(kind: bytes, payload: bytes) -> bytes:
    return kind + len(payload).to_bytes(4, "big") + payload


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _relay_told(end: bytes) -> tuple[int, bytes]:
    """Run the real relay, answer its command with the end *end* (as a guest's agent would),
    and return its exit status and stderr; fails if the relay is ever seen stopped."""
    host, guest = socket.socketpair()
    exec_r, exec_w = os.pipe()
    done_r, done_w = os.pipe()
    os.write(exec_w, b"0command")
    os.close(exec_w)
    relay = subprocess.Popen(
        [str(RELAY), str(exec_r), str(guest.fileno()), str(done_w)],
        pass_fds=(exec_r, guest.fileno(), done_w),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    os.close(exec_r)
    os.close(done_w)
    guest.close()
    try:
        host.settimeout(10)
        assert host.recv(5)[:1] == b"E"  # the relay sent the command: now the guest answers
        host.sendall(_frame(b"X", end + b"\0"))
        deadline = time.monotonic() + 10
        while relay.poll() is None:
            assert _state(relay.pid) != "T", f"the guest's {end!r} stopped the host's relay"
            assert time.monotonic() < deadline, "the relay did not end"
            time.sleep(0.02)
        _out, err = relay.communicate()
        return relay.returncode, err
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
        host.close()
        os.close(done_r)


@pytest.mark.parametrize(
    "end",
    [
        b"signal 19",
        b"signal 20",
        b"signal 21",
        b"signal 22",
        b"signal 0",
        b"signal 99",
        b"signal x",
        b"exit 300",
        b"exit -1",
        b"exit",
    ],
)
def test_a_guests_made_up_end_never_stops_the_relay(end: bytes) -> None:
    status, err = _relay_told(end)
    assert status == 125, (status, err)
    assert b"broke the agent protocol" in err and b"Traceback" not in err, err


@pytest.mark.parametrize(
    ("end", "status"), [(b"exit 7", 7), (b"signal 15", -15), (b"signal 9", -9)]
)
def test_a_guests_real_end_is_passed_on(end: bytes, status: int) -> None:
    """The check above refuses only ends no command can have: real ones still pass."""
    assert _relay_told(end)[0] == status
