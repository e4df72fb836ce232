"""A linked git worktree as the workspace: its shared git directory in the policy."""

from __future__ import annotations

import os

import pytest

from .conftest import SettingsWorld


def worktree(world: SettingsWorld, pointer: str | None = None) -> tuple[str, str]:
    """``(common dir, worktree)``: ``repo/.git`` and ``repo/.claude/worktrees/X``."""
    common = os.path.join(world.root, "repo", ".git")
    admin = os.path.join(common, "worktrees", "X")
    tree = os.path.join(world.root, "repo", ".claude", "worktrees", "X")
    for name in ("hooks", "objects", "refs"):
        os.makedirs(os.path.join(common, name))
    os.makedirs(tree)
    world.write(os.path.join(admin, "commondir"), "../..\n")
    world.write(os.path.join(admin, "gitdir"), os.path.join(tree, ".git") + "\n")
    world.write(os.path.join(tree, ".git"), f"gitdir: {pointer or admin}\n")
    return common, tree


@pytest.mark.parametrize("relative", [False, True])
def test_the_shared_git_directory_is_writable_with_its_persistence_points_protected(
    world: SettingsWorld, relative: bool
) -> None:
    common, tree = worktree(world, "../../../.git/worktrees/X" if relative else None)
    fs = world.load(cwd=tree).policy.filesystem
    assert fs.workspace == tree
    assert common in fs.allow_write
    for denied in ("config", "hooks/**", "commondir", "worktrees/*/config.worktree"):
        assert f"{common}/{denied}" in fs.deny_write, denied
    assert f"{common}/modules/**/config" in fs.deny_write


def test_read_only_exposes_it_read_only(world: SettingsWorld) -> None:
    world.write(world.user_file, '{"filesystem": {"readOnly": true}}')
    common, tree = worktree(world)
    fs = world.load(cwd=tree).policy.filesystem
    assert common in fs.allow_read and common not in fs.allow_write


def test_a_repository_under_a_secret_path_stays_hidden(world: SettingsWorld) -> None:
    common, tree = worktree(world)
    world.write(world.user_file, f'{{"filesystem": {{"denyRead": ["{os.path.dirname(common)}"]}}}}')
    resolved = world.load(cwd=tree)
    assert common not in resolved.policy.filesystem.allow_write
    assert any("stays hidden" in w for w in resolved.warnings)


@pytest.mark.parametrize(
    "pointer", ["gitdir:", "not a pointer", "gitdir: /nonexistent/x", "gitdir: ."]
)
def test_other_git_files_change_nothing(world: SettingsWorld, pointer: str) -> None:
    tree = os.path.join(world.root, "tree")
    os.makedirs(tree)
    world.write(os.path.join(tree, ".git"), pointer + "\n")
    before = world.load(cwd=world.workspace).policy.filesystem
    fs = world.load(cwd=tree).policy.filesystem
    assert fs.allow_write == before.allow_write and fs.allow_read == before.allow_read


@pytest.mark.parametrize(
    ("admin", "commondir"),
    [
        ("objects/zz/G", "../.."),  # the shared directory, but not git's layout
        ("worktrees/X", "../../.."),  # worktrees/NAME under the main working tree
    ],
)
def test_a_back_pointer_anywhere_but_worktrees_name_exposes_nothing(
    world: SettingsWorld, admin: str, commondir: str
) -> None:
    """ATK13: a sandbox of a linked worktree writes the shared directory, so it can forge
    a vouching admin directory there; its ``commondir`` must not choose the area (the
    integration test ``test_a_back_pointer_forged_in_the_shared_directory_never_widens_it_beyond_it``
    has it choose the main working tree)."""
    common, tree = worktree(world)
    forged = os.path.join(common, admin)
    sub = os.path.join(tree, "sub")
    world.write(os.path.join(forged, "commondir"), commondir + "\n")
    world.write(os.path.join(forged, "gitdir"), os.path.join(sub, ".git") + "\n")
    world.write(os.path.join(sub, ".git"), f"gitdir: {forged}\n")
    fs = world.load(cwd=sub).policy.filesystem
    exposed = [p for p in (*fs.allow_write, *fs.allow_read) if p.startswith(world.root)]
    assert not [p for p in exposed if p != sub], exposed
