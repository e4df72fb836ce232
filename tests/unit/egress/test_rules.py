"""Request rules and masked-credential substitution (pure), and their settings."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from corral import _exceptions
from corral.egress._rules import MaskSpec, RequestPolicy
from corral.policy._hosts import parse_host
from corral.policy._requests import normalise_path, parse_rule, path_forms

from ..policy.conftest import SettingsWorld


@pytest.fixture
def world(tmp_path: Any) -> SettingsWorld:
    return SettingsWorld(str(tmp_path))


RULES = RequestPolicy(
    deny=("POST */git-receive-pack", "PUT registry.npmjs.org/*"),
    allow=("GET github.com/*", "POST github.com/*/git-upload-pack"),
)


@pytest.mark.parametrize(
    ("method", "host", "path", "refusal"),
    [
        ("POST", "github.com", "/o/r.git/git-receive-pack", "POST */git-receive-pack"),
        ("POST", "gitlab.com", "/o/r.git/git-receive-pack", "POST */git-receive-pack"),
        # evasions: escapes, dot segments, double slashes, case, a query
        ("POST", "gitlab.com", "/o/r.git/%67it-receive-pack", "POST */git-receive-pack"),
        ("POST", "gitlab.com", "//o/x/../r.git/./git-receive-pack?a=b", "POST */git-receive-pack"),
        ("post", "gitlab.com", "/o/r.git/GIT-RECEIVE-PACK", "POST */git-receive-pack"),
        # path parameters, which servers such as Tomcat and Jetty drop before routing
        ("POST", "gitlab.com", "/o/r.git/git-receive-pack;x", "POST */git-receive-pack"),
        ("POST", "gitlab.com", "/o/r.git;a=b/git-receive-pack;", "POST */git-receive-pack"),
        ("GET", "github.com", "/o/r;/../../x", None),  # allowed in both forms
        ("PUT", "registry.npmjs.org", "/corral-probe", "PUT registry.npmjs.org/*"),
        ("POST", "github.com", "/o/r.git/info/lfs", "not in network.allowRequests for github.com"),
        ("DELETE", "github.com", "/o/r", "not in network.allowRequests for github.com"),
        ("GET", "github.com", "/o/r.git/info/refs", None),
        ("POST", "github.com", "/o/r.git/git-upload-pack", None),
        ("GET", "registry.npmjs.org", "/corral-probe", None),  # no allow rule names it
        ("POST", "example.com", "/anything", None),
    ],
)
def test_decides_requests(method: str, host: str, path: str, refusal: str | None) -> None:
    got = RULES.decide(method, host, path)
    if refusal is None:
        assert got is None
    else:
        assert got is not None
        assert got.endswith(refusal)


def test_rules_name_the_hosts_whose_tls_is_terminated() -> None:
    rules = RequestPolicy(allow=("GET github.com/*",))
    assert rules.terminates(parse_host("github.com"), 443)
    assert not rules.terminates(parse_host("api.github.com"), 443)
    assert RequestPolicy(deny=("POST */x",)).terminates(parse_host("any.test"), 443)
    mask = MaskSpec(name="T", placeholder="p", secret="s", hosts=("*.example.test",))
    masked = RequestPolicy(masks=(mask,))
    assert masked.terminates(parse_host("api.example.test"), 443)
    assert not masked.terminates(parse_host("example.test"), 443)
    assert not RequestPolicy()


def test_path_parameters_give_a_second_form() -> None:
    assert path_forms(b"/a/b") == ("/a/b",)
    assert path_forms(b"/a;x/b;y?q;z") == ("/a;x/b;y", "/a/b")
    assert path_forms(b"/a/%3Bx") == ("/a/;x",)  # an escaped ';' is no delimiter
    # Tomcat's "..;": literally a segment named "..;" under /public, routed as ".."
    rules = RequestPolicy(allow=("GET h.test/public/*",))
    assert rules.decide("GET", "h.test", "/public/a;v=1") is None
    refusal = rules.decide("GET", "h.test", "/public/..;/private/x")
    assert refusal == "not in network.allowRequests for h.test"


def test_normalises_paths() -> None:
    assert normalise_path(b"/a//b/../c/%2e%2e/d?q#f") == "/a/d"
    assert normalise_path(b"/a/b/") == "/a/b/"
    assert normalise_path(b"x") == "/x"
    assert normalise_path(b"/../../etc") == "/etc"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("POST", 'expected "METHOD host/path"'),
        ("post */x", "not an HTTP method"),
        ("GET /x", "names no host"),
        ("GET a b/x", "cannot contain spaces"),
        ("GET exa%mple.com/x", "not a valid host"),
        ("GET github.com:8443/x", "no port"),
        ("GET [::1]/x", "no port"),
    ],
)
def test_refuses_malformed_rules(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rule(text)


def test_substitutes_only_towards_the_named_hosts_and_headers() -> None:
    mask = MaskSpec(
        name="GH",
        placeholder="corral_masked_abc",
        secret="ghp_real",
        hosts=("api.github.com",),
        headers=("authorization", "x-api-key"),
    )
    policy = RequestPolicy(masks=(mask,))
    basic = b"Basic " + base64.b64encode(b"x:corral_masked_abc")
    headers = [
        (b"authorization", b"Bearer corral_masked_abc"),
        (b"x-api-key", b"corral_masked_abc"),
        (b"x-other", b"corral_masked_abc"),
    ]
    out, used = policy.substitute(parse_host("api.github.com"), 443, headers)
    assert out == [
        (b"authorization", b"Bearer ghp_real"),
        (b"x-api-key", b"ghp_real"),
        (b"x-other", b"corral_masked_abc"),  # not a named header
    ]
    assert used == ("GH",)
    out, _ = policy.substitute(parse_host("api.github.com"), 443, [(b"authorization", basic)])
    assert out == [(b"authorization", b"Basic " + base64.b64encode(b"x:ghp_real"))]
    # another host: the placeholder stays
    out, used = policy.substitute(parse_host("evil.test"), 443, headers)
    assert out == headers
    assert used == ()
    assert "ghp_real" not in repr(mask)


def _error(world: SettingsWorld, data: Any) -> _exceptions.SettingsError:
    world.user(data)
    with pytest.raises(_exceptions.SettingsError) as info:
        world.load()
    return info.value


@pytest.mark.parametrize(
    ("data", "key", "message"),
    [
        ({"network": {"denyRequests": ["POST"]}}, "network.denyRequests[0]", "METHOD host/path"),
        (
            {"network": {"allowRequests": ["GET ok.test/", "get x/y"]}},
            "network.allowRequests[1]",
            "not an HTTP method",
        ),
        (
            {"credentials": [{"name": "T", "from": "env:T", "commands": ["*"], "mode": "mask"}]},
            "credentials[0].hosts",
            "needs the hosts",
        ),
        (
            {
                "credentials": [
                    {"name": "T", "from": "env:T", "commands": ["*"], "headers": ["x-key"]}
                ]
            },
            "credentials[0].headers",
            '"mask" only',
        ),
        (
            {
                "credentials": [
                    {
                        "name": "T",
                        "from": "env:T",
                        "commands": ["*"],
                        "hosts": ["a.test"],
                        "mode": "mask",
                        "headers": ["Host"],
                    }
                ]
            },
            "credentials[0].headers[0]",
            "cannot carry a credential",
        ),
    ],
)
def test_settings_errors_are_located(
    world: SettingsWorld, data: Any, key: str, message: str
) -> None:
    err = _error(world, data)
    assert err.key == key
    assert message in err.message


def test_settings_load_rules_and_masks(world: SettingsWorld) -> None:
    world.user(
        {
            "network": {
                "mode": "allowlist",
                "allow": ["github.com"],
                "denyRequests": ["POST  */git-receive-pack"],
                "allowRequests": ["GET github.com/*"],
            },
            "credentials": [
                {
                    "name": "GH_TOKEN",
                    "from": "env:GH",
                    "commands": ["git *"],
                    "hosts": ["github.com"],
                    "mode": "mask",
                    "headers": ["Authorization", "X-Token"],
                }
            ],
        }
    )
    policy = world.load().policy
    assert policy.network.deny_requests == ("POST */git-receive-pack",)
    assert policy.network.allow_requests == ("GET github.com/*",)
    (credential,) = policy.credentials
    assert credential.headers == ("authorization", "x-token")


def test_substitutes_in_the_query_only_when_the_mask_says_so() -> None:
    host = parse_host("api.example.test")
    with_query = MaskSpec(
        name="Q", placeholder="corral_masked_q", secret="s e/c", hosts=("api.example.test",),
        query=True,
    )  # fmt: skip
    policy = RequestPolicy(masks=(with_query,))
    target = b"/v1?token=corral_masked_q&x=corral_masked_q"
    assert policy.substitute_query(host, 443, target) == b"/v1?token=s%20e%2Fc&x=s%20e%2Fc"
    assert policy.substitute_query(host, 443, b"/corral_masked_q") == b"/corral_masked_q"
    assert policy.substitute_query(parse_host("evil.test"), 443, target) == target
    without = RequestPolicy(masks=(with_query.replace(query=False),))
    assert without.substitute_query(host, 443, target) == target


def test_settings_refuse_query_outside_mask_mode(world: SettingsWorld) -> None:
    credential = {"name": "T", "from": "env:T", "commands": ["*"], "query": True}
    err = _error(world, {"credentials": [credential]})
    assert err.key == "credentials[0].query"
    err = _error(world, {"credentials": [{**credential, "mode": "mask", "hosts": ["a.test"],
                                          "query": "yes"}]})  # fmt: skip
    assert "expected true or false" in err.message


def test_rule_hosts_are_canonical() -> None:
    assert parse_rule("GET GitHub.COM./x").text == "GET github.com/x"
    assert parse_rule("GET bücher.example/x").host == "xn--bcher-kva.example"
    assert RequestPolicy(deny=("GET bücher.example/*",)).terminates(
        parse_host("xn--bcher-kva.example"), 443
    )


def test_the_name_check_refuses_encrypted_client_hellos() -> None:
    from corral.egress._context import ProxyContext, ProxyLimits
    from corral.egress._resolve import StaticResolver
    from corral.egress._sni import ClientHello, NameRefused, check_name
    from corral.egress.allowlist import Allowlist

    ctx = ProxyContext(
        allowlist=Allowlist(allow=["a.test", "10.0.0.1"]),
        token="t",
        resolver=StaticResolver({}),
        limits=ProxyLimits(),
    )
    with pytest.raises(NameRefused, match="ECH"):
        check_name(ctx, ClientHello(sni="a.test", encrypted=True), parse_host("a.test"), 443)
    # an address-only tunnel with ECH: nothing named to check against
    check_name(ctx, ClientHello(sni=None, encrypted=True), parse_host("10.0.0.1"), 443)
    check_name(ctx, ClientHello(sni="A.TEST.", encrypted=False), parse_host("a.test"), 443)
