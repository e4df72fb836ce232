"""Where git takes code from: the shape of a gitdir and the configs of enclosing repositories."""

from __future__ import annotations

import os
import subprocess

import pytest

from corral.backends._gitlayout import CodePaths, git_shaped, work_tree_config_files


def enclosing_code_paths(directory: str) -> list[str]:
    return CodePaths().enclosing(directory)


def _git(*args: str, cwd: str) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": cwd, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


def test_enclosing_repositories_name_their_code_paths_from_any_depth(tmp_path: object) -> None:
    root = str(tmp_path)
    outer, inner = f"{root}/outer", f"{root}/outer/tools/inner"
    os.makedirs(inner)
    _git("init", "-q", ".", cwd=outer)
    _git("config", "core.hooksPath", "tools/githooks", cwd=outer)
    _git("init", "-q", ".", cwd=inner)
    _git("config", "core.fsmonitor", "../fsmon.sh", cwd=inner)
    # from the inner work tree: its own fsmonitor (relative to it) and the outer hooks path
    found = enclosing_code_paths(inner)
    assert f"{root}/outer/tools/fsmon.sh" in found
    assert f"{outer}/tools/githooks" in found
    # from a directory of the outer tree that does not exist yet: the outer config only
    assert enclosing_code_paths(f"{outer}/tools/new/dir") == [f"{outer}/tools/githooks"]
    assert enclosing_code_paths(root) == []


def test_a_linked_worktrees_config_is_its_repositorys(tmp_path: object) -> None:
    root = str(tmp_path)
    repo = f"{root}/repo"
    os.makedirs(repo)
    _git("init", "-q", ".", cwd=repo)
    _git(
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
        cwd=repo,
    )
    _git("config", "core.hooksPath", ".githooks", cwd=repo)
    _git("worktree", "add", "-q", f"{root}/wt", cwd=repo)
    assert work_tree_config_files(f"{root}/wt")[1][0] == f"{repo}/.git/config"
    assert f"{root}/wt/.githooks" in enclosing_code_paths(f"{root}/wt")


def test_a_directory_is_shaped_like_a_gitdir_by_objects_and_refs_or_commondir(
    tmp_path: object,
) -> None:
    d = str(tmp_path)
    fd = os.open(d, os.O_PATH | os.O_DIRECTORY)
    try:
        assert not git_shaped(fd)
        os.mkdir(f"{d}/objects")
        assert not git_shaped(fd)
        assert git_shaped(fd, adding="refs")
        os.mkdir(f"{d}/refs")
        assert git_shaped(fd)
    finally:
        os.close(fd)


def test_includes_home_and_an_fsmonitor_command_line_name_code_paths_too(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATK19's reading: git follows a config's includes, expands ``~/``, and runs an
    fsmonitor value with arguments through the shell - each names a code path."""
    root = str(tmp_path)
    home, repo = f"{root}/home", f"{root}/home/repo"
    os.makedirs(repo)
    monkeypatch.setenv("HOME", home)
    _git("init", "-q", ".", cwd=repo)
    with open(f"{repo}/.git/extra.inc", "w") as f:
        f.write("[core]\n\thooksPath = ~/hooks\n")
    _git("config", "include.path", "extra.inc", cwd=repo)
    _git("config", "core.fsmonitor", "tools/fsmon.sh --quiet", cwd=repo)
    found = enclosing_code_paths(repo)
    assert f"{home}/hooks" in found  # through the include, ~ expanded
    assert f"{repo}/tools/fsmon.sh" in found  # the program of the command line


def test_a_directory_of_this_uid_the_walk_cannot_read_is_no_answer() -> None:
    """A sandbox can ``chmod 000`` a directory of its uid: a repository below it would be
    hidden from the walk, so the walk gives no answer (its callers refuse); another
    user's unreadable directory is passed by (this user's git cannot work there)."""
    import shutil
    import sys
    import tempfile

    # another user must reach it: not under pytest's private directory
    root = tempfile.mkdtemp(prefix="corral-walk-", dir="/var/tmp")
    os.chmod(root, 0o755)
    os.makedirs(f"{root}/ws/locked/app/.git")
    os.makedirs(f"{root}/ws/other")
    probe = (
        "import sys; from corral.backends._gitlayout import CodePathsUnknown, nested_work_trees\n"
        "try: print(nested_work_trees(sys.argv[1]))\n"
        "except CodePathsUnknown: print(None)"
    )
    prefix: list[str] = []
    if os.geteuid() == 0:  # root reads through any mode: walk as another user
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is needed to walk as another user")
        for directory, dirs, _files in os.walk(root):
            for name in [directory, *(os.path.join(directory, d) for d in dirs)]:
                os.chown(name, 65534, 65534)
        os.chmod(root, 0o755)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    os.chmod(f"{root}/ws/locked", 0)
    try:
        walk = subprocess.run(
            [*prefix, sys.executable, "-c", probe, f"{root}/ws"], capture_output=True, text=True
        )
        assert walk.stdout.strip() == "None", walk.stderr
        if os.geteuid() == 0:  # the same directory, another user's: passed by
            os.chown(f"{root}/ws/locked", 0, 0)
            walk = subprocess.run(
                [*prefix, sys.executable, "-c", probe, f"{root}/ws"],
                capture_output=True,
                text=True,
            )
            assert walk.stdout.strip() == "[]", walk.stderr
    finally:
        os.chmod(f"{root}/ws/locked", 0o755)
        shutil.rmtree(root, ignore_errors=True)
