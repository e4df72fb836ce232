"""The generated Seatbelt profile: deny by default, balanced, every allowance traced to the policy."""

from __future__ import annotations

import re

import pytest

from corral.backends._sbpl import build_profile, glob_to_regex

WS = "/Users/me/proj (x)"


def _profile(**changes: object):  # type: ignore[no-untyped-def]
    args = {
        "workspace": WS,
        "tmpdir": "/private/tmp/corral-1",
        "read_only": False,
        "allow_write": ("/Users/me/cache",),
        "deny_read": ("/Users/me/.ssh",),
        "allow_read": ("/Users/me/.ssh/config",),
        "protect": ("**/.git/hooks/**", "**/.bashrc"),
        "deny_write": ("**/*.pem",),
        "network_mode": "none",
    }
    args.update(changes)
    return build_profile(**args)  # type: ignore[arg-type]


def _balanced(text: str) -> bool:
    depth = 0
    for line in text.splitlines():
        if line.startswith(";"):
            continue
        for ch in re.sub(r'"(\\.|[^"\\])*"', '""', line):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth < 0:
                return False
    return depth == 0


def test_opens_with_deny_default_and_is_balanced() -> None:
    text = _profile().text
    assert text.splitlines()[:2] == ["(version 1)", "(deny default)"]
    assert _balanced(text)


def test_every_allowance_carries_its_reason() -> None:
    lines = _profile().text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("(allow"):
            assert lines[i - 1].startswith("; reason: ")
            assert len(lines[i - 1]) > len("; reason: ")


def test_untrusted_paths_are_parameters_never_profile_text() -> None:
    profile = _profile()
    assert WS not in profile.text
    assert "/Users/me" not in profile.text
    values = dict(profile.params).values()
    assert WS in values
    assert "/Users/me/.ssh" in values
    assert "/Users/me/.ssh/config" in values
    for name, _value in profile.params:
        assert f'(param "{name}")' in profile.text


def test_traces_each_rule_to_the_policy() -> None:
    text = _profile().text
    assert "; filesystem.denyRead" in text
    assert "filesystem.allowRead" in text
    assert "filesystem.allowWrite" in text
    assert "; protected: **/.git/hooks/**" in text
    assert "; protected: **/*.pem" in text


def test_network_none_opens_nothing_and_open_opens_all() -> None:
    assert "network" not in _profile().text.replace("network.mode", "")
    assert "(allow network*)" in _profile(network_mode="open").text
    proxy = _profile(network_mode="allowlist", proxy_port=3128).text
    assert '(allow network-outbound (remote tcp "localhost:3128"))' in proxy


def test_protect_globs_become_anchored_regexes_with_ancestors() -> None:
    regex, ancestors = glob_to_regex("**/.git/hooks/**")
    assert re.search(regex, "/p/a/.git/hooks/pre-commit")
    assert re.search(regex, "/p/.git/hooks")
    assert not re.search(regex, "/p/.git/hooksx/y")
    assert any(re.search(a, "/p/sub/.git") for a in ancestors)
    assert re.search(glob_to_regex("**/*.pem")[0], "/p/k/x.pem")
    with pytest.raises(ValueError, match="character classes"):
        glob_to_regex("**/[ab].txt")


def test_read_only_workspace_is_not_writable() -> None:
    profile = _profile(read_only=True)
    assert WS not in [v for n, v in profile.params if n.startswith("WRITE")]
