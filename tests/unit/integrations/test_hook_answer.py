"""The hook's answer is a function of its input and the environment it is given.

The corral server answers hooks for many clients from one process, so
:func:`corral.cli.commands.hook.answer` must not read this process's
environment (``$HOME`` for ``~``, XDG directories, ``CORRAL_*``).
"""

from __future__ import annotations

import json
import os

import pytest

from corral.cli.commands.hook import answer
from corral.integrations.claude_code_hook import expand_user


@pytest.fixture
def client(tmp_path: object) -> dict[str, str]:
    root = str(tmp_path)
    for name in ("home", "ws/.git", "server-home"):
        os.makedirs(os.path.join(root, name))
    return {
        "HOME": os.path.join(root, "home"),
        "PATH": "/usr/bin:/bin",
        "WS": os.path.join(root, "ws"),
        "SERVER_HOME": os.path.join(root, "server-home"),
    }


def _input(cwd: str, tool: str, tool_input: dict[str, object]) -> bytes:
    return json.dumps(
        {
            "session_id": "s",
            "cwd": cwd,
            "hook_event_name": "PreToolUse",
            "tool_name": tool,
            "tool_input": tool_input,
        }
    ).encode()


def test_tilde_and_settings_come_from_the_given_environment(
    client: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # this process's own environment points somewhere else entirely
    monkeypatch.setenv("HOME", client["SERVER_HOME"])
    monkeypatch.setenv("CORRAL_SETTINGS", "/nonexistent/settings.json")
    environ = {"HOME": client["HOME"], "PATH": client["PATH"]}
    result = answer(
        "claude-code",
        _input(client["WS"], "Write", {"file_path": "~/.bashrc", "content": ""}),
        environ=environ,
        python_cli=("/venv/bin/corral",),
    )
    assert (result.status, result.stderr) == (0, b"")
    reason = json.loads(result.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    assert f"Write of {client['HOME']}/.bashrc is not allowed" in reason


def test_a_broken_input_is_a_blocking_answer_not_an_exception(client: dict[str, str]) -> None:
    result = answer("claude-code", b"\xff", environ={"HOME": client["HOME"]}, python_cli=())
    assert result.status == 2 and result.stdout == b""
    assert result.stderr.startswith(b"corral: the hook input is not valid JSON")
    other = answer("nope", b"{}", environ={}, python_cli=())
    assert other.stderr == b"corral: unknown hook nope: only 'corral hook claude-code' exists\n"


@pytest.mark.parametrize(
    ("path", "environ", "expected"),
    [
        ("~", {"HOME": "/h/me/"}, "/h/me"),
        ("~/x", {"HOME": "/h/me"}, "/h/me/x"),
        ("~/x", {"HOME": ""}, "/x"),
        ("~", {"HOME": ""}, "/"),
        ("~root/x", {"HOME": "/h/me"}, os.path.expanduser("~root") + "/x"),
        ("~no-such-user-corral/x", {"HOME": "/h/me"}, "~no-such-user-corral/x"),
        ("x/~", {"HOME": "/h/me"}, "x/~"),
    ],
)
def test_expand_user_is_expanduser_with_the_given_home(
    path: str, environ: dict[str, str], expected: str
) -> None:
    assert expand_user(path, environ) == expected
