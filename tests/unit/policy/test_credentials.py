"""Which credentials a command receives (corral.policy._credentials)."""

from __future__ import annotations

import pytest

from corral.policy import Credential, NetworkPolicy, Policy
from corral.policy._credentials import applicable_credentials, credential_names, hosts_reachable

NPM = Credential(
    name="NPM_TOKEN",
    source="env:NPM_TOKEN",
    commands=("npm publish*",),
    hosts=("registry.npmjs.org",),
)
SIGN = Credential(name="SIGNING_KEY", source="file:/k", commands=("make release", "make sign*"))


def _policy(network: NetworkPolicy, *credentials: Credential) -> Policy:
    return Policy.for_workspace("/w", home="/h").replace(network=network, credentials=credentials)


ALLOW_NPM = NetworkPolicy(mode="allowlist", allow=("registry.npmjs.org",))


@pytest.mark.parametrize(
    ("command", "names"),
    [
        ("npm publish", ("NPM_TOKEN",)),
        ("npm publish --tag next", ("NPM_TOKEN",)),
        ("npm install", ()),
        ("sh -c npm publish", ()),
        ("make release", ("SIGNING_KEY",)),
        ("make sign-all", ("SIGNING_KEY",)),
        ("make", ()),
    ],
)
def test_injects_only_for_matching_commands(command: str, names: tuple[str, ...]) -> None:
    policy = _policy(ALLOW_NPM, NPM, SIGN)
    assert tuple(c.name for c in applicable_credentials(policy, command)) == names


@pytest.mark.parametrize(
    ("network", "reachable"),
    [
        (NetworkPolicy(mode="none"), False),
        (NetworkPolicy(mode="open"), True),
        (NetworkPolicy(mode="allowlist"), False),
        (ALLOW_NPM, True),
        (NetworkPolicy(mode="allowlist", allow=("*.npmjs.org",)), True),
        (
            NetworkPolicy(mode="allowlist", allow=("registry.npmjs.org:443",)),
            False,
        ),  # not every port
        (NetworkPolicy(mode="allowlist", allow=("npmjs.org",)), False),
        (
            NetworkPolicy(
                mode="allowlist", allow=("*.npmjs.org",), deny=("registry.npmjs.org:80",)
            ),
            False,
        ),
        (NetworkPolicy(mode="allowlist", allow=("*.npmjs.org",), deny=("evil.npmjs.org",)), True),
    ],
)
def test_injects_only_while_every_host_is_reachable(
    network: NetworkPolicy, reachable: bool
) -> None:
    assert hosts_reachable(("registry.npmjs.org",), network) is reachable
    policy = _policy(network, NPM)
    assert bool(applicable_credentials(policy, "npm publish")) is reachable


def test_a_credential_without_hosts_ignores_the_network() -> None:
    assert hosts_reachable((), NetworkPolicy(mode="none"))
    assert applicable_credentials(_policy(NetworkPolicy(), SIGN), "make release") == (SIGN,)


def test_a_wildcard_host_needs_a_covering_allow_and_no_overlapping_deny() -> None:
    network = NetworkPolicy(
        mode="allowlist", allow=("*.example.test",), deny=("evil.example.test",)
    )
    assert not hosts_reachable(("*.example.test",), network)
    assert hosts_reachable(("*.api.example.test",), network)


def test_lists_every_credential_name() -> None:
    assert credential_names(_policy(ALLOW_NPM, NPM, SIGN)) == {"NPM_TOKEN", "SIGNING_KEY"}
