"""Local services on the host (``network.allow: ["localhost:PORT"]``), reached from a sandbox.

The proxy also listens on ``127.0.0.1:PORT`` inside the sandbox's network and
relays to the host's ``127.0.0.1:PORT``; plain clients (which skip the proxy
for loopback) reach the service at the same address.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from corral._exceptions import UsageError

from .conftest import Upstream
from .test_sandbox import World, _ok

pytestmark = pytest.mark.backend("bubblewrap")
CURL = shutil.which("curl")


@pytest.fixture
def world(tmp_path: Any, upstream: Upstream, evil: Upstream) -> Iterator[World]:
    yield World(str(tmp_path), upstream, evil)
    assert not any(t.name == "corral-egress" for t in threading.enumerate())


@pytest.mark.skipif(CURL is None, reason="curl is not installed (apt-get install curl)")
def test_curl_reaches_an_allowed_local_service_and_nothing_else(world: World) -> None:
    port, other = world.upstream.port, world.evil.port
    policy = world.policy(allow=("example.test", f"localhost:{port}"))
    outcome = world.run(
        f"curl -sS http://localhost:{port}/hello.txt && "
        f"curl -sS http://127.0.0.1:{port}/again; "
        f"curl -sS http://localhost:{other}/x; echo exit=$?",
        policy,
    )
    out = _ok(outcome)
    assert out.startswith(f"hello through the proxy\nhello from 127.0.0.1:{port} /again\n"), out
    assert out.endswith("exit=7\n"), out  # connection refused: not forwarded
    assert [r["path"] for r in world.upstream.seen.requests] == ["/hello.txt", "/again"]
    assert world.evil.seen.connections == 0
    forwarded = [a for a in outcome.network if a.method == "FORWARD"]
    assert [(a.host, a.port, a.rule) for a in forwarded] == [
        ("127.0.0.1", port, f"network.allow: localhost:{port}")
    ] * 2
    assert all(a.bytes_up > 0 and a.bytes_down > 0 for a in forwarded)


def test_the_proxy_port_cannot_be_forwarded(world: World) -> None:
    with pytest.raises(UsageError, match="the egress proxy's own port"):
        world.run(["true"], world.policy(allow=("127.0.0.1:3128",)))


@pytest.mark.skipif(CURL is None, reason="curl is not installed (apt-get install curl)")
def test_request_rules_hold_on_a_forwarded_local_service(world: World) -> None:
    pytest.importorskip("cryptography")
    port = world.upstream.port
    policy = world.policy(allow=("example.test", f"localhost:{port}"))
    policy = policy.replace(
        network=policy.network.replace(deny_requests=("POST */git-receive-pack",))
    )
    outcome = world.run(
        f"curl -sS http://localhost:{port}/hello.txt && "
        f"curl -sS -X POST -d x http://127.0.0.1:{port}/r.git/git-receive-pack",
        policy,
    )
    out = _ok(outcome)
    assert out.startswith("hello through the proxy\ncorral: blocked request POST"), out
    assert [r["path"] for r in world.upstream.seen.requests] == ["/hello.txt"]
    (violation,) = outcome.violations
    assert violation.rule == "network.denyRequests: POST */git-receive-pack"
