"""Planning masked credentials and request rules (pure: policy + facts -> plan)."""

from __future__ import annotations

from typing import Any

import pytest

from corral._exceptions import EnforcementUnavailable
from corral.backends import HostFacts
from corral.backends._egress import check_request_rules, mask_placeholder
from corral.backends._proxy_env import TRUST_ENV
from corral.backends.bubblewrap import FD_TRUST, BubblewrapBackend
from corral.pipeline._request import ExecRequest
from corral.policy import Credential, NetworkPolicy, Policy, ResourceLimits

CA = (b"-----BEGIN CERTIFICATE-----\nCA\n", b"-----BEGIN PRIVATE KEY-----\nKEY\n")
BUNDLE = ("/etc/ssl/certs/ca-certificates.crt", b"SYSTEM ROOTS\n" + CA[0])
FACTS = HostFacts(
    uid=1000,
    gid=1000,
    home="/h",
    arch="x86_64",
    bwrap="/usr/bin/bwrap",
    bwrap_version=(0, 8, 0),
    helper="/opt/corral-exec",
    path_kinds=(("/w", "dir"),),
    environ=(("PATH", "/usr/bin:/bin"), ("GH_REAL", "ghp_real")),
    egress_token="f00d",
    egress_ca=CA,
    trust_bundle=BUNDLE,
)
GH = Credential(
    name="GH_TOKEN",
    source="env:GH_REAL",
    commands=("git *",),
    hosts=("github.com",),
    mode="mask",
)
ALLOW = NetworkPolicy(mode="allowlist", allow=("github.com", "registry.npmjs.org"))


def _policy(network: NetworkPolicy = ALLOW, *credentials: Credential) -> Policy:
    return Policy.for_workspace("/w", home="/h").replace(
        network=network,
        resources=ResourceLimits(timeout=None, output=None),
        credentials=credentials,
    )


def _plan(policy: Policy, *argv: str, facts: HostFacts = FACTS) -> Any:
    request = ExecRequest.from_argv(argv or ("true",), cwd="/w", sandbox_id="sbx")
    return BubblewrapBackend().plan(request, policy, facts)


def test_a_masked_credential_gives_the_sandbox_a_placeholder_and_the_proxy_the_secret() -> None:
    plan = _plan(_policy(ALLOW, GH), "git", "push")
    env = dict(plan.env)
    placeholder = mask_placeholder("f00d", "GH_TOKEN")
    assert env["GH_TOKEN"] == placeholder != "ghp_real"
    assert "ghp_real" not in repr(plan.argv) + repr(plan.env) + repr(plan.fds)
    assert "ghp_real" not in repr(plan.egress)  # the spec's repr never shows secrets
    assert plan.egress.masks == (
        ("GH_TOKEN", placeholder, "ghp_real", ("github.com",), ("authorization",), False),
    )
    assert plan.egress.ca == CA
    # the merged bundle replaces the system's, and every tool is pointed at it
    (fd,) = [f for f in plan.fds if f.number == FD_TRUST]
    assert fd.data == BUNDLE[1]
    assert CA[1] not in fd.data  # the CA's key never enters the sandbox
    at = plan.argv.index("--ro-bind-data")
    assert plan.argv[at : at + 3] == ("--ro-bind-data", str(FD_TRUST), BUNDLE[0])
    for name, _reason in TRUST_ENV:
        assert env[name] == BUNDLE[0]
    # another run draws another token, so another placeholder
    assert mask_placeholder("beef", "GH_TOKEN") != placeholder


def test_without_rules_or_masks_nothing_is_terminated_or_mounted() -> None:
    plan = _plan(_policy(ALLOW), "git", "push")
    assert plan.egress.ca == ()
    assert "--ro-bind-data" not in plan.argv
    assert "SSL_CERT_FILE" not in dict(plan.env)


def test_request_rules_travel_to_the_proxy() -> None:
    network = ALLOW.replace(deny_requests=("POST */git-receive-pack",))
    plan = _plan(_policy(network), "git", "push")
    assert plan.egress.deny_requests == ("POST */git-receive-pack",)
    assert plan.egress.ca == CA
    assert plan.egress.masks == ()


def test_refuses_termination_without_a_ca() -> None:
    network = ALLOW.replace(deny_requests=("POST */git-receive-pack",))
    facts = FACTS.replace(egress_ca=(), trust_bundle=())
    with pytest.raises(EnforcementUnavailable, match="cryptography"):
        _plan(_policy(network), "git", "push", facts=facts)
    with pytest.raises(EnforcementUnavailable, match="cryptography"):
        _plan(_policy(ALLOW, GH), "git", "push", facts=facts)


def test_request_rules_are_refused_where_they_cannot_be_enforced() -> None:
    rules = ALLOW.replace(deny_requests=("PUT registry.npmjs.org/*",))
    with pytest.raises(EnforcementUnavailable, match='"open"') as info:
        check_request_rules(_policy(rules.replace(mode="open")), terminating=True, backend="x")
    assert info.value.rule == "network.denyRequests"
    with pytest.raises(EnforcementUnavailable, match="podman backend's proxy"):
        check_request_rules(_policy(rules), terminating=False, backend="podman")
    # no network at all: nothing to check
    check_request_rules(_policy(rules.replace(mode="none")), terminating=False, backend="x")
