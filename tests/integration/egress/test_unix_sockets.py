"""``network.allowUnixSockets`` as a list: only the named host sockets are reachable.

Real host servers, a real ``corral run`` on bubblewrap, plain Python clients
inside; each server counts what it received on the host.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from tests.conftest import World, client_command, is_root, needs_bwrap

pytestmark = [needs_bwrap]

#: Prints, per path given, ``OK <reply>`` or ``ERR <errno name>``.
CLIENT = """
import errno, socket, sys
for path in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect(path)
        print(path, "OK", s.recv(64).decode())
    except OSError as e:
        print(path, "ERR", errno.errorcode.get(e.errno, e.errno))
"""


class Server:
    """A unix socket server on the host that answers ``pong`` and counts connections."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self.accepted = 0
        self.on_accept: Callable[[socket.socket], object] | None = None
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        os.chmod(path, 0o666)  # a root caller's sandbox runs as an unrelated uid
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                if self.on_accept is not None:
                    self.on_accept(conn)
                conn.sendall(b"pong")

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


@contextmanager
def servers(*paths: str) -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        for path in paths:
            started.append(Server(path))
        yield started
    finally:
        for server in started:
            server.close()


def run(world: World, settings: dict[str, object], *paths: str, backend: str = "bubblewrap"):  # type: ignore[no-untyped-def]
    path = world.write(
        os.path.join(world.root, f"s-{uuid.uuid4().hex[:6]}.json"), json.dumps(settings)
    )
    return world.corral(
        "run", "--backend", backend, "--settings", path, "--", "python3", "-c", CLIENT, *paths
    )


def answers(stdout: bytes) -> dict[str, str]:
    """``{path: "OK pong" | "ERR ENAME"}`` from the client's output."""
    found: dict[str, str] = {}
    for line in stdout.decode().splitlines():
        path, _, rest = line.partition(" ")
        found[path] = rest
    return found


def test_only_the_named_host_socket_is_reachable(world: World) -> None:
    svc = os.path.join(world.outside, "svc")
    named, sibling = os.path.join(svc, "named.sock"), os.path.join(svc, "other.sock")
    docker = os.path.join(world.outside, "var", "lib", "docker.sock")
    paths = [named, sibling, docker]
    run_dir = None
    if is_root() and os.access("/run", os.W_OK):
        # a service's socket under the host's /run: the whole directory is hidden
        run_dir = f"/run/corral-test-{uuid.uuid4().hex[:8]}"
        paths.append(os.path.join(run_dir, "docker.sock"))
    try:
        with servers(*paths) as started:
            for mode in ("none", "allowlist"):
                result = run(
                    world, {"network": {"mode": mode, "allowUnixSockets": [named]}}, *paths
                )
                assert result.returncode == 0, result.stderr
                seen = answers(result.stdout)
                assert seen[named] == "OK pong", seen
                assert seen[sibling] == "ERR ECONNREFUSED", seen  # /dev/null over it
                assert seen[docker] == "ERR ECONNREFUSED", seen
                if run_dir:
                    assert seen[paths[3]] == "ERR ENOENT", seen  # an empty /run
            # on the host: only the named server was ever reached, and all still serve
            assert [s.accepted for s in started] == [2] + [0] * (len(paths) - 1)
            for path in paths:
                client = socket.socket(socket.AF_UNIX)
                client.connect(path)
                assert client.recv(4) == b"pong"
                client.close()
    finally:
        if run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def test_the_corral_server_socket_stays_unreachable(world: World) -> None:
    """Even re-exposed with allowRead, the server's socket is covered (and the run uses it);
    named, it is refused."""
    from tests.integration.server.conftest import stop

    del world.environ["CORRAL_SERVER"]
    svc = os.path.join(world.outside, "svc", "named.sock")
    server_dir = os.path.join(world.state_dir, "server")
    assert world.corral("server", "--detach").returncode == 0
    try:
        sock = os.path.join(server_dir, "server.sock")
        assert os.path.exists(sock)
        with servers(svc) as (named,):
            settings: dict[str, object] = {
                "network": {"allowUnixSockets": [svc]},
                "filesystem": {"allowRead": [server_dir]},
            }
            result = run(world, settings, svc, sock)
            assert result.returncode == 0, result.stderr
            seen = answers(result.stdout)
            assert seen == {svc: "OK pong", sock: "ERR ECONNREFUSED"}, seen
            assert named.accepted == 1
            # named on purpose: refused before anything runs (the broker makes the connect,
            # and corral's server must never take it for one of its own clients')
            settings["network"] = {"allowUnixSockets": [sock]}
            result = run(world, settings, sock)
            assert result.returncode == 125, result.stderr
            assert b"it is corral's own" in result.stderr
            assert result.stdout == b""
    finally:
        stop(world)


def test_the_list_is_refused_where_it_cannot_hold(world: World) -> None:
    svc = os.path.join(world.outside, "named.sock")
    in_workspace = world.ws("ws.sock")
    with servers(svc, in_workspace):
        cases: list[tuple[dict[str, object], str, str]] = [
            ({"network": {"mode": "open", "allowUnixSockets": [svc]}}, "bubblewrap", "open"),
            ({"network": {"allowUnixSockets": [in_workspace]}}, "bubblewrap", "may write"),
            ({"network": {"allowUnixSockets": [svc + ".gone"]}}, "bubblewrap", "does not exist"),
            ({"network": {"allowUnixSockets": [world.victim]}}, "bubblewrap", "not a socket"),
            ({"network": {"allowUnixSockets": [svc]}}, "landlock", "landlock"),
            (
                {"network": {"allowUnixSockets": [svc]}, "image": "corral:python"},
                "podman",
                "podman",
            ),
        ]
        world.write(world.victim, "v\n")
        for settings, backend, words in cases:
            extra: dict[str, object] = {}
            if backend == "landlock":
                extra = {"isolation": "process", "allowDegraded": ["isolation"]}
            result = run(world, {**settings, **extra}, svc, backend=backend)
            assert result.returncode == 125, (backend, settings, result.stderr)
            assert b"network.allowUnixSockets" in result.stderr, result.stderr
            assert words.encode() in result.stderr, result.stderr
            assert b"OK" not in result.stdout


def test_abstract_sockets_of_the_host_are_not_reachable(world: World) -> None:
    """The sandbox's own network namespace has none of the host's abstract names."""
    name = f"\0corral-test-{uuid.uuid4().hex[:8]}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(name)
    server.listen(1)
    server.settimeout(0.2)
    svc = os.path.join(world.outside, "named.sock")
    code = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"try: s.connect({name!r}); print('REACHED')\n"
        "except OSError as e: print('ERR', e.errno)"
    )
    try:
        with servers(svc):
            path = world.write(
                os.path.join(world.root, "abstract.json"),
                json.dumps({"network": {"allowUnixSockets": [svc]}}),
            )
            result = world.corral(
                "run", "--backend", "bubblewrap", "--settings", path, "--", "python3", "-c", code
            )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"ERR {errno.ECONNREFUSED}".encode(), result.stdout
        with pytest.raises(OSError):
            server.accept()
    finally:
        server.close()


def test_a_host_socket_listed_under_another_name_stays_unreachable(world: World) -> None:
    """/proc/net/unix names a socket by the path given to bind() - relative, or where its
    directory was before a rename - so no mount covers it; the broker's connect() judges the
    inode the path reaches, whatever the listing says."""
    svc = os.path.join(world.outside, "svc")
    named = os.path.join(svc, "named.sock")
    relative_dir = os.path.join(
        world.outside, "rel"
    )  # short: the unprivileged pass's paths are long
    bound_in, moved_to = os.path.join(world.outside, "a"), os.path.join(world.outside, "b")
    os.makedirs(relative_dir)
    relative = socket.socket(socket.AF_UNIX)
    with servers(named, os.path.join(bound_in, "moved.sock")) as started:
        os.rename(bound_in, moved_to)  # still listening; /proc/net/unix says .../a/moved.sock
        here = os.getcwd()
        os.chdir(relative_dir)
        try:
            relative.bind("r.sock")  # /proc/net/unix says "r.sock"
        finally:
            os.chdir(here)
        os.chmod(os.path.join(relative_dir, "r.sock"), 0o666)
        relative.listen(4)
        relative.setblocking(False)
        try:
            others = [
                os.path.join(relative_dir, "r.sock"),
                os.path.join(moved_to, "moved.sock"),
            ]
            result = run(world, {"network": {"mode": "none", "allowUnixSockets": [named]}},
                         named, *others)  # fmt: skip
            assert result.returncode == 0, result.stderr
            seen = answers(result.stdout)
            assert seen[named] == "OK pong", seen
            # on the host: neither unnamed server was reached
            try:
                relative.accept()[0].close()
                reached_relative = True
            except BlockingIOError:
                reached_relative = False
            assert (reached_relative, started[1].accepted) == (False, 0), seen
            assert all(seen[path] == "ERR ECONNREFUSED" for path in others), seen
        finally:
            relative.close()


DATAGRAM_AND_LATE = """
import errno, os, socket, sys, time
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    print("dgram", "OK")
except OSError as e:
    print("dgram", "ERR", errno.errorcode.get(e.errno, e.errno))
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
a.send(b"x")
print("socketpair", "OK", b.recv(1).decode())
deadline = time.monotonic() + 10
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    print("late", "OK", s.recv(64).decode())
except OSError as e:
    print("late", "ERR", errno.errorcode.get(e.errno, e.errno))
"""


def test_no_datagram_socket_and_no_socket_made_after_the_start(world: World) -> None:
    """Named sockets: a datagram unix socket would reach any path by sendto() without a
    connect(), so it is refused (socketpair() still works); a socket the host creates after
    the sandbox started is unnamed, so unreachable, and the attempt is a recorded violation."""
    svc = os.path.join(world.outside, "svc")
    named, late = os.path.join(svc, "named.sock"), os.path.join(svc, "late.sock")
    path = world.write(
        os.path.join(world.root, "dgram.json"),
        json.dumps({"network": {"mode": "none", "allowUnixSockets": [named]}}),
    )
    with servers(named):
        import subprocess

        proc = subprocess.Popen(
            [*client_command("corral"), "run", "--backend", "bubblewrap", "--settings", path, "--",
             "python3", "-c", DATAGRAM_AND_LATE, late],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.environ, cwd=world.workspace,
        )  # fmt: skip
        import time

        time.sleep(1.0)  # the sandbox has started: the host's socket appears only now
        with servers(late) as (late_server,):
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            seen = answers(out)
            assert seen["dgram"] == "ERR EPERM", seen
            assert seen["socketpair"] == "OK x", seen
            assert seen["late"] == "ERR ECONNREFUSED", seen
            assert late_server.accepted == 0
    records = world.audit_records()
    violations = records[-1]["violations"]
    assert any(
        v["kind"] == "network" and v["rule"] == "network.allowUnixSockets" and late in v["target"]
        for v in violations
    ), violations


@pytest.mark.skipif(not is_root(), reason="a root caller's sandbox identity")
def test_a_root_callers_connect_is_made_as_the_sandbox_uid_not_root(world: World) -> None:
    """The broker connects for the sandbox: the server sees the sandbox's uid (65533), never
    root's, and a socket only root may open stays closed to it, as the kernel would say."""
    svc = os.path.join(world.outside, "svc")
    open_sock, root_only = os.path.join(svc, "open.sock"), os.path.join(svc, "root-only.sock")
    with servers(open_sock, root_only) as (opened, closed):
        os.chmod(root_only, 0o600)
        peers: list[tuple[int, int, int]] = []
        opened.on_accept = lambda conn: peers.append(
            struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        )
        result = run(
            world,
            {"network": {"mode": "none", "allowUnixSockets": [open_sock, root_only]}},
            open_sock,
            root_only,
        )
        assert result.returncode == 0, result.stderr
        seen = answers(result.stdout)
        assert seen == {open_sock: "OK pong", root_only: "ERR EACCES"}, seen
        assert closed.accepted == 0
        assert [(uid, gid) for _pid, uid, gid in peers] == [(65533, 65533)]
