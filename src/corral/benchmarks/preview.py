"""Preview: set-up and tear-down against workspace size; diff and apply against changed files.

Rows (medians; baselines measured in the same run):

* ``set-up``: ``Preview.create`` plus the extra time of running ``true`` in
  the preview over running it in the same sandbox without one (the overlay
  mount) - for workspaces of 1k, 10k and 100k files. Target: <= 50 ms and
  flat (the 100k/1k ratio near 1).
* ``tear-down``: ``Preview.discard`` after a run that changed 10 files.
* the copy mechanism's set-up for contrast (it grows with the workspace).
* ``diff``: computing the change set and rendering every diff, for 10 and
  1,000 changed files; ``apply``: landing them. Target: proportional to the
  changed files, independent of the workspace (the same 10 files in a 1k and
  a 100k workspace).
"""

from __future__ import annotations

import os
import shutil
import time

from . import Context, Row

__all__ = ["run"]

SIZES = (1_000, 10_000, 100_000)


def _make_workspace(root: str, files: int) -> str:
    """*files* small files, 100 per directory."""
    ws = os.path.join(root, f"ws-{files}")
    if os.path.isdir(ws):
        return ws
    os.makedirs(ws)
    for i in range(files):
        directory = os.path.join(ws, f"d{i // 100:04d}")
        if i % 100 == 0:
            os.mkdir(directory)
        with open(os.path.join(directory, f"f{i:06d}.txt"), "w") as f:
            f.write(f"line one of file {i}\nline two\n")
    return ws


class _Runner:
    """Runs ``sh -c SCRIPT`` in a workspace, with or without a preview, in-process."""

    def __init__(self, workspace: str, state: str) -> None:
        from ..policy import Policy, ResourceLimits

        self.workspace = workspace
        self.state = state
        self.policy = Policy.for_workspace(workspace, home=os.environ.get("HOME", "/")).replace(
            resources=ResourceLimits(timeout=600.0)
        )

    def run(self, script: str, preview: object = None) -> None:
        from ..pipeline._request import ExecRequest
        from ..pipeline._runner import execute

        request = ExecRequest.from_argv(["/bin/sh", "-c", script], cwd=self.workspace)
        outcome = execute(request, self.policy, environ=os.environ, preview=preview)  # type: ignore[arg-type]
        if outcome.returncode != 0:
            raise RuntimeError(
                f"{script!r} exited {outcome.returncode}: {outcome.text('stderr')[-300:]}"
            )


def _median(ctx: Context, fn: object, runs: int) -> float:
    return ctx.median_ms(fn, runs=runs, warmup=1)  # type: ignore[arg-type]


def _touch_script(count: int) -> str:
    """Modify *count* existing files (spread over directories) and add one new file."""
    return (
        f'i=0; for f in d*/f*.txt; do [ $i -ge {count} ] && break; echo changed >> "$f"; '
        "i=$((i + 1)); done; echo new-$$ > added.txt"
    )


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""
    from ..preview import Preview, render_diff

    rows: list[Row] = []
    root = os.path.join(ctx.workspace, "preview-bench")
    state = os.path.join(root, "state")
    runs = max(3, min(ctx.runs, 15))
    setups: dict[int, float] = {}
    for files in SIZES:
        ws = _make_workspace(root, files)
        runner = _Runner(ws, state)
        plain = _median(ctx, lambda runner=runner: runner.run("true"), runs)

        def create_and_run(runner: _Runner = runner, ws: str = ws) -> None:
            preview = Preview.create(ws, state_dir=state, mechanism="overlay")
            runner.run("true", preview)
            preview.discard()

        def create_only(ws: str = ws) -> None:
            Preview.create(ws, state_dir=state, mechanism="overlay").discard()

        create = _median(ctx, create_only, runs)
        whole = _median(ctx, create_and_run, runs)
        setup = whole - plain
        setups[files] = setup
        rows.append(Row(f"run true, no preview ({files} files)", plain, samples=runs))
        rows.append(Row(f"Preview.create + discard, overlay ({files} files)", create, samples=runs))
        rows.append(
            Row(
                f"preview set-up, overlay ({files} files)",
                setup,
                samples=runs,
                baseline=f"run true, no preview ({files} files)",
                target="<= 50 ms, flat",
                note="create + run true in the preview - run true without one",
            )
        )
        teardown = []
        for _ in range(runs):
            preview = Preview.create(ws, state_dir=state, mechanism="overlay")
            runner.run(_touch_script(10), preview)
            start = time.perf_counter()
            preview.discard()
            teardown.append((time.perf_counter() - start) * 1000)
        rows.append(
            Row(f"preview tear-down (discard) ({files} files)", _med(teardown), samples=runs)
        )
    rows.append(
        Row(
            "set-up ratio 100k/1k files",
            setups[100_000] / setups[1_000] if setups[1_000] else 0.0,
            unit="x",
            target="~1 (flat)",
        )
    )
    for files in SIZES[:2]:
        ws = _make_workspace(root, files)

        def copy_setup(ws: str = ws) -> None:
            Preview.create(ws, state_dir=state, mechanism="copy").discard()

        rows.append(
            Row(
                f"preview set-up, copy mechanism ({files} files)",
                _median(ctx, copy_setup, 3),
                samples=3,
                note="for contrast: grows with the workspace",
            )
        )
    for files, changed in ((10_000, 10), (10_000, 1_000), (1_000, 10), (100_000, 10)):
        ws = _make_workspace(root, files)
        runner = _Runner(ws, state)
        diffs, applies = [], []
        for _ in range(max(3, runs // 3)):
            preview = Preview.create(ws, state_dir=state, mechanism="overlay")
            runner.run(_touch_script(changed), preview)
            start = time.perf_counter()
            for _line in render_diff(preview.changes()):
                pass
            diffs.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            preview.apply()
            applies.append((time.perf_counter() - start) * 1000)
        rows.append(
            Row(
                f"diff of {changed + 1} changed files ({files}-file workspace)",
                _med(diffs),
                samples=len(diffs),
                note="change set + every unified diff",
            )
        )
        rows.append(
            Row(
                f"apply of {changed + 1} changed files ({files}-file workspace)",
                _med(applies),
                samples=len(applies),
                target="proportional to changed files",
            )
        )
    shutil.rmtree(root, ignore_errors=True)
    return rows


def _med(values: list[float]) -> float:
    import statistics

    return statistics.median(values)
