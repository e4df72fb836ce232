"""What a fresh run computes once per process obeys every change on the very next run.

One interpreter runs several fresh sandboxes in a row (as the server and the
SDK do), so the per-process memos of docs/design.md ("What a fresh run
computes once") are warm: each test edits the rule or the host between two
runs and checks that the next run obeys the new state, then that the old
rule comes back when restored (a memo must not stick to either).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.pipeline._request import ExecRequest
from corral.pipeline._runner import execute
from corral.policy import Policy
from tests.conftest import needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.backend("bubblewrap")]


def _policy(workspace: Path) -> Policy:
    policy = Policy.for_workspace(str(workspace), home=os.path.expanduser("~"))
    return policy.replace(backend="bubblewrap")


def _run(policy: Policy, workspace: Path, script: str, environ: dict[str, str]) -> str:
    request = ExecRequest.from_argv(["/bin/sh", "-c", script], cwd=str(workspace))
    outcome = execute(request, policy, environ=environ)
    return outcome.stdout.decode()


def test_env_rules_edited_between_runs_apply_to_the_next_run(tmp_path: Path) -> None:
    base = _policy(tmp_path)
    passes = base.replace(env=base.env.replace(pass_through=(*base.env.pass_through, "FRESH_*")))
    denied = passes.replace(env=passes.env.replace(deny=(*passes.env.deny, "FRESH_SECRET")))
    environ = {**os.environ, "FRESH_SECRET": "s3cret", "FRESH_PLAIN": "plain"}
    script = 'echo "${FRESH_SECRET-unset} ${FRESH_PLAIN-unset}"'
    assert _run(passes, tmp_path, script, environ) == "s3cret plain\n"
    assert _run(denied, tmp_path, script, environ) == "unset plain\n"
    assert _run(base, tmp_path, script, environ) == "unset unset\n"
    assert _run(passes, tmp_path, script, environ) == "s3cret plain\n"


def test_protect_rules_edited_between_runs_apply_to_the_next_run(tmp_path: Path) -> None:
    base = _policy(tmp_path)
    guarded = base.replace(
        filesystem=base.filesystem.replace(protect=(*base.filesystem.protect, "guarded-*.txt"))
    )
    script = "echo {0} > guarded-{0}.txt; echo done"
    target = tmp_path / "guarded-{}.txt"
    assert _run(guarded, tmp_path, script.format(1), dict(os.environ)) == "done\n"
    assert not target.with_name("guarded-1.txt").exists()
    assert _run(base, tmp_path, script.format(2), dict(os.environ)) == "done\n"
    assert target.with_name("guarded-2.txt").read_text() == "2\n"
    assert _run(guarded, tmp_path, script.format(3), dict(os.environ)) == "done\n"
    assert not target.with_name("guarded-3.txt").exists()


def test_a_file_the_host_creates_under_a_deny_glob_is_hidden_from_the_next_run(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    secrets = tmp_path / "secrets"
    workspace.mkdir()
    secrets.mkdir()
    (secrets / "old.pem").write_text("old-key\n")
    base = _policy(workspace)
    policy = base.replace(
        filesystem=base.filesystem.replace(
            deny_read=(*base.filesystem.deny_read, f"{secrets}/*.pem")
        )
    )
    script = f"cat {secrets}/old.pem {secrets}/new.pem 2>/dev/null; echo end"
    assert _run(policy, workspace, script, dict(os.environ)) == "end\n"
    (secrets / "new.pem").write_text("new-key\n")  # the host writes a secret between runs
    assert _run(policy, workspace, script, dict(os.environ)) == "end\n"
    (secrets / "new.pem").unlink()
    (secrets / "new.pem").symlink_to(secrets / "old.pem")  # and swaps it for a link
    assert _run(policy, workspace, script, dict(os.environ)) == "end\n"
