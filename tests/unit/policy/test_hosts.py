"""Host canonicalisation and host patterns (corral.policy._hosts)."""

from __future__ import annotations

import pytest

from corral.policy._hosts import (
    ADDRESS,
    ANY,
    BROAD_SUFFIXES,
    NAME,
    SUFFIX,
    Host,
    broad_pattern_problem,
    format_address,
    parse_host,
    parse_pattern,
    pattern_covers,
    pattern_matches,
    patterns_overlap,
    split_authority,
)


@pytest.mark.parametrize(
    ("text", "canonical", "version"),
    [
        ("example.com", "example.com", 0),
        ("Example.COM.", "example.com", 0),
        ("_acme-challenge.a-b.example", "_acme-challenge.a-b.example", 0),
        ("bücher.de", "xn--bcher-kva.de", 0),
        ("123abc", "123abc", 0),  # not numeric: a name (inet_aton refuses it too)
        ("127.0.0.1", "127.0.0.1", 4),
        ("127.1", "127.0.0.1", 4),
        ("127.0.1", "127.0.0.1", 4),
        ("2130706433", "127.0.0.1", 4),
        ("0x7f.1", "127.0.0.1", 4),
        ("0X7F.0.0.1", "127.0.0.1", 4),
        ("0177.0.0.1", "127.0.0.1", 4),
        ("0x7f000001", "127.0.0.1", 4),
        ("0", "0.0.0.0", 4),
        ("0x", "0.0.0.0", 4),
        ("1.2.0x", "1.2.0.0", 4),  # WHATWG: a bare "0x" part is zero
        ("a\u3002b", "a.b", 0),  # IDNA maps the ideographic full stop
        ("1.2.3.4.", "1.2.3.4", 4),
        ("169.254.169.254", "169.254.169.254", 4),
        ("::1", "::1", 6),
        ("::", "::", 6),
        ("0:0:0:0:0:0:0:1", "::1", 6),
        ("2001:DB8:0:0:0:0:0:1", "2001:db8::1", 6),
        ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1", 6),  # first of two equal runs
        ("2001:0:0:1:0:0:0:1", "2001:0:0:1::1", 6),  # the longest run
        ("1:2:3:4:5:6:7:0", "1:2:3:4:5:6:7:0", 6),  # a single zero is not compressed
        ("1::", "1::", 6),
        ("fe80::1:2", "fe80::1:2", 6),
        ("64:ff9b::1.2.3.4", "64:ff9b::102:304", 6),
        ("1:2:3:4:5:6:1.2.3.4", "1:2:3:4:5:6:102:304", 6),
        ("::ffff:127.0.0.1", "127.0.0.1", 4),  # IPv4-mapped: the IPv4 address it reaches
        ("::FFFF:7f00:1", "127.0.0.1", 4),
    ],
)
def test_canonicalises_hosts(text: str, canonical: str, version: int) -> None:
    host = parse_host(text)
    assert (host.text, host.version) == (canonical, version)
    assert host.is_address == (version != 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        (".", "is empty"),
        ("a..b", "empty label"),
        ("a.b..", "empty label"),
        ("exa mple.com", "spaces or control characters"),
        ("a\tb", "spaces or control characters"),
        ("a\x7fb", "spaces or control characters"),
        ("evil.test\r\nX: y", "carriage return"),
        ("evil.test\nX", "line feed"),
        ("evil\x00.test", "NUL byte"),
        ("fe80::1%eth0", "zone ids"),
        ("fe80::1%25eth0", "zone ids"),
        ("a%2e.com", "percent escapes"),
        ("user@evil.test", "user info"),
        ("a/b", "'/'"),
        ("a\\b", "'\\'"),
        ("ex*ample.com", "only letters, digits"),
        ("a" * 64 + ".com", "longer than 63"),
        (".".join(["a" * 60] * 5), "longer than 253"),
        ("1.2.3.256", "not a valid IPv4"),
        ("256.1.1.1", "not a valid IPv4"),
        ("1.2.3.4.5", "not a valid IPv4"),
        ("example.123", "not a valid IPv4"),
        ("08", "not a valid IPv4"),
        ("0x1g", "only letters"),  # last label not numeric: a name, but '0x1g' is fine... see below
        ("4294967296", "not a valid IPv4"),
        ("1.16777216", "not a valid IPv4"),
        ("1..1", "not a valid IPv4"),
        ("0xg.1", "not a valid IPv4"),
        (":::", "not a valid IPv6"),
        ("1::2::3", "not a valid IPv6"),
        ("1:2:3:4:5:6:7:8:9", "not a valid IPv6"),
        ("1:2:3:4:5:6:7", "not a valid IPv6"),
        ("1::2:3:4:5:6:7:8", "not a valid IPv6"),
        ("12345::", "not a valid IPv6"),
        ("g::", "not a valid IPv6"),
        ("::1.2.3.04", "not a valid IPv6"),
        ("::1.2.3", "not a valid IPv6"),
        ("::1.2.3.256", "not a valid IPv6"),
        ("::1.2.3.x", "not a valid IPv6"),
        ("1.2.3.4::", "not a valid IPv6"),
        (":1:2:3:4:5:6:7", "not a valid IPv6"),
        ("xn--a.\udcff", "spaces or control characters"),
    ],
)
def test_refuses_invalid_hosts(text: str, message: str) -> None:
    if text == "0x1g":
        assert parse_host(text).text == "0x1g"  # a name: its last label is not a number
        return
    with pytest.raises(ValueError) as info:
        parse_host(text)
    assert message in str(info.value)


def test_refuses_names_that_idna_cannot_encode() -> None:
    with pytest.raises(ValueError, match="internationalised"):
        parse_host("ü" * 70 + ".de")


def test_formats_addresses() -> None:
    assert format_address(4, 0x7F000001) == "127.0.0.1"
    assert format_address(6, 0) == "::"
    assert format_address(6, 1 << 112) == "1::"


def test_host_authority_brackets_ipv6() -> None:
    assert parse_host("::1").authority(443) == "[::1]:443"
    assert parse_host("example.test").authority(80) == "example.test:80"


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [
        ("example.test", None, ("example.test", None)),
        ("example.test", 80, ("example.test", 80)),
        ("example.test:8080", None, ("example.test", 8080)),
        ("[::1]", 80, ("::1", 80)),
        ("[::1]:443", None, ("::1", 443)),
        ("::1", None, ("::1", None)),
        (":80", None, ("", 80)),
    ],
)
def test_splits_authorities(
    text: str, default: int | None, expected: tuple[str, int | None]
) -> None:
    assert split_authority(text, default_port=default) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[::1", "without a closing"),
        ("[::1]x", "unexpected"),
        ("[::1]:", "is not a number"),
        ("example.test:", "is not a number"),
        ("example.test:http", "is not a number"),
        ("example.test:123456", "is not a number"),
        ("example.test:0", "port 0 is not"),
        ("example.test:65536", "port 65536 is not"),
    ],
)
def test_refuses_bad_authorities(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        split_authority(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "canonical", "kind"),
    [
        ("*", "*", ANY),
        ("*:443", "*:443", ANY),
        ("Example.COM.", "example.com", NAME),
        ("example.com:443", "example.com:443", NAME),
        ("*.Example.com", "*.example.com", SUFFIX),
        ("*.example.com.:8443", "*.example.com:8443", SUFFIX),
        ("*.com", "*.com", SUFFIX),
        ("10.1.2.3", "10.1.2.3", ADDRESS),
        ("127.1:80", "127.0.0.1:80", ADDRESS),
        ("10.0.0.0/8", "10.0.0.0/8", ADDRESS),
        ("10.0.0.0/8:443", "10.0.0.0/8:443", ADDRESS),
        ("10.1.2.3/32", "10.1.2.3", ADDRESS),
        ("0.0.0.0/0", "0.0.0.0/0", ADDRESS),
        ("::1", "::1", ADDRESS),
        ("[::1]:22", "[::1]:22", ADDRESS),
        ("[FD00::1]", "fd00::1", ADDRESS),
        ("fd00::/8", "fd00::/8", ADDRESS),
        ("[2001:db8::/32]:443", "[2001:db8::/32]:443", ADDRESS),
        ("[::ffff:10.0.0.0/104]:22", "10.0.0.0/8:22", ADDRESS),
        ("::ffff:127.0.0.1", "127.0.0.1", ADDRESS),
    ],
)
def test_parses_patterns_into_canonical_form(text: str, canonical: str, kind: str) -> None:
    pattern = parse_pattern(text)
    assert (pattern.text, pattern.kind) == (canonical, kind)
    assert parse_pattern(pattern.text) == pattern  # canonical text round-trips


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("a*.example.com", "only as the whole first label"),
        ("foo.*.com", "only as the whole first label"),
        ("*.*.com", "only once"),
        ("*.1.2.3", "not to IP addresses"),
        ("*.", "is empty"),
        ("*.a b", "spaces"),
        ("10.0.0.1/8", "bits set beyond the /8 prefix (the network is 10.0.0.0)"),
        ("fd00::1/8", "the network is fd00::"),
        ("10.0.0.0/33", "out of range"),
        ("10.0.0.0/x", "is not a number"),
        ("10.0.0.0/", "is not a number"),
        ("10.0.0.0/0008", "is not a number"),
        ("::ffff:10.0.0.0/8", "out of range"),
        ("example.com/8", "needs an IP address"),
        ("[fd00::/8", "without a closing"),
        ("[fd00::/8]x", "unexpected"),
        ("[fd00::/x]:1", "is not a number"),
        ("[fd00::%1/8]", "zone ids"),
        ("example.com:0", "port 0"),
        ("exa mple.com", "spaces"),
        ("1.2.3.256", "not a valid IPv4"),
    ],
)
def test_refuses_malformed_patterns(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_pattern(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("*", "allows every host"),
        ("*:443", "allows every host"),
        ("*.com", "under the top-level domain 'com'"),
        ("*.test:443", "under the top-level domain 'test'"),
        ("*.co.uk", "public suffix"),
        ("*.ngrok.io", "tunnel service"),
        ("*.s3.amazonaws.com", "bucket"),
        ("0.0.0.0/0", "wider than /8"),
        ("10.0.0.0/7", "wider than /8"),
        ("::/0", "wider than /16"),
        ("fd00::/8", "wider than /16"),
    ],
)
def test_refuses_over_broad_allow_patterns(text: str, problem: str) -> None:
    found = broad_pattern_problem(parse_pattern(text))
    assert found is not None
    assert problem in found


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "*.example.com",
        "*.pythonhosted.org",
        "*.my-bucket.s3.amazonaws.com",
        "10.0.0.0/8",
        "2001:db8::/32",
        "127.0.0.1:8443",
    ],
)
def test_accepts_specific_allow_patterns(text: str) -> None:
    assert broad_pattern_problem(parse_pattern(text)) is None


def test_every_broad_suffix_has_a_reason_and_is_refused() -> None:
    for suffix, reason in BROAD_SUFFIXES:
        assert reason
        assert broad_pattern_problem(parse_pattern(f"*.{suffix}")) is not None
        assert broad_pattern_problem(parse_pattern(suffix)) is None  # the exact name is fine


def _h(text: str) -> Host:
    return parse_host(text)


@pytest.mark.parametrize(
    ("pattern", "host", "port", "matches"),
    [
        ("*", "anything.test", 1, True),
        ("*", "10.0.0.1", 1, True),
        ("*:443", "a.test", 80, False),
        ("example.test", "example.test", 443, True),
        ("example.test", "EXAMPLE.test.", 443, True),
        ("example.test", "api.example.test", 443, False),
        ("example.test", "evil-example.test", 443, False),
        ("example.test", "example.test.evil.test", 443, False),
        ("example.test:443", "example.test", 80, False),
        ("example.test:443", "example.test", 443, True),
        ("*.example.test", "api.example.test", 443, True),
        ("*.example.test", "a.b.example.test", 443, True),
        ("*.example.test", "example.test", 443, False),  # the apex is not included
        ("*.example.test", "evilexample.test", 443, False),
        ("*.example.test", "example.test.evil.test", 443, False),
        ("127.0.0.1", "127.0.0.1", 80, True),
        ("127.0.0.1", "2130706433", 80, True),
        ("127.0.0.1", "localhost", 80, False),  # a name never matches an address
        ("localhost", "127.0.0.1", 80, False),  # and an address never a name
        ("10.0.0.0/8", "10.255.1.2", 80, True),
        ("10.0.0.0/8", "11.0.0.1", 80, False),
        ("10.0.0.0/8", "::ffff:10.0.0.1", 80, True),
        ("fd00::/8", "fdff::1", 80, True),
        ("fd00::/8", "10.0.0.1", 80, False),
        ("::1", "0:0::1", 22, True),
        ("0.0.0.0/0", "::1", 22, False),
    ],
)
def test_matches_patterns(pattern: str, host: str, port: int, matches: bool) -> None:
    assert pattern_matches(parse_pattern(pattern), _h(host), port) is matches


@pytest.mark.parametrize(
    ("outer", "inner", "covers"),
    [
        ("*", "anything.test:1", True),
        ("*", "*", True),
        ("*:443", "a.test", False),  # every port of a.test, only 443 of *
        ("*:443", "a.test:443", True),
        ("a.test", "*", False),
        ("a.test", "a.test", True),
        ("a.test", "a.test:443", True),
        ("a.test:443", "a.test", False),
        ("a.test", "b.test", False),
        ("a.test", "*.a.test", False),
        ("*.a.test", "a.test", False),
        ("*.a.test", "x.a.test", True),
        ("*.a.test", "*.x.a.test", True),
        ("*.a.test", "*.a.test", True),
        ("*.a.test", "*.test", False),
        ("*.a.test", "10.0.0.1", False),
        ("10.0.0.0/8", "10.1.0.0/16", True),
        ("10.1.0.0/16", "10.0.0.0/8", False),
        ("10.0.0.0/8", "10.1.2.3", True),
        ("10.0.0.0/8", "fd00::/16", False),
        ("10.0.0.0/8", "a.test", False),
    ],
)
def test_pattern_covers(outer: str, inner: str, covers: bool) -> None:
    assert pattern_covers(parse_pattern(outer), parse_pattern(inner)) is covers


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("*", "a.test", True),
        ("a.test", "*", True),
        ("a.test:443", "a.test:80", False),
        ("a.test:443", "a.test", True),
        ("a.test", "a.test", True),
        ("a.test", "b.test", False),
        ("*.a.test", "x.a.test", True),
        ("x.a.test", "*.a.test", True),
        ("*.a.test", "a.test", False),
        ("*.a.test", "*.x.a.test", True),
        ("*.test", "*.a.test", True),
        ("*.a.test", "*.b.test", False),
        ("10.0.0.0/8", "10.1.0.0/16", True),
        ("10.1.0.0/16", "10.0.0.0/8", True),
        ("10.1.0.0/16", "10.2.0.0/16", False),
        ("10.0.0.0/8", "a.test", False),
        ("a.test", "10.0.0.1", False),
    ],
)
def test_patterns_overlap(a: str, b: str, overlap: bool) -> None:
    assert patterns_overlap(parse_pattern(a), parse_pattern(b)) is overlap


def test_settings_store_host_patterns_in_canonical_form(world) -> None:  # type: ignore[no-untyped-def]
    world.user(
        {
            "network": {
                "mode": "allowlist",
                "allow": ["Example.TEST.", "127.1:8080"],
                "deny": ["*", "*.com"],
            }
        }
    )
    resolved = world.load(flags={"network": {"allow": ["!EXAMPLE.test"]}})
    assert resolved.policy.network.allow == ("127.0.0.1:8080",)
    assert resolved.policy.network.deny == ("*", "*.com")
