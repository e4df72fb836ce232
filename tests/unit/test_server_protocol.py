"""The corral server's frames, signal relay and peer checks, without a server process."""

from __future__ import annotations

import _socket
import os
import socket

import pytest

from corral.pipeline._runner import SignalRelay
from corral.server._peers import PeerRefused, check_peer, process_context
from corral.server._wire import MAX_FRAME, FrameReader, WireError, code_stamp, encode, socket_path


def test_frames_round_trip_in_any_chunking() -> None:
    messages = [{"op": "run", "argv": ["a", "\udcff"], "env": {"K": "v"}}, {"signal": 2}]
    data = b"".join(encode(m) for m in messages)
    for size in (1, 3, 7, len(data)):
        reader = FrameReader()
        got = []
        for i in range(0, len(data), size):
            got += reader.feed(data[i : i + size])
        assert got == messages and reader.pending == 0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ((MAX_FRAME + 1).to_bytes(4, "big"), "exceeds"),
        (len(b"[1]").to_bytes(4, "big") + b"[1]", "not a JSON object"),
        (len(b"{x").to_bytes(4, "big") + b"{x", "malformed frame"),
    ],
)
def test_bad_frames_are_errors(data: bytes, message: str) -> None:
    with pytest.raises(WireError, match=message):
        FrameReader().feed(data)


def test_socket_path_and_code_stamp() -> None:
    assert socket_path("/s/corral") == "/s/corral/server/server.sock"
    stamp = code_stamp()
    assert stamp.startswith("1:") and os.path.dirname(__import__("corral").__file__) in stamp


class FakeRunning:
    def __init__(self) -> None:
        self.events: list[object] = []

    def send_signal(self, signum: int) -> None:
        self.events.append(signum)

    def cancel(self) -> None:
        self.events.append("cancel")

    def kill(self) -> None:
        self.events.append("kill")


def test_signals_before_the_start_are_delivered_at_the_start_in_order() -> None:
    relay = SignalRelay((1,))
    relay.deliver(2)
    running = FakeRunning()
    relay.started(running)  # type: ignore[arg-type]
    relay.deliver(2)
    assert running.events == [1, 2, 2]


@pytest.mark.parametrize("started", [False, True])
def test_sigterm_stops_the_whole_sandbox_rather_than_being_forwarded(started: bool) -> None:
    relay = SignalRelay()
    running = FakeRunning()
    if started:
        relay.started(running)  # type: ignore[arg-type]
    relay.deliver(15)
    if not started:
        relay.started(running)  # type: ignore[arg-type]
    assert running.events == ["cancel"] and relay.stopped == "stop"


@pytest.mark.parametrize(("action", "event"), [("kill", "kill"), ("stop", "cancel")])
def test_a_stop_before_the_start_applies_at_the_start(action: str, event: str) -> None:
    relay = SignalRelay()
    getattr(relay, action)()
    running = FakeRunning()
    relay.started(running)  # type: ignore[arg-type]
    assert running.events == [event] and relay.stopped == action


def test_a_kill_wins_over_a_stop() -> None:
    relay = SignalRelay()
    relay.stop()
    relay.kill()
    relay.stop()
    assert relay.stopped == "kill"


def test_this_process_passes_its_own_peer_check() -> None:
    a, b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        pid, pidfd = check_peer(a, process_context())
        os.close(pidfd)
        assert pid == os.getpid()
    finally:
        a.close()
        b.close()


def test_threads_that_end_during_the_check_do_not_fail_it() -> None:
    """A peer starting and ending threads (a server during its start) passes its check.

    Its threads end between the listing of ``/proc/PID/task`` and the read of
    their status; the check skips them (nothing of them is left) and checks the rest.
    """
    import threading

    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            t = threading.Thread(target=lambda: None)
            t.start()
            t.join()

    churners = [threading.Thread(target=churn) for _ in range(4)]
    for t in churners:
        t.start()
    a, b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        own = process_context()
        for _ in range(300):
            pid, pidfd = check_peer(a, own)
            os.close(pidfd)
            assert pid == os.getpid()
    finally:
        stop.set()
        for t in churners:
            t.join()
        a.close()
        b.close()


def test_a_context_difference_is_not_a_security_refusal() -> None:
    security, context = process_context()
    context = {**context, "Umask": "0777"}
    a, b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        with pytest.raises(PeerRefused) as info:
            check_peer(a, (security, context))
        assert not info.value.security and "Umask" in info.value.reason
        with pytest.raises(PeerRefused) as info:
            check_peer(a, ({**security, "Seccomp_filters": "7"}, context))
        assert info.value.security and info.value.reason == "Seccomp_filters differs"
    finally:
        a.close()
        b.close()


def test_this_kernel_can_host_a_server() -> None:
    from corral.server._server import _kernel_problem

    assert _kernel_problem() is None  # SO_PEERPIDFD: Linux 6.5+


def test_clients_stop_starting_servers_a_kernel_cannot_host(tmp_path: object) -> None:
    from corral.cli._client import _may_start_server

    state = str(tmp_path)
    assert _may_start_server(state, {})
    assert not _may_start_server(state, {"CORRAL_SANDBOX_ID": "sbx-1"})  # nested: never
    os.makedirs(os.path.join(state, "server"))
    marker = os.path.join(state, "server", "unavailable")
    with open(marker, "w") as f:
        f.write(f"{os.uname().release}\nno SO_PEERPIDFD\n")
    assert not _may_start_server(state, {})
    with open(marker, "w") as f:
        f.write("4.19.0-old\nno SO_PEERPIDFD\n")
    assert _may_start_server(state, {})  # another kernel now: try again


def test_clients_start_no_server_while_the_last_start_failed_for_a_while(tmp_path: object) -> None:
    import time

    from corral.cli._client import _busy, _may_start_server
    from corral.server._slots import BUSY, mark_busy

    state = str(tmp_path)
    directory = os.path.join(state, "server")
    os.makedirs(directory)
    assert _busy(state) is None
    mark_busy(directory, "16 corral servers already run for uid 0")
    assert _busy(state) == "16 corral servers already run for uid 0"
    assert not _may_start_server(state, {})
    with open(os.path.join(directory, BUSY), "w") as f:
        f.write(f"{time.time() - 1}\nno slot\n")  # the retry time has passed
    assert _busy(state) is None
    assert _may_start_server(state, {})
    mark_busy(directory, "no slot")
    mark_busy(directory, None)  # a server started: cleared
    assert not os.path.exists(os.path.join(directory, BUSY))
    assert _may_start_server(state, {})


def _fds_on(directory: str) -> list[str]:
    """This process's descriptors of *directory* (or of anything below it)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(directory):
            found.append(target)
    return found


@pytest.mark.parametrize("depth", [40, 200])
def test_bind_and_connect_reach_a_socket_at_any_path_length(tmp_path: object, depth: int) -> None:
    from corral.server._wire import SUN_PATH_MAX, bind_unix, connect_unix

    directory = os.path.join(str(tmp_path), "d" * max(1, depth - len(str(tmp_path)) - 14))
    os.makedirs(directory)
    path = os.path.join(directory, "server.sock")
    assert (len(path) > SUN_PATH_MAX) == (depth == 200)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        bind_unix(listener, path)
        listener.listen(1)
        assert os.listdir(directory) == ["server.sock"]  # the socket is at the long path itself
        connect_unix(client, path)
        conn, _ = listener.accept()
        client.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        conn.close()
        assert _fds_on(str(tmp_path)) == []  # the alias's descriptor is closed again
    finally:
        listener.close()
        client.close()


def test_connect_to_a_long_path_whose_directory_is_missing_is_file_not_found(
    tmp_path: object,
) -> None:
    from corral.server._wire import connect_unix

    path = os.path.join(str(tmp_path), "x" * 150, "server", "server.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with pytest.raises(FileNotFoundError):
            connect_unix(sock, path)
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("argv", ["sh", "-c", "a\0b"], "argv must not contain a NUL byte"),
        ("cwd", "/tmp\0/etc", "cwd must not contain a NUL byte"),
        ("env", {"PATH": "/bin\0/usr/bin"}, "env must not contain a NUL byte"),
        ("env", {"A\0B": "c"}, "env must not contain a NUL byte"),
    ],
)
def test_a_run_request_with_a_nul_byte_is_refused_before_anything_uses_it(
    field: str, value: object, reason: str
) -> None:
    """No system call takes a NUL byte: such a request is a bad request up front, not an
    internal error of the server later (ATK11)."""
    from corral.server._requests import _run_request

    message = {"argv": ["true"], "cwd": "/", "env": {}, "pid": 7, field: value}
    assert _run_request(message, [0, 1, 2], 7) == reason
