"""Core overhead: ``corral run -- true`` and the in-process API against baselines.

Baselines measured in the same run: bare ``sh -c true``; ``python -c pass``
with the interpreter corral runs on; raw ``bwrap`` with the agent profile of
docs/design.md (same namespaces, read-only root, private /tmp, workspace
bind) running ``true``.

Targets (issue #2): ``corral run -- true`` within 1.3x of ``python -c pass`` +
raw bwrap; the in-process API without limits within 1.5x of raw bwrap.
"""

from __future__ import annotations

import os

from . import Context, Row

__all__ = ["run"]

NO_LIMITS = ["--memory", "none", "--pids", "none", "--timeout", "none", "--max-output", "none"]


def _bwrap() -> str | None:
    from ..backends import _find_bwrap

    return _find_bwrap(dict(os.environ))


def _import_ms(ctx: Context) -> float:
    """Start-up added by importing the ``corral run`` path (median, ms)."""
    code = (
        "import corral.cli.commands.run, corral._runner, corral._engine, corral.backends.bubblewrap"
    )
    with_imports = ctx.median_cmd_ms([ctx.python, "-c", code])
    bare = ctx.median_cmd_ms([ctx.python, "-c", "pass"])
    return with_imports - bare


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""
    rows: list[Row] = []
    ws = ctx.workspace
    bare = ctx.median_cmd_ms(["/bin/sh", "-c", "true"])
    rows.append(Row("sh -c true (bare process)", bare, samples=ctx.runs))
    py = ctx.median_cmd_ms([ctx.python, "-c", "pass"])
    rows.append(Row(f"{os.path.basename(ctx.python)} -c pass", py, samples=ctx.runs))
    bwrap = _bwrap()
    raw = None
    if bwrap:
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
        rows.append(Row("python -c pass + raw bwrap", py + raw, note="baseline for corral run"))
    env = dict(os.environ)
    cli_default = ctx.median_cmd_ms([*ctx.corral, "run", "--", "true"], env=env)
    rows.append(
        Row(
            "corral run -- true (default policy)",
            cli_default,
            samples=ctx.runs,
            baseline="python -c pass + raw bwrap",
            target="<= 1.3x",
            note=_ratio(cli_default, py + raw if raw else None),
        )
    )
    cli_nolimits = ctx.median_cmd_ms([*ctx.corral, "run", *NO_LIMITS, "--", "true"], env=env)
    rows.append(
        Row(
            "corral run -- true (no limits)",
            cli_nolimits,
            samples=ctx.runs,
            baseline="python -c pass + raw bwrap",
            target="<= 1.3x",
            note=_ratio(cli_nolimits, py + raw if raw else None),
        )
    )
    rows += _api_rows(ctx, raw)
    rows.append(
        Row(
            "import time of the run path",
            _import_ms(ctx),
            samples=ctx.runs,
            note="python -c 'import corral.cli.commands.run ...' minus python -c pass",
        )
    )
    return rows


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "n/a"


def _api_rows(ctx: Context, raw: float | None) -> list[Row]:
    from .._request import ExecRequest
    from .._runner import execute
    from .._state import state_dir
    from ..policy import load_settings

    rows = []
    flags_none = {"resources": {"memory": None, "pids": None, "timeout": None, "output": None}}
    for label, flags in (("no limits", flags_none), ("default policy", {})):
        resolved = load_settings(cwd=ctx.workspace, flags=flags, command="true")
        policy = resolved.policy

        def once(policy: object = policy) -> None:
            request = ExecRequest.from_argv(["true"], cwd=ctx.workspace)
            outcome = execute(request, policy, environ=os.environ, state_dir=state_dir())  # type: ignore[arg-type]
            if outcome.returncode != 0:
                raise RuntimeError(f"true exited {outcome.returncode}")

        value = ctx.median_ms(once)
        target = "<= 1.5x" if label == "no limits" else None
        rows.append(
            Row(
                f"in-process API run(['true']) ({label})",
                value,
                samples=ctx.runs,
                baseline="raw bwrap",
                target=target,
                note=_ratio(value, raw),
            )
        )
    return rows
