"""Git as a persistence path (issue 10, sections 1 and 2).

Every attack plants something git would discover and that would make the
host's git run code: an fsmonitor that creates a marker file, or a hook. After
each run, real git runs on the host in every directory of the workspace; the
marker must not appear. The positive side: git init, clone, worktree add and
submodule update work under the default policy, and git works on the host
afterwards.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import World, needs_bwrap

pytestmark = [needs_bwrap]

BACKENDS = ("bubblewrap", "landlock")


def host_git(world: World, cwd: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {
        "HOME": world.home,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, check=False, timeout=60
    )


def git_everywhere(world: World) -> None:
    """The user's next action: ``git status`` (and a commit where it is a repository)."""
    for directory, dirs, _files in os.walk(world.workspace):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(directory, d))]
        host_git(world, directory, "status")
        host_git(world, directory, "commit", "-q", "--allow-empty", "-m", "host")


def marker(world: World) -> str:
    return os.path.join(world.outside, "PWNED")


def run(
    world: World, script: str, backend: str = "bubblewrap"
) -> subprocess.CompletedProcess[bytes]:
    # landlock refuses a root caller (it would keep root's identity) unless told
    degrade = (
        ("--allow-degraded", "isolation") if backend == "landlock" and os.geteuid() == 0 else ()
    )
    env = {}
    if backend == "podman":  # the image built for the user (the world has its own HOME)
        home_cache = os.path.join(os.path.expanduser("~"), ".cache")
        env["XDG_CACHE_HOME"] = os.environ.get("XDG_CACHE_HOME", home_cache)
    result = world.run(script, "--backend", backend, "--isolation", "process", *degrade, env=env)
    assert result.returncode != 125, result.stderr
    return result


def payload_config(world: World) -> str:
    """A git config whose fsmonitor (and an alias, and a hooksPath) would create the marker."""
    return (
        "[core]\n\tbare = false\n\trepositoryformatversion = 0\n"
        f'\tfsmonitor = "touch {marker(world)}; false"\n'
        "\thooksPath = payload-hooks\n"
    )


def hook_script(world: World) -> str:
    return f"#!/bin/sh\ntouch {marker(world)}\n"


def assert_safe(world: World) -> None:
    git_everywhere(world)
    assert not os.path.exists(marker(world)), "the host's git ran planted code"


#: Build a gitdir-shaped directory under another name, in every order of its pieces
#: (the config first, the config last through git's config.lock rename, or written
#: directly last), and point a planted .git file at each.
_SHAPES = (
    "mkdir -p a && cp {cfg} a/config; mkdir a/objects; echo 'ref: refs/heads/m' > a/HEAD;"
    " mkdir a/refs",
    "mkdir -p b/objects b/refs && echo 'ref: refs/heads/m' > b/HEAD; cp {cfg} b/config.lock;"
    " mv b/config.lock b/config",
    "mkdir -p c/objects c/refs && echo 'ref: refs/heads/m' > c/HEAD; cp {cfg} c/config",
    "mkdir -p d && cp {cfg} d/config; echo x > d/commondir",
)


def backend_problem(name: str) -> str | None:
    """Why *name* cannot run here (podman: also its default image), or None."""
    from corral.backends import get_backend, inspect_host
    from corral.pipeline._request import ExecRequest
    from corral.policy import Policy

    backend = get_backend(name)
    policy = Policy.for_workspace(os.getcwd(), home=os.environ.get("HOME", "/root"))
    facts, _ = inspect_host(backend, ExecRequest.from_argv(["true"]), policy, dict(os.environ))
    problem = backend.problem(facts)
    image = facts.detail("image")
    return problem or getattr(image, "problem", None)


@pytest.mark.parametrize("backend", [*BACKENDS, "podman"])
def test_a_dot_git_file_pointing_at_a_planted_repository(world: World, backend: str) -> None:
    if backend == "podman" and (problem := backend_problem("podman")) is not None:
        pytest.skip(f"podman is not available here: {problem}")
    # in the workspace: the containers see only it (and the image)
    cfg = World.write(world.ws("payload.cfg"), payload_config(world))
    script = "; ".join(shape.format(cfg=cfg) for shape in _SHAPES)
    links = "; ".join(f"mkdir -p s{n} && printf 'gitdir: ../{n}\\n' > s{n}/.git" for n in "abcd")
    result = run(world, f"{script}; {links}; echo done", backend)
    assert result.stdout == b"done\n", result.stderr
    # refused while the run lasts (what is left is checked again after it)
    assert result.stderr.count(b"blocked write") >= 4, result.stderr
    assert_safe(world)


def test_a_planted_repository_is_inert_while_the_run_lasts(world: World) -> None:
    """The host runs git in the planted directories *during* the run: nothing runs.

    The command holds a descriptor to ``evil/config`` from before the directory
    became repository-shaped and writes the payload through it afterwards; the
    broker's own copy, landed when the shape completed, is what git reads.
    """
    import time

    cfg = World.write(os.path.join(world.outside, "cfg"), payload_config(world))
    ready, done = world.ws("READY"), world.ws("DONE")
    script = (
        "import os, subprocess, time\n"
        "os.makedirs('evil'); os.makedirs('src')\n"
        "held = open('evil/config', 'w'); held.write('[core]\\n\\tbare = false\\n'); held.flush()\n"
        "os.mkdir('evil/objects'); os.mkdir('evil/refs')\n"
        "open('evil/HEAD', 'w').write('ref: refs/heads/main\\n')\n"
        f"held.seek(0); held.write(open({cfg!r}).read()); held.close()\n"
        "open('src/.git', 'w').write('gitdir: ../evil\\n')\n"
        "open('READY', 'w').close()\n"
        "deadline = time.monotonic() + 60\n"
        "while not os.path.exists('DONE') and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
    )
    import subprocess

    from tests.conftest import PROBE_PYTHON, client_command

    environ = dict(world.environ)
    child = subprocess.Popen(
        [*client_command("corral"), "run", "--", PROBE_PYTHON, "-c", script],
        cwd=world.workspace,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(ready) and child.poll() is None:
            assert time.monotonic() < deadline, "the command never got ready"
            time.sleep(0.05)
        assert child.poll() is None, child.communicate()
        for where in ("src", "evil"):  # the user's editor polls git meanwhile
            host_git(world, world.ws(where), "status")
        assert not os.path.exists(marker(world)), "the host's git ran planted code mid-run"
        with open(world.ws("evil", "config"), encoding="utf-8") as f:
            assert "fsmonitor" not in f.read()
    finally:
        World.write(done, "")
        _out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert_safe(world)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bare_repository_shaped_directory(world: World, backend: str) -> None:
    World.write(os.path.join(world.outside, "cfg"), payload_config(world) + "\tworktree = ..\n")
    result = run(
        world,
        f"mkdir -p bare && cp {world.outside}/cfg bare/config && mkdir bare/objects"
        " && echo 'ref: refs/heads/main' > bare/HEAD && mkdir bare/refs",
        backend,
    )
    assert b"would become a repository whose config runs code" in result.stderr, result.stderr
    assert not os.path.exists(world.ws("bare", "refs"))
    assert_safe(world)


def read_if_file(path: str) -> bytes | None:
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def seed_repo(world: World, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    assert host_git(world, path, "init", "-q").returncode == 0
    assert host_git(world, path, "commit", "-q", "--allow-empty", "-m", "seed").returncode == 0


@pytest.mark.parametrize(
    "target",
    [
        ".git/commondir",  # the workspace's repository
        "nested/.git/commondir",  # a nested repository
        ".git/modules/lib/commondir",  # a submodule's gitdir
        ".git/worktrees/w/commondir",  # a worktree's gitdir
        ".git/modules/lib/config",
        ".git/worktrees/w/config.worktree",
        "sub/.git",  # a submodule's .git file, rewritten
        "nested/.git/hooks/post-commit",
    ],
)
def test_redirects_of_existing_repositories_are_refused(world: World, target: str) -> None:
    os.rmdir(world.ws(".git"))
    seed_repo(world, world.workspace)
    seed_repo(world, world.ws("nested"))
    for gitdir in (".git/modules/lib", ".git/worktrees/w"):
        os.makedirs(world.ws(gitdir, "refs"))
        World.write(world.ws(gitdir, "HEAD"), "ref: refs/heads/main\n")
    World.write(world.ws(".git", "modules", "lib", "config"), "[core]\n\tbare = false\n")
    World.write(world.ws("sub", ".git"), "gitdir: ../.git/modules/lib\n")
    World.write(os.path.join(world.outside, "evil", "config"), payload_config(world))
    os.makedirs(os.path.join(world.outside, "evil", "objects"))
    os.makedirs(os.path.join(world.outside, "evil", "refs"))
    World.write(os.path.join(world.outside, "evil", "HEAD"), "ref: refs/heads/main\n")
    script = (
        f"mkdir -p evil && cp -r {world.outside}/evil/. evil/;"
        f" printf '%s\\n' ../../evil > {target}.tmp 2>/dev/null; mv -f {target}.tmp {target};"
        f" printf '%s\\n' 'gitdir: ../evil' > {target};"
        f" cp {world.outside}/evil/config {target}; echo '#!/bin/sh' > {target}; true"
    )
    before = read_if_file(world.ws(target))
    result = run(world, script)
    after = read_if_file(world.ws(target))
    assert before == after, result.stderr
    assert b"blocked write to" in result.stderr
    assert_safe(world)


def test_a_repository_made_in_the_sandbox_keeps_git_config_but_loses_code(world: World) -> None:
    # refused while the run lasts (a host editor may run git there meanwhile): a config
    # key git does not write itself, a hook that is not a sample, config as a symlink
    World.write(os.path.join(world.outside, "hook"), hook_script(world))
    result = run(
        world,
        "git init -q made && cd made && git config user.name agent;"
        " git config core.fsmonitor 'touch " + marker(world) + "';"
        f" cp {world.outside}/hook .git/hooks/post-commit; chmod +x .git/hooks/post-commit;"
        " printf '[core]\\n\\tfsmonitor = x\\n' > .git/config;"
        " ln -s ../../payload .git/config.worktree; echo DONE",
    )
    assert b"DONE" in result.stdout, result.stderr
    assert b"blocked write to" in result.stderr
    made = world.ws("made", ".git")
    with open(os.path.join(made, "config"), encoding="utf-8") as f:
        config = f.read()
    assert "agent" in config and "fsmonitor" not in config
    assert not os.path.lexists(os.path.join(made, "hooks", "post-commit"))
    assert not os.path.lexists(os.path.join(made, "config.worktree"))
    assert_safe(world)


def test_config_of_an_existing_repository_takes_only_keys_git_writes(world: World) -> None:
    os.rmdir(world.ws(".git"))
    seed_repo(world, world.workspace)
    with open(world.ws(".git", "config"), "a", encoding="utf-8") as f:
        f.write("[core]\n\thooksPath = .githooks-of-the-user\n")  # the user's own: kept
    result = run(
        world,
        "git config user.email agent@example.invalid && echo OK1;"
        f" git config core.fsmonitor 'touch {marker(world)}' || echo REFUSED;"
        " git config alias.st '!touch x' || echo REFUSED2",
    )
    assert b"OK1" in result.stdout and b"REFUSED\n" in result.stdout, result.stderr
    assert b"REFUSED2" in result.stdout
    with open(world.ws(".git", "config"), encoding="utf-8") as f:
        config = f.read()
    assert "agent@example.invalid" in config and "hooksPath" in config
    assert "fsmonitor" not in config and "alias" not in config
    assert_safe(world)


def test_a_symlinked_hooks_directory_in_a_new_repository(world: World) -> None:
    World.write(os.path.join(world.outside, "hook"), hook_script(world))
    run(
        world,
        f"mkdir -p payload && cp {world.outside}/hook payload/post-commit && chmod +x payload/*"
        " && git init -q made && rm -rf made/.git/hooks && ln -s ../../payload made/.git/hooks",
    )
    assert not os.path.islink(world.ws("made", ".git", "hooks"))
    assert_safe(world)


def test_deleting_a_nested_repository_cannot_widen_the_next_workspace(world: World) -> None:
    os.rmdir(world.ws(".git"))
    seed_repo(world, world.workspace)
    World.write(world.ws("inner", ".git"), "gitdir: ../.git\n")
    result = world.run("rm -f .git; rm -rf .git; mv .git gone; true", cwd=world.ws("inner"))
    assert os.path.isfile(world.ws("inner", ".git")), result.stderr


# ------------------------------------------------------------------ git keeps working
def make_upstream(world: World) -> tuple[str, str]:
    """A library repository and an app repository that has it as a submodule."""
    lib = os.path.join(world.outside, "lib")
    app = os.path.join(world.outside, "app")
    seed_repo(world, lib)
    World.write(os.path.join(lib, "lib.txt"), "lib\n")
    host_git(world, lib, "add", "lib.txt")
    host_git(world, lib, "commit", "-q", "-m", "lib")
    seed_repo(world, app)
    World.write(os.path.join(app, "app.txt"), "app\n")
    host_git(world, app, "add", "app.txt")
    assert (
        host_git(
            world, app, "-c", "protocol.file.allow=always", "submodule", "add", "-q", lib, "lib"
        ).returncode
        == 0
    )
    assert host_git(world, app, "commit", "-q", "-m", "app").returncode == 0
    return lib, app


@pytest.mark.parametrize("backend", BACKENDS)
def test_git_init_clone_worktree_and_submodules_work_in_the_sandbox(
    world: World, backend: str
) -> None:
    _lib, app = make_upstream(world)
    ident = "-c user.name=a -c user.email=a@example.invalid -c protocol.file.allow=always"
    script = (
        "set -e\n"
        f"git init -q fresh && cd fresh && git {ident} commit -q --allow-empty -m one && cd ..\n"
        f"git {ident} clone -q {app} app && cd app\n"
        f"git {ident} submodule update -q --init\n"
        "test -f lib/lib.txt\n"
        f"git {ident} worktree add -q ../app-wt\n"
        "cd ../app-wt && test -f app.txt && git status --short\n"
        "echo ALL-OK\n"
    )
    result = run(world, script, backend)
    assert b"ALL-OK" in result.stdout, result.stderr
    # a superproject that existed before the run: submodule init adds its own keys
    app_copy = world.ws("app-existing")
    assert host_git(world, world.workspace, "clone", "-q", app, app_copy).returncode == 0
    existing = run(
        world,
        f"cd app-existing && git {ident} submodule update -q --init && test -f lib/lib.txt"
        " && echo SUB-OK",
        backend,
    )
    assert b"SUB-OK" in existing.stdout, existing.stderr
    assert b"quarantined" not in result.stderr, result.stderr
    assert b"blocked" not in result.stderr, result.stderr
    for repo in ("fresh", "app", "app/lib", "app-wt"):
        status = host_git(world, world.ws(repo), "status", "--short")
        assert status.returncode == 0, (repo, status.stderr)
    log = host_git(world, world.ws("app"), "log", "--oneline")
    assert b"app" in log.stdout
    assert_safe(world)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hook_paths_named_by_the_trusted_config_are_protected(world: World, backend: str) -> None:
    os.rmdir(world.ws(".git"))
    seed_repo(world, world.workspace)
    host_git(world, world.workspace, "config", "core.hooksPath", ".githooks")
    host_git(world, world.workspace, "config", "core.fsmonitor", "tools/fsmon.sh")
    World.write(os.path.join(world.outside, "hook"), hook_script(world))
    result = run(
        world,
        f"mkdir -p .githooks tools; cp {world.outside}/hook .githooks/pre-commit;"
        f" cp {world.outside}/hook tools/fsmon.sh; chmod +x .githooks/* tools/*;"
        f" mkdir -p p && cp {world.outside}/hook p/pre-commit && ln -s p .githooks; true",
        backend,
    )
    assert b"blocked write to" in result.stderr
    assert not os.path.lexists(world.ws(".githooks"))
    assert not os.path.lexists(world.ws("tools", "fsmon.sh"))
    host_git(world, world.workspace, "config", "--unset", "core.fsmonitor")
    assert_safe(world)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hook_paths_named_by_nested_and_global_configs_are_protected(
    world: World, backend: str
) -> None:
    """A nested repository's config and the user's ~/.gitconfig name hook paths in the
    workspace (inside and outside the nested work tree): planting there is refused."""
    os.rmdir(world.ws(".git"))
    seed_repo(world, world.workspace)
    lib = world.ws("lib")
    seed_repo(world, lib)
    host_git(world, lib, "config", "core.hooksPath", ".githooks")
    host_git(world, lib, "config", "core.fsmonitor", "../tools/fsmon.sh")
    World.write(
        os.path.join(world.home, ".gitconfig"),
        f"[core]\n\thooksPath = .hooks-everywhere\n\tfsmonitor = {world.ws('bin', 'mon')}\n",
    )
    World.write(world.ws("hook.txt"), hook_script(world))
    targets = (
        "lib/.githooks/pre-commit",
        "tools/fsmon.sh",
        ".hooks-everywhere/pre-commit",
        "lib/.hooks-everywhere/pre-commit",
        "bin/mon",
    )
    script = "; ".join(
        f"mkdir -p {os.path.dirname(t)} && cp hook.txt {t} && chmod +x {t} && echo WROTE {t}"
        for t in targets
    )
    result = run(world, f"{script}; true", backend)
    assert b"WROTE" not in result.stdout, result.stdout
    for target in targets:
        assert not os.path.lexists(world.ws(target)), target
    os.remove(os.path.join(world.home, ".gitconfig"))  # the host's own fsmonitor would fail
    host_git(world, lib, "config", "--unset", "core.fsmonitor")
    assert_safe(world)


def test_a_repository_moved_into_place_is_checked(world: World) -> None:
    # a pre-existing bare-shaped directory (e.g. a test fixture) moved under a new name:
    # the moved tree was never journaled entry by entry, so the check walks it
    fixture = world.ws("fixtures", "deep", "evil")
    os.makedirs(os.path.join(fixture, "objects"))
    os.makedirs(os.path.join(fixture, "refs"))
    World.write(os.path.join(fixture, "HEAD"), "ref: refs/heads/main\n")
    World.write(os.path.join(fixture, "config"), payload_config(world))
    result = run(world, "mv fixtures/deep landed")
    assert result.returncode == 0, result.stderr
    assert os.path.exists(world.ws("landed", "evil", "config.corral-quarantined"))
    os.rename(world.ws("fixtures"), os.path.join(world.outside, "fixtures"))  # not the run's
    assert_safe(world)


def test_each_session_exec_is_checked(world: World) -> None:
    from corral import Sandbox

    World.write(os.path.join(world.outside, "cfg"), payload_config(world))
    with Sandbox(workspace=world.workspace, environ=world.environ) as sbx:
        first = sbx.exec(
            ["sh", "-c", f"mkdir -p evil/objects && cp {world.outside}/cfg evil/config"]
        )
        assert first.violations == ()  # no repository shape yet: plain files
        second = sbx.exec(["sh", "-c", "mkdir evil/refs"])  # would complete it: refused live
        assert [v.operation for v in second.violations] == ["mkdir"], second.violations
        # a redirect is judged after the exec (its content is written through an fd)
        third = sbx.exec(["sh", "-c", "mkdir sub && printf 'gitdir: ../evil\\n' > sub/.git"])
        assert [v.operation for v in third.violations] == ["git-check"], third.violations
    assert os.path.exists(world.ws("sub", ".git.corral-quarantined"))
    assert_safe(world)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="renameat2 is syscall 316 on x86_64")
def test_configs_renamed_into_place_are_validated_whatever_the_flags(world: World) -> None:
    code = r"""
import ctypes, os, subprocess
subprocess.run(["git", "init", "-q", "made"], check=True)
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
for flags in (0, 1, 2):  # plain, RENAME_NOREPLACE, RENAME_EXCHANGE
    with open("bad.cfg", "w") as f:
        f.write("[core]\n\tfsmonitor = touch MARKER\n")
    if flags == 1:
        os.rename("made/.git/config", "made/.git/config.keep")
    rc = libc.syscall(316, AT_FDCWD, b"bad.cfg", AT_FDCWD, b"made/.git/config", flags)
    print(flags, rc, ctypes.get_errno())
    if flags == 1 and os.path.exists("made/.git/config.keep"):
        os.rename("made/.git/config.keep", "made/.git/config")
""".replace("MARKER", marker(world))
    path = World.write(os.path.join(world.outside, "probe.py"), code)
    result = world.corral("run", "--allow-read", path, "--", "/usr/bin/python3", path)
    assert result.returncode == 0, result.stderr
    with open(world.ws("made", ".git", "config"), encoding="utf-8") as f:
        assert "fsmonitor" not in f.read()
    assert_safe(world)


#: Sandbox A of the two-broker race: toggles ``d/refs`` (the name that makes ``d`` shaped)
#: until ``stop``; it holds still while ``pause`` exists, and keeps ``refs`` while a config
#: exists; then its run lasts until ``DONE`` (its git check at its end would judge ``d``).
_TOGGLER = r"""
import os, time
os.makedirs("d/objects")
open("d/HEAD", "w").write("ref: refs/heads/main\n")
open("READY", "w").close()
end = time.monotonic() + 40
while not os.path.exists("stop") and time.monotonic() < end:
    if os.path.exists("pause"):
        open("paused", "w").close()
        while os.path.exists("pause") and not os.path.exists("stop"):
            time.sleep(0.005)
        os.unlink("paused")
        continue
    try:
        os.mkdir("d/refs")
    except OSError:
        pass
    if not os.path.exists("d/config"):
        try:
            os.rmdir("d/refs")
        except OSError:
            pass
end = time.monotonic() + 60
while not os.path.exists("DONE") and time.monotonic() < end:
    time.sleep(0.05)
"""

#: Sandbox B: creates ``d/config`` (its broker checked ``d`` not shaped); when afterwards
#: ``d`` is shaped and ``config`` is still the file B holds (A's broker judged ``d`` between
#: B's broker's check and its create), writes the payload through it, plants ``w/.git``
#: and an index, says ``WON`` and lasts until ``DONE``.
_CREATOR = r"""
import os, subprocess, sys, time
payload = open(sys.argv[1]).read()
subprocess.run("git init -q /tmp/ix && cd /tmp/ix && touch f && git add f", shell=True, check=True)
index = open("/tmp/ix/.git/index", "rb").read()
while not os.path.exists("READY"):
    time.sleep(0.01)
end = time.monotonic() + 30
while time.monotonic() < end:
    try:
        fd = os.open("d/config", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        try:
            os.unlink("d/config")
        except OSError:
            pass
        continue
    def current():
        try:
            return os.path.isdir("d/refs") and os.fstat(fd).st_ino == os.stat("d/config").st_ino
        except OSError:
            return False
    if current():
        open("pause", "w").close()
        while not os.path.exists("paused"):
            time.sleep(0.005)
        if current():
            open("stop", "w").close()
            os.write(fd, payload.encode())
            os.close(fd)
            os.makedirs("w")
            open("w/.git", "w").write("gitdir: ../d\n")
            open("w/f", "w").close()
            open("d/index", "wb").write(index)
            open("WON", "w").close()
            break
        os.unlink("pause")
    os.close(fd)
    try:
        os.unlink("d/config")
    except OSError:
        pass
open("stop", "w").close()
end = time.monotonic() + 60
while not os.path.exists("DONE") and time.monotonic() < end:
    time.sleep(0.05)
"""


def test_a_directory_shaped_by_another_sandbox_is_inert_while_both_runs_last(
    world: World,
) -> None:
    """Two sandboxes on one workspace have two write brokers. One broker's check that a
    directory is not shaped like a gitdir (so a ``config`` may be created there) and its
    create must not let the other broker's shaping of that directory in between: else the
    first holds a writable descriptor to the config of a repository-shaped directory, and
    the host's ``git status`` (an editor polling) runs its fsmonitor while the runs last."""
    import time

    from tests.conftest import PROBE_PYTHON, client_command

    cfg = World.write(os.path.join(world.outside, "cfg"), payload_config(world))
    run = [*client_command("corral"), "run", "--", PROBE_PYTHON, "-c"]
    spawn = {
        "cwd": world.workspace,
        "env": dict(world.environ),
        "stdout": subprocess.PIPE,
        "stderr": subprocess.PIPE,
    }
    a = subprocess.Popen([*run, _TOGGLER], **spawn)  # type: ignore[call-overload]
    b = subprocess.Popen([*run, _CREATOR, cfg], **spawn)  # type: ignore[call-overload]
    try:
        deadline = time.monotonic() + 90
        while not os.path.exists(world.ws("stop")) and b.poll() is None:
            assert time.monotonic() < deadline, "the race never ended"
            time.sleep(0.05)
        time.sleep(0.2)
        if os.path.isdir(world.ws("w")):
            host_git(world, world.ws("w"), "status")  # the user's editor polls git meanwhile
        assert not os.path.exists(marker(world)), "the host's git ran planted code mid-run"
    finally:
        World.write(world.ws("DONE"), "")
        for child in (a, b):
            try:
                child.communicate(timeout=60)
            finally:
                child.kill()
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert_safe(world)
