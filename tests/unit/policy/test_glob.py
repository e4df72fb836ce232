"""Globs for paths, environment variable names and command lines."""

from __future__ import annotations

import pytest

from corral.policy import PathPattern, match_word
from corral.policy._glob import _match_text, validate_pattern


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("", "empty pattern"),
        ("a\x00b", "pattern contains a NUL byte"),
        ("[abc", "unclosed '[' at position 0"),
        ("x/[!a", "unclosed '[' at position 2"),
        ("[]", "unclosed '[' at position 0"),
        ("ok", None),
        ("[]]", None),
        ("[!]]x", None),
        ("**/*.pem", None),
    ],
)
def test_validates_patterns(pattern: str, problem: str | None) -> None:
    assert validate_pattern(pattern) == problem


@pytest.mark.parametrize(
    ("pattern", "word", "expected"),
    [
        ("npm publish*", "npm publish --tag next", True),
        ("npm publish*", "npm install", False),
        ("*", "", True),
        ("*", "anything/with/slashes", True),
        ("LC_*", "LC_ALL", True),
        ("LC_*", "LANG", False),
        ("?", "a", True),
        ("?", "", False),
        ("a?c", "abc", True),
        ("[abc]x", "bx", True),
        ("[abc]x", "dx", False),
        ("[a-c]", "b", True),
        ("[a-c]", "d", False),
        ("[!a-c]", "d", True),
        ("[!a-c]", "b", False),
        ("[]]", "]", True),
        ("[!]]", "]", False),
        ("[!]]", "a", True),
        ("[a]]", "a]", True),
        ("[ab-]", "-", True),
        ("[a", "[a", True),  # an unclosed class is literal when matching
        ("[a", "a", False),
        ("*a*b", "xxaxxb", True),
        ("*a*b", "xxaxx", False),
        ("a*", "b", False),
        ("**", "x", True),
        ("abc", "abcd", False),
    ],
)
def test_matches_words(pattern: str, word: str, expected: bool) -> None:
    assert match_word(pattern, word) is expected


@pytest.mark.parametrize(
    ("pattern", "text"),
    [("a*", "a/b"), ("a?b", "a/b"), ("a[/]b", "a/b"), ("*", "/")],
)
def test_slash_is_not_matched_by_wildcards_in_path_segments(pattern: str, text: str) -> None:
    assert not _match_text(pattern, text, slash_is_special=True)
    assert _match_text(pattern, text, slash_is_special=False)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("**/.git/config", ".git/config", True),
        ("**/.git/config", "a/b/.git/config", True),
        ("**/.git/config", "a/.git/config/x", False),
        ("build/**", "build/x/y", True),
        ("build/**", "build", False),
        ("**/.git/hooks/**", "vendor/lib/.git/hooks/pre-commit", True),
        ("a/**/**/b", "a/x/b", True),
        ("a/**/b", "a/b", True),
        ("*.pem", "key.pem", True),
        ("*.pem", "dir/key.pem", False),
        ("./src/*.py", "src/x.py", True),
        ("/etc/*.conf", "/etc/a.conf", True),
        ("a/b", "a", False),
        ("a", "a/b", False),
    ],
)
def test_matches_paths(pattern: str, path: str, expected: bool) -> None:
    assert PathPattern(pattern).matches(path) is expected


@pytest.mark.parametrize(
    ("pattern", "directory", "expected"),
    [
        ("**/.git/hooks/**", "vendor", True),
        ("**/.git/hooks/**", "", True),
        (".vscode/**", ".vscode", True),
        (".vscode/**", "src", False),
        ("a/b", "a", True),
        ("a/b", "a/b", False),
        ("a/b", "a/b/c", False),
        ("a", "", True),
    ],
)
def test_knows_whether_a_directory_can_hold_matches(
    pattern: str, directory: str, expected: bool
) -> None:
    assert PathPattern(pattern).could_match_below(directory) is expected


def test_path_patterns_are_values() -> None:
    pattern = PathPattern("/etc/**")
    assert pattern.absolute
    assert not PathPattern("etc/**").absolute
    assert pattern == PathPattern("/etc/**")
    assert pattern != PathPattern("/etc/*")
    assert pattern != "/etc/**"
    assert hash(pattern) == hash(PathPattern("/etc/**"))
    assert repr(pattern) == "PathPattern('/etc/**')"


def test_invalid_path_patterns_are_refused() -> None:
    with pytest.raises(ValueError, match=r"invalid pattern '\[x': unclosed"):
        PathPattern("[x")


def test_the_literal_prefilter_never_skips_a_match() -> None:
    """``could_match_parts`` is a necessary condition of ``matches``: the write broker skips
    a row it rules out, so it must never rule out a path the row matches. Random patterns
    (literals, ``*``, ``?``, classes, ``**``) against random paths over the same names."""
    import random

    from corral.policy._glob import components

    rng = random.Random(20261125)
    names = ["a", "b", ".git", "hooks", "config", "x.pem", "[", "]", "a]", "ab"]
    pieces = ["*", "?", "[ab]", "[!a]", "a*", "*.pem", "**", "[]]"]
    checked = matched = skipped = 0
    for _ in range(4000):
        pattern = "/".join(
            rng.choice(names if rng.random() < 0.6 else pieces) for _ in range(rng.randint(1, 4))
        )
        if validate_pattern(pattern) is not None:
            continue
        glob = PathPattern(pattern)
        for _ in range(10):
            path = "/".join(rng.choice(names) for _ in range(rng.randint(1, 5)))
            checked += 1
            possible = glob.could_match_parts(components(path))
            if glob.matches(path):
                matched += 1
                assert possible, (pattern, path)
            elif not possible:
                skipped += 1
    assert checked > 30000 and matched > 1000 and skipped > 10000  # both sides exercised


def test_the_literal_prefilter_rules_out_paths_without_the_literals() -> None:
    from corral.policy._glob import components

    hooks = PathPattern("**/.git/hooks/**")
    assert hooks.literals == {".git", "hooks"}
    assert not hooks.could_match_parts(components("src/app.py"))
    assert not hooks.could_match_parts(components("vendor/.git/config"))
    assert hooks.could_match_parts(components("vendor/.git/hooks/pre-commit"))
    assert PathPattern("**/*.pem").literals == frozenset()  # no literal: always tried


@pytest.mark.parametrize(
    ("pattern", "root", "expected"),
    [
        # a match beginning in the root's own components
        ("**/.config/fish/**", "/home/u/.config", True),
        ("**/.config/fish/**", "/home/u/.config/fish", False),  # the root is inside it
        ("**/.config/fish", "/home/u/.config", True),
        ("**/.git/worktrees/*/commondir", "/r/.git/worktrees", True),
        ("**/.git/worktrees/*/commondir", "/r/.git", True),
        ("**/.git/modules/**/hooks/**", "/r/.git/modules/sub", True),
        ("**/.local/lib/python*/site-packages/*.pth", "/h/.local/lib/python3.11", True),
        # the root wholly inside what the pattern protects (a Claude Code worktree session)
        ("**/.claude/**", "/r/.claude/worktrees/one", False),
        ("**/.git", "/r/new/.git", False),
        # nothing of the root can begin a match
        ("**/.config/fish/**", "/srv/ws", False),
        ("**/.git/hooks/**", "/r/.git/worktrees", False),
        ("**/.bashrc", "/home/u", False),  # one segment: the match is the name itself
        # not an any-depth pattern: relative to its root only
        (".config/fish/**", "/home/u/.config", False),
        ("/etc/**", "/etc", False),
    ],
)
def test_knows_which_patterns_reach_into_a_root_from_above(
    pattern: str, root: str, expected: bool
) -> None:
    assert PathPattern(pattern).reaches_into(root) is expected


def test_a_match_beginning_above_the_root_is_always_announced() -> None:
    """The write broker, the hook and ``apply`` match a pattern against the whole path only
    for the roots :meth:`PathPattern.reaches_into` names, so it must name every root where
    the whole path matches and the root-relative one does not (unless the root itself
    matches, or is DIR of a pattern DIR/**: the root lies inside what it protects). Random any-depth patterns against
    random roots and paths below them."""
    import random

    rng = random.Random(20261207)
    names = ["a", "b", ".git", "hooks", "config", "x.pem", "ab"]
    pieces = ["*", "?", "[ab]", "a*", "**"]
    checked = above = 0
    for _ in range(3000):
        tail = "/".join(
            rng.choice(names if rng.random() < 0.7 else pieces) for _ in range(rng.randint(1, 4))
        )
        glob = PathPattern("**/" + tail)
        for _ in range(10):
            root = "/" + "/".join(rng.choice(names) for _ in range(rng.randint(1, 4)))
            rel = "/".join(rng.choice(names) for _ in range(rng.randint(1, 3)))
            checked += 1
            if glob.matches(f"{root}/{rel}") and not glob.matches(rel):
                parts = tail.split("/")
                while len(parts) > 1 and parts[-1] == "**":
                    parts.pop()  # DIR of DIR/** (a run of ** is one **)
                directory = PathPattern("/".join(["**", *parts]))
                if glob.matches(root) or (tail.endswith("**") and directory.matches(root)):
                    assert not glob.reaches_into(root), (glob, root)
                    continue
                above += 1
                assert glob.reaches_into(root), (glob, root, rel)
    assert checked == 30000 and above > 150  # the case is exercised


def test_an_escaped_path_matches_only_itself() -> None:
    from corral.policy._glob import escape

    for path in ("a*b/c?d/[x", "tools/githooks", "x]y"):
        pattern = PathPattern(escape(path))
        assert pattern.matches(path)
    assert not PathPattern(escape("a*b")).matches("aXb")
    assert not PathPattern(escape("c?d")).matches("cXd")
