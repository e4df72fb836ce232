"""load_settings: workspace detection, explicit inputs, integration keys, start-up cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from corral.policy import Key, find_workspace, load_settings, policy_digest
from corral.policy import _keys as k

from .conftest import SettingsWorld

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))


# ---------------------------------------------------------------- workspace
def test_the_workspace_is_the_git_top_level_above_cwd(world: SettingsWorld) -> None:
    deep = os.path.join(world.workspace, "a", "b")
    os.makedirs(deep)
    resolved = world.load(cwd=deep)
    assert resolved.workspace == world.workspace
    assert resolved.provenance["filesystem.workspace"] == "detected: git top-level"


def test_a_git_file_marks_a_worktree_top_level(world: SettingsWorld) -> None:
    tree = os.path.join(world.root, "tree")
    os.makedirs(os.path.join(tree, "src"))
    world.write(os.path.join(tree, ".git"), "gitdir: /elsewhere\n")
    assert find_workspace(os.path.join(tree, "src"), home=world.home) == (
        tree,
        "detected: git top-level",
    )


def test_without_git_the_workspace_is_cwd(world: SettingsWorld) -> None:
    plain = os.path.join(world.root, "plain")
    os.makedirs(plain)
    resolved = world.load(cwd=plain)
    assert resolved.workspace == plain
    assert resolved.provenance["filesystem.workspace"] == "detected: current directory"


def test_a_dotfiles_repository_in_home_is_not_a_project(world: SettingsWorld) -> None:
    os.makedirs(os.path.join(world.home, ".git"))
    project = os.path.join(world.home, "notes")
    os.makedirs(project)
    assert find_workspace(project, home=world.home) == (project, "detected: current directory")


def test_root_is_never_an_implicit_workspace(world: SettingsWorld) -> None:
    from corral._exceptions import SettingsError

    with pytest.raises(SettingsError, match="refusing to use / as the workspace"):
        world.load(cwd="/")
    with pytest.raises(SettingsError, match="it is a directory above"):
        world.load(cwd="/", workspace="/")  # explicit: still above every home directory
    forced = world.load(cwd="/", workspace="/", flags={"filesystem": {"allowHomeWorkspace": True}})
    assert forced.workspace == "/"


@pytest.mark.parametrize("workspace", [None, "~", "~/.."])
def test_a_home_workspace_is_refused_unless_allowed(
    world: SettingsWorld, workspace: str | None
) -> None:
    from corral._exceptions import SettingsError

    with pytest.raises(SettingsError, match="refusing the workspace") as info:
        world.load(cwd=world.home, workspace=workspace)
    assert "--allow-home-workspace" in (info.value.hint or "")
    resolved = world.load(
        cwd=world.home, workspace=workspace, flags={"filesystem": {"allowHomeWorkspace": True}}
    )
    relative = (workspace or ".").replace("~", ".")
    assert resolved.workspace == os.path.normpath(os.path.join(world.home, relative))
    assert any("allowHomeWorkspace" in warning for warning in resolved.warnings)


def test_the_passwd_home_is_a_home_too(world: SettingsWorld) -> None:
    import pwd

    from corral._exceptions import SettingsError

    passwd_home = pwd.getpwuid(os.getuid()).pw_dir
    assert passwd_home != world.home  # the fixture's $HOME is elsewhere, as under sudo
    with pytest.raises(SettingsError, match="refusing the workspace"):
        world.load(cwd=world.home, workspace=passwd_home)


def test_a_project_file_cannot_allow_a_home_workspace(world: SettingsWorld) -> None:
    from corral._exceptions import SettingsError

    os.makedirs(os.path.join(world.home, ".corral"))
    with open(os.path.join(world.home, ".corral", "settings.json"), "w") as f:
        f.write('{"filesystem": {"allowHomeWorkspace": true}}')
    with pytest.raises(SettingsError, match="refusing the workspace"):
        world.load(cwd=world.home)


def test_the_workspace_can_come_from_a_settings_file(world: SettingsWorld) -> None:
    other = os.path.join(world.root, "other")
    os.makedirs(other)
    world.user({"filesystem": {"workspace": "~/../other", "allowWrite": ["out"]}})
    resolved = world.load()
    assert resolved.workspace == other
    assert resolved.policy.filesystem.allow_write == (f"{other}/out",)
    assert resolved.provenance["filesystem.workspace"] == f"user {world.user_file}"


def test_later_layers_decide_the_workspace(world: SettingsWorld) -> None:
    first = os.path.join(world.root, "first")
    second = os.path.join(world.root, "second")
    os.makedirs(first)
    os.makedirs(second)
    world.user({"filesystem": {"workspace": first}})
    extra = world.write("extra.json", {"filesystem": {"workspace": second}})
    assert world.load(settings_files=[extra]).workspace == second
    assert (
        world.load(settings_files=[extra], flags={"filesystem": {"workspace": first}}).workspace
        == first
    )


def test_project_files_are_read_from_the_workspace(world: SettingsWorld) -> None:
    world.project({"resources": {"pids": 10}})
    resolved = world.load(cwd=world.root, workspace=world.workspace)
    assert resolved.policy.resources.pids == 10


# ---------------------------------------------------------------- inputs
def test_defaults_come_from_the_process(
    world: SettingsWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(world.workspace)
    monkeypatch.setenv("HOME", world.home)
    monkeypatch.setenv("CORRAL_BACKEND", "docker")
    for name in (
        "XDG_CONFIG_HOME",
        "XDG_STATE_HOME",
        "CORRAL_SETTINGS",
        "CORRAL_PROFILE",
        "CORRAL_ISOLATION",
    ):
        monkeypatch.delenv(name, raising=False)
    resolved = load_settings()
    assert resolved.workspace == world.workspace
    assert resolved.policy.backend == "docker"
    assert resolved.policy.filesystem.deny_read[0] == f"{world.home}/.ssh"


def test_a_relative_cwd_is_relative_to_the_process_cwd(
    world: SettingsWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(world.root)
    assert world.load(cwd="ws").workspace == world.workspace


def test_a_relative_home_environment_falls_back_to_the_user_database(
    world: SettingsWorld,
) -> None:
    import pwd

    from corral.policy._locations import default_home

    assert default_home({"HOME": "relative"}) == pwd.getpwuid(os.getuid()).pw_dir
    assert default_home({}) == pwd.getpwuid(os.getuid()).pw_dir
    assert default_home({"HOME": "/x//y/"}) == "/x/y"


def test_settings_files_may_start_with_a_tilde(world: SettingsWorld) -> None:
    world.write(os.path.join(world.home, "extra.json"), {"image": "x"})
    assert world.load(settings_files=["~/extra.json"]).policy.image == "x"


def test_reports_the_layers_it_considered(world: SettingsWorld) -> None:
    world.project({})
    resolved = world.load(flags={"image": "x"})
    assert [(layer.name, layer.found, layer.trusted) for layer in resolved.layers] == [
        ("defaults", True, True),
        ("user", False, True),
        ("project", True, False),
        ("local", False, False),
        ("flags", True, True),
    ]
    project = resolved.layers[2]
    assert project.path == world.project_file
    assert project.sha256 is not None
    assert len(project.sha256) == 64


def test_the_digest_follows_the_policy(world: SettingsWorld) -> None:
    first = policy_digest(world.load().policy)
    assert first == policy_digest(world.load().policy)
    assert len(first) == 64
    assert policy_digest(world.load(flags={"resources": {"pids": 5}}).policy) != first


# ---------------------------------------------------------------- integrations
# The core keys plus test rows (the shipped integration rows are left out, so
# these tests do not depend on them).
TABLE = k.KeyTable(k.CORE_KEYS).extended(
    [
        Key(
            path="integrations.claudeCode.unsandboxedCommands",
            kind=k.COMMAND_PATTERNS,
            tighten=k.ADDITIONS,
            description="Commands let through.",
        ),
        Key(
            path="integrations.mcp.maxSandboxes",
            kind=k.INT,
            tighten=k.LOWER,
            default=8,
            description="Sandboxes at once.",
        ),
        Key(path="integrations.mcp.tags", kind=k.STRINGS, tighten=k.LOOSENS, description="Labels."),
        Key(
            path="integrations.mcp.mounts",
            kind=k.PATH_MAP,
            tighten=k.LOOSENS,
            description="Extra mounts.",
        ),
    ]
)


def test_integration_keys_are_validated_merged_and_returned(world: SettingsWorld) -> None:
    world.user(
        {
            "integrations": {
                "claudeCode": {"unsandboxedCommands": ["git status"]},
                "mcp": {"maxSandboxes": 4, "tags": ["a", "!b"], "mounts": {"data": "data"}},
            }
        }
    )
    resolved = world.load(
        keys=TABLE, flags={"integrations": {"claudeCode": {"unsandboxedCommands": ["ls*"]}}}
    )
    assert resolved.integrations == {
        "claudeCode.unsandboxedCommands": ("git status", "ls*"),
        "mcp.maxSandboxes": 4,
        "mcp.tags": ("a",),
        "mcp.mounts": (("data", f"{world.workspace}/data"),),
    }
    assert world.load(keys=TABLE).integrations["mcp.maxSandboxes"] == 4


def test_integration_keys_follow_the_untrusted_rule(world: SettingsWorld) -> None:
    world.project({"integrations": {"mcp": {"maxSandboxes": 100}}})
    resolved = world.load(keys=TABLE)
    assert resolved.integrations["mcp.maxSandboxes"] == 8
    assert len(resolved.warnings) == 1


def test_integration_keys_are_unknown_to_other_tables(world: SettingsWorld) -> None:
    from corral._exceptions import SettingsError

    world.user({"integrations": {"mcp": {"maxSandbox": 4}}})
    with pytest.raises(SettingsError, match='unknown key \\(did you mean "maxSandboxes"\\?\\)'):
        world.load(keys=TABLE)


def test_cluster_warm_vms_is_a_count_of_vms_only(world: SettingsWorld) -> None:
    """The node agents' warm pool size (docs/cluster.md): a positive count or null, VMs only."""
    from corral._exceptions import SettingsError

    assert world.load().integrations["cluster.warmVms"] is None
    world.user({"integrations": {"cluster": {"warmVms": 2}}})
    assert world.load().integrations["cluster.warmVms"] == 2
    for bad in ({"warmVms": 0}, {"warmVms": "2"}, {"warmPodman": 1}, {"warm": {"podman": 1}}):
        world.user({"integrations": {"cluster": bad}})
        with pytest.raises(SettingsError):
            world.load()


# ---------------------------------------------------------------- start-up cost
FORBIDDEN = (
    "json",
    "re",
    "typing",
    "dataclasses",
    "pathlib",
    "fnmatch",
    "difflib",
    "hashlib",
    "enum",
    "inspect",
    "argparse",
)


def test_loading_valid_settings_imports_no_heavy_module(world: SettingsWorld) -> None:
    world.user(
        {
            "resources": {"memory": "2G", "timeout": "10m"},
            "network": {"allow": ["a.org"]},
            "profiles": {"ci": {"isolation": "vm"}},
            "rules": [{"match": "pytest*", "resources": {"timeout": "1h"}}],
            "credentials": [{"name": "T", "from": "env:T", "commands": ["*"]}],
        }
    )
    world.project({"filesystem": {"denyWrite": ["secrets/**"], "allowWrite": ["/tmp/x"]}})
    world.local({"env": {"deny": ["AWS_*"]}})
    world.trust()
    world.project({"filesystem": {"denyWrite": ["secrets/**"], "allowWrite": ["/tmp/y"]}})
    env_file = world.write("env.json", {"caches": {"npm": "~/.npm"}})
    script = textwrap.dedent(f"""
        import sys
        before = set(sys.modules)
        sys.path.insert(0, {SRC!r})
        from corral.policy._settings import load_settings
        resolved = load_settings(
            cwd={world.workspace!r}, home={world.home!r},
            environ={{"HOME": {world.home!r}, "CORRAL_SETTINGS": {env_file!r},
                      "CORRAL_BACKEND": "gvisor"}},
            profile="ci", command=["pytest", "-q"], flags={{"resources": {{"pids": 10}}}},
        )
        assert resolved.warnings, resolved.warnings  # the changed project file was untrusted
        print(" ".join(sorted(set(sys.modules) - before)))
    """)
    # -S: no site, so modules that site-packages' .pth files import do not hide ours.
    result = subprocess.run(
        [sys.executable, "-S", "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ.get("PATH", "")},
    )
    imported = set(result.stdout.split())
    assert "corral.policy._settings" in imported
    assert imported.isdisjoint(FORBIDDEN), sorted(imported & set(FORBIDDEN))


def test_the_effective_settings_load_back(world: SettingsWorld) -> None:
    from corral.policy import effective_settings_json

    world.user(
        {
            "resources": {"memory": "2G", "cpus": 1.5},
            "network": {"allow": ["a.org"]},
            "env": {"set": {"CI": "1"}},
            "caches": {"npm": "~/.npm"},
            "credentials": [{"name": "T", "from": "env:T", "commands": ["*"], "hosts": ["a.org"]}],
            "allowDegraded": ["resources.cpus"],
        }
    )
    resolved = world.load()
    exported = world.write("exported.json", json.dumps(effective_settings_json(resolved)))
    os.remove(world.user_file)
    assert world.load(settings_files=[exported]).policy == resolved.policy


def test_secret_paths_are_hidden_under_the_passwd_home_and_the_xdg_directories(
    world: SettingsWorld,
) -> None:
    import pwd

    passwd_home = pwd.getpwuid(os.getuid()).pw_dir
    world.environ.update(XDG_CONFIG_HOME="/xdg/config", XDG_DATA_HOME="/xdg/data")
    deny_read = world.load().policy.filesystem.deny_read
    assert f"{world.home}/.ssh" in deny_read
    assert f"{passwd_home}/.ssh" in deny_read  # HOME=... corral run, or sudo
    assert f"{passwd_home}/.config/gh" in deny_read
    assert "/xdg/config/gh" in deny_read
    assert "/xdg/config/gcloud" in deny_read
    assert "/xdg/data/keyrings" in deny_read


def test_settings_files_in_use_are_read_only_inside_writable_areas(world: SettingsWorld) -> None:
    inside = os.path.join(world.workspace, "corral.json")
    with open(inside, "w") as f:
        f.write("{}")
    world.environ["CORRAL_SETTINGS"] = inside
    assert inside in world.load().policy.filesystem.deny_write
    outside = os.path.join(world.root, "elsewhere.json")
    with open(outside, "w") as f:
        f.write("{}")
    world.environ["CORRAL_SETTINGS"] = outside
    assert outside not in world.load().policy.filesystem.deny_write
