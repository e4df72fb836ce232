"""Per-backend overhead: ``corral run -- true`` and session ``exec`` medians in one table.

Baselines measured in the same run: the bare process (``/bin/true``) and raw
bwrap with the agent profile. For each backend that works here: the CLI
``corral run --backend NAME -- true`` in-process (``CORRAL_SERVER=off``, so
each row includes the interpreter's start-up), and for backends with sessions
(bubblewrap through the SDK, podman, docker) one ``exec`` of ``true`` into
an open session, without limits. For ``microvm``: a cold boot per run
(``corral run --read-only -- true``), a run whose VM comes from a warm pool
(in-process: acquire, attach the workspace, ``true``, destroy), the
agent's exec round trip in one booted VM, and an SDK session's ``exec`` of
``true`` in its kept VM (the round trip plus corral's engine and relay, the
plan, the audit record), against the cold run.
"""

from __future__ import annotations

import os

from . import Context, Row, ratio

__all__ = ["run"]

NO_LIMITS = ["--memory", "none", "--pids", "none", "--timeout", "none", "--max-output", "none"]
ISOLATION = {"landlock": "process", "gvisor": "kernel", "none": "process", "microvm": "vm"}


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
    if works.get("microvm"):
        rows.extend(_microvm_rows(ctx, raw, bare))
    else:
        rows.append(Row("corral run --backend microvm -- true", float("nan"), note="unavailable"))
    return rows


def _microvm_rows(ctx: Context, raw: float | None, bare: float) -> list[Row]:
    """Cold boot, warm-pool run and agent round trip (TCG or KVM, as the backend chose)."""
    import json
    import time

    from ..backends import get_backend, inspect_host
    from ..backends._microvm_pool import VmPool
    from ..backends.microvm import FD_CONFIG, boot_vm, set_pool, vm_config_of
    from ..pipeline._request import ExecRequest
    from ..pipeline._runner import launch, prepare
    from ..policy import load_settings

    runs = max(3, ctx.runs // 10)
    rows = []
    cold = ctx.median_cmd_ms(
        [*ctx.corral, "run", *_settings(ctx, "microvm"), *NO_LIMITS, "--read-only", "--", "true"],
        runs=runs,
    )
    policy = load_settings(
        cwd=ctx.workspace,
        workspace=ctx.workspace,
        flags={"backend": "microvm", "isolation": "vm", "filesystem": {"readOnly": True}},
    ).policy
    request = ExecRequest.from_argv(["true"], cwd=ctx.workspace)
    facts, _ = inspect_host(get_backend("microvm"), request, policy, dict(os.environ))
    accel = get_backend("microvm").accel(facts)  # type: ignore[attr-defined]
    rows.append(
        Row(
            f"microvm cold boot + true ({accel}, corral run)",
            cold,
            samples=runs,
            baseline="raw bwrap",
            note=f"{ratio(cold, raw)} of raw bwrap (boot, run, power off)",
        )
    )
    pool = VmPool(size=1)
    previous = set_pool(pool)
    try:
        samples = []
        for _ in range(runs):
            prepared = prepare(request, policy, environ=os.environ)
            config = next(f for f in prepared.plan.fds if f.number == FD_CONFIG)
            vm_config, _share = vm_config_of(json.loads(config.data))
            pool.refill(vm_config)
            deadline = time.monotonic() + 120
            while pool.idle(vm_config) < 1 and time.monotonic() < deadline:
                time.sleep(0.05)  # not timed: the pool boots between runs
            started = time.perf_counter()
            outcome = launch(prepared, request)
            samples.append((time.perf_counter() - started) * 1000)
            if outcome.returncode != 0:
                raise RuntimeError(f"pooled microvm run exited {outcome.returncode}")
        samples.sort()
        warm = samples[len(samples) // 2]
    finally:
        set_pool(previous)
        pool.close()
    rows.append(
        Row(
            f"microvm warm-pool acquire + true ({accel}, in-process)",
            warm,
            samples=len(samples),
            baseline="raw bwrap",
            note=f"{ratio(warm, raw)} of raw bwrap (target <= 100 ms under TCG)",
        )
    )
    vm = boot_vm(vm_config)
    try:
        channel = vm.channel
        assert channel is not None
        from ..backends._microvm_vm import ExecSpec

        spec = ExecSpec(argv=("true",), env=(("PATH", "/usr/bin:/bin"),), cwd="/", uid=0, gid=0)

        def once() -> None:
            for kind, payload in channel.run(spec):
                if kind == b"X" and payload[:6] != b"exit 0":
                    raise RuntimeError(f"true in the guest: {payload!r}")

        exec_ms = ctx.median_ms(once, ctx.runs)
    finally:
        vm.close()
    rows.append(
        Row(
            f"microvm agent exec round trip true ({accel}, one booted VM)",
            exec_ms,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=f"{ratio(exec_ms, raw)} of raw bwrap (target <= 20 ms under TCG)",
        )
    )
    rows.append(_microvm_session_row(ctx, accel, cold, raw))
    return rows


def _microvm_session_row(ctx: Context, accel: str, cold: float, raw: float | None) -> Row:
    """``exec(["true"])`` in an SDK session's kept VM (its boot not timed), median of >= 20."""
    from .._sandbox import Sandbox

    runs = max(20, ctx.runs)
    with Sandbox(
        workspace=ctx.workspace,
        isolation="vm",
        read_only=True,
        settings={"resources": {"memory": None, "pids": None, "timeout": None, "output": None}},
    ) as sandbox:
        sandbox.exec(["true"]).check()  # waits for the VM (its boot began with the Sandbox)
        value = ctx.median_ms(lambda: sandbox.exec(["true"]).check(), runs)
    return Row(
        f"microvm session exec true ({accel}, SDK, kept VM)",
        value,
        samples=runs,
        baseline="cold microvm run",
        note=(
            f"{ratio(value, cold)} of a cold microvm run ({cold / value:.0f}x faster), "
            f"{ratio(value, raw)} of raw bwrap (target <= 20 ms under TCG)"
        ),
    )


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
