"""Per-backend overhead: ``corral run -- true`` and session ``exec`` medians in one table.

Baselines measured in the same run: the bare process (``/bin/true``) and raw
bwrap with the agent profile. For each backend that works here: the CLI
``corral run --backend NAME -- true`` in-process (``CORRAL_SERVER=off``, so
each row includes the interpreter's start-up), and for backends with sessions
(bubblewrap through the SDK, podman, docker) one ``exec`` of ``true`` into
an open session, without limits.
"""

from __future__ import annotations

import os

from . import Context, Row, ratio

__all__ = ["run"]

NO_LIMITS = ["--memory", "none", "--pids", "none", "--timeout", "none", "--max-output", "none"]
ISOLATION = {"landlock": "process", "gvisor": "kernel", "none": "process"}


def _settings(ctx: Context, name: str) -> list[str]:
    import json

    path = os.path.join(ctx.workspace, f".bench-{name}.json")
    settings: dict[str, object] = {"backend": name, "isolation": ISOLATION.get(name, "namespace")}
    if name in ("podman", "docker"):
        settings["image"] = "corral:python"
    if name in ("gvisor", "docker"):
        settings["allowDegraded"] = ["filesystem.protect", "network.allowUnixSockets"]
    if name == "landlock" and os.geteuid() == 0:
        settings["allowDegraded"] = ["isolation"]  # it refuses a root caller otherwise
    with open(path, "w", encoding="utf-8") as f:
        json.dump(settings, f)
    return ["--settings", path]


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""
    from ..cli.commands.doctor import check_backends

    rows: list[Row] = []
    bare = ctx.median_cmd_ms(["/bin/true"])
    rows.append(Row("bare process /bin/true", bare, samples=ctx.runs))
    raw = ctx.raw_bwrap_ms()
    if raw is not None:
        rows.append(Row("raw bwrap (agent profile) true", raw, samples=ctx.runs))
    works = {e["backend"]: bool(e["works"]) for e in check_backends()}
    for name in ("none", "landlock", "bubblewrap", "gvisor", "podman", "docker"):
        if not works.get(name):
            rows.append(
                Row(f"corral run --backend {name} -- true", float("nan"), note="unavailable here")
            )
            continue
        runs = ctx.runs if name in ("none", "landlock", "bubblewrap") else max(5, ctx.runs // 3)
        value = ctx.median_cmd_ms(
            [*ctx.corral, "run", *_settings(ctx, name), *NO_LIMITS, "--", "true"], runs=runs
        )
        rows.append(
            Row(
                f"corral run --backend {name} -- true",
                value,
                samples=runs,
                baseline="raw bwrap",
                note=f"{ratio(value, raw)} of raw bwrap, {ratio(value, bare)} of bare"
                " (in-process CLI, CORRAL_SERVER=off)",
            )
        )
    if works.get("bubblewrap"):
        rows.append(_sdk_session_row(ctx, raw, bare))
    for name in ("podman", "docker"):
        if works.get(name):
            rows.append(_session_row(ctx, name, raw, bare))
    return rows


def _sdk_session_row(ctx: Context, raw: float | None, bare: float) -> Row:
    from .._sandbox import Sandbox

    with Sandbox(
        workspace=ctx.workspace,
        backend="bubblewrap",
        settings={"resources": {"memory": None, "pids": None, "timeout": None, "output": None}},
    ) as sandbox:
        value = ctx.median_ms(lambda: sandbox.exec(["true"]).check())
    return Row(
        "bubblewrap session exec true (SDK, in-process)",
        value,
        samples=ctx.runs,
        baseline="raw bwrap",
        note=f"{ratio(value, raw)} of raw bwrap, {ratio(value, bare)} of bare",
    )


def _session_row(ctx: Context, name: str, raw: float | None, bare: float) -> Row:
    from ..backends import get_backend, inspect_host
    from ..pipeline._request import ExecRequest, new_sandbox_id
    from ..policy import load_settings

    backend = get_backend(name)
    flags = {
        "image": "corral:python",
        "backend": name,
        "resources": {"memory": None, "pids": None, "timeout": None, "output": None},
    }
    if name == "docker":
        flags["allowDegraded"] = ["filesystem.protect", "network.allowUnixSockets"]
    policy = load_settings(cwd=ctx.workspace, workspace=ctx.workspace, flags=flags).policy
    request = ExecRequest.from_argv(["true"], cwd=ctx.workspace)
    facts, _ = inspect_host(backend, request, policy, dict(os.environ))
    session = backend.open_session(policy, facts, new_sandbox_id())  # type: ignore[attr-defined]
    try:

        def once() -> None:
            outcome = session.exec(ExecRequest.from_argv(["true"], cwd=ctx.workspace))
            if outcome.returncode != 0:
                raise RuntimeError(
                    f"session exec exited {outcome.returncode}: {outcome.text('stderr')}"
                )

        runs = max(5, ctx.runs // 3)
        value = ctx.median_ms(once, runs)
    finally:
        session.close()
    return Row(
        f"{name} session exec true (in-process)",
        value,
        samples=runs,
        baseline="raw bwrap",
        note=f"{ratio(value, raw)} of raw bwrap, {ratio(value, bare)} of bare",
    )
