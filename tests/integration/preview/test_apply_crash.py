"""An apply killed at any point leaves every file wholly old or wholly new, and is completed.

Two kinds of trials against one real overlay preview (restored before each):

* fault injection: a forked child runs ``Preview.apply`` and SIGKILLs itself
  at step *k* of the apply, for every step the apply has (and more at random
  until there are at least 200 trials);
* ``corral apply`` as a process, SIGKILLed at a random moment.

After each kill: every path is exactly its old or its new version (a name
being replaced may show only the temporary ``.corral-apply-*`` file next to
it), then the next corral command completes the journal: the workspace is
exactly the tree the command saw (or untouched, if the kill came before the
journal was committed), and no temporary file or journal is left.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from corral.preview import Preview, recover_interrupted
from corral.preview import _apply as apply_module
from tests.integration.preview.conftest import SHOW_TREE
from tests.tree_listing import tree

MIN_TRIALS = 200
CLI_TRIALS = 30

SETUP = """
set -e
i=0
while [ $i -lt 40 ]; do
  mkdir -p "d$((i % 5))"
  letter="$(printf \\\\$(printf %o $((65 + i % 26))))"
  head -c 8192 /dev/zero | tr '\\0' "$letter" > "d$((i % 5))/f$i"
  i=$((i + 1))
done
mkdir -p gone/deeper && echo g > gone/deeper/x && echo h > gone/y
echo was-a-file > becomes_dir
mkdir becomes_file && echo inner > becomes_file/inner
ln -s d0/f0 link
chmod 644 d1/f1
"""

EDITS = """
set -e
for f in d0/* d2/*; do head -c 8192 /dev/urandom > "$f"; done
i=0; while [ $i -lt 12 ]; do head -c 4096 /dev/urandom > "d4/new$i"; i=$((i + 1)); done
rm -f d3/f3 d3/f8 d3/f13
mv d1/f6 d1/f6.renamed
chmod 755 d1/f1
rm -r gone
rm becomes_dir && mkdir becomes_dir && echo now > becomes_dir/child
rm -r becomes_file && echo now-a-file > becomes_file
ln -sf d2/f2 link
mkdir -p brand/new/tree && echo t > brand/new/tree/leaf
"""


class Trials:
    """Where the trials run: a workspace and state dir restored from the templates each time.

    On a tmpfs when there is one (``/dev/shm``): fsync is free there, which keeps
    hundreds of trials fast; a kill -9 is survived the same way on any
    filesystem (the page cache outlives the process).
    """

    def __init__(self, root: str) -> None:
        from tests.integration.preview.conftest import World

        self.world = World(root)
        self.workspace = self.world.workspace
        self.state = self.world.state

    def cli_env(self) -> dict[str, str]:
        return self.world.cli_env()


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A workspace and a preview of it (run for real, on disk), kept as templates."""
    from tests.integration.preview.conftest import World

    root = str(tmp_path_factory.mktemp("crash"))
    world = World(root)
    subprocess.run(["/bin/sh", "-c", SETUP], cwd=world.workspace, check=True)
    preview = world.preview("overlay")
    outcome = world.run(preview, EDITS + SHOW_TREE)
    assert outcome.returncode == 0, outcome.stderr
    old, new = tree(world.workspace), json.loads(outcome.stdout)
    saved_ws = os.path.join(root, "ws.template")
    saved_preview = os.path.join(root, "preview.template")
    subprocess.run(["cp", "-a", world.workspace, saved_ws], check=True)
    subprocess.run(["cp", "-a", preview.path, saved_preview], check=True)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else root
    scratch = tempfile.mkdtemp(prefix="corral-crash-", dir=shm)
    try:
        yield Trials(scratch), preview.id, saved_ws, saved_preview, old, new
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def restore(template) -> None:
    """The workspace as it was, and the preview as the run left it (with this workspace path)."""
    world, preview_id, saved_ws, saved_preview, _old, _new = template
    shutil.rmtree(world.workspace, ignore_errors=True)
    subprocess.run(["cp", "-a", saved_ws, world.workspace], check=True)
    previews = os.path.join(world.state, "previews")
    os.makedirs(previews, exist_ok=True)
    for name in os.listdir(previews):
        if name != ".apply.lock":
            subprocess.run(["rm", "-rf", os.path.join(previews, name)], check=True)
    target = os.path.join(previews, preview_id)
    subprocess.run(["cp", "-a", saved_preview, target], check=True)
    shutil.rmtree(os.path.join(world.state, "apply-journals"), ignore_errors=True)
    meta_path = os.path.join(target, "preview.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["workspace"] = world.workspace
    # the restored copy is new, but older than the preview: a base time after it
    meta["base_ns"] = time.time_ns()
    with open(meta_path, "w") as f:
        json.dump(meta, f)


def check_each_path_old_or_new(workspace, old, new) -> None:
    now = tree(workspace)
    for path in set(old) | set(new) | set(now):
        name = path.rsplit("/", 1)[-1]
        if name.startswith(".corral-apply-"):
            continue  # a temporary name next to its target, never the target itself
        if any(p.startswith(".corral-apply-") for p in path.split("/")[:-1]):
            continue  # inside an exchanged-out temporary directory
        assert now.get(path) in (old.get(path), new.get(path)), (
            f"{path}: {now.get(path)} is neither old {old.get(path)} nor new {new.get(path)}"
        )


def journal_pending(world, preview_id) -> bool:
    return os.path.exists(os.path.join(world.state, "apply-journals", f"{preview_id}.json"))


def expected_after_kill(world, old, new, pending) -> dict:
    """With a journal, the next command completes it: new. Without one, the kill came
    before the journal was committed (old, untouched) or after it was done (new)."""
    if pending:
        return new
    now = tree(world.workspace)
    assert now in (old, new), "no journal, but the workspace is neither wholly old nor wholly new"
    return now


def check_completed(world, preview_id, expected, new) -> None:
    assert tree(world.workspace) == expected
    journals = os.path.join(world.state, "apply-journals")
    assert not os.path.exists(journals) or os.listdir(journals) == []
    remaining = Preview.list(state_dir=world.state)  # also sweeps an interrupted removal
    if expected == new:
        assert remaining == []
        assert [
            n for n in os.listdir(os.path.join(world.state, "previews")) if n != ".apply.lock"
        ] == []
    else:
        assert [p.id for p in remaining] == [preview_id]


def count_steps(template) -> int:
    world, preview_id, *_ = template
    restore(template)
    labels: list[str] = []
    apply_module.FAULT_HOOK = labels.append
    try:
        Preview.open(preview_id, state_dir=world.state).apply()
    finally:
        apply_module.FAULT_HOOK = None
    return len(labels)


def apply_and_die_at(world, preview_id, step) -> int:
    """Fork; the child applies and SIGKILLs itself at *step*; return the wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            seen = [0]

            def fault(_label: str) -> None:
                seen[0] += 1
                if seen[0] == step:
                    os.kill(os.getpid(), signal.SIGKILL)

            apply_module.FAULT_HOOK = fault
            Preview.open(preview_id, state_dir=world.state).apply()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return status


def test_apply_killed_at_every_step_is_completed_by_the_next_command(template):
    world, preview_id, _ws, _pv, old, new = template
    steps = count_steps(template)
    assert steps > 100  # the change set is big enough to be interesting
    check_completed(world, preview_id, new, new)  # the uninterrupted apply
    plan = list(range(1, steps + 1))
    rng = random.Random(5)
    while len(plan) < MIN_TRIALS:
        plan.append(rng.randint(1, steps))
    killed = 0
    for step in plan:
        restore(template)
        status = apply_and_die_at(world, preview_id, step)
        assert os.WIFSIGNALED(status), (step, status)
        assert os.WTERMSIG(status) == signal.SIGKILL, (step, status)
        killed += 1
        check_each_path_old_or_new(world.workspace, old, new)
        pending = journal_pending(world, preview_id)
        expected = expected_after_kill(world, old, new, pending)
        messages = recover_interrupted(world.state)  # what every corral command does first
        assert bool(messages) == pending
        check_completed(world, preview_id, expected, new)
    assert killed >= MIN_TRIALS


def _start_and_wait_for_journal(argv, env, journal, timeout=30.0):
    """Start ``corral apply``; return (process, seconds until its journal appeared or it exited)."""
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start = time.monotonic()
    while not os.path.exists(journal) and process.poll() is None:
        if time.monotonic() - start > timeout:
            process.kill()
            raise AssertionError("corral apply did not start applying")
        time.sleep(0.0002)
    return process, time.monotonic() - start


@pytest.mark.slow
def test_corral_apply_sigkilled_at_random_moments(template):
    """One third of the kills at any moment of the process's life, the rest while it applies."""
    world, preview_id, _ws, _pv, old, new = template
    argv = [sys.executable, "-m", "corral", "apply", preview_id]
    journal = os.path.join(world.state, "apply-journals", f"{preview_id}.json")
    restore(template)
    process, startup = _start_and_wait_for_journal(argv, world.cli_env(), journal)
    begin = time.monotonic()
    assert process.wait() == 0
    applying = time.monotonic() - begin
    rng = random.Random(7)
    outcomes = {"untouched": 0, "completed": 0, "journal": 0}
    for trial in range(CLI_TRIALS):
        restore(template)
        if trial % 3 == 0:
            process = subprocess.Popen(
                argv, env=world.cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            time.sleep(rng.uniform(0, startup + applying))
        else:
            process, _ = _start_and_wait_for_journal(argv, world.cli_env(), journal)
            time.sleep(rng.uniform(0, applying))
        process.send_signal(signal.SIGKILL)
        process.wait()
        check_each_path_old_or_new(world.workspace, old, new)
        pending = journal_pending(world, preview_id)
        expected = expected_after_kill(world, old, new, pending)
        outcomes["journal" if pending else "completed" if expected == new else "untouched"] += 1
        listing = subprocess.run(
            [sys.executable, "-m", "corral", "previews"],
            env=world.cli_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        assert ("completed the interrupted apply" in listing.stderr) == pending, listing.stderr
        assert "failed" not in listing.stderr, listing.stderr
        check_completed(world, preview_id, expected, new)
    assert outcomes["journal"] >= CLI_TRIALS // 6, outcomes  # many kills landed inside the apply
