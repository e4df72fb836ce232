"""Claude Code Bash permission rules applied to the original command (the hook's check)."""

from __future__ import annotations

import pytest

from corral.integrations._permissions import matches, simple_commands


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("rm:*", "rm", True),
        ("rm:*", "rm -rf /", True),
        ("rm:*", "rmdir x", False),
        ("git push:*", "git push origin main", True),
        ("git push:*", "git pushx", False),
        ("npm *", "npm", True),  # a lone trailing " *" also matches nothing
        ("npm *", "npm publish", True),
        ("npm *", "npmx", False),
        ("* install", "pip install", True),
        ("* install", "pip installer", False),
        ("git * main", "git push origin main", True),
        ("git * main", "git push origin dev", False),
        ("ls", "ls", True),
        ("ls", "ls -la", False),
        ("*", "anything at all", True),
    ],
)
def test_rule_specifiers_match_as_claude_code_documents(
    pattern: str, text: str, expected: bool
) -> None:
    assert matches(pattern, text) is expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("ls && rm x", "rm x"),
        ("ls; rm x", "rm x"),
        ("ls | rm x", "rm x"),
        ("ls & rm x", "rm x"),
        ("ls\nrm x", "rm x"),
        ("echo $(rm x)", "rm x"),
        ("echo `rm x`", "rm x"),
        ('echo "$(rm x)"', "rm x"),
        ("(rm x)", "rm x"),
        ("{ rm x; }", "rm x"),
        ("A=1 B=2 rm x", "rm x"),
        ("sudo -n rm x", "rm x"),
        ("timeout 5 rm x", "rm x"),
        ("env -i A=1 /usr/bin/nice -n 5 rm x", "rm x"),
        ("'rm' \"x\"", "rm x"),
        ("r\\m x", "rm x"),
    ],
)
def test_compound_commands_are_judged_by_each_simple_command(command: str, expected: str) -> None:
    assert expected in simple_commands(command)


def test_separators_inside_single_quotes_do_not_split() -> None:
    assert simple_commands("echo 'a; rm x'") == ["echo 'a; rm x'", "echo a; rm x"]


def test_disallowed_tools_values_split_outside_parentheses() -> None:
    from corral.integrations._permissions import _split_rules

    assert _split_rules("Bash(git push:*),Edit Write") == ["Bash(git push:*)", "Edit", "Write"]
    assert _split_rules("Bash(rm -rf, x)") == ["Bash(rm -rf, x)"]
