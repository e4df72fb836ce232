"""Deeply nested JSON from untrusted places is a clear error, never a RecursionError."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from corral._exceptions import SettingsError, UsageError
from corral._jsonfast import MAX_DEPTH, JSONError, check_depth, loads
from corral.integrations._jsonfile import load_object
from corral.policy._validate import parse_settings

DEEP = '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}"


def test_loads_refuses_deep_nesting_with_the_place() -> None:
    with pytest.raises(JSONError) as info:
        loads(DEEP)
    assert info.value.reason == f"nested deeper than {MAX_DEPTH} levels"
    assert (info.value.line, info.value.column) == (1, 6 + MAX_DEPTH)  # "{" counts too


def test_the_limit_is_exact_and_brackets_in_strings_do_not_count() -> None:
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert loads(at_limit) is not None
    with pytest.raises(JSONError):
        loads("[" + at_limit + "]")
    text = '["' + "[{" * 1000 + '\\"[" ]'
    check_depth(text)
    assert loads(text) == ["[{" * 1000 + '"[']


def test_a_deep_settings_file_names_the_file_and_the_depth() -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings(DEEP.encode(), source="/h/.config/corral/settings.json")
    assert str(info.value).startswith("/h/.config/corral/settings.json: malformed JSON at line 1")
    assert f"nested deeper than {MAX_DEPTH} levels" in str(info.value)


def test_a_deep_plugin_file_is_refused(tmp_path: object) -> None:
    path = os.path.join(str(tmp_path), "hooks.json")
    with open(path, "w") as f:
        f.write(DEEP)
    with pytest.raises(UsageError, match=f"not valid JSON .*nested deeper than {MAX_DEPTH}"):
        load_object(path)


def test_a_deep_hook_input_is_answered_not_crashed(tmp_path: object) -> None:
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "CORRAL_SERVER": "off"}
    result = subprocess.run(
        [sys.executable, "-m", "corral", "hook", "claude-code"],
        input=DEEP.encode(),
        capture_output=True,
        env=env,
        cwd=str(tmp_path),
        timeout=60,
        check=False,
    )
    assert b"Traceback" not in result.stderr
    assert b"RecursionError" not in result.stderr
    assert b"nested deeper than" in result.stderr
    assert result.returncode == 2  # the hook blocks the tool call it cannot read


def _depth_by_characters(text: str) -> int:
    """The deepest nesting outside strings, one character at a time (the reference)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def test_the_scan_in_c_agrees_with_a_character_loop_on_strings_escapes_and_brackets() -> None:
    """Brackets inside strings, escaped quotes and escaped backslashes before quotes: the
    fast scan refuses exactly the documents the character loop finds too deep. (A backslash
    outside a string is not JSON: the parser stops there, at a depth both scans agree on.)"""
    import random

    from corral._jsonfast import JSONError, check_depth

    def string() -> str:  # a JSON string: a backslash only ever escapes (as the parser needs)
        pieces = ["[", "{", "]", "x", "\\\\", '\\"']
        return '"' + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6))) + '"'

    rng = random.Random(12)
    for _ in range(3000):
        text = "".join(
            rng.choice(["[", "[", "]", "{", "}", "a", string()]) for _ in range(rng.randint(0, 30))
        )
        for limit in (0, 1, 3):
            try:
                check_depth(text, limit=limit)
                refused = False
            except JSONError:
                refused = True
            if _depth_by_characters(text) <= limit and text.count("[") + text.count("{") > limit:
                assert not refused, (text, limit)
            elif _depth_by_characters(text) > limit:
                assert refused, (text, limit)
