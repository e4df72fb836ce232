"""Agent integrations: the Claude Code hook's latency, end to end, and an SDK session.

Rows (medians, all measured in this run):

* baselines: ``bash -c true``; ``python -c pass`` (the interpreter's start,
  which every Python hook pays); raw ``bwrap`` (agent profile) ``true``;
  ``corral run -- true``;
* ``hook decision``: process start of ``corral hook claude-code`` to its JSON
  on stdout, for a Bash call (rewrite) and a Write call (path check);
* ``hook + rewritten command``: what a Bash tool call costs in Claude Code with
  corral: the hook, then ``bash -c <rewritten>`` running ``true`` - next to
  ``corral run -- true`` and raw bwrap;
* ``SDK session exec``: ``Sandbox.exec(["true"])`` in an open session (no
  interpreter start), next to raw bwrap.
"""

from __future__ import annotations

import json
import os
import subprocess

from . import Context, Row

__all__ = ["run"]


def _payload(ctx: Context, tool: str, tool_input: dict[str, object]) -> bytes:
    return json.dumps(
        {
            "session_id": "bench-session",
            "transcript_path": "/dev/null",
            "cwd": ctx.workspace,
            "permission_mode": "default",
            "hook_event_name": "PreToolUse",
            "tool_name": tool,
            "tool_input": tool_input,
            "tool_use_id": "toolu_bench",
        }
    ).encode()


def _hook(ctx: Context, payload: bytes) -> dict[str, object]:
    result = subprocess.run(
        [*ctx.corral, "hook", "claude-code"],
        input=payload,
        capture_output=True,
        cwd=ctx.workspace,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the hook exited {result.returncode}: {result.stderr.decode()[-300:]}")
    decision: dict[str, object] = json.loads(result.stdout) if result.stdout.strip() else {}
    return decision


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "n/a"


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""
    from .core import _bwrap

    os.makedirs(os.path.join(ctx.workspace, ".git"), exist_ok=True)
    rows: list[Row] = []
    bash = ctx.median_cmd_ms(["bash", "-c", "true"])
    rows.append(Row("bash -c true (bare)", bash, samples=ctx.runs))
    python = ctx.median_cmd_ms([ctx.python, "-c", "pass"])
    rows.append(
        Row(f"{os.path.basename(ctx.python)} -c pass (interpreter start)", python, samples=ctx.runs)
    )
    bwrap = _bwrap()
    raw = None
    if bwrap:
        ws = ctx.workspace
        raw = ctx.median_cmd_ms(
            [
                bwrap,
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--tmpfs",
                "/tmp",
                "--bind",
                ws,
                ws,
                "--unshare-all",
                "--die-with-parent",
                "--new-session",
                "true",
            ]
        )
        rows.append(Row("raw bwrap (agent profile) true", raw, samples=ctx.runs))
    run_true = ctx.median_cmd_ms([*ctx.corral, "run", "--", "true"])
    rows.append(
        Row(
            "corral run -- true",
            run_true,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=_ratio(run_true, raw),
        )
    )

    bash_call = _payload(ctx, "Bash", {"command": "true", "description": "bench"})
    decision = ctx.median_ms(lambda: _hook(ctx, bash_call))
    rows.append(
        Row(
            "hook decision, Bash (start to JSON out)",
            decision,
            samples=ctx.runs,
            baseline="python -c pass",
            note=_ratio(decision, python),
        )
    )
    write_call = _payload(
        ctx, "Write", {"file_path": os.path.join(ctx.workspace, ".git", "config"), "content": "x"}
    )
    rows.append(
        Row(
            "hook decision, Write (path check)",
            ctx.median_ms(lambda: _hook(ctx, write_call)),
            samples=ctx.runs,
        )
    )

    rewritten = str(_hook(ctx, bash_call)["hookSpecificOutput"]["updatedInput"]["command"])  # type: ignore[index]

    def end_to_end() -> None:
        answer = _hook(ctx, bash_call)
        command = answer["hookSpecificOutput"]["updatedInput"]["command"]  # type: ignore[index]
        subprocess.run(["bash", "-c", command], cwd=ctx.workspace, check=True)

    rows.append(
        Row(
            "rewritten command alone (bash -c 'corral run ... true')",
            ctx.median_cmd_ms(["bash", "-c", rewritten]),
            samples=ctx.runs,
            baseline="corral run -- true",
        )
    )
    total = ctx.median_ms(end_to_end)
    rows.append(
        Row(
            "hook + rewritten command, end to end",
            total,
            samples=ctx.runs,
            baseline="corral run -- true",
            note=_ratio(total, run_true),
        )
    )
    if raw:
        rows.append(
            Row(
                "hook + rewritten command vs raw bwrap",
                total,
                samples=ctx.runs,
                baseline="raw bwrap",
                note=_ratio(total, raw),
            )
        )
    rows += _sdk_rows(ctx, raw)
    return rows


def _sdk_rows(ctx: Context, raw: float | None) -> list[Row]:
    from .._sandbox import Sandbox

    with Sandbox(workspace=ctx.workspace) as sandbox:
        value = ctx.median_ms(lambda: sandbox.exec(["true"]).check())
    return [
        Row(
            "SDK session exec(['true'])",
            value,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=_ratio(value, raw),
        )
    ]
