"""Planning allowlist egress and scoped credentials (bubblewrap and none backends). Pure."""

from __future__ import annotations

import os
from typing import Any

import pytest

from corral._exceptions import EnforcementUnavailable, LaunchFailed, UsageError
from corral.backends import FdSpec, HostFacts
from corral.backends._egress import read_credential_file
from corral.backends._plan import EgressSpec
from corral.backends._proxy_env import PROXY_ENV, proxy_environment
from corral.backends.bubblewrap import FD_BLOCK, FD_INFO, BubblewrapBackend
from corral.backends.unsandboxed import UnsandboxedBackend
from corral.pipeline._request import ExecRequest
from corral.policy import Credential, NetworkPolicy, Policy, ResourceLimits

FACTS = HostFacts(
    uid=1000,
    gid=1000,
    home="/h",
    arch="x86_64",
    bwrap="/usr/bin/bwrap",
    bwrap_version=(0, 8, 0),
    helper="/opt/corral-exec",
    path_kinds=(("/w", "dir"),),
    environ=(
        ("PATH", "/usr/bin:/bin"),
        ("HOME", "/h"),
        ("NPM_TOKEN", "npm-secret"),
        ("GH_TOKEN", "gh"),
    ),
    egress_token="f00d",
    credential_files=(("file:/keys/deploy", "deploy-secret"),),
)
NO_LIMITS = ResourceLimits(timeout=None, output=None)
NPM = Credential(
    name="NPM_TOKEN",
    source="env:NPM_TOKEN",
    commands=("npm publish*",),
    hosts=("registry.npmjs.org",),
)
DEPLOY = Credential(name="DEPLOY_KEY", source="file:/keys/deploy", commands=("make deploy",))


def _policy(network: NetworkPolicy, *credentials: Credential, **env: Any) -> Policy:
    policy = Policy.for_workspace("/w", home="/h").replace(
        network=network,
        resources=NO_LIMITS,
        credentials=credentials,
    )
    if env:
        policy = policy.replace(env=policy.env.replace(**env))
    return policy


def _request(*argv: str) -> ExecRequest:
    return ExecRequest.from_argv(argv, cwd="/w", sandbox_id="sbx-test")


def _plan(policy: Policy, *argv: str, facts: HostFacts = FACTS) -> Any:
    return BubblewrapBackend().plan(_request(*(argv or ("true",))), policy, facts)


def test_allowlist_differs_from_no_network_only_by_the_proxy() -> None:
    closed = _plan(_policy(NetworkPolicy(mode="none")))
    allow = NetworkPolicy(
        mode="allowlist", allow=("pypi.org", "*.pythonhosted.org"), deny=("evil.pypi.org",)
    )
    plan = _plan(_policy(allow))
    separator = closed.argv.index("--")
    expected_argv = (
        *closed.argv[:separator],
        "--info-fd",
        str(FD_INFO),
        "--block-fd",
        str(FD_BLOCK),
        *closed.argv[separator:],
    )
    assert "--unshare-net" in closed.argv
    assert plan == closed.replace(
        argv=expected_argv,
        fds=(
            *closed.fds,
            FdSpec(number=FD_INFO, kind="info"),
            FdSpec(number=FD_BLOCK, kind="block"),
        ),
        env=(*closed.env, *proxy_environment(3128, "f00d")),
        egress=EgressSpec(
            allow=("pypi.org", "*.pythonhosted.org"),
            deny=("evil.pypi.org",),
            port=3128,
            token="f00d",
        ),
    )


def test_the_proxy_environment_points_every_variable_at_the_sandbox_loopback() -> None:
    env = dict(proxy_environment(3128, "f00d"))
    assert env["HTTPS_PROXY"] == env["http_proxy"] == "http://corral:f00d@127.0.0.1:3128"
    assert env["ALL_PROXY"] == "socks5h://corral:f00d@127.0.0.1:3128"
    assert env["NO_PROXY"] == "localhost,127.0.0.1,::1"
    assert len(env) == len(PROXY_ENV)
    assert all(reason for _name, _value, reason in PROXY_ENV)


def test_open_and_none_modes_start_no_proxy() -> None:
    for mode in ("none", "open"):
        plan = _plan(_policy(NetworkPolicy(mode=mode)))
        assert plan.egress is None
        assert plan.fd("info") is None
        assert not any(name == "HTTP_PROXY" for name, _ in plan.env)


def test_passes_the_static_hosts_file_to_the_proxy() -> None:
    facts = FACTS.replace(environ=(*FACTS.environ, ("CORRAL_EGRESS_HOSTS", "/etc/corral-hosts")))
    plan = _plan(_policy(NetworkPolicy(mode="allowlist", allow=("a.test",))), facts=facts)
    assert plan.egress.hosts_file == "/etc/corral-hosts"
    with pytest.raises(UsageError, match="must be an absolute path"):
        _plan(
            _policy(NetworkPolicy(mode="allowlist")),
            facts=FACTS.replace(environ=(("CORRAL_EGRESS_HOSTS", "rel/hosts"),)),
        )


@pytest.mark.parametrize(
    ("network", "message"),
    [
        (NetworkPolicy(mode="allowlist", allow=("*",)), "network.allow: '\\*' is too broad"),
        (NetworkPolicy(mode="allowlist", allow=("a b",)), "not a valid host pattern"),
        (NetworkPolicy(mode="allowlist", deny=("10.0.0.1/8",)), "network.deny: '10.0.0.1/8'"),
    ],
)
def test_refuses_invalid_rules_in_a_policy_built_in_code(
    network: NetworkPolicy, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        _plan(_policy(network))


def test_refuses_to_plan_allowlist_mode_without_a_proxy_credential() -> None:
    with pytest.raises(LaunchFailed, match="no proxy credential"):
        _plan(_policy(NetworkPolicy(mode="allowlist")), facts=FACTS.replace(egress_token=""))


# ---------------------------------------------------------------- credentials
def _env(plan: Any) -> dict[str, str]:
    return dict(plan.env)


def test_injects_a_credential_for_a_matching_command_with_reachable_hosts() -> None:
    policy = _policy(NetworkPolicy(mode="allowlist", allow=("registry.npmjs.org",)), NPM, DEPLOY)
    plan = _plan(policy, "npm", "publish", "--otp=npm-secret")
    assert _env(plan)["NPM_TOKEN"] == "npm-secret"
    assert "DEPLOY_KEY" not in _env(plan)
    assert plan.credentials == ("NPM_TOKEN",)
    assert plan.display_argv == ("npm", "publish", "--otp=***")
    deploy = _plan(policy, "make", "deploy")
    assert _env(deploy)["DEPLOY_KEY"] == "deploy-secret"
    assert deploy.credentials == ("DEPLOY_KEY",)


@pytest.mark.parametrize(
    ("network", "argv"),
    [
        (NetworkPolicy(mode="allowlist", allow=("registry.npmjs.org",)), ("npm", "install")),
        (
            NetworkPolicy(mode="allowlist", allow=("registry.npmjs.org",)),
            ("sh", "-c", "npm publish"),
        ),
        (NetworkPolicy(mode="allowlist", allow=("npmjs.org",)), ("npm", "publish")),
        (NetworkPolicy(mode="none"), ("npm", "publish")),
    ],
)
def test_a_credential_is_absent_otherwise_even_when_env_pass_matches(
    network: NetworkPolicy, argv: tuple[str, ...]
) -> None:
    policy = _policy(
        network, NPM, pass_through=("PATH", "HOME", "*_TOKEN"), set=(("NPM_TOKEN", "from-env-set"),)
    )
    plan = _plan(policy, *argv)
    assert "NPM_TOKEN" not in _env(plan)
    assert _env(plan)["GH_TOKEN"] == "gh"  # an ordinary pass-through variable still passes
    assert plan.credentials == ()


def test_refuses_a_run_whose_credential_source_is_missing() -> None:
    policy = _policy(NetworkPolicy(mode="open"), NPM)
    with pytest.raises(UsageError, match="the host variable NPM_TOKEN is not set"):
        _plan(policy, "npm", "publish", facts=FACTS.replace(environ=()))
    with pytest.raises(UsageError, match="the file /keys/deploy is not readable"):
        _plan(
            _policy(NetworkPolicy(), DEPLOY),
            "make",
            "deploy",
            facts=FACTS.replace(credential_files=()),
        )
    with pytest.raises(UsageError, match="is empty, too large or contains a NUL byte"):
        _plan(policy, "npm", "publish", facts=FACTS.replace(environ=(("NPM_TOKEN", ""),)))


def test_refuses_mask_credentials_it_cannot_enforce() -> None:
    masked = NPM.replace(mode="mask")
    with pytest.raises(EnforcementUnavailable, match='mode "mask" needs') as info:
        _plan(_policy(NetworkPolicy(mode="open"), masked), "npm", "publish")
    assert info.value.rule == "credentials"
    assert _plan(_policy(NetworkPolicy(mode="open"), masked), "npm", "install").credentials == ()
    allowlist = _policy(NetworkPolicy(mode="allowlist", allow=("registry.npmjs.org",)), masked)
    with pytest.raises(EnforcementUnavailable, match='mode "mask" needs'):
        UnsandboxedBackend().plan(_request("npm", "publish"), allowlist, FACTS)


def test_refuses_invalid_credential_hosts_in_a_policy_built_in_code() -> None:
    from corral.backends._egress import credentials_for

    broken = NPM.replace(hosts=("a b",))
    with pytest.raises(UsageError, match="credentials: invalid host pattern"):
        credentials_for(
            _request("npm", "publish"), _policy(NetworkPolicy(mode="allowlist"), broken)
        )


def test_the_none_backend_injects_credentials_the_same_way() -> None:
    policy = _policy(NetworkPolicy(mode="open"), NPM)
    backend = UnsandboxedBackend()
    plan = backend.plan(_request("npm", "publish"), policy, FACTS)
    assert dict(plan.env)["NPM_TOKEN"] == "npm-secret"
    assert plan.credentials == ("NPM_TOKEN",)
    assert "NPM_TOKEN" not in dict(backend.plan(_request("npm", "ci"), policy, FACTS).env)


def test_reads_credential_files_strictly(tmp_path: Any) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    assert read_credential_file(str(token)) == "abc"
    token.write_text("abc\r\n")
    assert read_credential_file(str(token)) == "abc"
    assert read_credential_file(str(tmp_path / "missing")) is None
    assert read_credential_file(str(tmp_path)) is None  # a directory
    token.write_bytes(b"\xff\xfe")
    assert read_credential_file(str(token)) is None
    token.write_bytes(b"x" * 70000)
    assert read_credential_file(str(token)) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert read_credential_file(str(fifo)) is None  # never blocks on a FIFO
