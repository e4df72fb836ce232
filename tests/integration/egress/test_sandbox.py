"""Allowlist egress in a real bubblewrap sandbox: real tools inside, loopback servers outside.

The sandbox has its own network namespace; the proxy listens on its loopback.
Test host names resolve only through the proxy's static hosts file
(``CORRAL_EGRESS_HOSTS``), to servers on the host's 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from corral.backends import get_backend, inspect_host
from corral.pipeline import _runner
from corral.pipeline._request import ExecRequest
from corral.policy import Credential, NetworkPolicy, Policy, ResourceLimits

from .conftest import Upstream

pytestmark = pytest.mark.backend("bubblewrap")


def _bubblewrap_problem() -> str | None:
    backend = get_backend("bubblewrap")
    policy = Policy.for_workspace("/", home="/")
    facts, _layout = inspect_host(
        backend, ExecRequest.from_argv(["true"]), policy, dict(os.environ)
    )
    return backend.problem(facts)


_PROBLEM = _bubblewrap_problem()
if _PROBLEM is not None:
    pytest.skip(f"the bubblewrap backend cannot run here: {_PROBLEM}", allow_module_level=True)

CURL = shutil.which("curl")
GIT = shutil.which("git")
CORRAL = os.path.join(os.path.dirname(sys.executable), "corral")
NO_CGROUP = ("--memory", "none", "--pids", "none")  # runs without a writable cgroup too


class World:
    """A workspace, a home, a hosts file and helpers to run commands in the sandbox."""

    def __init__(self, root: str, upstream: Upstream, evil: Upstream) -> None:
        self.root = root
        self.workspace = os.path.join(root, "ws")
        self.home = os.path.join(root, "home")
        self.state = os.path.join(root, "state")
        os.makedirs(self.workspace)
        os.makedirs(self.home)
        self.upstream = upstream
        self.evil = evil
        self.hosts_file = os.path.join(root, "hosts")
        with open(self.hosts_file, "w") as f:
            f.write(
                "127.0.0.1 example.test api.example.test pypi.test git.test\n"
                "127.0.0.1 evil.test evil.example.test rebind.example.test\n"
            )
        self.environ = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.home,
            "LANG": "C.UTF-8",
            "CORRAL_EGRESS_HOSTS": self.hosts_file,
            "XDG_STATE_HOME": self.state,
            "CORRAL_SERVER": "off",
        }
        # allowed: the test names, and the upstream's own address (the SSRF guard
        # refuses names that resolve to loopback unless the address is allowed too)
        self.allow = (
            "example.test",
            "*.example.test",
            "pypi.test",
            "git.test",
            f"127.0.0.1:{upstream.port}",
        )
        self.deny = ("evil.example.test",)

    def policy(self, **network: Any) -> Policy:
        net = NetworkPolicy(
            mode=network.pop("mode", "allowlist"),
            allow=network.pop("allow", self.allow),
            deny=network.pop("deny", self.deny),
        )
        assert not network
        policy = Policy.for_workspace(self.workspace, home=self.home)
        return policy.replace(
            network=net,
            resources=ResourceLimits(timeout=60.0, output=16 << 20, kill_grace=1.0),
            # the tests run this interpreter inside the sandbox: it may live under /tmp
            filesystem=policy.filesystem.replace(allow_read=(sys.prefix,)),
        )

    def run(
        self,
        command: str | list[str],
        policy: Policy | None = None,
        environ: dict[str, str] | None = None,
    ) -> Any:
        if isinstance(command, str):
            request = ExecRequest.from_shell(command, cwd=self.workspace)
        else:
            request = ExecRequest.from_argv(command, cwd=self.workspace)
        return _runner.execute(request, policy or self.policy(), environ=environ or self.environ)


@pytest.fixture
def world(tmp_path: Any, upstream: Upstream, evil: Upstream) -> Iterator[World]:
    yield World(str(tmp_path), upstream, evil)
    assert not any(t.name == "corral-egress" for t in threading.enumerate()), (
        "a proxy outlived its sandbox"
    )


def _ok(outcome: Any) -> str:
    assert outcome.returncode == 0, (outcome.returncode, outcome.text("stderr"), outcome.violations)
    return outcome.text()


# ---------------------------------------------------------------- allowed, with real tools
@pytest.mark.skipif(CURL is None, reason="curl is not installed (apt-get install curl)")
def test_curl_reaches_an_allowed_host_over_http_and_https(
    world: World, tls_upstream: Upstream, tls_files: tuple[str, str]
) -> None:
    cert = os.path.join(world.workspace, "ca.pem")
    shutil.copy(tls_files[0], cert)
    policy = world.policy(allow=(*world.allow, f"127.0.0.1:{tls_upstream.port}"))
    outcome = world.run(
        f"curl -sS http://example.test:{world.upstream.port}/hello.txt && "
        f"curl -sS --cacert {cert} https://api.example.test:{tls_upstream.port}/tls",
        policy,
    )
    assert (
        _ok(outcome)
        == f"hello through the proxy\nhello from api.example.test:{tls_upstream.port} /tls\n"
    )
    http, https = outcome.network
    assert (http.host, http.method, http.decision) == ("example.test", "GET", "allow")
    assert (https.host, https.method, https.rule) == (
        "api.example.test",
        "CONNECT",
        "network.allow: *.example.test",
    )
    assert https.bytes_up > 0
    assert https.bytes_down > 0
    assert outcome.violations == ()


def test_python_urllib_reaches_an_allowed_host(
    world: World, tls_upstream: Upstream, tls_files: tuple[str, str]
) -> None:
    cert = os.path.join(world.workspace, "ca.pem")
    shutil.copy(tls_files[0], cert)
    script = os.path.join(world.workspace, "fetch.py")
    with open(script, "w") as f:
        f.write(
            "import ssl, sys, urllib.request\n"
            "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode(), end='')\n"
            "ctx = ssl.create_default_context(cafile=sys.argv[3])\n"
            "reply = urllib.request.urlopen(sys.argv[2], timeout=10, context=ctx)\n"
            "print(reply.read().decode(), end='')\n"
        )
    policy = world.policy(allow=(*world.allow, f"127.0.0.1:{tls_upstream.port}"))
    outcome = world.run(
        [
            sys.executable,
            "-I",
            script,
            f"http://example.test:{world.upstream.port}/u",
            f"https://example.test:{tls_upstream.port}/s",
            cert,
        ],
        policy,
    )
    assert _ok(outcome) == (
        f"hello from example.test:{world.upstream.port} /u\n"
        f"hello from example.test:{tls_upstream.port} /s\n"
    )


def _build_index(root: str) -> str:
    """A PEP 503 simple index with one tiny wheel; returns the package name."""
    name, wheel = "corral-egress-probe", "corral_egress_probe-1.0-py3-none-any.whl"
    os.makedirs(os.path.join(root, "simple", name))
    dist = "corral_egress_probe-1.0.dist-info"
    with zipfile.ZipFile(os.path.join(root, wheel), "w") as zf:
        zf.writestr("corral_egress_probe.py", "VALUE = 1\n")
        zf.writestr(
            f"{dist}/METADATA", "Metadata-Version: 2.1\nName: corral-egress-probe\nVersion: 1.0\n"
        )
        zf.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{dist}/RECORD", "")
    with open(os.path.join(root, "simple", name, "index.html"), "w") as f:
        f.write(f'<html><body><a href="/{wheel}">{wheel}</a></body></html>\n')
    return name


def test_pip_downloads_from_a_local_index(world: World) -> None:
    package = _build_index(world.upstream.server.root)
    index = f"http://pypi.test:{world.upstream.port}/simple/"
    outcome = world.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--index-url",
            index,
            "--trusted-host",
            "pypi.test",
            "-d",
            "/tmp/dl",
            package,
        ],
        environ={**world.environ, "PIP_CONFIG_FILE": "/dev/null"},
    )
    text = _ok(outcome)
    assert "Saved /tmp/dl/corral_egress_probe-1.0-py3-none-any.whl" in text
    assert {(a.host, a.method) for a in outcome.network} == {("pypi.test", "GET")}
    assert any(r["path"].endswith(".whl") for r in world.upstream.seen.requests)


@pytest.mark.skipif(GIT is None, reason="git is not installed (apt-get install git)")
def _serve_repository(world: World) -> None:
    """A bare repository (README: "cloned through corral") served at /repo.git."""
    assert GIT is not None
    source = os.path.join(world.root, "src")
    bare = os.path.join(world.upstream.server.root, "repo.git")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    git = [GIT, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", source], check=True, env=env)
    with open(os.path.join(source, "README"), "w") as f:
        f.write("cloned through corral\n")
    subprocess.run([*git, "-C", source, "add", "README"], check=True, env=env)
    subprocess.run([*git, "-C", source, "commit", "-qm", "one"], check=True, env=env)
    subprocess.run([*git, "clone", "-q", "--bare", source, bare], check=True, env=env)
    subprocess.run([GIT, "-C", bare, "update-server-info"], check=True, env=env)


def test_git_clones_over_http(world: World) -> None:
    _serve_repository(world)
    outcome = world.run(
        f"git clone -q http://git.test:{world.upstream.port}/repo.git /tmp/clone"
        " && cat /tmp/clone/README",
        environ={**world.environ, "GIT_CONFIG_NOSYSTEM": "1"},
    )
    assert _ok(outcome) == "cloned through corral\n"
    assert outcome.network
    assert all(
        a.host == "git.test" and a.decision in ("allow", "challenge") for a in outcome.network
    )
    assert outcome.violations == ()


def test_git_clones_over_http_into_the_workspace_under_the_default_policy(world: World) -> None:
    # the clone's .git is the run's own repository: written, checked, nothing quarantined
    assert GIT is not None
    _serve_repository(world)
    outcome = world.run(
        f"git clone -q http://git.test:{world.upstream.port}/repo.git cloned"
        " && cd cloned && git log --oneline && cat README",
        environ={**world.environ, "GIT_CONFIG_NOSYSTEM": "1"},
    )
    assert _ok(outcome).endswith("cloned through corral\n")
    assert outcome.violations == ()
    cloned = os.path.join(world.workspace, "cloned")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    status = subprocess.run(
        [GIT, "status", "--short"], cwd=cloned, env=env, capture_output=True, check=False
    )
    assert status.returncode == 0, status.stderr
    assert os.path.isfile(os.path.join(cloned, ".git", "config"))
    assert not [n for n in os.listdir(os.path.join(cloned, ".git")) if "quarantined" in n]


# ---------------------------------------------------------------- refused
@pytest.mark.skipif(CURL is None, reason="curl is not installed (apt-get install curl)")
def test_refuses_unlisted_denied_look_alike_and_numeric_destinations(world: World) -> None:
    evil = world.evil.port
    targets = [
        (f"http://evil.test:{evil}/", f"evil.test:{evil}", "not in network.allow"),
        (
            f"http://example.test:{evil}/",
            f"example.test:{evil}",
            "resolves to 127.0.0.1, a loopback address not in network.allow",
        ),
        (
            f"https://example.test:{evil}/",
            f"example.test:{evil}",
            "resolves to 127.0.0.1, a loopback address not in network.allow",
        ),
        (
            f"http://evil.example.test:{world.upstream.port}/",
            f"evil.example.test:{world.upstream.port}",
            "network.deny: evil.example.test",
        ),
        (
            f"http://pkg.example.test.evil.test:{evil}/",
            f"pkg.example.test.evil.test:{evil}",
            "not in network.allow",
        ),
        (f"http://evil-example.test:{evil}/", f"evil-example.test:{evil}", "not in network.allow"),
        (
            f"http://rebind.example.test:{evil}/",
            f"rebind.example.test:{evil}",
            "resolves to 127.0.0.1, a loopback address not in network.allow",
        ),
        (f"http://2130706433:{evil}/", f"127.0.0.1:{evil}", "not in network.allow"),
        (f"http://127.1:{evil}/", f"127.0.0.1:{evil}", "not in network.allow"),
        (f"http://0x7f.0.0.1:{evil}/", f"127.0.0.1:{evil}", "not in network.allow"),
        (f"http://[::ffff:127.0.0.1]:{evil}/", f"127.0.0.1:{evil}", "not in network.allow"),
    ]
    # --noproxy '': numeric forms of 127.0.0.1 would otherwise match NO_PROXY and stay inside
    script = "; ".join(
        f"curl -s --noproxy '' -o /dev/null -w '%{{http_code}}\\n' {url}" for url, _t, _r in targets
    )
    outcome = world.run(script)
    codes = outcome.text().split()
    assert codes[2] in ("000", "403")  # HTTPS: curl reports the refused CONNECT as a failure
    assert set(codes[:2] + codes[3:]) == {"403"}
    described = [v.describe() for v in outcome.violations]
    for _url, target, rule in targets:
        assert f"blocked connection to {target} ({rule})" in described
    assert world.evil.seen.connections == 0  # nothing reached the server


@pytest.mark.skipif(CURL is None, reason="curl is not installed (apt-get install curl)")
def test_refuses_an_unlisted_port_and_the_apex_of_a_wildcard(world: World) -> None:
    outcome = world.run(
        f"curl -s -o /dev/null -w '%{{http_code}} ' http://api.example.test:{world.evil.port}/; "
        f"curl -s -o /dev/null -w '%{{http_code}}' http://example.test:{world.upstream.port}/",
        world.policy(allow=("*.example.test", f"127.0.0.1:{world.upstream.port}")),
    )
    assert outcome.text() == "403 403"
    assert [v.describe() for v in outcome.violations] == [
        f"blocked connection to api.example.test:{world.evil.port} "
        "(resolves to 127.0.0.1, a loopback address not in network.allow)",
        f"blocked connection to example.test:{world.upstream.port} (not in network.allow)",
    ]


def test_a_direct_connection_to_the_host_loopback_fails(world: World) -> None:
    code = (
        "import socket, sys\n"
        "for port in sys.argv[1:]:\n"
        "    try:\n"
        "        socket.create_connection(('127.0.0.1', int(port)), timeout=3)\n"
        "        print('connected', port)\n"
        "    except OSError as exc:\n"
        "        print(type(exc).__name__)\n"
    )
    outcome = world.run(
        [sys.executable, "-I", "-c", code, str(world.upstream.port), str(world.evil.port)],
        # names only: an allowed 127.0.0.1:PORT would be forwarded (test_local_services.py)
        world.policy(allow=("example.test", "*.example.test")),
    )
    assert _ok(outcome) == "ConnectionRefusedError\nConnectionRefusedError\n"
    assert world.upstream.seen.connections == 0
    assert world.evil.seen.connections == 0
    assert outcome.network == ()  # it never went through the proxy


def test_dns_queries_from_inside_fail(world: World) -> None:
    code = (
        "import socket\n"
        "for name in ('example.test', 'localhost.test'):\n"
        "    try:\n"
        "        socket.getaddrinfo(name, 80)\n"
        "        print('resolved', name)\n"
        "    except socket.gaierror:\n"
        "        print('no dns')\n"
        "servers = [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver')]\n"
        "for server in servers[:1]:\n"  # a DNS query straight to the configured server
        "    family = socket.AF_INET6 if ':' in server else socket.AF_INET\n"
        "    s = socket.socket(family, socket.SOCK_DGRAM)\n"
        "    s.settimeout(2)\n"
        "    try:\n"
        "        query = bytes.fromhex('123401000001000000000000')\n"
        "        query += b'\\x07example\\x04test\\x00'\n"
        "        s.sendto(query + bytes.fromhex('00010001'), (server, 53))\n"
        "        s.recvfrom(512)\n"
        "        print('answered')\n"
        "    except OSError as exc:\n"
        "        print('query failed')\n"
    )
    outcome = world.run([sys.executable, "-I", "-c", code])
    lines = _ok(outcome).splitlines()
    assert lines[:2] == ["no dns", "no dns"]
    assert "answered" not in lines


def test_the_proxy_port_is_the_only_listener_and_needs_the_credential(world: World) -> None:
    code = (
        "import socket\n"
        "s = socket.create_connection(('127.0.0.1', 3128), timeout=5)\n"
        "s.sendall(b'CONNECT example.test:443 HTTP/1.1\\r\\nHost: example.test\\r\\n\\r\\n')\n"
        "print(s.recv(200).split(b'\\r\\n')[0].decode())\n"
    )
    outcome = world.run([sys.executable, "-I", "-c", code])
    assert _ok(outcome) == "HTTP/1.1 407 Proxy Authentication Required\n"
    assert outcome.network[0].decision == "challenge"
    assert outcome.violations == ()


# ---------------------------------------------------------------- command line and audit log
@pytest.mark.skipif(CURL is None, reason="curl is not installed (apt-get install curl)")
def test_cli_prints_blocked_connections_and_audits_every_attempt(world: World) -> None:
    if not os.access(CORRAL, os.X_OK):
        pytest.skip(f"the corral script is not installed next to {sys.executable}")
    env = {**world.environ}
    result = subprocess.run(
        [
            CORRAL,
            "run",
            *NO_CGROUP,
            "--workspace",
            world.workspace,
            "--allow-host",
            "example.test",
            "--allow-host",
            f"127.0.0.1:{world.upstream.port}",
            "--",
            "sh",
            "-c",
            f"curl -s http://example.test:{world.upstream.port}/hello.txt; "
            "curl -s -o /dev/null https://evil.test:443/; true",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=world.workspace,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello through the proxy\n"
    assert result.stderr == "corral: blocked connection to evil.test:443 (not in network.allow)\n"
    with open(os.path.join(world.state, "corral", "audit.jsonl")) as f:
        record = json.loads(f.readlines()[-1])
    attempts = [(a["host"], a["port"], a["method"], a["decision"]) for a in record["network"]]
    assert attempts == [
        ("example.test", world.upstream.port, "GET", "allow"),
        ("evil.test", 443, "CONNECT", "deny"),
    ]
    assert record["violations"][0]["target"] == "evil.test:443"
    assert record["network"][0]["bytes_down"] > 0


def test_cli_refuses_over_broad_allow_hosts(world: World) -> None:
    if not os.access(CORRAL, os.X_OK):
        pytest.skip(f"the corral script is not installed next to {sys.executable}")
    result = subprocess.run(
        [CORRAL, "run", "--workspace", world.workspace, "--allow-host", "*.com", "--", "true"],
        capture_output=True,
        text=True,
        env=world.environ,
        timeout=60,
        check=False,
    )
    assert result.returncode == 125
    assert 'corral: --allow-host: "*.com" is too broad' in result.stderr


# ---------------------------------------------------------------- scoped credentials
def _fake_npm(world: World) -> dict[str, str]:
    bin_dir = os.path.join(world.workspace, "bin")
    os.makedirs(bin_dir)
    npm = os.path.join(bin_dir, "npm")
    with open(npm, "w") as f:
        f.write('#!/bin/sh\necho "npm $1: ${NPM_TOKEN-absent}"\n')
    os.chmod(npm, 0o755)
    return {
        **world.environ,
        "PATH": f"{bin_dir}:{world.environ['PATH']}",
        "NPM_TOKEN": "s3cr3t-npm-value",
    }


def _with_npm_credential(policy: Policy, **kwargs: Any) -> Policy:
    credential = Credential(
        name="NPM_TOKEN",
        source="env:NPM_TOKEN",
        commands=("npm publish*",),
        hosts=kwargs.pop("hosts", ("registry.example.test",)),
    )
    return policy.replace(
        credentials=(credential,),
        env=policy.env.replace(pass_through=(*policy.env.pass_through, "NPM_*")),
    )


def test_injects_a_credential_only_for_matching_commands(world: World) -> None:
    environ = _fake_npm(world)
    policy = _with_npm_credential(world.policy(allow=(*world.allow, "registry.example.test")))
    published = world.run(["npm", "publish", "--tag", "next"], policy, environ)
    assert _ok(published) == "npm publish: s3cr3t-npm-value\n"
    assert published.credentials == ("NPM_TOKEN",)
    assert "s3cr3t" not in json.dumps(published.to_json(include_output=False))
    for other in (["npm", "install"], ["sh", "-c", "npm publish"]):
        outcome = world.run(other, policy, environ)  # env.pass matches NPM_*, yet it is absent
        assert _ok(outcome).endswith(": absent\n")
        assert outcome.credentials == ()


def test_injects_a_credential_only_while_its_hosts_are_allowed(world: World) -> None:
    environ = _fake_npm(world)
    unlisted = _with_npm_credential(
        world.policy(allow=("example.test", "registry.example.test:80"))
    )
    assert _ok(world.run(["npm", "publish"], unlisted, environ)) == "npm publish: absent\n"
    offline = _with_npm_credential(world.policy(mode="none", allow=(), deny=()))
    assert _ok(world.run(["npm", "publish"], offline, environ)) == "npm publish: absent\n"


def test_the_audit_log_names_credentials_but_never_their_values(world: World) -> None:
    if not os.access(CORRAL, os.X_OK):
        pytest.skip(f"the corral script is not installed next to {sys.executable}")
    environ = _fake_npm(world)
    settings = os.path.join(world.root, "settings.json")
    with open(settings, "w") as f:
        json.dump(
            {
                "network": {"mode": "allowlist", "allow": ["registry.example.test"]},
                "credentials": [
                    {
                        "name": "NPM_TOKEN",
                        "from": "env:NPM_TOKEN",
                        "commands": ["npm publish*"],
                        "hosts": ["registry.example.test"],
                    }
                ],
            },
            f,
        )
    for argv in (["npm", "publish", "--otp=s3cr3t-npm-value"], ["npm", "install"]):
        result = subprocess.run(
            [
                CORRAL,
                "run",
                *NO_CGROUP,
                "--workspace",
                world.workspace,
                "--settings",
                settings,
                "--",
                *argv,
            ],
            capture_output=True,
            text=True,
            env=environ,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
    with open(os.path.join(world.state, "corral", "audit.jsonl")) as f:
        log = f.read()
    assert "s3cr3t" not in log
    published, installed = (json.loads(line) for line in log.splitlines()[-2:])
    assert published["credentials"] == ["NPM_TOKEN"]
    assert published["argv"] == ["npm", "publish", "--otp=***"]
    assert installed["credentials"] == []


def test_refuses_a_run_whose_credential_source_is_missing(world: World) -> None:
    environ = _fake_npm(world)
    del environ["NPM_TOKEN"]
    policy = _with_npm_credential(world.policy(allow=(*world.allow, "registry.example.test")))
    from corral._exceptions import UsageError

    with pytest.raises(UsageError, match="the host variable NPM_TOKEN is not set"):
        world.run(["npm", "publish"], policy, environ)


def test_reads_file_credentials_for_matching_commands_only(world: World) -> None:
    secret = os.path.join(world.root, "token")
    with open(secret, "w") as f:
        f.write("file-secret-value\n")
    credential = Credential(name="DEPLOY_KEY", source=f"file:{secret}", commands=("sh -c echo*",))
    policy = world.policy(mode="none", allow=(), deny=()).replace(credentials=(credential,))
    assert (
        _ok(world.run("echo ${DEPLOY_KEY-absent}", policy)) == "absent\n"
    )  # "echo ..." does not match
    outcome = world.run(["sh", "-c", "echo ${DEPLOY_KEY-absent}"], policy)
    assert _ok(outcome) == "file-secret-value\n"
    assert outcome.argv == ("sh", "-c", "echo ${DEPLOY_KEY-absent}")


def test_nothing_runs_when_the_proxy_cannot_start(world: World) -> None:
    from corral._exceptions import ProxyStartFailed

    marker = os.path.join(world.workspace, "ran")
    environ = {**world.environ, "CORRAL_EGRESS_HOSTS": os.path.join(world.root, "missing-hosts")}
    with pytest.raises(ProxyStartFailed, match="cannot read the hosts file"):
        world.run(f"touch {marker}", environ=environ)
    assert not os.path.exists(marker)
