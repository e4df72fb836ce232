"""``corral install claude-code``: merge into settings.json, idempotent, reversible."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from ..conftest import World, corral_executable, hook_corral

EXISTING: dict[str, Any] = {
    "model": "opus",
    "permissions": {"allow": ["Bash(npm test:*)"], "deny": ["Read(./.env)"]},
    "env": {"FOO": "bar"},
    "hooks": {
        "PreToolUse": [
            {"matcher": "Bash", "hooks": [{"type": "command", "command": "~/bin/log-bash.sh"}]},
        ],
        "PostToolUse": [
            {
                "matcher": "Write|Edit",
                "hooks": [{"type": "command", "command": "prettier --write"}],
            },
        ],
    },
    "unknownFutureKey": [1, {"nested": True}],
}


def install(world: World, *args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [corral_executable(), "install", "claude-code", *args],
        capture_output=True,
        text=True,
        env=world.environ,
        cwd=cwd or world.workspace,
        timeout=60,
        check=False,
    )


def user_settings(world: World) -> str:
    return os.path.join(world.home, ".claude", "settings.json")


def write(path: str, data: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=4)


def load(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def corral_groups(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        g
        for g in data["hooks"]["PreToolUse"]
        if any(" hook claude-code" in h["command"] for h in g["hooks"])
    ]


def test_install_keeps_every_existing_key_and_hook(world: World) -> None:
    path = user_settings(world)
    write(path, EXISTING)
    result = install(world, "--user")
    assert result.returncode == 0, result.stderr
    assert "installed corral's PreToolUse hook" in result.stdout
    data = load(path)
    for key in ("model", "permissions", "env", "unknownFutureKey"):
        assert data[key] == EXISTING[key]
    assert data["hooks"]["PostToolUse"] == EXISTING["hooks"]["PostToolUse"]
    assert data["hooks"]["PreToolUse"][0] == EXISTING["hooks"]["PreToolUse"][0]
    (ours,) = corral_groups(data)
    assert ours["matcher"] == "*"
    assert ours["hooks"] == [
        {
            "type": "command",
            "command": f"{hook_corral()} hook claude-code || exit 2",
            "timeout": 30,
        }
    ]


def test_installing_twice_changes_nothing(world: World) -> None:
    path = user_settings(world)
    write(path, EXISTING)
    install(world)
    with open(path, "rb") as f:
        first = f.read()
    stat_before = os.stat(path)
    result = install(world, "--user")
    assert "already in" in result.stdout
    with open(path, "rb") as f:
        assert f.read() == first
    assert os.stat(path).st_mtime_ns == stat_before.st_mtime_ns


def test_uninstall_restores_the_original_settings(world: World) -> None:
    path = user_settings(world)
    write(path, EXISTING)
    install(world)
    result = install(world, "--uninstall")
    assert "removed corral's hook" in result.stdout
    assert load(path) == EXISTING
    assert "is not in" in install(world, "--uninstall").stdout


def test_install_into_a_missing_file_and_uninstall_removes_it(world: World) -> None:
    path = user_settings(world)
    install(world)
    assert len(corral_groups(load(path))) == 1
    install(world, "--uninstall")
    assert not os.path.exists(path)


ODD_FORMAT = (
    '{\n    "model":"opus" ,\n\t"hooks": {"PreToolUse": [ ]},\n'
    '    "env": {"Z": "1", "A": "ünïcødé"}   }'
)


def test_uninstall_restores_the_file_byte_for_byte(world: World) -> None:
    path = user_settings(world)
    World.write(path, ODD_FORMAT)
    install(world)
    assert corral_groups(load(path))
    install(world)  # a re-install in between keeps the original
    assert "removed corral's hook" in install(world, "--uninstall").stdout
    with open(path, "rb") as f:
        assert f.read() == ODD_FORMAT.encode()


def test_uninstall_after_the_user_edited_the_file_keeps_their_edit(world: World) -> None:
    path = user_settings(world)
    World.write(path, ODD_FORMAT)
    install(world)
    data = load(path)
    data["model"] = "sonnet"
    write(path, data)
    install(world, "--uninstall")
    after = load(path)
    assert after["model"] == "sonnet" and "hooks" not in after
    assert after["env"] == {"Z": "1", "A": "ünïcødé"}


def test_a_users_hook_sharing_corrals_group_survives_reinstall_and_uninstall(
    world: World,
) -> None:
    path = user_settings(world)
    install(world)
    data = load(path)
    (ours,) = corral_groups(data)
    mine = {"type": "command", "command": "~/bin/audit-every-tool.sh"}
    ours["hooks"].append(mine)
    write(path, data)
    for _ in range(2):
        install(world)
        data = load(path)
        assert [mine] in [g["hooks"] for g in data["hooks"]["PreToolUse"]], data
        (ours,) = corral_groups(data)  # corral's hook has a group of its own again
        assert ours["hooks"][0]["command"].startswith(hook_corral())
    install(world, "--uninstall")
    assert load(path)["hooks"]["PreToolUse"] == [{"matcher": "*", "hooks": [mine]}]


def test_a_symlinked_settings_file_is_written_through_the_link(world: World) -> None:
    real = os.path.join(world.root, "dotfiles", "claude-settings.json")
    World.write(real, ODD_FORMAT)
    os.makedirs(os.path.join(world.home, ".claude"))
    os.symlink(real, user_settings(world))
    install(world)
    assert os.path.islink(user_settings(world))
    assert corral_groups(load(real))
    install(world, "--uninstall")
    assert os.path.islink(user_settings(world))
    with open(real, "rb") as f:
        assert f.read() == ODD_FORMAT.encode()


def test_the_installed_hook_blocks_when_corral_cannot_start(world: World) -> None:
    install(world)
    (ours,) = corral_groups(load(user_settings(world)))
    command = ours["hooks"][0]["command"].replace(hook_corral(), "/nonexistent/corral")
    result = subprocess.run(
        ["sh", "-c", command], input=b"{}", capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 2  # Claude Code blocks the call


def test_a_stale_corral_hook_is_replaced_not_duplicated(world: World) -> None:
    path = user_settings(world)
    stale = {
        "matcher": "Bash",
        "hooks": [{"type": "command", "command": "/old/venv/bin/corral hook claude-code"}],
    }
    write(path, {"hooks": {"PreToolUse": [stale, *EXISTING["hooks"]["PreToolUse"]]}})
    install(world)
    data = load(path)
    (ours,) = corral_groups(data)
    assert ours["hooks"][0]["command"].startswith(hook_corral())
    assert data["hooks"]["PreToolUse"][1] == EXISTING["hooks"]["PreToolUse"][0]


def test_project_scope_writes_the_projects_settings(world: World) -> None:
    sub = os.path.join(world.workspace, "src", "pkg")
    os.makedirs(sub)
    result = install(world, "--project", cwd=sub)
    assert result.returncode == 0, result.stderr
    assert corral_groups(load(os.path.join(world.workspace, ".claude", "settings.json")))
    assert not os.path.exists(user_settings(world))


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"hooks": []}', "'hooks' is not an object"),
        ('{"hooks": {"PreToolUse": {}}}', "'hooks.PreToolUse' is not a list"),
    ],
)
def test_malformed_settings_are_refused_and_left_alone(
    world: World, content: str, reason: str
) -> None:
    path = user_settings(world)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(content)
    result = install(world)
    assert result.returncode == 125
    assert reason in result.stderr
    with open(path) as f:
        assert f.read() == content


def test_the_file_mode_is_kept(world: World) -> None:
    path = user_settings(world)
    write(path, EXISTING)
    os.chmod(path, 0o600)
    install(world)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [n for n in os.listdir(os.path.dirname(path)) if n != "settings.json"] == []


def test_the_installed_hook_answers_like_corral_hook(world: World) -> None:
    """The registered command (the fast client when built) gives corral hook's exact answer."""
    install(world)
    (ours,) = corral_groups(load(user_settings(world)))
    payload = json.dumps(
        {
            "session_id": "s-install",
            "cwd": world.workspace,
            "hook_event_name": "PreToolUse",
            "tool_name": "Write",
            "tool_input": {"file_path": world.victim, "content": "x"},
        }
    ).encode()

    def hook(command: list[str]) -> tuple[int, bytes, bytes]:
        result = subprocess.run(
            command,
            input=payload,
            capture_output=True,
            env=world.environ,
            cwd=world.workspace,
            timeout=60,
            check=False,
        )
        return result.returncode, result.stdout, result.stderr

    installed = hook(["sh", "-c", ours["hooks"][0]["command"]])
    assert installed == hook([corral_executable(), "hook", "claude-code"])
    assert b'"permissionDecision":"deny"' in installed[1]
