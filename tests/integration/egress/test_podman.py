"""Allowlist egress under rootful podman: the container joins a namespace corral made.

The engine creates an empty network namespace with the proxy listening on its
loopback, and podman starts the container in it (``--network=ns:PATH``).
Real podman, the ``corral:python`` image built from apt, loopback servers
on the host; test host names resolve only through the proxy's hosts file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from corral.backends._image_ref import image_cache_dir
from corral.pipeline import _runner
from corral.pipeline._request import ExecRequest
from corral.policy import Credential, NetworkPolicy, Policy, ResourceLimits

from .conftest import Upstream

pytestmark = [
    pytest.mark.backend("podman"),
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful podman: the namespace needs root"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
    pytest.mark.skipif(shutil.which("mmdebstrap") is None, reason="mmdebstrap is not installed"),
]


@pytest.fixture(scope="module")
def image() -> str:
    """``corral:python`` (built from apt once, then reused from the cache)."""
    result = subprocess.run(
        [sys.executable, "-m", "corral", "image", "build", "python"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if result.returncode != 0 and "mmdebstrap exited" in result.stderr:
        pytest.skip(f"the Debian mirror is unreachable: {result.stderr.strip()[-300:]}")
    assert result.returncode == 0, result.stderr
    return "corral:python"


class World:
    """A workspace, a hosts file, and a podman policy with an allowlist."""

    def __init__(self, root: str, upstream: Upstream, evil: Upstream, image: str) -> None:
        self.workspace = os.path.join(root, "ws")
        self.home = os.path.join(root, "home")
        os.makedirs(self.workspace)
        os.makedirs(self.home)
        self.upstream = upstream
        self.evil = evil
        self.image = image
        hosts = os.path.join(root, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 example.test registry.example.test evil.test\n")
        self.environ = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.home,
            "LANG": "C.UTF-8",
            "CORRAL_EGRESS_HOSTS": hosts,
            "XDG_STATE_HOME": os.path.join(root, "state"),
            # where the image fixture's build went (this user's cache)
            "XDG_CACHE_HOME": os.path.dirname(os.path.dirname(image_cache_dir())),
            "CORRAL_SERVER": "off",
        }

    def policy(self, **changes: Any) -> Policy:
        policy = Policy.for_workspace(self.workspace, home=self.home)
        return policy.replace(
            backend="podman",
            image=self.image,
            network=NetworkPolicy(
                mode="allowlist",
                # the upstream's address too: the SSRF guard refuses a name that
                # resolves to loopback unless that address is allowed
                allow=("example.test", "registry.example.test", f"127.0.0.1:{self.upstream.port}"),
            ),
            resources=ResourceLimits(timeout=120.0, output=16 << 20, kill_grace=1.0),
            **changes,
        )

    def python(self, code: str, *args: str, policy: Policy | None = None) -> Any:
        request = ExecRequest.from_argv(["python3", "-I", "-c", code, *args], cwd=self.workspace)
        return _runner.execute(request, policy or self.policy(), environ=self.environ)


@pytest.fixture
def world(tmp_path: Any, upstream: Upstream, evil: Upstream, image: str) -> Iterator[World]:
    fds = set(os.listdir("/proc/self/fd"))
    yield World(str(tmp_path), upstream, evil, image)
    assert not any(t.name == "corral-egress" for t in threading.enumerate()), (
        "a proxy outlived its container"
    )
    # the namespace's fd and the proxy's socket are closed with the run
    assert set(os.listdir("/proc/self/fd")) <= fds


PROBE = """
import json, socket, sys, urllib.error, urllib.request
port, evil_port = int(sys.argv[1]), int(sys.argv[2])
out = {}
out["allowed"] = urllib.request.urlopen(f"http://example.test:{port}/podman", timeout=10).read().decode()
try:
    urllib.request.urlopen(f"http://evil.test:{evil_port}/x", timeout=10)
    out["denied"] = "reached"
except urllib.error.HTTPError as exc:
    out["denied"] = exc.code
for name, target in (("direct", port), ("direct_evil", evil_port)):
    try:
        socket.create_connection(("127.0.0.1", target), timeout=3).close()
        out[name] = "connected"
    except OSError as exc:
        out[name] = type(exc).__name__
try:
    socket.getaddrinfo("example.test", 80)
    out["dns"] = "resolved"
except socket.gaierror:
    out["dns"] = "no dns"
out["interfaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
print(json.dumps(out))
"""


def test_podman_reaches_allowed_hosts_through_the_proxy_and_nothing_else(world: World) -> None:
    outcome = world.python(PROBE, str(world.upstream.port), str(world.evil.port))
    assert outcome.returncode == 0, (outcome.text("stderr"), outcome.violations)
    assert outcome.backend == "podman"
    seen = json.loads(outcome.text())
    assert seen["allowed"] == f"hello from example.test:{world.upstream.port} /podman\n"
    assert seen["denied"] == 403
    # its own loopback: only the local service network.allow names by 127.0.0.1:PORT is
    # forwarded there (docs/egress.md); the other host server is not, and nothing resolves
    assert seen["direct"] == "connected"
    assert seen["direct_evil"] == "ConnectionRefusedError"
    assert seen["dns"] == "no dns"
    assert seen["interfaces"] == ["lo"]
    assert world.evil.seen.connections == 0  # the denial never reached it
    attempts = [(a.host, a.decision) for a in outcome.network if a.method != "FORWARD"]
    assert attempts == [("example.test", "allow"), ("evil.test", "deny")]
    assert [v.target for v in outcome.violations] == [f"evil.test:{world.evil.port}"]


def test_podman_injects_a_credential_only_for_matching_commands(world: World) -> None:
    credential = Credential(
        name="NPM_TOKEN",
        source="env:NPM_TOKEN",
        commands=("python3 -I -c print*",),
        hosts=("registry.example.test",),
    )
    policy = world.policy(credentials=(credential,))
    world.environ["NPM_TOKEN"] = "s3cr3t-podman-value"
    code = "import os; print(os.environ.get('NPM_TOKEN', 'absent'))"
    matching = world.python(
        "print(__import__('os').environ.get('NPM_TOKEN', 'absent'))", policy=policy
    )
    other = world.python(code, policy=policy)
    assert matching.text() == "s3cr3t-podman-value\n", matching.text("stderr")
    assert matching.credentials == ("NPM_TOKEN",)
    assert "s3cr3t" not in json.dumps(matching.to_json(include_output=False))
    assert other.text() == "absent\n", other.text("stderr")
    assert other.credentials == ()
