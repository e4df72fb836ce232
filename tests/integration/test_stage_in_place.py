"""The exec helper's ``--as-user`` stage clones only the bind sources the sandbox's uid cannot reach.

A root caller's bubblewrap runs as :data:`ROOT_SANDBOX_ID`; a bind source that
uid cannot look up (below a 0700 directory) is cloned onto ``/dev/shm/<k>`` of
the stage's private mount namespace, and one it can look up is bound from
where it is (docs/design.md, "The exec helper"). The helper asks the kernel
on every run, so a directory the host closes between two runs is staged on the
very next one. These tests run the helper itself with a program that prints the
argv it receives and lists the staged clone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral._exceptions import LaunchFailed
from corral.backends import helper_path
from corral.backends.bubblewrap import ROOT_SANDBOX_ID
from corral.pipeline._outcome import Outcome
from corral.pipeline._request import ExecRequest
from corral.pipeline._runner import execute, launch, prepare
from corral.policy import Policy, ResourceLimits
from tests.conftest import needs_bwrap, needs_root

pytestmark = [needs_root, needs_bwrap]

# the program run by the stage (as the sandbox's uid): the words it got, then the clone's content
SHOW = 'echo "$@"; ls /dev/shm/1 2>&1; cat /proc/self/status | grep ^Uid:'


def _stage(*sources: str, extra: tuple[str, ...] = ()) -> list[str]:
    helper = helper_path()
    assert helper is not None
    argv = [helper, "--as-user", str(ROOT_SANDBOX_ID)]
    for source in sources:
        argv += ["--stage", source]
    words = [w for k in range(len(sources)) for w in ("--ro-bind", f"/dev/shm/{k}", f"/dest{k}")]
    argv += ["--", "/bin/sh", "-c", SHOW, "sh", *words, *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """An open directory (0755 all the way) and one below a root-only 0700 directory."""
    base = Path("/tmp") / f"corral-stage-{os.getpid()}"
    (base / "open").mkdir(parents=True)
    base.chmod(0o755)
    (base / "open" / "o.txt").write_text("o")
    closed = tmp_path / "closed"
    (closed / "inner").mkdir(parents=True)
    closed.chmod(0o700)
    (closed / "inner" / "i.txt").write_text("i")
    yield base / "open", closed / "inner"
    (base / "open" / "o.txt").unlink()
    (base / "open").rmdir()
    base.rmdir()


def test_a_reachable_source_is_bound_in_place_and_a_closed_one_staged(
    dirs: tuple[Path, Path],
) -> None:
    open_dir, inner = dirs
    words, listing, uid = _stage(str(open_dir), str(inner))
    assert words.split() == [
        "--ro-bind",
        str(open_dir),
        "/dest0",
        "--ro-bind",
        "/dev/shm/1",
        "/dest1",
    ]
    assert listing == "i.txt"  # the clone of the closed directory, readable by the sandbox's uid
    assert uid.split()[1:] == [str(ROOT_SANDBOX_ID)] * 4


def test_a_directory_the_host_closes_is_staged_on_the_next_run(dirs: tuple[Path, Path]) -> None:
    open_dir, inner = dirs
    assert _stage(str(inner), str(open_dir))[0].split()[4] == str(open_dir)
    open_dir.parent.chmod(0o700)  # the host closes it between two runs
    try:
        words, listing, _uid = _stage(str(inner), str(open_dir))
    finally:
        open_dir.parent.chmod(0o755)
    assert words.split()[4] == "/dev/shm/1"
    assert listing == "o.txt"


def test_an_ambiguous_word_is_staged(dirs: tuple[Path, Path]) -> None:
    # the same source word twice (here the second copy is the command's own argument):
    # the helper cannot tell which one is bubblewrap's, so it stages
    open_dir, inner = dirs
    words, listing, _uid = _stage(str(inner), str(open_dir), extra=("--ro-bind", "/dev/shm/1"))
    assert words.split()[4] == "/dev/shm/1"
    assert listing == "o.txt"


def _run_beside(workspace: Path, writable: Path, script: str) -> Outcome:
    """*script* run by ``sh`` in a bubblewrap sandbox of *workspace* that may also write
    *writable* (an ``allowWrite`` directory)."""
    policy = Policy.for_workspace(str(workspace), home=os.path.expanduser("~"))
    policy = policy.replace(
        backend="bubblewrap",
        filesystem=policy.filesystem.replace(
            allow_write=(*policy.filesystem.allow_write, str(writable))
        ),
    )
    request = ExecRequest.from_argv(["/bin/sh", "-c", script], cwd=str(workspace))
    return execute(request, policy, environ=dict(os.environ))


def test_a_sandbox_over_both_kinds_of_source_reads_and_writes(
    dirs: tuple[Path, Path],
) -> None:
    open_dir, inner = dirs
    script = f"cat o.txt {inner}/i.txt && echo w > new.txt && echo w > {inner}/new.txt"
    outcome = _run_beside(open_dir, inner, script)
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout == b"oi"
    for written in (open_dir / "new.txt", inner / "new.txt"):
        assert written.read_text() == "w\n"
        assert written.stat().st_uid == 0  # stored as the caller's, through the idmapping
        written.unlink()


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """An open directory under /dev/shm, where the stage mounts its private tmpfs."""
    path = Path("/dev/shm") / f"corral-stage-{os.getpid()}"
    path.mkdir(mode=0o755)
    (path / "s.txt").write_text("s")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_source_under_the_stage_directory_is_staged_from_the_host(
    dirs: tuple[Path, Path], shm_dir: Path
) -> None:
    """The stage's tmpfs on /dev/shm would hide a source there (or part of one above it)
    from bubblewrap: such a source is always cloned - before the tmpfs exists - never
    bound from where it is, even when the sandbox's uid can reach it."""
    _open_dir, inner = dirs
    words, listing, _uid = _stage(str(inner), str(shm_dir))
    assert words.split()[4] == "/dev/shm/1"
    assert listing == "s.txt"  # the host's directory, not the (empty) staging tmpfs
    words = _stage(str(inner), "/dev")[0]  # above it: staged too
    assert words.split()[4] == "/dev/shm/1"


def test_a_workspace_under_dev_shm_runs_beside_a_staged_source(
    dirs: tuple[Path, Path], shm_dir: Path
) -> None:
    _open_dir, inner = dirs
    outcome = _run_beside(shm_dir, inner, f"cat s.txt {inner}/i.txt && echo w > new.txt")
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout == b"si"
    assert (shm_dir / "new.txt").read_text() == "w\n"


def test_a_sandbox_that_dies_in_its_set_up_says_why(tmp_path: Path) -> None:
    """bubblewrap failing early in its set-up (a bind source gone after the plan was made):
    the error is bubblewrap's reason - the sandbox is usually gone before it could join its
    cgroup, which used to surface as the failed move of a process that no longer exists."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    policy = Policy.for_workspace(str(workspace), home=os.path.expanduser("~"))
    policy = policy.replace(backend="bubblewrap", resources=ResourceLimits(memory=256 << 20))
    request = ExecRequest.from_argv(["true"], cwd=str(workspace))
    prepared = prepare(request, policy, environ=dict(os.environ))
    if prepared.layout is None:
        pytest.skip("no cgroup layout for a memory limit here")
    gone = tmp_path / "gone"  # never made: bubblewrap's first mount fails
    argv = list(prepared.plan.argv)
    at = next(i for i, word in enumerate(argv) if os.path.basename(word) == "bwrap") + 1
    argv[at:at] = ["--ro-bind", str(gone), "/mnt"]
    prepared.plan = prepared.plan.replace(argv=tuple(argv))
    with pytest.raises(LaunchFailed) as failed:
        launch(prepared, request)
    message = str(failed.value)
    assert "Can't find source path" in message and str(gone) in message, message


def test_a_source_linked_into_the_stage_directory_never_shows_another_clone(
    dirs: tuple[Path, Path],
) -> None:
    """A source the sandbox's uid can reach, named through a link into /dev/shm (here
    ``open/ln/0`` with ``ln -> /dev/shm``), was bound by its text "in place": in the stage's
    namespace that text resolves into the staging tmpfs, onto the clone of *another* staged
    source (``/dev/shm/0``, a root-only directory), whose files the sandbox then read without
    the masks bound over their own destination. The run must fail instead (a staged source
    with a link on its way). Runs in a private mount namespace with its own tmpfs on
    /dev/shm, so the host's /dev/shm is not touched."""
    open_dir, inner = dirs
    (inner / "secret").write_text("TOPSECRET")
    (inner / "secret").chmod(0o644)  # the sandbox's uid may read it, but only where bound
    link = open_dir / "ln"
    link.symlink_to("/dev/shm")
    helper = helper_path()
    assert helper is not None
    alias = f"{link}/0"
    script = (
        "mount --make-rprivate / && mount -t tmpfs tmpfs /dev/shm && mkdir -m 755 /dev/shm/0 && "
        'exec "$@"'
    )
    words = ["--ro-bind", "/dev/shm/0", "/dest0", "--ro-bind", "/dev/shm/1", "/dest1"]
    argv = ["unshare", "-m", "sh", "-c", script, "sh", helper, "--as-user", str(ROOT_SANDBOX_ID)]
    argv += ["--stage", str(inner), "--stage", alias, "--", "/bin/sh", "-c"]
    argv += ['cat "$5/secret"', "sh", *words]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    finally:
        link.unlink()
        (inner / "secret").unlink()
    assert "TOPSECRET" not in done.stdout, done.stdout
    assert done.returncode != 0 and "symbolic link" in done.stderr, done.stderr
