"""A state directory whose socket path does not fit ``sun_path`` (108 bytes) is served.

The server binds, and both clients connect, through ``/proc/self/fd/N/server.sock``
(N a descriptor of the socket's directory): ``corral run`` and ``corral-client run``
go through the server, not in-process; ``--status`` and ``--stop`` reach it.
"""

from __future__ import annotations

import json
import os

from corral.backends._unix_covers import corral_sockets, host_unix_listeners
from tests.conftest import World, fast_client_path, needs_bwrap
from tests.integration.server.conftest import gone, wait_for

pytestmark = needs_bwrap


def test_a_socket_path_of_200_bytes_is_served_by_both_clients(world: World) -> None:
    base = os.path.join(world.root, "state")
    deep = os.path.join(base, "s" * 60, "t" * 60)
    pad = 200 - len(os.path.join(deep, "corral", "server", "server.sock"))
    deep = os.path.join(deep, "u" * max(1, pad - 1))
    os.makedirs(deep)
    state = os.path.join(deep, "corral")
    sock = os.path.join(state, "server", "server.sock")
    assert len(sock) >= 200
    world.environ["XDG_STATE_HOME"] = deep
    del world.environ["CORRAL_SERVER"]

    def status() -> dict[str, object] | None:
        data = json.loads(world.corral("server", "--status", "--json").stdout or b"null")
        assert data is None or isinstance(data, dict)
        return data

    started = world.corral("server", "--detach")
    assert started.returncode == 0, started.stderr
    try:
        first = status()
        assert first is not None and first["state_dir"] == state and first["served"] == 0
        assert os.stat(sock).st_mode & 0o777 == 0o600  # the socket is at the long path itself
        # the kernel's table names it by its alias; the sandboxes' socket covers still find it
        with open("/proc/net/unix", encoding="utf-8") as f:
            assert sock not in f.read()
        listeners = dict(host_unix_listeners(as_other=False, also=corral_sockets(state)))
        assert os.path.realpath(sock) in listeners
        clients = ["corral"] + (["corral-client"] if fast_client_path() else [])
        for client in clients:
            result = world.corral("run", "--", "sh", "-c", "echo via-$0", client, client=client)
            assert result.returncode == 0, result.stderr
            assert result.stdout == f"via-{client}\n".encode()
            assert b"warning" not in result.stderr
        after = status()
        assert after is not None and after["served"] == len(clients)  # none ran in-process
    finally:
        stopped = world.corral("server", "--stop")
    assert stopped.returncode == 0, stopped.stderr
    assert b"stopped the corral server" in stopped.stdout
    wait_for(lambda: gone(int(first["pid"])), what="the server to exit")  # type: ignore[arg-type]
    assert status() is None
    assert not os.path.exists(sock)
