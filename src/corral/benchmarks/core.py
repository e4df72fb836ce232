"""Core overhead: ``corral run -- true`` and the in-process API against baselines.

Baselines measured in the same run: bare ``sh -c true``; ``python -c pass``
with the interpreter corral runs on; raw ``bwrap`` with the agent profile of
docs/design.md (same namespaces, read-only root, private /tmp, workspace
bind) running ``true``.

Targets (issue #2): ``corral run -- true`` within 1.3x of ``python -c pass`` +
raw bwrap - measured through a warm corral server, the way ``corral run``
normally runs (the server is started for this suite with its own state
directory and stopped afterwards); the in-process rows (``CORRAL_SERVER=off``)
are shown beside it. The in-process API without limits: within 1.5x of raw
bwrap.

The compiled client (``corral-client run -- true``, the command the Claude
Code hook writes) goes through the same warm server: no interpreter starts,
so it should stay below ``python -c pass`` + raw bwrap (<= 1.0x); its rows
also give the ratio to the Python client's.
"""

from __future__ import annotations

import os

from . import Context, Row, ratio

__all__ = ["run"]

NO_LIMITS = ["--memory", "none", "--pids", "none", "--timeout", "none", "--max-output", "none"]


def _import_ms(ctx: Context) -> float:
    """Start-up added by importing the ``corral run`` path (median, ms)."""
    code = (
        "import corral.cli.commands.run, corral.pipeline._runner, corral.pipeline._engine, "
        "corral.backends.bubblewrap"
    )
    with_imports = ctx.median_cmd_ms([ctx.python, "-c", code])
    bare = ctx.median_cmd_ms([ctx.python, "-c", "pass"])
    return with_imports - bare


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""
    rows: list[Row] = []
    bare = ctx.median_cmd_ms(["/bin/sh", "-c", "true"])
    rows.append(Row("sh -c true (bare process)", bare, samples=ctx.runs))
    py = ctx.median_cmd_ms([ctx.python, "-c", "pass"])
    rows.append(Row(f"{os.path.basename(ctx.python)} -c pass", py, samples=ctx.runs))
    raw = ctx.raw_bwrap_ms()
    if raw is not None:
        rows.append(Row("raw bwrap (agent profile) true", raw, samples=ctx.runs))
        rows.append(Row("python -c pass + raw bwrap", py + raw, note="baseline for corral run"))
    baseline = py + raw if raw else None
    rows += _server_rows(ctx, baseline)
    env = {**os.environ, "CORRAL_SERVER": "off"}
    for label, options in (("default policy", []), ("no limits", NO_LIMITS)):
        value = ctx.median_cmd_ms([*ctx.corral, "run", *options, "--", "true"], env=env)
        rows.append(
            Row(
                f"corral run -- true (in-process, {label})",
                value,
                samples=ctx.runs,
                baseline="python -c pass + raw bwrap",
                note=ratio(value, baseline) + " (CORRAL_SERVER=off)",
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


def _server_rows(ctx: Context, baseline: float | None) -> list[Row]:
    """``corral run -- true`` through a warm server of its own (started and stopped here),
    with the Python client and - when it is built - the compiled one."""
    from ..server._fastclient import usable_client

    fast = usable_client()
    rows = []
    python_rows: dict[str, float] = {}
    with ctx.warm_server() as server:
        for label, options, target in (
            ("default policy", [], "<= 1.3x"),
            ("no limits", NO_LIMITS, None),
        ):
            value = ctx.median_cmd_ms([*ctx.corral, "run", *options, "--", "true"], env=server.env)
            python_rows[label] = value
            rows.append(
                Row(
                    f"corral run -- true (warm server, {label})",
                    value,
                    samples=ctx.runs,
                    baseline="python -c pass + raw bwrap",
                    target=target,
                    note=ratio(value, baseline),
                )
            )
        for label, options, target in (
            ("default policy", [], "<= 1.0x"),
            ("no limits", NO_LIMITS, None),
        ):
            if fast is None:
                break
            value = ctx.median_cmd_ms([fast, "run", *options, "--", "true"], env=server.env)
            rows.append(
                Row(
                    f"corral-client run -- true (warm server, {label})",
                    value,
                    samples=ctx.runs,
                    baseline="python -c pass + raw bwrap",
                    target=target,
                    note=f"{ratio(value, baseline)}; "
                    f"{ratio(value, python_rows[label])} of the Python client's",
                )
            )
        data = server.status()
    expected = (2 if fast is None else 4) * (ctx.runs + 2)  # each row: 2 warm-up runs, the samples
    if data.get("served") != expected:
        raise RuntimeError(
            f"the server served {data.get('served')} of {expected} runs: "
            "the warm-server rows would measure something else"
        )
    pool = data.get("launchers")
    if isinstance(pool, dict):
        rows[
            0
        ].note += f" (launcher pool: {pool['served']} served, {pool['missed']} found it empty)"
    if fast is None:
        rows.append(
            Row("corral-client run -- true", 0.0, note="not measured: corral-client not built")
        )
    return rows


def _api_rows(ctx: Context, raw: float | None) -> list[Row]:
    from .._state import state_dir
    from ..pipeline._request import ExecRequest
    from ..pipeline._runner import execute
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
                note=ratio(value, raw),
            )
        )
    return rows
