"""Holes in the write broker: rules that reached it only in part (issue 10, sections 4 and 5).

Each test makes the real attempt inside the sandbox and checks the host
afterwards. They run on bubblewrap and on landlock: both use the broker.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.conftest import PROBE_PYTHON, World, needs_bwrap

pytestmark = [needs_bwrap]

BACKENDS = ("bubblewrap", "landlock")


def py(world: World, code: str, backend: str, *options: str, cwd: str | None = None) -> Any:
    """Run *code* with ``PROBE_PYTHON`` on *backend*; the probe itself must finish."""
    path = World.write(os.path.join(world.outside, "probe.py"), code)
    result = world.corral(
        "run",
        *("--backend", backend, "--isolation", "process"),
        # landlock refuses a root caller (it would keep root's identity) unless told
        *(("--allow-degraded", "isolation") if backend == "landlock" and os.geteuid() == 0 else ()),
        *options,
        *("--allow-read", path, "--", PROBE_PYTHON, path),
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("backend", BACKENDS)
def test_deny_read_inside_the_workspace_holds_for_read_write_opens(
    world: World, backend: str
) -> None:
    World.write(world.ws(".env"), "API_KEY=hunter2\n")
    code = r"""
import os
for flags in (os.O_RDWR, os.O_RDWR | os.O_APPEND, os.O_WRONLY):
    try:
        fd = os.open(".env", flags)
    except OSError as exc:
        print("refused", exc.errno)
        continue
    try:
        print("read", os.read(fd, 100))
    except OSError as exc:
        print("unreadable", exc.errno)
for op in (lambda: os.rename(".env", "stolen"), lambda: os.unlink(".env"),
           lambda: os.link(".env", "hard")):
    try:
        op(); print("changed")
    except OSError as exc:
        print("refused", exc.errno)
"""
    result = py(world, code, backend, "--deny-read", world.ws(".env"))
    assert b"hunter2" not in result.stdout + result.stderr
    assert b"changed" not in result.stdout, result.stdout
    assert World.read(world.ws(".env")) == "API_KEY=hunter2\n"
    assert not os.path.exists(world.ws("stolen")) and not os.path.exists(world.ws("hard"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_secret_directory_cannot_be_renamed_away_from_a_home_workspace(
    world: World, backend: str
) -> None:
    # the workspace is the home directory: ~/.ssh is hidden inside it
    home_ws = world.home
    code = r"""
import os
for src in (".ssh", ".ssh/id_rsa", ".aws"):
    try:
        os.rename(src, "moved-" + os.path.basename(src)); print("moved", src)
    except OSError as exc:
        print("refused", src, exc.errno)
os.makedirs("x", exist_ok=True)
try:
    os.rename(".aws", "x/.aws"); print("moved into x")
except OSError as exc:
    print("refused", exc.errno)
"""
    result = py(world, code, backend, "--workspace", home_ws, "--allow-home-workspace", cwd=home_ws)
    assert b"moved" not in result.stdout, result.stdout + result.stderr
    assert os.path.exists(world.secret)
    assert os.path.exists(os.path.join(world.home, ".aws", "credentials"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "target",
    [
        "existing-dir/file.txt",  # inside an existing directory
        "existing-dir",  # the directory itself (rename/delete)
        "not-yet.txt",  # a file that does not exist yet
        "new/deeper/file.txt",  # nested path none of whose parts exist
    ],
)
def test_deny_write_absolute_paths_inside_the_workspace(
    world: World, backend: str, target: str
) -> None:
    World.write(world.ws("existing-dir", "keep.txt"), "keep\n")
    denied = world.ws(target.split("/")[0]) if target.startswith("new/") else world.ws(target)
    code = rf"""
import os, shutil
t = {target!r}
attempts = [
    lambda: (os.makedirs(os.path.dirname(t) or ".", exist_ok=True), open(t, "w").write("x")),
    lambda: open("existing-dir/keep.txt", "a").write("x") if t.startswith("existing-dir") else None,
    lambda: os.rename("existing-dir", "elsewhere") if t == "existing-dir" else None,
    lambda: shutil.rmtree("existing-dir") if t == "existing-dir" else None,
    lambda: os.symlink("/tmp", t.rstrip("/")) if not t.startswith("existing") else None,
]
for a in attempts:
    try:
        a()
    except OSError as exc:
        print("refused", exc.errno)
"""
    before = world.tree()
    result = py(world, code, backend, "--deny-write", denied)
    after = world.tree()
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    assert not {p for p in changed if p.startswith(denied)}, (changed, result.stderr)
    assert not os.path.lexists(world.ws("elsewhere"))
    assert os.path.exists(world.ws("existing-dir", "keep.txt"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_deny_write_over_an_allow_write_of_the_same_path(world: World, backend: str) -> None:
    extra = os.path.join(world.outside, "extra")
    World.write(os.path.join(extra, "a.txt"), "a\n")
    code = f"""
import os
for op in (lambda: open({extra!r} + "/a.txt", "a").write("x"),
           lambda: open({extra!r} + "/new.txt", "w").write("x"),
           lambda: os.mkdir({extra!r} + "/d")):
    try:
        op(); print("wrote")
    except OSError as exc:
        print("refused", exc.errno)
"""
    result = py(world, code, backend, "--allow-write", extra, "--deny-write", extra)
    assert b"wrote" not in result.stdout, result.stdout
    assert sorted(os.listdir(extra)) == ["a.txt"]
    assert World.read(os.path.join(extra, "a.txt")) == "a\n"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "name", [".vscode", ".claude", ".husky", ".devcontainer", ".idea", ".corral"]
)
def test_protected_directories_cannot_be_planted_as_symlinks(
    world: World, backend: str, name: str
) -> None:
    code = f"""
import os
os.makedirs("payload", exist_ok=True)
open("payload/tasks.json", "w").write("{{}}")
for where in ({name!r}, "sub/" + {name!r}):
    os.makedirs(os.path.dirname(where) or ".", exist_ok=True)
    try:
        os.symlink(os.path.abspath("payload"), where); print("planted", where)
    except OSError as exc:
        print("refused", exc.errno)
    try:
        open(where, "w").write("x"); print("planted file", where)
    except OSError as exc:
        print("refused", exc.errno)
"""
    result = py(world, code, backend)
    assert b"planted" not in result.stdout, result.stdout
    assert not os.path.lexists(world.ws(name))
    assert not os.path.lexists(world.ws("sub", name))


@pytest.mark.parametrize("backend", BACKENDS)
def test_git_hooks_cannot_be_planted_as_a_symlink(world: World, backend: str) -> None:
    code = """
import os
os.makedirs("payload", exist_ok=True)
try:
    os.symlink(os.path.abspath("payload"), ".git/hooks"); print("planted")
except OSError as exc:
    print("refused", exc.errno)
"""
    result = py(world, code, backend)
    assert b"planted" not in result.stdout, result.stdout
    assert not os.path.lexists(world.ws(".git", "hooks"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["home-workspace", "allow-write-config"])
def test_corral_own_settings_and_state_cannot_be_planted(
    world: World, backend: str, how: str
) -> None:
    # ~/.config/corral and ~/.local/state/corral: as a symlink, a directory or a file
    config = os.path.join(world.home, ".config")
    os.makedirs(config, exist_ok=True)
    payload = World.write(os.path.join(world.home, "x", "settings.json"), '{"backend": "none"}')
    code = f"""
import os
attempts = [
    lambda: os.symlink({os.path.dirname(payload)!r}, {config!r} + "/corral"),
    lambda: os.mkdir({config!r} + "/corral"),
    lambda: open({config!r} + "/corral", "w").write("x"),
    lambda: os.rename({os.path.dirname(payload)!r}, {config!r} + "/corral"),
    lambda: os.makedirs({world.home!r} + "/.local/state", exist_ok=True)
    or os.symlink("/tmp", {world.home!r} + "/.local/state/corral"),
]
for attempt in attempts:
    try:
        attempt(); print("planted")
    except OSError as exc:
        print("refused", exc.errno)
"""
    if how == "home-workspace":
        result = py(
            world,
            code,
            backend,
            "--workspace",
            world.home,
            "--allow-home-workspace",
            cwd=world.home,
        )
    else:
        result = py(world, code, backend, "--allow-write", config)
    assert b"planted" not in result.stdout, result.stdout
    assert not os.path.lexists(os.path.join(config, "corral"))
    assert not os.path.lexists(os.path.join(world.home, ".local", "state", "corral", "x"))
