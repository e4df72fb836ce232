"""Where the hook finds a Bash call's workspace from (claude_code_hook.anchored_cwd)."""

from __future__ import annotations

import os
from pathlib import Path

from corral.integrations.claude_code_hook import anchored_cwd


def _tree(tmp_path: Path) -> tuple[str, str, str]:
    """``home``, a project repository ``home/proj`` (with ``src/lib`` and a worktree), and
    another repository ``home/other`` (with ``deep``)."""
    home = tmp_path / "home"
    project = home / "proj"
    (project / ".git").mkdir(parents=True)
    (project / "src" / "lib").mkdir(parents=True)
    (project / ".claude" / "worktrees" / "w").mkdir(parents=True)
    (project / ".claude" / "worktrees" / "w" / ".git").write_text("gitdir: ../../../.git\n")
    (home / "other" / ".git").mkdir(parents=True)
    (home / "other" / "deep").mkdir()
    return str(home), str(project), str(home / "other")


def test_without_a_project_directory_the_call_directory_counts_as_it_is(tmp_path: Path) -> None:
    home, project, _other = _tree(tmp_path)
    assert anchored_cwd(f"{project}/src", None, home) == f"{project}/src"
    assert anchored_cwd(f"{project}/src", "relative/path", home) == f"{project}/src"


def test_plain_directories_below_the_project_count_to_the_call_directory(tmp_path: Path) -> None:
    home, project, _other = _tree(tmp_path)
    assert anchored_cwd(f"{project}/src/lib", project, home) == f"{project}/src/lib"
    assert anchored_cwd(project, project, home) == project
    worktree = f"{project}/.claude/worktrees/w"
    assert anchored_cwd(worktree, project, home) == worktree  # a worktree: its own workspace


def test_a_link_below_the_project_ends_the_call_directory(tmp_path: Path) -> None:
    home, project, other = _tree(tmp_path)
    os.symlink(other, f"{project}/src/out")
    assert anchored_cwd(f"{project}/src/out/deep", project, home) == f"{project}/src"
    os.symlink(f"{project}/src/lib", f"{project}/inside")  # even one that stays inside
    assert anchored_cwd(f"{project}/inside", project, home) == project


def test_a_call_directory_outside_the_project_counts_as_the_project(tmp_path: Path) -> None:
    home, project, other = _tree(tmp_path)
    assert anchored_cwd(f"{other}/deep", project, home) == project
    assert anchored_cwd("/", project, home) == project
    assert anchored_cwd(f"{project}-sibling", project, home) == project  # not a prefix match


def test_the_project_path_ends_at_a_link_inside_a_work_tree(tmp_path: Path) -> None:
    home, project, other = _tree(tmp_path)
    os.symlink(other, f"{project}/sub")  # a sandbox of proj could have made or swapped it
    assert anchored_cwd(f"{project}/sub/deep", f"{project}/sub", home) == project


def test_a_link_outside_any_work_tree_on_the_project_path_is_followed(tmp_path: Path) -> None:
    home, _project, _other = _tree(tmp_path)
    os.symlink(home, str(tmp_path / "alias"))  # like /home -> /usr/home: no sandbox writes there
    aliased = str(tmp_path / "alias" / "proj")
    assert anchored_cwd(f"{aliased}/src", aliased, home) == f"{aliased}/src"
