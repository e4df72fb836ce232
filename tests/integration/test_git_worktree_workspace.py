"""A linked git worktree as the workspace (issue 11, Claude Code's worktree sessions).

The workspace is ``repo/.claude/worktrees/X``, whose ``.git`` file points at
``repo/.git/worktrees/X`` outside it. Under the default policy git works in
the sandbox (status, add, commit) with real git, while every persistence
point of the shared git directory stays protected: after the attacks, the
host's git in the worktree and in the main repository runs nothing planted.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import World, needs_bwrap

from .test_git_persistence import host_git, marker, payload_config

pytestmark = [needs_bwrap]


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def make_worktree(world: World) -> tuple[str, str]:
    """``(repo, worktree)``: a repository with one commit and a linked worktree under .claude/."""
    repo = os.path.join(world.root, "repo")
    os.makedirs(repo)
    assert host_git(world, repo, "init", "-q").returncode == 0
    World.write(os.path.join(repo, "README"), "main\n")
    assert host_git(world, repo, "add", "README").returncode == 0
    assert host_git(world, repo, "commit", "-qm", "init").returncode == 0
    worktree = os.path.join(repo, ".claude", "worktrees", "X")
    added = host_git(world, repo, "worktree", "add", "-q", worktree)
    assert added.returncode == 0, added.stderr
    return repo, worktree


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_git_works_in_a_linked_worktree_and_its_repository_stays_safe(
    world: World, backend: str
) -> None:
    repo, worktree = make_worktree(world)
    common = os.path.join(repo, ".git")
    with open(os.path.join(worktree, ".git"), encoding="utf-8") as f:
        pointer = f.read()
    before = {
        name: read_bytes(os.path.join(common, name))
        for name in ("config", "worktrees/X/gitdir", "worktrees/X/commondir")
    }
    ident = "-c user.name=t -c user.email=t@example.invalid"
    attacks = [
        f"printf '%s' '{payload_config(world)}' > {common}/config",
        f"printf '#!/bin/sh\\ntouch {marker(world)}\\n' > {common}/hooks/post-commit",
        f"mkdir -p {common}/hooks && ln -s /bin/true {common}/hooks/pre-commit",
        f"printf '[core]\\n\\tfsmonitor = touch {marker(world)}\\n' > {common}/config.worktree",
        f"printf '[core]\\n\\tfsmonitor = touch {marker(world)}\\n'"
        f" > {common}/worktrees/X/config.worktree",
        f"echo {world.outside} > {common}/worktrees/X/commondir",
        f"echo 'gitdir: {world.outside}' > .git",
        f"echo changed > {repo}/README",  # the main working tree is not the workspace
    ]
    script = (
        "set -e\n"
        "git status --short\n"
        "echo work > work.txt\n"
        "git add work.txt\n"
        f"git {ident} commit -qm 'in the sandbox'\n"
        "git log --format=%s -1\n"
        "set +e\n"
        + "".join(
            f"{attack} 2>/dev/null && echo ESCAPED: {i}\n" for i, attack in enumerate(attacks)
        )
        + "exit 0\n"
    )
    degrade = (
        ("--allow-degraded", "isolation") if backend == "landlock" and os.geteuid() == 0 else ()
    )
    result = world.run(
        script, "--backend", backend, "--isolation", "process", *degrade, cwd=worktree
    )
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr
    assert "in the sandbox" in out and "ESCAPED" not in out, out
    # the commit landed in the shared repository, on the worktree's branch
    log = host_git(world, repo, "log", "--format=%s", "-1", "X")
    assert log.stdout.decode().strip() == "in the sandbox"
    # the persistence points are as they were
    with open(os.path.join(worktree, ".git"), encoding="utf-8") as f:
        assert f.read() == pointer
    for name, content in before.items():
        assert read_bytes(os.path.join(common, name)) == content, name
    assert not os.path.lexists(os.path.join(common, "config.worktree"))
    assert not os.path.lexists(os.path.join(common, "worktrees", "X", "config.worktree"))
    assert sorted(os.listdir(os.path.join(common, "hooks"))) == sorted(
        n for n in os.listdir(os.path.join(common, "hooks")) if n.endswith(".sample")
    )
    with open(os.path.join(repo, "README"), encoding="utf-8") as f:
        assert f.read() == "main\n"
    # the user's next action: git in the worktree and in the repository runs nothing planted
    for directory in (worktree, repo):
        assert host_git(world, directory, "status").returncode == 0
        host_git(world, directory, "commit", "-q", "--allow-empty", "-m", "host")
    assert not os.path.exists(marker(world)), "the host's git ran planted code"


def test_a_read_only_worktree_workspace_can_read_its_repository(world: World) -> None:
    _repo, worktree = make_worktree(world)
    result = world.run("git log --format=%s -1; touch x", "--read-only", cwd=worktree)
    assert result.stdout.decode().startswith("init\n"), result.stderr
    assert result.returncode != 0 and not os.path.exists(os.path.join(worktree, "x"))


def test_a_git_file_a_sandbox_planted_never_makes_another_repositorys_git_dir_writable(
    world: World,
) -> None:
    """ATK12: a sandbox plants ``sub/.git`` naming another repository's git directory
    (as ``--separate-git-dir`` would, or as one of its real worktrees); the git check
    lets it stand (it leads to a git directory the sandbox cannot write), and the next
    run started in ``sub`` finds ``sub`` its workspace. That run must not get the other
    repository's git directory writable: nothing there vouches for ``sub``."""
    other = os.path.join(world.outside, "other")
    os.makedirs(other)
    for args in (("init", "-q"), ("commit", "-q", "--allow-empty", "-m", "init")):
        assert host_git(world, other, *args).returncode == 0
    elsewhere = os.path.join(world.outside, "elsewhere")
    assert host_git(world, other, "worktree", "add", "-q", elsewhere).returncode == 0
    common = os.path.join(other, ".git")
    plants = {"sub1": common, "sub2": os.path.join(common, "worktrees", "elsewhere")}
    planted = world.run(
        "".join(f"mkdir {d} && printf 'gitdir: %s\\n' {g} > {d}/.git\n" for d, g in plants.items())
    )
    assert planted.returncode == 0, planted.stderr
    for name, gitdir in plants.items():  # the plant stands: the attack is the next run
        with open(os.path.join(world.workspace, name, ".git"), encoding="utf-8") as f:
            assert f.read() == f"gitdir: {gitdir}\n"

    def snapshot() -> dict[str, bytes]:
        found = {}
        for top, _dirs, files in os.walk(common):
            for name in files:
                path = os.path.join(top, name)
                found[path] = read_bytes(path)
        return found

    before = snapshot()
    head = host_git(world, other, "rev-parse", "HEAD").stdout.decode().strip()
    for name in plants:
        attack = (
            f"echo {head} > {common}/refs/heads/planted && echo ESCAPED ref\n"
            f"mkdir -p {common}/objects/ab && echo x > {common}/objects/ab/cd && echo ESCAPED obj\n"
            f"echo ref: refs/heads/planted > {common}/HEAD && echo ESCAPED HEAD\n"
            "exit 0\n"
        )
        result = world.run(attack, cwd=os.path.join(world.workspace, name))
        assert result.returncode == 0, result.stderr
        assert b"ESCAPED" not in result.stdout, (name, result.stdout)
    assert snapshot() == before
    assert host_git(world, other, "status").returncode == 0


def test_a_back_pointer_forged_in_the_shared_directory_never_widens_it_beyond_it(
    world: World,
) -> None:
    """ATK13: a sandbox in a linked worktree (``git worktree add ../wt``) can write the
    shared ``repo/.git``, so the vouching back-pointer is no proof there: it makes
    ``repo/.git/objects/zz/G`` with ``commondir`` = ``../../../..`` (the main working
    tree ``repo``, an ancestor of G, which the sandbox cannot write) and ``gitdir``
    naming ``wt/sub/.git``, and plants ``wt/sub/.git`` = ``gitdir: G``. The git check
    quarantines both only when that run ends; a run started in ``sub`` while it lasts
    (a background call beside a foreground one) must not get ``repo`` writable."""
    import subprocess
    import time

    from tests.conftest import client_command

    repo = os.path.join(world.root, "repo")
    os.makedirs(repo)
    assert host_git(world, repo, "init", "-q").returncode == 0
    World.write(os.path.join(repo, "README"), "main\n")
    assert host_git(world, repo, "add", "README").returncode == 0
    assert host_git(world, repo, "commit", "-qm", "init").returncode == 0
    worktree = os.path.join(world.root, "wt")
    assert host_git(world, repo, "worktree", "add", "-q", worktree).returncode == 0
    forged = os.path.join(repo, ".git", "objects", "zz", "G")
    sub = os.path.join(worktree, "sub")
    plant = (
        f"mkdir -p {forged} && printf '../../../..\\n' > {forged}/commondir"
        f" && printf '%s\\n' {sub}/.git > {forged}/gitdir"
        f" && mkdir sub && printf 'gitdir: %s\\n' {forged} > sub/.git"
        " && touch sub/planted && sleep 60"
    )
    planter = subprocess.Popen(
        [*client_command("corral"), "run", "-c", plant],
        cwd=worktree,
        env=dict(world.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(sub, "planted")):
            assert planter.poll() is None, planter.communicate()
            assert time.monotonic() < deadline, "the plant never appeared"
            time.sleep(0.05)
        attack = world.run(f"echo pwned > {repo}/README && echo ESCAPED; exit 0", cwd=sub)
        assert attack.returncode == 0, attack.stderr
        assert b"ESCAPED" not in attack.stdout, attack.stdout
    finally:
        planter.kill()
        planter.communicate()
    with open(os.path.join(repo, "README"), encoding="utf-8") as f:
        assert f.read() == "main\n"
    assert host_git(world, repo, "status", "--short").stdout == b""


def test_a_shared_directory_inside_a_git_directory_keeps_its_persistence_points_protected(
    world: World,
) -> None:
    """ATK16: a sandbox in a linked worktree (``git worktree add ../wt``) writes the shared
    ``repo/.git``, where ``worktrees/*/commondir`` is a protect row. It turns
    ``repo/.git/worktrees`` itself into a git directory (``objects``, ``refs``) with the
    admin directory ``repo/.git/worktrees/worktrees/N`` (``commondir`` ``../..``: G's
    grandparent, as the layout rule asks; ``gitdir`` naming ``wt/sub/.git``; the protect
    row ``worktrees/*/commondir`` matches one component only) and plants ``wt/sub/.git``.
    A run started in ``sub`` while that run lasts gets ``repo/.git/worktrees`` writable,
    with the ``**/.git/REST`` rows re-rooted there - ``repo/.git/worktrees/worktrees/*/commondir``,
    not ``repo/.git/worktrees/wt/commondir`` - so it could re-point the real worktree's
    ``commondir`` (at a config that runs code when the host's git runs there; the git check
    renames it away only at the end, which breaks the worktree). The planter could not."""
    import subprocess
    import time

    from tests.conftest import client_command

    repo = os.path.join(world.root, "repo")
    os.makedirs(repo)
    assert host_git(world, repo, "init", "-q").returncode == 0
    World.write(os.path.join(repo, "README"), "main\n")
    assert host_git(world, repo, "add", "README").returncode == 0
    assert host_git(world, repo, "commit", "-qm", "init").returncode == 0
    worktree = os.path.join(world.root, "wt")
    assert host_git(world, repo, "worktree", "add", "-q", worktree).returncode == 0
    admin = os.path.join(repo, ".git", "worktrees")
    commondir = os.path.join(admin, "wt", "commondir")
    before = read_bytes(commondir)
    forged = os.path.join(admin, "worktrees", "N")
    sub = os.path.join(worktree, "sub")
    plant = (
        f"mkdir -p {admin}/objects {admin}/refs {forged} && printf '../..\\n' > {forged}/commondir"
        f" && printf '%s\\n' {sub}/.git > {forged}/gitdir"
        f" && mkdir sub && printf 'gitdir: %s\\n' {forged} > sub/.git"
        " && touch sub/planted && sleep 60"
    )
    planter = subprocess.Popen(
        [*client_command("corral"), "run", "-c", plant],
        cwd=worktree,
        env=dict(world.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(sub, "planted")):
            assert planter.poll() is None, planter.communicate()
            assert time.monotonic() < deadline, "the plant never appeared"
            time.sleep(0.05)
        attack = world.run(f"printf '/elsewhere\\n' > {commondir} && echo ESCAPED; exit 0", cwd=sub)
        assert attack.returncode == 0, attack.stderr
        assert b"ESCAPED" not in attack.stdout, attack.stdout
    finally:
        planter.kill()
        planter.communicate()
    # the real worktree's redirect is as git made it, and git still works there
    assert os.path.isfile(commondir), os.listdir(os.path.dirname(commondir))
    assert read_bytes(commondir) == before
    assert host_git(world, worktree, "status", "--short").returncode == 0


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
@pytest.mark.parametrize(
    ("key", "value", "name", "trigger"),
    [
        ("core.hooksPath", "tools/githooks", "tools/githooks/pre-commit", "commit"),
        ("core.fsmonitor", "tools/fsmonitor.sh", "tools/fsmonitor.sh", "status"),
    ],
)
def test_a_linked_worktree_keeps_the_code_paths_its_repositorys_config_names(
    world: World, backend: str, key: str, value: str, name: str, trigger: str
) -> None:
    """ATK17: the broker protects what the root's repository config names as code
    (``core.hooksPath``, a ``core.fsmonitor`` program) by opening the root's ``.git``
    as a directory - a linked worktree's ``.git`` is a file, so in a Claude Code worktree
    session nothing of it is protected: one run writes ``tools/githooks/pre-commit`` (in
    the main working tree a run is refused that), and the host's next ``git commit`` in
    the worktree runs it (``git status`` for the fsmonitor program)."""
    from .test_git_persistence import host_git, marker

    repo = os.path.join(world.root, "repo")
    os.makedirs(os.path.join(repo, "tools", "githooks"))
    assert host_git(world, repo, "init", "-q").returncode == 0
    World.write(os.path.join(repo, "tools", "githooks", "pre-commit"), "#!/bin/sh\nexit 0\n")
    World.write(os.path.join(repo, "tools", "fsmonitor.sh"), "#!/bin/sh\nexit 1\n")
    for script in ("githooks/pre-commit", "fsmonitor.sh"):
        os.chmod(os.path.join(repo, "tools", script), 0o755)
    assert host_git(world, repo, "add", "-A").returncode == 0
    assert host_git(world, repo, "commit", "-qm", "init").returncode == 0
    assert host_git(world, repo, "config", key, value).returncode == 0
    worktree = os.path.join(repo, ".claude", "worktrees", "X")
    assert host_git(world, repo, "worktree", "add", "-q", worktree).returncode == 0
    degrade = (
        ["--allow-degraded", "isolation"] if backend == "landlock" and os.geteuid() == 0 else []
    )
    options = ["--backend", backend, "--isolation", "process", *degrade]
    payload = f"#!/bin/sh\\ntouch {marker(world)}\\nexit 1\\n"
    main = world.run(f"printf '{payload}' > {name}", *options, cwd=repo)
    assert b"blocked write to" in main.stderr, main.stderr  # the main tree's run may not
    world.run(f"printf '{payload}' > {name}", *options, cwd=worktree)
    if trigger == "commit":
        host_git(world, worktree, "commit", "-q", "--allow-empty", "-m", "next")
    else:
        host_git(world, worktree, "status", "--short")
    assert not os.path.exists(marker(world)), f"the host's git ran the planted {value}"
