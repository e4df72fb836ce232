"""The git check's config rule: only keys git writes itself, values that choose no program."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from corral.backends._gitcheck import config_problem

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git_written_config(tmp_path: object) -> bytes:
    """What real git init + clone + submodule/branch work leave in .git/config."""
    base = str(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "HOME": base, "GIT_CONFIG_NOSYSTEM": "1"}
    src = os.path.join(base, "src")
    subprocess.run(["git", "init", "-q", src], check=True, env=env)
    subprocess.run(
        [
            "git",
            "-C",
            src,
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
        env=env,
    )
    dst = os.path.join(base, "dst")
    subprocess.run(["git", "clone", "-q", src, dst], check=True, env=env)
    subprocess.run(["git", "-C", dst, "config", "user.name", "agent"], check=True, env=env)
    subprocess.run(
        ["git", "-C", dst, "config", "submodule.lib.update", "rebase"], check=True, env=env
    )
    with open(os.path.join(dst, ".git", "config"), "rb") as f:
        return f.read()


def test_what_git_writes_itself_passes(tmp_path: object) -> None:
    assert config_problem(git_written_config(tmp_path)) is None


@pytest.mark.parametrize(
    "text",
    [
        "[core]\n\tfsmonitor = touch /x\n",
        "[core]\n\thooksPath = payload\n",
        "[core]\n\tsshCommand = sh -c x\n",
        "[core]\n\tpager = sh -c x\n",
        "[core]\n\teditor = x\n",
        "[core]\n\tgitProxy = x\n",
        "[core] fsmonitor = x\n",  # a key on the header's line
        '[alias]\n\tst = "!touch /x"\n',
        "[include]\n\tpath = ../evil\n",
        '[includeIf "gitdir:/"]\n\tpath = ../evil\n',
        '[filter "x"]\n\tclean = touch /x\n',
        '[diff "x"]\n\ttextconv = touch /x\n',
        '[merge "x"]\n\tdriver = touch /x\n',
        "[credential]\n\thelper = !touch /x\n",
        "[gpg]\n\tprogram = x\n",
        "[uploadpack]\n\tpackObjectsHook = x\n",
        '[remote "origin"]\n\tuploadpack = x\n',
        '[remote "origin"]\n\treceivepack = x\n',
        '[remote "origin"]\n\turl = ext::sh -c touch% /x\n',
        '[remote "origin"]\n\turl = fd::17\n',
        '[remote "origin"]\n\turl = -uploadpack=x\n',
        '[url "ext::sh -c x"]\n\tinsteadOf = https://\n',
        '[submodule "lib"]\n\tupdate = !touch /x\n',
        "[core]\n\tbare = !sh\n",
        "[core\n",  # git cannot parse it
    ],
)
def test_code_running_or_unknown_keys_fail(text: str) -> None:
    assert config_problem(text.encode()) is not None


def test_ipv6_urls_are_not_transport_helpers() -> None:
    assert config_problem(b'[remote "o"]\n\turl = http://[::1]:8080/r.git\n') is None


def test_trusted_code_paths_of_a_nested_and_of_a_global_config(tmp_path: object) -> None:
    from corral.backends._gitlayout import CodePaths

    lib = f"{tmp_path}/ws/lib"
    os.makedirs(f"{lib}/.git")
    with open(f"{lib}/.git/config", "w") as f:
        f.write("[core]\n\thooksPath = .githooks\n\tfsmonitor = ../tools/mon\n")
    # a nested work tree: relative to it
    assert sorted(CodePaths().tree(lib)) == [f"{lib}/.githooks", f"{tmp_path}/ws/tools/mon"]
    # a global config: every work tree (any depth); absolute values as they are
    glob = f"{tmp_path}/gitconfig"
    with open(glob, "w") as f:
        f.write("[core]\n\thooksPath = h\n\tfsmonitor = /ws/bin/m\n")
    rows = {text for text, _label in CodePaths().global_patterns([glob])}
    assert rows == {"**/h", "**/h/**", "/ws/bin/m", "/ws/bin/m/**"}
    # above every work tree: no row
    with open(glob, "w") as f:
        f.write("[core]\n\thooksPath = ../x\n")
    assert CodePaths().global_patterns([glob]) == []
