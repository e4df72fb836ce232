"""PathRules: the policy's filesystem rows applied to host paths, as the hook uses them."""

from __future__ import annotations

import os

import pytest

from corral.integrations._access import PathRules
from corral.policy import Policy


@pytest.fixture
def tree(tmp_path: object) -> dict[str, str]:
    root = str(tmp_path)
    paths = {
        "ws": f"{root}/ws",
        "home": f"{root}/home",
        "data": f"{root}/data",
        "etc": f"{root}/etc",
    }
    for path in paths.values():
        os.makedirs(path)
    os.makedirs(f"{root}/home/.ssh")
    os.makedirs(f"{root}/home/.ssh/public")
    return paths


def rules_for(tree: dict[str, str], **filesystem: object) -> PathRules:
    policy = Policy.for_workspace(tree["ws"], home=tree["home"])
    return PathRules(policy.replace(filesystem=policy.filesystem.replace(**filesystem)))


def test_writes_inside_the_workspace_are_allowed(tree: dict[str, str]) -> None:
    rules = rules_for(tree)
    assert rules.write_denial(f"{tree['ws']}/src/app.py") is None
    assert rules.write_denial(f"{tree['ws']}/new/dir/file") is None


def test_writes_outside_writable_areas_are_denied(tree: dict[str, str]) -> None:
    rules = rules_for(tree)
    denial = rules.write_denial(f"{tree['etc']}/passwd")
    assert denial is not None
    assert "outside the areas the sandbox may write" in denial
    assert rules.write_denial(f"{tree['ws']}/../etc/passwd") is not None


def test_allow_write_and_read_only(tree: dict[str, str]) -> None:
    assert rules_for(tree, allow_write=(tree["data"],)).write_denial(f"{tree['data']}/x") is None
    denial = rules_for(tree, read_only=True).write_denial(f"{tree['ws']}/x")
    assert denial is not None
    assert "filesystem.readOnly" in denial


@pytest.mark.parametrize(
    "rel",
    [
        ".bashrc",
        "a/b/.zshrc",
        ".git/hooks/pre-commit",
        ".git/config",
        "vendor/x/.git/hooks/post-merge",
        ".vscode/tasks.json",
        ".mcp.json",
        ".claude/settings.json",
        ".corral/settings.json",
        ".gitmodules",
    ],
)
def test_protected_names_are_denied_at_any_depth(tree: dict[str, str], rel: str) -> None:
    denial = rules_for(tree).write_denial(f"{tree['ws']}/{rel}")
    assert denial is not None
    assert "filesystem.protect" in denial


def test_deny_write_relative_absolute_and_glob(tree: dict[str, str]) -> None:
    rules = rules_for(
        tree,
        allow_write=(tree["data"],),
        deny_write=("docs/**", f"{tree['data']}/locked", f"{tree['data']}/*.db"),
    )
    assert "docs/**" in (rules.write_denial(f"{tree['ws']}/docs/a.md") or "")
    assert rules.write_denial(f"{tree['ws']}/src/docs.md") is None
    assert rules.write_denial(f"{tree['data']}/locked/deep/file") is not None
    assert rules.write_denial(f"{tree['data']}/app.db") is not None
    assert rules.write_denial(f"{tree['data']}/app.txt") is None


def test_symlinks_are_judged_where_they_lead(tree: dict[str, str]) -> None:
    os.symlink(tree["etc"], f"{tree['ws']}/etc-link")
    os.symlink(f"{tree['home']}/.ssh", f"{tree['ws']}/keys")
    rules = rules_for(tree)
    denial = rules.write_denial(f"{tree['ws']}/etc-link/passwd")
    assert denial is not None
    assert "resolves to" in denial
    assert rules.read_denial(f"{tree['ws']}/keys/id_rsa") is not None


def test_a_symlinked_workspace_is_still_the_workspace(
    tree: dict[str, str], tmp_path: object
) -> None:
    link = f"{tmp_path}/ws-link"
    os.symlink(tree["ws"], link)
    policy = Policy.for_workspace(link, home=tree["home"])
    assert PathRules(policy).write_denial(f"{link}/src/a.py") is None
    assert PathRules(policy).write_denial(f"{tree['ws']}/src/a.py") is None


def test_secrets_are_unreadable_unless_carved_out(tree: dict[str, str]) -> None:
    rules = rules_for(tree)
    assert "filesystem.denyRead" in (rules.read_denial(f"{tree['home']}/.ssh/id_rsa") or "")
    assert rules.read_denial(f"{tree['home']}/notes.txt") is None
    carved = rules_for(tree, allow_read=(f"{tree['home']}/.ssh/public",))
    assert carved.read_denial(f"{tree['home']}/.ssh/public/key.pub") is None
    assert carved.read_denial(f"{tree['home']}/.ssh/id_rsa") is not None
    assert rules.write_denial(f"{tree['home']}/.ssh/authorized_keys") is not None


def test_searches_may_not_reach_existing_secrets(tree: dict[str, str]) -> None:
    rules = rules_for(tree)
    assert rules.search_denial(tree["ws"]) is None
    assert "would reach the secret path" in (rules.search_denial(tree["home"]) or "")
    assert rules.search_denial(f"{tree['home']}/.ssh") is not None
    assert rules.search_denial(tree["ws"], f"{tree['home']}/.ssh/*") is not None
    assert rules.search_denial(tree["ws"], "../home/**/id_*") is not None
    assert rules.search_denial(tree["ws"], "src/**/*.py") is None
    # ~/.aws does not exist here: searching next to where it would be is fine
    assert rules.search_denial(f"{tree['home']}/.ssh/../notes") is None


# ------------------------------------------------- paths as the kernel resolves them
def test_link_dotdot_is_the_parent_of_the_links_target(tree: dict[str, str]) -> None:
    # ws/link -> home/.ssh/public: "link/.." is home/.ssh for the kernel, ws for normpath
    os.symlink(f"{tree['home']}/.ssh/public", f"{tree['ws']}/link")
    with open(f"{tree['home']}/.ssh/id_rsa", "w") as f:
        f.write("SECRET\n")
    rules = rules_for(tree)
    read = rules.read_denial(f"{tree['ws']}/link/../id_rsa")
    assert read is not None and "secret path" in read
    write = rules.write_denial(f"{tree['ws']}/link/../authorized_keys")
    assert write is not None and "secret path" in write
    search = rules.search_denial(f"{tree['ws']}/link/..")
    assert search is not None
    # a plain directory's .. stays lexical
    os.makedirs(f"{tree['ws']}/sub")
    assert rules.write_denial(f"{tree['ws']}/sub/../file") is None


@pytest.mark.parametrize(
    "path",
    [
        "/proc/self/cwd/../home/.ssh/id_rsa",
        "/proc/thread-self/root/etc/shadow",
        "/proc/1/root/etc/passwd",
        "/dev/fd/3",
        "/dev/stdin",
    ],
)
def test_per_process_links_are_refused(tree: dict[str, str], path: str) -> None:
    rules = rules_for(tree)
    for denial in (rules.read_denial(path), rules.write_denial(path), rules.search_denial(path)):
        assert denial is not None and "names a different object" in denial


def test_a_link_into_proc_self_is_refused(tree: dict[str, str]) -> None:
    os.symlink("/proc/self/cwd", f"{tree['ws']}/here")
    rules = rules_for(tree)
    denial = rules.read_denial(f"{tree['ws']}/here/../x")
    assert denial is not None and "goes through /proc/self" in denial


def test_symlink_loops_are_refused(tree: dict[str, str]) -> None:
    os.symlink("loop", f"{tree['ws']}/loop")
    denial = rules_for(tree).read_denial(f"{tree['ws']}/loop/x")
    assert denial is not None and "symbolic links" in denial


@pytest.mark.parametrize(
    "pattern",
    [
        "{../home/.ssh,src}/*",
        "../{home,x}/.ssh/id_rsa",
        "{x,{y,../home/.ssh}}/**",
        "../hom{e,x}/.ssh/*",
    ],
)
def test_glob_braces_cannot_smuggle_a_secret_past_the_check(
    tree: dict[str, str], pattern: str
) -> None:
    with open(f"{tree['home']}/.ssh/id_rsa", "w") as f:
        f.write("SECRET\n")
    denial = rules_for(tree).search_denial(tree["ws"], pattern)
    assert denial is not None and ".ssh" in denial, pattern


def test_glob_braces_inside_the_workspace_are_fine(tree: dict[str, str]) -> None:
    assert rules_for(tree).search_denial(tree["ws"], "src/**/*.{py,pyi}") is None
    assert rules_for(tree).search_denial(tree["ws"], "{a,b,c}/{d,e}") is None


def test_a_workspace_below_a_protected_name_keeps_what_is_protected_above_it(
    tree: dict[str, str],
) -> None:
    """A nested repository a sandbox made at ``home/.config`` becomes the workspace of a call
    started there: ``fish/config.fish`` is still ``**/.config/fish/**`` (docs/threat-model.md,
    "A root never hides a protection above it")."""
    config = f"{tree['home']}/.config"
    os.makedirs(f"{config}/.git")
    policy = Policy.for_workspace(config, home=tree["home"])
    rules = PathRules(policy)
    for rel in ("fish/config.fish", "git/config", "systemd/user/x.service"):
        denial = rules.write_denial(f"{config}/{rel}")
        assert denial is not None, rel
        assert "filesystem.protect: **/.config/" in denial
    assert rules.write_denial(f"{config}/nvim/init.lua") is None


def test_a_worktree_session_under_claude_is_its_own_workspace(tree: dict[str, str]) -> None:
    worktree = f"{tree['ws']}/.claude/worktrees/one"
    os.makedirs(worktree)
    rules = PathRules(Policy.for_workspace(worktree, home=tree["home"]))
    assert rules.write_denial(f"{worktree}/src/app.py") is None
    denial = rules.write_denial(f"{worktree}/.claude/settings.json")
    assert denial is not None
    assert "**/.claude/**" in denial


def test_file_tools_get_the_brokers_rules_beyond_the_rows(tree: dict[str, str]) -> None:
    """ATK17: each check the write broker makes beyond the rows must be the hook's too -
    a file tool writes on the host, where git then runs what it wrote."""
    ws = tree["ws"]
    rules = rules_for(tree)
    # a gitdir under another name (git init --separate-git-dir=evil x): its config, its hooks
    for name in ("objects", "refs/heads", "hooks"):
        os.makedirs(f"{ws}/evil/{name}")
    assert rules.write_denial(f"{ws}/evil/config") is not None
    assert rules.write_denial(f"{ws}/evil/config.worktree") is not None
    assert rules.write_denial(f"{ws}/evil/hooks/pre-commit") is not None
    assert rules.write_denial(f"{ws}/evil/hooks/pre-commit.sample") is None
    assert rules.write_denial(f"{ws}/evil/description") is None
    # the name that makes a directory so shaped
    os.makedirs(f"{ws}/half/objects")
    denial = rules.write_denial(f"{ws}/half/refs")
    assert denial is not None and "shaped like a repository" in denial
    assert rules.write_denial(f"{ws}/half/commondir") is not None
    # a directory the tool makes holds what it makes: commondir alone shapes it, objects not
    assert rules.write_denial(f"{ws}/plain/commondir") is not None
    assert rules.write_denial(f"{ws}/plain/objects") is None
    # the directories made on the way are judged too (ATK18): refs/ made in half/, and the
    # hooks/ made in a shaped directory without one
    assert rules.write_denial(f"{ws}/half/refs/heads/main") is not None
    os.makedirs(f"{ws}/bare/objects")
    os.makedirs(f"{ws}/bare/refs")
    assert rules.write_denial(f"{ws}/bare/hooks/pre-commit") is not None
    assert rules.write_denial(f"{ws}/bare/hooks/pre-commit.sample") is None
    assert rules.write_denial(f"{ws}/new/.vscode/tasks.json") is not None
    # a file with another hard link (possibly a protected file, or one outside)
    with open(f"{ws}/a.txt", "w") as f:
        f.write("a\n")
    os.link(f"{ws}/a.txt", f"{ws}/b.txt")
    denial = rules.write_denial(f"{ws}/b.txt")
    assert denial is not None and "hard links" in denial


def test_file_tools_never_write_what_a_trusted_git_config_runs(tree: dict[str, str]) -> None:
    import subprocess

    ws = tree["ws"]
    git = ["git", "-c", "init.defaultBranch=main"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tree["home"]}
    subprocess.run([*git, "init", "-q", ws], check=True, env=env)
    subprocess.run(["git", "-C", ws, "config", "core.hooksPath", "tools/githooks"], env=env)
    # the workspace's own config, and an enclosing repository's seen from a nested root
    nested = f"{ws}/tools"
    os.makedirs(f"{nested}/.git")
    for workspace in (ws, nested):
        policy = Policy.for_workspace(workspace, home=tree["home"])
        denial = PathRules(policy, environ=env).write_denial(f"{ws}/tools/githooks/pre-commit")
        assert denial is not None and "runs code from" in denial, workspace
    # the user's global config: a relative hooksPath applies in every work tree
    with open(f"{tree['home']}/.gitconfig", "w") as f:
        f.write("[core]\n\thooksPath = .hooks\n")
    policy = Policy.for_workspace(ws, home=tree["home"])
    denial = PathRules(policy, environ=env).write_denial(f"{ws}/sub/.hooks/pre-push")
    assert denial is not None and "global git config" in denial
    assert PathRules(policy, environ=env).write_denial(f"{ws}/sub/hooks/pre-push") is None


def test_a_code_path_in_another_writable_root_is_protected_too(tree: dict[str, str]) -> None:
    """A repository of the workspace naming, as its hooks path, a directory in an
    ``allowWrite`` root: the path is code wherever it lies (ATK19's reading)."""
    import subprocess

    ws, data = tree["ws"], tree["data"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tree["home"]}
    subprocess.run(["git", "init", "-q", ws], check=True, env=env)
    subprocess.run(["git", "-C", ws, "config", "core.hooksPath", f"{data}/hooks"], env=env)
    rules = PathRules(
        Policy.for_workspace(ws, home=tree["home"]).replace(
            filesystem=Policy.for_workspace(ws, home=tree["home"]).filesystem.replace(
                allow_write=(data,)
            )
        ),
        environ=env,
    )
    denial = rules.write_denial(f"{data}/hooks/pre-commit")
    assert denial is not None and "runs code from" in denial
    assert rules.write_denial(f"{data}/other.txt") is None
