"""``corral run --report-fd``: the sandbox's untrusted directory report, checked and handed on."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from corral.cli._client import _write_report
from corral.server._cwd_report import (
    MAX_REPORT,
    checked_directory,
    make_report_dir,
    tagged_report,
    take_report,
)


@pytest.fixture
def workspace(tmp_path: Path) -> str:
    ws = tmp_path / "ws"
    (ws / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", ws / "out")
    os.symlink(ws / "sub", ws / "in")
    (ws / "file").write_text("x")
    return str(ws)


def test_a_directory_at_or_under_the_workspace_is_reported_by_its_real_path(
    workspace: str,
) -> None:
    assert checked_directory(workspace.encode() + b"\n", workspace) == workspace
    assert checked_directory(f"{workspace}/sub/deeper".encode(), workspace) == (
        f"{workspace}/sub/deeper"
    )
    # a link that stays inside, and dot-dot that stays inside: their real path
    assert checked_directory(f"{workspace}/in\n".encode(), workspace) == f"{workspace}/sub"
    assert checked_directory(f"{workspace}/sub/..".encode(), workspace) == workspace


@pytest.mark.parametrize(
    "claim",
    [
        "{ws}/out",  # a link out of the workspace
        "{ws}/sub/../../outside",  # dot-dot out
        "{ws}/..",
        "/",
        "{ws}x",  # a sibling whose name starts with the workspace's
        "{ws}/file",  # not a directory
        "{ws}/missing",
        "sub",  # relative
        "{ws}/sub\n{ws}",  # two lines
        "{ws}/sub\n\n",
        "{ws}/sub\0",
        "",
    ],
)
def test_anything_else_reports_nothing(workspace: str, claim: str) -> None:
    assert checked_directory(claim.format(ws=workspace).encode(), workspace) is None


def test_a_report_too_large_or_absent_reports_nothing(workspace: str) -> None:
    long = (workspace + "/sub" + "/." * MAX_REPORT).encode()
    assert checked_directory(long[: MAX_REPORT + 1], workspace) is None
    assert checked_directory(None, workspace) is None


def test_the_report_directory_is_private_and_taken_back_without_following_links(
    tmp_path: Path,
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("keep")
    directory = make_report_dir({"TMPDIR": str(tmp_path)})
    assert os.stat(directory).st_mode & 0o777 == 0o700
    Path(directory, "cwd").write_text("/some/where\n")
    os.symlink(victim, os.path.join(directory, "link"))
    assert take_report(directory) == b"/some/where\n"
    assert not os.path.exists(directory) and (victim / "keep").read_text() == "keep"
    # a report that is a link (to a file the sandbox cannot write) is not read
    directory = make_report_dir({"TMPDIR": str(tmp_path)})
    os.symlink(victim / "keep", os.path.join(directory, "cwd"))
    assert take_report(directory) is None and (victim / "keep").exists()


def test_the_client_writes_the_servers_report_only_to_a_descriptor_of_its_callers() -> None:
    read, write = os.pipe()
    own = socket.socket(socket.AF_UNIX)
    try:
        for report in (
            {"fd": write, "text": "/ws/sub\n"},
            {"fd": 2, "text": "no\n"},
            {"fd": True, "text": "no\n"},
            {"fd": own.fileno(), "text": "no\n"},
            {"fd": write, "text": 7},
            ["fd", write],
            None,
        ):
            _write_report(report, own.fileno())
        os.close(write)
        assert os.read(read, 4096) == b"/ws/sub\n"
    finally:
        own.close()
        os.close(read)


@pytest.mark.parametrize("given", ["0", "1", "2", "-3", "x", "3.0", "", "٣"])
def test_report_fd_must_be_a_descriptor_number_of_3_or_more(given: str, tmp_path: Path) -> None:
    from corral.cli.commands.run import Caller, run
    from corral.pipeline._runner import SignalRelay

    read, write = os.pipe()
    try:
        caller = Caller(cwd=str(tmp_path), environ={"HOME": str(tmp_path)}, stdio=(-1, -1, write))
        status = run(["--report-fd", given, "--", "true"], caller, SignalRelay())
        os.close(write)
        assert status == 125
        assert b"--report-fd" in os.read(read, 4096)
    finally:
        os.close(read)


def test_a_tagged_report_is_the_tail_after_this_runs_marker_only(workspace: str) -> None:
    """A kept sandbox's shell state: exports, then ``return``, the run's id, the report."""
    sub = f"{workspace}/sub".encode()
    # exported values are the command's: one may even hold a marker line for this id
    exports = b'declare -x A="x\nreturn\nsbx-1\n/forged"\n' * 600  # larger than the window

    def report(data: bytes) -> bytes | None:
        return tagged_report(data, "sbx-1")

    assert report(exports + b"return\nsbx-1\n" + sub + b"\n") == sub + b"\n"
    assert report(b"return\nsbx-1\n" + sub) == sub  # the marker starts the state
    assert report(b"declare -x B=1\n") is None  # no report: failed, or ended by exec
    assert report(b"") is None
    too_long = report(exports + b"return\nsbx-1\n" + b"/" * (MAX_REPORT + 50))
    assert checked_directory(too_long, workspace) is None  # past the window, or too long
    # an earlier run's report: what follows this run's marker (if any) is no report
    for stale in (b"declare -x B=1\n", exports):
        found = report(stale + b"return\nsbx-0\n" + sub + b"\n")
        assert checked_directory(found, workspace) is None, found
