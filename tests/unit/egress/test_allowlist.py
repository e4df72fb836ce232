"""Egress decisions (corral.egress.allowlist): deny first, then allow, then the SSRF guard."""

from __future__ import annotations

import pytest

from corral.egress.allowlist import NOT_ALLOWED, SPECIAL_RANGES, Allowlist, Decision, special_range
from corral.policy._hosts import parse_host

RULES = Allowlist(
    allow=[
        "example.test",
        "*.pkg.test",
        "git.test:8443",
        "10.1.0.0/16",
        "127.0.0.1:8080",
        "[::1]:8080",
    ],
    deny=["evil.pkg.test", "*.bad.pkg.test", "10.1.2.0/24"],
)


def decide(host: str, port: int) -> Decision:
    return RULES.decide(parse_host(host), port)


@pytest.mark.parametrize(
    ("host", "port", "rule"),
    [
        ("example.test", 443, "network.allow: example.test"),
        ("EXAMPLE.test.", 80, "network.allow: example.test"),
        ("a.pkg.test", 443, "network.allow: *.pkg.test"),
        ("a.b.pkg.test", 443, "network.allow: *.pkg.test"),
        ("git.test", 8443, "network.allow: git.test:8443"),
        ("10.1.200.3", 22, "network.allow: 10.1.0.0/16"),
        ("127.0.0.1", 8080, "network.allow: 127.0.0.1:8080"),
        ("2130706433", 8080, "network.allow: 127.0.0.1:8080"),
        ("::ffff:127.0.0.1", 8080, "network.allow: 127.0.0.1:8080"),
        ("0:0:0:0:0:0:0:1", 8080, "network.allow: [::1]:8080"),
    ],
)
def test_allows_listed_destinations(host: str, port: int, rule: str) -> None:
    assert decide(host, port) == Decision(allowed=True, rule=rule, reason="allowed")


@pytest.mark.parametrize(
    ("host", "port", "rule", "reason"),
    [
        ("unlisted.test", 443, NOT_ALLOWED, "not-allowed"),
        ("git.test", 443, NOT_ALLOWED, "not-allowed"),  # unlisted port
        ("pkg.test", 443, NOT_ALLOWED, "not-allowed"),  # the apex of a wildcard
        ("evil-example.test", 443, NOT_ALLOWED, "not-allowed"),  # look-alike
        ("example.test.evil.test", 443, NOT_ALLOWED, "not-allowed"),  # look-alike suffix
        ("example.testx", 443, NOT_ALLOWED, "not-allowed"),
        ("evil.pkg.test", 443, "network.deny: evil.pkg.test", "denied-by-rule"),  # denied subdomain
        ("x.bad.pkg.test", 443, "network.deny: *.bad.pkg.test", "denied-by-rule"),
        ("10.1.2.3", 22, "network.deny: 10.1.2.0/24", "denied-by-rule"),
        ("127.0.0.1", 8081, NOT_ALLOWED, "not-allowed"),
        ("127.1", 22, NOT_ALLOWED, "not-allowed"),
        ("0x7f000001", 22, NOT_ALLOWED, "not-allowed"),
        ("169.254.169.254", 80, NOT_ALLOWED, "not-allowed"),
    ],
)
def test_refuses_unlisted_and_denied_destinations(
    host: str, port: int, rule: str, reason: str
) -> None:
    assert decide(host, port) == Decision(allowed=False, rule=rule, reason=reason)


def test_deny_rules_win_over_allow_rules() -> None:
    rules = Allowlist(allow=["a.test"], deny=["a.test"])
    assert rules.decide(parse_host("a.test"), 443).rule == "network.deny: a.test"
    assert (
        Allowlist(allow=["a.test"], deny=["*"]).decide(parse_host("a.test"), 1).rule
        == "network.deny: *"
    )


def test_refuses_invalid_and_over_broad_rules() -> None:
    with pytest.raises(ValueError, match=r"network.allow: '\*' is too broad"):
        Allowlist(allow=["*"])
    with pytest.raises(ValueError, match=r"network\.allow: 'a b' is not a valid host pattern"):
        Allowlist(allow=["a b"])
    with pytest.raises(ValueError, match=r"network\.deny: '10\.0\.0\.1/8'"):
        Allowlist(deny=["10.0.0.1/8"])
    assert Allowlist(deny=["*", "*.com"]).deny[0].text == "*"  # broad deny rules are fine


def _addresses(*texts: str) -> list:
    return [parse_host(t) for t in texts]


@pytest.mark.parametrize(
    ("address", "label"),
    [
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "shared (CGNAT)"),
        ("169.254.1.1", "link-local"),
        ("169.254.169.254", "cloud-metadata"),
        ("169.254.170.2", "cloud-metadata"),
        ("168.63.129.16", "cloud-metadata"),
        ("100.100.100.200", "cloud-metadata"),
        ("fd00:ec2::254", "cloud-metadata"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("255.255.255.255", "reserved"),
        ("198.18.0.1", "reserved"),
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("::127.0.0.1", "reserved"),
        ("fc00::1", "private"),
        ("fe80::1", "link-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "reserved"),
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 to 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "cloud-metadata"),  # NAT64 to 169.254.169.254
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
        ("::ffff:10.0.0.1", "private"),  # mapped: canonicalised to IPv4 first
    ],
)
def test_classifies_special_addresses(address: str, label: str) -> None:
    assert special_range(parse_host(address)) == label


@pytest.mark.parametrize(
    "address",
    ["93.184.216.34", "172.32.0.1", "2606:4700::1111", "64:ff9b::5db8:d822", "2002:5db8:d822::1"],
)
def test_public_addresses_are_not_special(address: str) -> None:
    assert special_range(parse_host(address)) is None


def test_every_special_range_has_a_label_and_reason() -> None:
    for _version, _network, _prefix, label, reason in SPECIAL_RANGES:
        assert label
        assert reason


def test_connects_to_public_addresses_of_an_allowed_name() -> None:
    usable, refusal = RULES.check_addresses(_addresses("93.184.216.34", "2606:4700::1111"), 443)
    assert refusal is None
    assert [a.text for a in usable] == ["93.184.216.34", "2606:4700::1111"]


def test_refuses_a_name_resolving_to_loopback() -> None:
    usable, refusal = RULES.check_addresses(_addresses("127.0.0.1"), 443)
    assert usable == []
    assert refusal == Decision(
        allowed=False,
        rule="resolves to 127.0.0.1, a loopback address not in network.allow",
        reason="special-address",
    )


def test_refuses_metadata_with_the_right_article() -> None:
    _usable, refusal = RULES.check_addresses(_addresses("169.254.169.254"), 80)
    assert refusal is not None
    assert (
        refusal.rule == "resolves to 169.254.169.254, a cloud-metadata address not in network.allow"
    )
    _usable, refusal = RULES.check_addresses(_addresses("fe80::1"), 80)
    assert refusal is not None
    assert "fe80::1, a link-local address" in refusal.rule
    _usable, refusal = RULES.check_addresses(_addresses("::"), 80)
    assert refusal is not None
    assert ":: (an unspecified address" not in refusal.rule
    assert "::, an unspecified address" in refusal.rule


def test_allows_a_special_address_that_is_itself_allowed() -> None:
    usable, refusal = RULES.check_addresses(
        _addresses("127.0.0.1"), 8080
    )  # 127.0.0.1:8080 is allowed
    assert refusal is None
    assert usable == _addresses("127.0.0.1")
    usable, refusal = RULES.check_addresses(
        _addresses("10.1.9.9"), 22
    )  # in the allowed 10.1.0.0/16
    assert (usable, refusal) == (_addresses("10.1.9.9"), None)


def test_drops_refused_addresses_and_keeps_the_rest() -> None:
    usable, refusal = RULES.check_addresses(
        _addresses("127.0.0.1", "93.184.216.34", "10.0.0.1"), 443
    )
    assert (usable, refusal) == (_addresses("93.184.216.34"), None)


def test_applies_address_deny_rules_to_resolved_addresses() -> None:
    usable, refusal = RULES.check_addresses(_addresses("10.1.2.7"), 22)  # allowed /16, denied /24
    assert usable == []
    assert refusal is not None
    assert refusal.rule == "resolves to 10.1.2.7, network.deny: 10.1.2.0/24"
    assert refusal.reason == "denied-by-rule"


def test_refuses_a_name_without_addresses() -> None:
    usable, refusal = RULES.check_addresses([], 443)
    assert usable == []
    assert refusal is not None
    assert refusal.rule == "the name resolved to no address"
