"""Every settings key, every value shape: enforced (a real attempt, checked on the host) or refused.

The walk is driven by the key table (:data:`corral.policy._keys.KEYS`, the
source of the JSON Schema): :func:`test_every_key_and_shape_has_a_proof` fails
when a key is added, or a choice added to an enum, without a proof here. Each
proof runs the installed ``corral run`` with the value in a ``--settings``
file (the real loader, the real backend: bubblewrap unless the proof picks
another) and then checks the host: the file is there or not, the secret did
not arrive, the connection was not received, or the run was refused with exit
125 naming the rule. Nothing accepted may be a no-op.

Shapes per kind (what the completeness test requires):

* enum: every choice; bool: ``true`` and ``false`` (``allowUnixSockets``: also
  ``list``); nullable: ``null``;
* path lists: ``absolute``, ``relative`` and ``home`` (``~/``); path
  pattern lists and ``denyRead``: those plus ``glob``;
* sizes, durations, numbers: ``value``; everything else: at least one shape.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from corral.policy import _keys as k
from corral.testing.conformance import tcp_server
from tests.conftest import PROBE_PYTHON, World, corral_command, needs_bwrap

from .conftest import available

pytestmark = [needs_bwrap, pytest.mark.backend("bubblewrap")]

Proof = Callable[[World], None]
_count = iter(range(1_000_000))


# ---------------------------------------------------------------- helpers
def run(
    world: World, settings: dict[str, object], command: str, *options: str, **kw: object
) -> subprocess.CompletedProcess[bytes]:
    """``corral run --settings FILE [options] -c COMMAND`` in the workspace."""
    path = world.write(os.path.join(world.root, f"walk-{next(_count)}.json"), json.dumps(settings))
    landlock = "landlock" in (settings.get("backend"), world.environ.get("CORRAL_BACKEND"))
    if landlock and os.geteuid() == 0:
        # landlock refuses a root caller (it would keep root's identity) unless told
        options = ("--allow-degraded", "isolation", *options)
    return world.corral("run", "--settings", path, *options, "-c", command, **kw)  # type: ignore[arg-type]


def refused(result: subprocess.CompletedProcess[bytes], *words: str) -> None:
    """The run was refused before anything ran: exit 125, the rule named."""
    assert result.returncode == 125, (result.returncode, result.stderr)
    for word in words:
        assert word.encode() in result.stderr, result.stderr
    assert b"RAN" not in result.stdout


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, (result.returncode, result.stderr)
    return result.stdout.decode()


def py(code: str) -> str:
    return f"{PROBE_PYTHON} -c " + "'" + code.replace("'", "'\\''") + "'"


def outside(world: World, name: str) -> str:
    return os.path.join(world.outside, name)


def wrote(world: World, settings: dict[str, object], path: str, *options: str) -> bool:
    """Whether the command could create *path* (checked on the host)."""
    run(world, settings, f"mkdir -p $(dirname {path}) 2>/dev/null; echo x > {path}", *options)
    return os.path.exists(path)


def reads(world: World, settings: dict[str, object], path: str, *options: str) -> bool:
    """Whether the command could read the marker in *path*."""
    result = run(world, settings, f"cat {path}", *options)
    return b"MARK-" in result.stdout


def secret(path: str) -> str:
    World.write(path, "MARK-" + os.path.basename(path) + "\n")
    return path


def connect(port: int) -> str:
    return py(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)")


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"HELLO-WALK\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        del args


@contextmanager
def http_server(world: World) -> Iterator[int]:
    """An HTTP server on 127.0.0.1; ``*.walk.test`` names resolve to it through the proxy."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    hosts = world.write(
        os.path.join(world.root, "hosts"), "127.0.0.1 api.walk.test other.walk.test walk.test\n"
    )
    world.environ["CORRAL_EGRESS_HOSTS"] = hosts
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def fetch(host: str, port: int) -> str:
    return f"curl -s --max-time 10 http://{host}:{port}/ || echo FAILED"


def allowlist_reaches(
    world: World,
    allow: list[str],
    host: str,
    deny: list[str] = (),  # type: ignore[assignment]
    **requests: list[str],
) -> bool:
    with http_server(world) as port:
        network: dict[str, object] = {
            "mode": "allowlist",
            "allow": [a.replace("PORT", str(port)) for a in allow],
            **requests,  # allowRequests / denyRequests
        }
        if deny:
            network["deny"] = list(deny)
        result = run(world, {"network": network}, fetch(host, port))
    assert result.returncode in (0, 7, 22, 56), result.stderr  # curl's own failures are fine
    return b"HELLO-WALK" in result.stdout


def backend_usable(name: str) -> bool:
    return available().get(name, "not registered") is None


# ---------------------------------------------------------------- isolation and backend
ISOLATION_BACKEND = {"process": "landlock", "namespace": "bubblewrap", "kernel": "gvisor"}


def isolation_proof(level: str) -> Proof:
    def proof(world: World) -> None:
        target = outside(world, "escaped")
        settings: dict[str, object] = {"isolation": level}
        if level == "kernel":  # gVisor refuses protect (see allowDegraded)
            settings["allowDegraded"] = ["filesystem.protect"]
        result = run(world, settings, f"touch {target}; echo RAN")
        assert not os.path.exists(target)
        if level == "vm" or not backend_usable(ISOLATION_BACKEND[level]):
            refused(result, level)  # no backend here provides it: refused, never weaker
        else:
            assert "RAN" in ok(result)

    return proof


def backend_proof(name: str) -> Proof:
    def proof(world: World) -> None:
        target = outside(world, "escaped")
        level = k.BACKEND_ISOLATION[name] or "namespace"
        settings: dict[str, object] = {"backend": name}
        if name != "none":
            settings["isolation"] = level if level != "none" else "process"
        if name in ("podman", "docker"):
            settings["image"] = "corral:python"
        if name == "gvisor":  # it refuses protect (see allowDegraded); the rest is enforced
            settings["allowDegraded"] = ["filesystem.protect"]
        result = run(world, settings, f"touch {target}; echo RAN")
        if name == "none":  # the explicit opt-out: it runs on the host, and says so
            assert "RAN" in ok(result)
            assert os.path.exists(target)
            assert b"without a sandbox" in result.stderr
            return
        assert not os.path.exists(target)
        if name in ("auto", "bubblewrap", "landlock") or (
            name == "gvisor" and backend_usable(name)
        ):
            assert "RAN" in ok(result)
        elif result.returncode == 125:  # not usable here (no engine, no image, no KVM, not macOS)
            assert b"Failed" in result.stderr or b"corral:" in result.stderr, result.stderr
            assert b"RAN" not in result.stdout
        else:
            assert "RAN" in ok(result)

    return proof


def allow_degraded(world: World) -> None:
    if not backend_usable("gvisor"):
        pytest.skip("gvisor is not available here: no rule that a backend refuses")
    settings = {"backend": "gvisor", "isolation": "kernel"}
    refused(run(world, settings, "echo RAN"), "filesystem.protect")
    allowed = run(world, {**settings, "allowDegraded": ["filesystem.protect"]}, "echo RAN")
    assert "RAN" in ok(allowed)
    assert b"filesystem.protect was not enforced" in allowed.stderr


# ---------------------------------------------------------------- filesystem
def workspace_shape(shape: str) -> Proof:
    def proof(world: World) -> None:
        other = os.path.join(world.root, "other")
        os.makedirs(other)
        value = other if shape == "absolute" else "../other"
        inside = os.path.join(other, "made")
        assert wrote(world, {"filesystem": {"workspace": value}}, inside)
        assert not wrote(world, {"filesystem": {"workspace": value}}, world.ws("not-now"))

    return proof


def allow_home_workspace(value: bool) -> Proof:
    def proof(world: World) -> None:
        result = run(
            world,
            {"filesystem": {"allowHomeWorkspace": value}},
            "echo x > made-in-home; echo RAN",
            cwd=world.home,
        )
        if value:
            assert "RAN" in ok(result)
            assert os.path.exists(os.path.join(world.home, "made-in-home"))
            assert b"allowHomeWorkspace" in result.stderr
        else:
            refused(result, "refusing the workspace")
            assert not os.path.exists(os.path.join(world.home, "made-in-home"))

    return proof


def read_only(value: bool) -> Proof:
    def proof(world: World) -> None:
        before = world.read(world.ws("README"))
        run(world, {"filesystem": {"readOnly": value}}, "echo changed > README")
        assert (world.read(world.ws("README")) == before) is value

    return proof


def allow_write(shape: str) -> Proof:
    def proof(world: World) -> None:
        if shape == "absolute":
            value, target = world.outside, outside(world, "made")
        elif shape == "home":
            os.makedirs(os.path.join(world.home, "cache"))
            value, target = "~/cache", os.path.join(world.home, "cache", "made")
        else:  # relative to the workspace; proves it with readOnly on
            os.makedirs(world.ws("out"))
            value, target = "out", world.ws("out", "made")
        settings: dict[str, object] = {"filesystem": {"allowWrite": [value]}}
        if shape == "relative":
            settings = {"filesystem": {"allowWrite": [value], "readOnly": True}}
        assert wrote(world, settings, target)
        assert not wrote(world, settings, os.path.join(world.home, "not-allowed"))

    return proof


def deny_write(shape: str) -> Proof:
    def proof(world: World) -> None:
        cases = {
            "absolute": (world.ws("config"), world.ws("config", "new.txt")),
            "relative": ("settings.ini", world.ws("settings.ini")),
            "glob": ("**/*.lock", world.ws("a", "b", "x.lock")),
            "home": ("~/notes", os.path.join(world.home, "notes", "x")),
        }
        value, target = cases[shape]
        os.makedirs(world.ws("config"), exist_ok=True)
        settings: dict[str, object] = {"filesystem": {"denyWrite": [value]}}
        if shape == "home":
            os.makedirs(os.path.join(world.home, "notes"))
            settings = {"filesystem": {"denyWrite": [value], "allowWrite": ["~/notes"]}}
        assert not wrote(world, settings, target)
        assert wrote(world, settings, world.ws("free.txt"))

    return proof


def deny_write_absent_nested(world: World) -> None:
    """An absolute denyWrite inside the workspace none of whose parts exist yet."""
    target = world.ws("gen", "deep", "x.txt")
    assert not wrote(world, {"filesystem": {"denyWrite": [world.ws("gen")]}}, target)


def deny_read(shape: str) -> Proof:
    def proof(world: World) -> None:
        cases = {
            "absolute": (outside(world, "cert.key"), outside(world, "cert.key")),
            "relative": (".env", world.ws(".env")),
            "home": ("~/tokens", os.path.join(world.home, "tokens", "t.txt")),
            "glob": (world.outside + "/**/*.pem", outside(world, "a/b/server.pem")),
        }
        value, path = cases[shape]
        secret(path)
        secret(outside(world, "visible.txt"))
        settings = {"filesystem": {"denyRead": [value]}}
        assert not reads(world, settings, path)
        assert reads(world, settings, outside(world, "visible.txt"))
        assert os.path.exists(path)  # hidden, not removed

    return proof


def deny_read_link(world: World) -> None:
    """A secret reached through a link (a dotfiles manager's ~/.aws) is hidden at its target."""
    real = secret(os.path.join(world.home, "dotfiles", "aws", "credentials"))
    os.symlink(os.path.dirname(real), os.path.join(world.home, ".aws-linked"))
    settings = {"filesystem": {"denyRead": ["~/.aws-linked"]}}
    assert not reads(world, settings, os.path.join(world.home, ".aws-linked", "credentials"))
    assert not reads(world, settings, real)


def deny_read_relative_glob(world: World) -> None:
    secret(world.ws("sub", "dir", ".env"))
    assert not reads(world, {"filesystem": {"denyRead": ["**/.env"]}}, world.ws("sub/dir/.env"))


def allow_read(shape: str) -> Proof:
    def proof(world: World) -> None:
        hidden = os.path.join(world.home, "hidden")
        carve = os.path.join(hidden, "public")
        secret(os.path.join(carve, "p.txt"))
        secret(os.path.join(hidden, "private.txt"))
        value = {"absolute": carve, "home": "~/hidden/public", "relative": carve}[shape]
        if shape == "relative":  # relative to the workspace
            os.makedirs(world.ws("hidden-ws", "pub"))
            secret(world.ws("hidden-ws", "pub", "p.txt"))
            settings = {"filesystem": {"denyRead": ["hidden-ws"], "allowRead": ["hidden-ws/pub"]}}
            assert reads(world, settings, world.ws("hidden-ws", "pub", "p.txt"))
            return
        settings = {"filesystem": {"denyRead": [hidden], "allowRead": [value]}}
        assert reads(world, settings, os.path.join(carve, "p.txt"))
        assert not reads(world, settings, os.path.join(hidden, "private.txt"))

    return proof


def protect(shape: str) -> Proof:
    def proof(world: World) -> None:
        value = {"glob": "**/deploy.cfg", "relative": "deploy.cfg", "absolute": None}[shape]
        if value is None:  # protect is workspace-relative: an absolute pattern is refused
            result = run(world, {"filesystem": {"protect": ["/etc/x"]}}, "echo RAN")
            refused(result, "filesystem.protect")
            return
        target = world.ws("a", "deploy.cfg") if shape == "glob" else world.ws("deploy.cfg")
        assert not wrote(world, {"filesystem": {"protect": [value]}}, target)

    return proof


# ---------------------------------------------------------------- network
def network_mode(mode: str) -> Proof:
    def proof(world: World) -> None:
        if mode == "allowlist":
            allow = ["walk.test:PORT", "127.0.0.1"]  # the name resolves to loopback
            assert allowlist_reaches(world, allow, "walk.test")
            assert not allowlist_reaches(world, allow, "other.walk.test")
            return
        with tcp_server() as (port, received):
            run(world, {"network": {"mode": mode}}, connect(port))
        assert bool(received) is (mode == "open")

    return proof


def network_allow(shape: str) -> Proof:
    value = {
        "host": "walk.test",
        "host:port": "walk.test:PORT",
        "wildcard": "*.walk.test",
        "ip": "127.0.0.1",
        "cidr": "127.0.0.0/8",
    }[shape]
    host = "api.walk.test" if shape == "wildcard" else "walk.test"

    def proof(world: World) -> None:
        if shape in ("ip", "cidr"):  # the name resolves to loopback: allowed only with it
            assert allowlist_reaches(world, ["walk.test", value], "walk.test")
            assert not allowlist_reaches(world, ["walk.test"], "walk.test")
            return
        if shape in ("host", "wildcard"):  # loopback must be allowed too (see network.allow)
            assert allowlist_reaches(world, [value, "127.0.0.1"], host)
            assert not allowlist_reaches(world, ["nothing.walk.test", "127.0.0.1"], host)
            return
        assert allowlist_reaches(world, [value, "127.0.0.1"], host)
        assert not allowlist_reaches(world, ["walk.test:1", "127.0.0.1"], host)

    return proof


def network_deny(world: World) -> None:
    allow = ["*.walk.test", "127.0.0.1"]
    assert allowlist_reaches(world, allow, "api.walk.test")
    assert not allowlist_reaches(world, allow, "api.walk.test", deny=["api.walk.test"])


def network_requests(key: str) -> Proof:
    """A request rule refuses the plain-HTTP request it names (HTTPS: tests/integration/egress)."""

    def proof(world: World) -> None:
        allow = ["walk.test:PORT", "127.0.0.1"]
        if key == "denyRequests":
            assert allowlist_reaches(world, allow, "walk.test", denyRequests=["PUT walk.test/*"])
            assert not allowlist_reaches(
                world, allow, "walk.test", denyRequests=["GET walk.test/*"]
            )
        else:
            assert allowlist_reaches(world, allow, "walk.test", allowRequests=["GET walk.test/"])
            assert not allowlist_reaches(
                world, allow, "walk.test", allowRequests=["GET walk.test/other"]
            )

    return proof


def unix_sockets(value: bool) -> Proof:
    def proof(world: World) -> None:
        path = world.ws("host.sock")
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen(2)
        server.settimeout(0.5)
        try:
            code = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({path!r})"
            run(world, {"network": {"allowUnixSockets": value}}, py(code))
            try:
                server.accept()[0].close()
                reached = True
            except OSError:
                reached = False
        finally:
            server.close()
        assert reached is value

    return proof


def unix_sockets_list(world: World) -> None:
    """A list: the named host socket is reached, its neighbour is not; landlock refuses."""
    named, other = (os.path.join(world.outside, name) for name in ("named.sock", "other.sock"))
    servers = []
    for path in (named, other):
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        os.chmod(path, 0o666)  # a root caller's sandbox runs as an unrelated uid
        server.listen(2)
        server.settimeout(0.5)
        servers.append(server)
    try:
        code = (
            "import socket\n"
            f"for p in ({named!r}, {other!r}):\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try: s.connect(p); print('CONNECTED', p)\n"
            "    except OSError as e: print('FAILED', p, e)"
        )
        result = run(world, {"network": {"allowUnixSockets": [named]}}, py(code))
        if world.environ.get("CORRAL_BACKEND") == "landlock":
            refused(result, "network.allowUnixSockets", "landlock")
            return
        reached = []
        for server in servers:
            try:
                server.accept()[0].close()
                reached.append(True)
            except OSError:
                reached.append(False)
    finally:
        for server in servers:
            server.close()
    assert reached == [True, False], (reached, result.stdout, result.stderr)


# ---------------------------------------------------------------- resources
ALLOCATE = py("b = bytearray({n} << 20); b[::4096] = b'x' * len(b[::4096]); print('ALLOCATED')")


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("cgroup v1 limits need root here (see needs_root)")


def memory(shape: str) -> Proof:
    def proof(world: World) -> None:
        need_root()
        if shape == "value":
            result = run(world, {"resources": {"memory": "128M"}}, ALLOCATE.format(n=512))
            assert b"ALLOCATED" not in result.stdout
            assert (
                b"ALLOCATED"
                in run(world, {"resources": {"memory": "128M"}}, ALLOCATE.format(n=16)).stdout
            )
        else:
            result = run(world, {"resources": {"memory": None}}, ALLOCATE.format(n=256))
            assert "ALLOCATED" in ok(result)

    return proof


def pids(shape: str) -> Proof:
    spawn = py(
        "import subprocess\n"
        "ps = []\n"
        "try:\n"
        "    for _ in range(40): ps.append(subprocess.Popen(['sleep', '2']))\n"
        "    print('SPAWNED', len(ps))\n"
        "except OSError: print('LIMITED', len(ps))\n"
        "for p in ps: p.kill()"
    )

    def proof(world: World) -> None:
        need_root()
        value = 10 if shape == "value" else None
        out = run(world, {"resources": {"pids": value}}, spawn).stdout
        assert (b"LIMITED" in out) is (shape == "value"), out

    return proof


def cpus(shape: str) -> Proof:
    burn = py(
        "import os, time\n"
        "end = time.monotonic() + 1.5\n"
        "while time.monotonic() < end: pass\n"
        "print('CPU', os.times().user + os.times().system)"
    )

    def proof(world: World) -> None:
        need_root()
        value = 0.2 if shape == "value" else None
        out = ok(run(world, {"resources": {"cpus": value}}, burn))
        used = float(out.split()[-1])
        if shape == "value":
            assert used < 0.8, used  # 0.2 cores for 1.5 s is 0.3 s; load only lowers it
        else:
            assert used > 0.0

    return proof


def cpu_time(shape: str) -> Proof:
    burn = py("while True: pass")

    def proof(world: World) -> None:
        if shape == "value":
            result = run(world, {"resources": {"cpuTime": 1, "timeout": 60}}, burn)
            assert result.returncode != 0  # SIGXCPU / SIGKILL from RLIMIT_CPU, not the timeout
            assert result.returncode != 124
        else:
            result = run(world, {"resources": {"cpuTime": None}}, py("print('DONE')"))
            assert "DONE" in ok(result)

    return proof


def timeout(shape: str) -> Proof:
    def proof(world: World) -> None:
        if shape == "value":
            assert run(world, {"resources": {"timeout": "1s"}}, "sleep 30").returncode == 124
        else:
            assert (
                ok(run(world, {"resources": {"timeout": None}}, "sleep 1.2; echo WOKE")).strip()
                == "WOKE"
            )

    return proof


def output(shape: str) -> Proof:
    def proof(world: World) -> None:
        flood = py("print('y' * 100000)")
        result = run(world, {"resources": {"output": "1K" if shape == "value" else None}}, flood)
        assert (len(result.stdout) < 2048) is (shape == "value"), len(result.stdout)

    return proof


#: every place a read-only sandbox can write: the temporary directories, and /dev
#: (bubblewrap's is a tmpfs of half the RAM) with /dev/shm
DISK_PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/dev")
DISK_FILL = (
    f"for d in {' '.join(DISK_PLACES)}; do head -c 30000000 /dev/zero > $d/fill 2>/dev/null; "
    'echo "$d $(wc -c < $d/fill 2>/dev/null || echo 0)"; done'
)


def assert_disk_quota(out: str, quota: int) -> None:
    """Each place filled up at the quota, or is not writable at all."""
    sizes = {place: int(size) for place, size in (line.split() for line in out.splitlines())}
    assert sorted(sizes) == sorted(DISK_PLACES), out
    assert all(size <= quota for size in sizes.values()), out


def disk(shape: str) -> Proof:
    def proof(world: World) -> None:
        if shape == "null":
            out = ok(run(world, {"resources": {"disk": None}}, DISK_FILL, "--read-only"))
            assert out.splitlines()[0] == "/tmp 30000000", out
            return
        settings = {"resources": {"disk": "8M"}}
        refused(run(world, settings, "echo RAN"), "Failed to enforce resources.disk")
        assert_disk_quota(ok(run(world, settings, DISK_FILL, "--read-only")), 8 << 20)

    return proof


def kill_grace(world: World) -> None:
    stubborn = py(
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('READY', flush=True)\n"
        "time.sleep(60)"
    )
    import time

    start = time.monotonic()
    result = run(world, {"resources": {"timeout": "1s", "killGrace": "1s"}}, stubborn)
    assert result.returncode == 124
    assert time.monotonic() - start < 30  # SIGKILL came after the grace, not after 60 s


# ---------------------------------------------------------------- environment and credentials
def env_pass(shape: str) -> Proof:
    def proof(world: World) -> None:
        world.environ["WALK_ONE"] = "one"
        world.environ["WALK_TWO"] = "two"
        value = "WALK_ONE" if shape == "name" else "WALK_*"
        out = ok(run(world, {"env": {"pass": [value]}}, "env"))
        assert "WALK_ONE=one" in out
        assert ("WALK_TWO=two" in out) is (shape == "glob")

    return proof


def env_set(shape: str) -> Proof:
    def proof(world: World) -> None:
        if shape == "value":
            assert "WALK_SET=v" in ok(run(world, {"env": {"set": {"WALK_SET": "v"}}}, "env"))
            return
        world.write(
            os.path.join(world.home, ".config", "corral", "settings.json"),
            json.dumps({"env": {"set": {"WALK_SET": "v"}}}),
        )
        assert "WALK_SET" not in ok(run(world, {"env": {"set": {"WALK_SET": None}}}, "env"))

    return proof


def env_deny(world: World) -> None:
    world.environ["WALK_ONE"] = "one"
    out = ok(run(world, {"env": {"pass": ["WALK_*"], "deny": ["WALK_ONE"]}}, "env"))
    assert "WALK_ONE" not in out


def credentials(shape: str) -> Proof:
    def proof(world: World) -> None:
        world.environ["WALK_TOKEN_SRC"] = "tok-123"
        entry: dict[str, object] = {"name": "WALK_TOKEN", "from": "env:WALK_TOKEN_SRC"}
        if shape == "mask":
            # the sandbox holds a placeholder; the swap itself: tests/integration/egress
            entry.update(mode="mask", commands=["*"], hosts=["walk.test"])
            network = {"mode": "allowlist", "allow": ["walk.test"]}
            settings = {"credentials": [entry], "network": network}
            out = ok(run(world, settings, "printenv WALK_TOKEN"))
            assert out.startswith("corral_masked_")
            assert "tok-123" not in out
            open_mode = {"credentials": [entry], "network": {"mode": "open"}}
            refused(run(world, open_mode, "echo RAN"), "credentials")  # no proxy to swap it
            return
        entry.update(commands=["printenv*"])
        assert "tok-123" in ok(run(world, {"credentials": [entry]}, "printenv WALK_TOKEN"))
        assert "tok-123" not in run(world, {"credentials": [entry]}, "env").stdout.decode()

    return proof


# ---------------------------------------------------------------- caches and image
def caches(shape: str) -> Proof:
    def proof(world: World) -> None:
        directory = os.path.join(world.root, "cache-dir")
        if shape == "missing":
            result = run(world, {"caches": {"pip": directory}}, "echo RAN")
            refused(result, "caches")
            return
        os.makedirs(directory)
        ok(run(world, {"caches": {"pip": directory}}, f"echo kept > {directory}/entry"))
        assert world.read(os.path.join(directory, "entry")) == "kept\n"
        second = run(world, {"caches": {"pip": directory}}, f"cat {directory}/entry")
        assert "kept" in ok(second)  # it persists across runs

    return proof


def image(world: World) -> None:
    refused(
        run(world, {"image": "corral:python", "backend": "bubblewrap"}, "echo RAN"),
        "Failed to enforce image",
    )


def image_null(world: World) -> None:
    assert "RAN" in ok(run(world, {"image": None, "backend": "bubblewrap"}, "echo RAN"))


# ---------------------------------------------------------------- rules and profiles
def rules(world: World) -> None:
    settings = {"rules": [{"match": "sleep*", "resources": {"timeout": "1s"}}]}
    assert run(world, settings, "sleep 30").returncode == 124
    assert "WOKE" in ok(run(world, settings, "echo WOKE"))


def profiles(world: World) -> None:
    settings = {"profiles": {"quick": {"resources": {"timeout": "1s"}}}}
    assert run(world, settings, "sleep 30", "--profile", "quick").returncode == 124
    assert "WOKE" in ok(run(world, settings, "sleep 1.2; echo WOKE"))


# ---------------------------------------------------------------- integrations
def unsandboxed_commands(world: World) -> None:
    settings = {"integrations": {"claudeCode": {"unsandboxedCommands": ["docker build*"]}}}
    world.write(
        os.path.join(world.home, ".config", "corral", "settings.json"), json.dumps(settings)
    )

    def answer(command: str) -> dict[str, object]:
        payload = {
            "session_id": "s",
            "cwd": world.workspace,
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": command},
        }
        result = world.corral("hook", "claude-code", input=json.dumps(payload).encode())
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["hookSpecificOutput"]  # type: ignore[no-any-return]

    assert answer("docker build .")["permissionDecision"] == "ask"
    assert answer("ls")["permissionDecision"] == "allow"  # rewritten to run in corral


def mcp_key(name: str) -> Proof:
    """The MCP server's keys, proved through the real server and the SDK client."""

    def proof(world: World) -> None:
        pytest.importorskip("mcp", reason="the mcp package (2.x) is not installed")
        import asyncio

        from mcp import Client, StdioServerParameters

        values = {"maxSandboxes": 1, "maxOutput": 100, "preview": False, "preview=true": True}
        world.write(
            os.path.join(world.home, ".config", "corral", "settings.json"),
            json.dumps({"integrations": {"mcp": {name.partition("=")[0]: values[name]}}}),
        )

        async def main() -> None:
            params = StdioServerParameters(
                command=corral_command()[0],
                args=[*corral_command()[1:], "mcp"],
                cwd=world.workspace,
                env=world.environ,
            )
            async with Client(params, mode="legacy") as client:
                first = await client.call_tool("sandbox_create", {"preview": False})
                assert not first.is_error, first
                data = json.loads(first.content[0].text)  # type: ignore[union-attr]
                if name == "maxSandboxes":
                    second = await client.call_tool("sandbox_create", {"preview": False})
                    assert second.is_error
                elif name == "maxOutput":
                    ran = await client.call_tool(
                        "sandbox_exec",
                        {"sandbox_id": data["sandbox_id"], "command": "head -c 5000 /dev/zero"},
                    )
                    out = json.loads(ran.content[0].text)  # type: ignore[union-attr]
                    assert out["stdout_truncated"]
                else:
                    default = await client.call_tool("sandbox_create", {})
                    assert not default.is_error, default
                    made = json.loads(default.content[0].text)  # type: ignore[union-attr]
                    # preview on: the sandbox works on a preview; off: on the workspace
                    assert (made["preview_id"] is not None) is (name == "preview=true"), made

        asyncio.run(asyncio.wait_for(main(), 120))

    return proof


def image_packages(world: World) -> None:
    """The packages reach ``corral image build``: a bad name in them refuses the build.

    A real build takes minutes (mmdebstrap); tests/integration covers one. Here
    the proof is that the setting is not ignored: the builder checks every
    package it was given before doing anything.
    """
    settings = world.write(
        os.path.join(world.root, "image.json"),
        json.dumps({"integrations": {"image": {"packages": ["jq", "-not-a-package"]}}}),
    )
    result = world.corral("image", "build", "walk-probe", "--settings", settings, timeout=120)
    assert result.returncode == 125, result.stderr
    assert b"'-not-a-package' is not an apt package name" in result.stderr


def cluster_warm_vms(size: int | None) -> Proof:
    """A node agent reads the size of its micro-VM pool from the node's own settings.

    A real pool needs a Ray cluster and a VM image (tests/integration/cluster
    covers one). Here the agent's pool start runs alone (no Ray: the agent is
    made without its Ray-placed constructor) in this world, where no VM image
    is built: with a size it reports why its pool cannot run; with ``null``
    there is no pool at all.
    """

    def proof(world: World) -> None:
        import subprocess
        import sys

        probe = (
            "import json\n"
            "from corral.cluster._agent import NodeAgent\n"
            "agent = NodeAgent.__new__(NodeAgent)\n"
            "agent._vm_pool = None\n"
            "agent._warm_problem = None\n"
            "agent._start_pool()\n"
            "print(json.dumps(agent.warm()))\n"
        )
        settings = world.write(
            os.path.join(world.root, "warm.json"),
            json.dumps({"integrations": {"cluster": {"warmVms": size}}}),
        )
        done = subprocess.run(
            [sys.executable, "-c", probe],
            env={**world.environ, "CORRAL_SETTINGS": settings},
            cwd=world.workspace,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        warm = json.loads(done.stdout)
        if size is None:
            assert warm == {}
        else:
            assert warm["microvm"]["size"] == 0, warm
            assert "microvm backend cannot run here" in warm["microvm"]["problem"], warm

    return proof


# ---------------------------------------------------------------- the table
PROOFS: dict[str, dict[str, Proof]] = {
    "isolation": {
        level: isolation_proof(level) for level in ("process", "namespace", "kernel", "vm")
    },
    "backend": {name: backend_proof(name) for name in k.BACKENDS},
    "allowDegraded": {"rule": allow_degraded},
    "filesystem.workspace": {s: workspace_shape(s) for s in ("absolute", "relative")},
    "filesystem.allowHomeWorkspace": {
        "true": allow_home_workspace(True),
        "false": allow_home_workspace(False),
    },
    "filesystem.readOnly": {"true": read_only(True), "false": read_only(False)},
    "filesystem.allowWrite": {s: allow_write(s) for s in ("absolute", "relative", "home")},
    "filesystem.denyWrite": {
        **{s: deny_write(s) for s in ("absolute", "relative", "home", "glob")},
        "absent-nested": deny_write_absent_nested,
    },
    "filesystem.denyRead": {
        **{s: deny_read(s) for s in ("absolute", "relative", "home", "glob")},
        "relative-glob": deny_read_relative_glob,
        "link": deny_read_link,
    },
    "filesystem.allowRead": {s: allow_read(s) for s in ("absolute", "relative", "home")},
    "filesystem.protect": {s: protect(s) for s in ("absolute", "relative", "glob")},
    "network.mode": {mode: network_mode(mode) for mode in ("none", "allowlist", "open")},
    "network.allow": {s: network_allow(s) for s in ("host", "host:port", "wildcard", "ip", "cidr")},
    "network.deny": {"host": network_deny},
    "network.allowUnixSockets": {
        "true": unix_sockets(True),
        "false": unix_sockets(False),
        "list": unix_sockets_list,
    },
    "network.allowRequests": {"rule": network_requests("allowRequests")},
    "network.denyRequests": {"rule": network_requests("denyRequests")},
    "resources.memory": {s: memory(s) for s in ("value", "null")},
    "resources.pids": {s: pids(s) for s in ("value", "null")},
    "resources.cpus": {s: cpus(s) for s in ("value", "null")},
    "resources.cpuTime": {s: cpu_time(s) for s in ("value", "null")},
    "resources.timeout": {s: timeout(s) for s in ("value", "null")},
    "resources.output": {s: output(s) for s in ("value", "null")},
    "resources.killGrace": {"value": kill_grace},
    "resources.disk": {s: disk(s) for s in ("value", "null")},
    "env.pass": {s: env_pass(s) for s in ("name", "glob")},
    "env.set": {s: env_set(s) for s in ("value", "null")},
    "env.deny": {"name": env_deny},
    "credentials": {s: credentials(s) for s in ("env", "mask")},
    "caches": {s: caches(s) for s in ("existing", "missing")},
    "image": {"value": image, "null": image_null},
    "rules": {"match": rules},
    "profiles": {"selected": profiles},
    "integrations.claudeCode.unsandboxedCommands": {"glob": unsandboxed_commands},
    "integrations.mcp.maxSandboxes": {"value": mcp_key("maxSandboxes")},
    "integrations.mcp.maxOutput": {"value": mcp_key("maxOutput")},
    "integrations.mcp.preview": {"false": mcp_key("preview"), "true": mcp_key("preview=true")},
    "integrations.image.packages": {"value": image_packages},
    "integrations.cluster.warmVms": {
        "value": cluster_warm_vms(2),
        "null": cluster_warm_vms(None),
    },
}


def required_shapes(row: k.Key) -> set[str]:
    """The value shapes a key's proofs must cover (see the module docstring)."""
    shapes: set[str] = set()
    if row.kind == k.ENUM:
        shapes |= set(row.choices)
    elif row.kind == k.BOOL:
        shapes |= {"true", "false"}
    elif row.kind == k.UNIX_SOCKETS:
        shapes |= {"true", "false", "list"}
    elif row.kind in (k.SIZE, k.DURATION, k.NUMBER, k.INT):
        shapes.add("value")
    elif row.kind == k.PATHS:
        shapes |= {"absolute", "relative", "home"}
    elif row.kind == k.PATH_PATTERNS:
        shapes |= {"absolute", "relative", "glob"}
    if row.path == "filesystem.denyRead":
        shapes.add("glob")
    if row.nullable:
        shapes.add("null")
    return shapes


def test_every_key_and_shape_has_a_proof() -> None:
    keys = {row.path: row for row in k.KEYS.rows}
    assert set(PROOFS) == set(keys), "keys without a proof: " + ", ".join(
        sorted(set(keys) - set(PROOFS))
    )
    missing = {
        path: sorted(required_shapes(row) - set(PROOFS[path]))
        for path, row in keys.items()
        if required_shapes(row) - set(PROOFS[path])
    }
    assert not missing, f"value shapes without a proof: {missing}"
    assert all(PROOFS[path] for path in PROOFS)


@pytest.mark.parametrize(
    ("key", "shape"),
    [(key, shape) for key, shapes in PROOFS.items() for shape in shapes],
    ids=[f"{key}={shape}" for key, shapes in PROOFS.items() for shape in shapes],
)
def test_the_setting_is_enforced_or_refused(world: World, key: str, shape: str) -> None:
    PROOFS[key][shape](world)


#: Keys whose enforcement differs per backend mechanism: their proofs run again on
#: Landlock (no namespaces: rules, the broker and the seccomp filter instead of mounts).
#: The per-backend guarantees of the default policy are the conformance matrix's.
PER_BACKEND: dict[str, tuple[str, ...]] = {
    "filesystem.readOnly": ("true", "false"),
    "filesystem.allowWrite": ("absolute", "home"),
    "filesystem.denyRead": ("absolute", "relative", "home", "glob", "link", "relative-glob"),
    "filesystem.allowRead": ("absolute", "home"),
    "filesystem.protect": ("relative", "glob"),
    "network.allowUnixSockets": ("true", "false", "list"),
    "env.pass": ("name", "glob"),
    "caches": ("existing", "missing"),
}


@pytest.mark.parametrize(
    ("key", "shape"),
    [(key, shape) for key, shapes in PER_BACKEND.items() for shape in shapes],
    ids=[f"landlock:{key}={shape}" for key, shapes in PER_BACKEND.items() for shape in shapes],
)
def test_the_setting_is_enforced_or_refused_on_landlock(world: World, key: str, shape: str) -> None:
    if not backend_usable("landlock"):
        pytest.skip(f"landlock is not available here: {available().get('landlock')}")
    world.environ.update(CORRAL_BACKEND="landlock", CORRAL_ISOLATION="process")
    PROOFS[key][shape](world)


def test_the_disk_quota_covers_every_writable_place_on_gvisor_or_is_refused(world: World) -> None:
    """gVisor: runsc cannot size /dev, so the quota holds only where /dev is not writable.

    A command that is not uid 0 inside (a non-root caller; a root caller over the
    host's / runs as 65533) cannot write /dev and the quota holds everywhere else;
    one that is uid 0 there (an image's root, or root kept by ``allowDegraded``)
    makes the rule refused.
    """
    if not backend_usable("gvisor"):
        pytest.skip(f"gvisor is not available here: {available().get('gvisor')}")
    world.environ.update(CORRAL_BACKEND="gvisor", CORRAL_ISOLATION="kernel")
    settings: dict[str, object] = {
        "resources": {"disk": "8M"},
        "allowDegraded": ["filesystem.protect"],
    }
    assert_disk_quota(ok(run(world, settings, DISK_FILL, "--read-only")), 8 << 20)
    if os.geteuid() == 0:
        kept_root = {**settings, "allowDegraded": ["filesystem.protect", "isolation"]}
        refused(
            run(world, kept_root, "echo RAN", "--read-only"), "Failed to enforce resources.disk"
        )


def test_landlock_refuses_a_disk_quota(world: World) -> None:
    world.environ.update(CORRAL_BACKEND="landlock", CORRAL_ISOLATION="process")
    refused(
        run(world, {"resources": {"disk": "8M"}}, "echo RAN", "--read-only"),
        "Failed to enforce resources.disk",
    )
