"""Agent integrations: the Claude Code hook's latency, end to end, and an SDK session.

Rows (medians, all measured in this run):

* baselines: ``bash -c true``; ``python -c pass`` (the interpreter's start,
  which every Python hook pays); raw ``bwrap`` (agent profile) ``true``;
  ``corral run -- true``;
* ``hook decision``: process start of ``corral hook claude-code`` to its JSON
  on stdout, for a Bash call (rewrite) and a Write call (path check); and of
  ``corral-client hook claude-code`` (the compiled client, answered by a warm
  server), measured interleaved with a **no-op hook** (:data:`NOOP_HOOK`: ``sh``
  reading its input with builtins and printing ``{}``, started the same way
  with the same input), so the decision's own cost shows both in absolute
  terms and over what any hook costs Claude Code;
* ``hook + rewritten command``: what a Bash tool call costs in Claude Code with
  corral: the hook, then ``bash -c <rewritten>`` running ``true`` - in-process
  (``CORRAL_SERVER=off``) and through a warm corral server of the suite's own
  (how ``corral run`` normally runs), next to raw bwrap. The rewritten command
  starts ``corral-client`` when it is built (in-process rows: it hands over to
  the Python CLI); the warm-server rows show the Python hook and client (as
  before the compiled client), the Python hook with the compiled client, and
  the compiled client for both. These run in the agent session's kept
  sandbox (``--keep``, :mod:`corral.server._kept`); one more row runs the same
  call without ``--keep``: a fresh sandbox per call, in the same run; and
  ``corral-client run -- true`` with and without ``--keep`` (no hook, no
  shell around it); and, interleaved with the ``--keep`` row, the same with
  ``--shell bash -c true`` (the sandbox's bash) and ``bash -c <rewritten>``
  without the hook (the host bash and corral's script around the command):
  the kept call piece by piece; and the target's row (hook + rewritten ``true``
  in the kept sandbox, <= 2x raw bwrap) once more, interleaved with raw bwrap,
  so that its baseline comes from the same rounds;
* ``SDK session exec``: ``Sandbox.exec(["true"])`` in an open session (no
  interpreter start): in the session's resident sandbox (the default) and in
  a fresh sandbox per command (``CORRAL_RESIDENT=0``), next to raw bwrap and
  to a bare ``posix_spawn`` of ``true`` from the same interpreter (the floor
  a resident sandbox is measured against: target ≤ 2 ms).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence

from . import Context, Row, ratio

__all__ = ["NOOP_HOOK", "run"]

#: A hook that decides nothing: it reads its whole input (builtins only) and prints ``{}``.
#: The floor of any hook, started like corral's (``hook claude-code`` become ``$0 $1``).
NOOP_HOOK = ("sh", "-c", 'while IFS= read -r _; do :; done; echo "{}"')


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


def _hook(
    ctx: Context,
    payload: bytes,
    env: dict[str, str] | None = None,
    hook: list[str] | None = None,
) -> dict[str, object]:
    result = subprocess.run(
        [*(hook or ctx.corral), "hook", "claude-code"],
        input=payload,
        capture_output=True,
        cwd=ctx.workspace,
        env=env,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the hook exited {result.returncode}: {result.stderr.decode()[-300:]}")
    decision: dict[str, object] = json.loads(result.stdout) if result.stdout.strip() else {}
    return decision


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""

    os.makedirs(os.path.join(ctx.workspace, ".git"), exist_ok=True)
    rows: list[Row] = []
    bash = ctx.median_cmd_ms(["bash", "-c", "true"])
    rows.append(Row("bash -c true (bare)", bash, samples=ctx.runs))
    python = ctx.median_cmd_ms([ctx.python, "-c", "pass"])
    rows.append(
        Row(f"{os.path.basename(ctx.python)} -c pass (interpreter start)", python, samples=ctx.runs)
    )
    raw = ctx.raw_bwrap_ms()
    if raw is not None:
        rows.append(Row("raw bwrap (agent profile) true", raw, samples=ctx.runs))
    run_true = ctx.median_cmd_ms([*ctx.corral, "run", "--", "true"])
    rows.append(
        Row(
            "corral run -- true (in-process)",
            run_true,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=ratio(run_true, raw),
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
            note=ratio(decision, python),
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
    alone = ctx.median_cmd_ms(["bash", "-c", rewritten])
    rows.append(
        Row(
            "rewritten command alone (bash -c 'corral run ... true')",
            alone,
            samples=ctx.runs,
            baseline="corral run -- true (in-process)",
            note=ratio(alone, run_true),
        )
    )
    total = ctx.median_ms(_tool_call(ctx, bash_call, None))
    rows.append(
        Row(
            "hook + rewritten command, end to end (in-process)",
            total,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=ratio(total, raw),
        )
    )
    from ..integrations.claude_code_hook import rewrite_command
    from ..server._fastclient import usable_client

    fast = usable_client()
    python_rewrite = rewrite_command(
        "true",
        session_id="bench-session",
        corral=ctx.corral,
        workspace=os.path.realpath(ctx.workspace),  # as the hook rewrites: the cwd carries
    )
    paired = False  # the kept call measured interleaved with raw bwrap
    with ctx.warm_server() as server:
        served = ctx.median_cmd_ms([*ctx.corral, "run", "--", "true"], env=server.env)
        python_total = ctx.median_ms(
            _tool_call(ctx, bash_call, server.env, rewritten=python_rewrite)
        )
        served_total = ctx.median_ms(_tool_call(ctx, bash_call, server.env))
        noop_hook = list(NOOP_HOOK)
        hooks = [lambda: _hook(ctx, bash_call, server.env, noop_hook)]
        if fast is not None:
            hooks.append(lambda: _hook(ctx, bash_call, server.env, [fast]))
        noop, *fast_decisions = _interleaved_ms(ctx, hooks)
        if fast is not None:
            fast_decision = fast_decisions[0]
            fast_total = ctx.median_ms(_tool_call(ctx, bash_call, server.env, hook=[fast]))
            fresh_total = ctx.median_ms(
                _tool_call(ctx, bash_call, server.env, hook=[fast], keep=False)
            )
            _check_kept(ctx, server.env, [fast])
            client_fresh = ctx.median_cmd_ms([fast, "run", "--", "true"], env=server.env)
            # each piece in a session of its own, as each would run alone: a session's next
            # bash is started ahead only after a bash -c call (corral.pipeline._resident_next)
            kept = [fast, "run", "--agent-session", "bench-kept", "--keep"]
            kept_shell = [fast, "run", "--agent-session", "bench-kept-shell", "--keep"]
            answer = _hook(ctx, bash_call, server.env, [fast])
            rewritten = str(answer["hookSpecificOutput"]["updatedInput"]["command"])  # type: ignore[index]
            # the kept call piece by piece, interleaved: the client and the init's fork, then
            # the sandbox's bash, then the whole rewritten command (host bash, corral's script)
            client_kept, shell_kept, rewritten_kept = _interleaved_ms(
                ctx,
                [
                    _command(ctx, [*kept, "--", "true"], server.env),
                    _command(ctx, [*kept_shell, "--shell", "bash", "-c", "true"], server.env),
                    _command(ctx, ["bash", "-c", rewritten], server.env),
                ],
            )
            # the target's row with its baseline in the same rounds: a baseline measured at
            # the suite's start drifts with the machine (a third between runs, here)
            raw_argv = ctx.raw_bwrap_argv()
            if raw_argv is not None:
                raw_paired, kept_paired = _interleaved_ms(
                    ctx,
                    [
                        _command(ctx, raw_argv, dict(os.environ)),
                        _tool_call(ctx, bash_call, server.env, hook=[fast]),
                    ],
                )
                paired = True
        status = server.status()
    per_row = ctx.runs + 2  # 2 warm-up runs and the samples
    expected = (
        (9 * per_row + 1 + paired * per_row) if fast is not None else 3 * per_row,
        (3 * per_row + 2 + paired * per_row) if fast is not None else 0,
    )
    if (status.get("served"), status.get("hooks")) != expected:
        raise RuntimeError(
            f"the warm server served {status.get('served')} runs and {status.get('hooks')} "
            f"hooks, not {expected[0]} and {expected[1]}: the warm-server rows would measure "
            "something else (did corral's code change during the run?)"
        )
    rows.append(
        Row(
            "corral run -- true (warm server)",
            served,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=ratio(served, raw),
        )
    )
    rows.append(
        Row(
            "hook + rewritten command, end to end (warm server, Python hook and client)",
            python_total,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=ratio(python_total, raw) + " (as before corral-client)",
        )
    )
    rows.append(
        Row(
            "hook + rewritten command, end to end (warm server, Python hook)",
            served_total,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=ratio(served_total, raw)
            + (" (the rewrite starts corral-client)" if fast else " (corral-client not built)"),
        )
    )
    rows.append(
        Row(
            "no-op hook (sh reads the input, prints {})",
            noop,
            samples=ctx.runs,
            note="what any hook costs; interleaved with the corral-client decision",
        )
    )
    if fast is not None:
        rows.append(
            Row(
                "hook decision, Bash, corral-client (warm server)",
                fast_decision,
                samples=ctx.runs,
                baseline="no-op hook",
                target="<= 1 ms",
                note=f"{ratio(fast_decision, noop)} of the no-op hook, "
                f"+{fast_decision - noop:.2f} ms over it (interleaved); "
                f"{ratio(fast_decision, decision)} of the Python hook's",
            )
        )
        rows.append(
            Row(
                "hook + rewritten command, end to end (warm server, corral-client for both)",
                fast_total,
                samples=ctx.runs,
                baseline="raw bwrap",
                note=f"{ratio(fast_total, raw)}; {ratio(fast_total, python_total)} of the "
                "Python hook and client's; the session's kept sandbox",
            )
        )
        rows.append(
            Row(
                "hook + rewritten command, end to end (warm server, corral-client, "
                "fresh sandbox per call)",
                fresh_total,
                samples=ctx.runs,
                baseline="raw bwrap",
                note=f"{ratio(fresh_total, raw)}; the kept session's is "
                f"{ratio(fast_total, fresh_total)} of this",
            )
        )
        rows.append(
            Row(
                "corral-client run -- true (warm server, fresh sandbox)",
                client_fresh,
                samples=ctx.runs,
                baseline="raw bwrap",
                note=ratio(client_fresh, raw),
            )
        )
        rows.append(
            Row(
                "corral-client run --agent-session S --keep -- true (warm server, kept sandbox)",
                client_kept,
                samples=ctx.runs,
                baseline="raw bwrap",
                note=f"{ratio(client_kept, raw)}; {ratio(client_kept, client_fresh)} of fresh",
            )
        )
        rows.append(
            Row(
                "corral-client run --agent-session S --keep --shell bash -c true (kept sandbox)",
                shell_kept,
                samples=ctx.runs,
                baseline="raw bwrap",
                note=f"{ratio(shell_kept, raw)}; {shell_kept - client_kept:+.2f} ms against the row "
                "above: bash, started ahead, in place of /bin/true (true is bash's builtin; "
                "interleaved with it)",
            )
        )
        rows.append(
            Row(
                "bash -c <the hook's rewritten command> (kept sandbox, no hook)",
                rewritten_kept,
                samples=ctx.runs,
                baseline="raw bwrap",
                note=f"{ratio(rewritten_kept, raw)}; {rewritten_kept - shell_kept:+.2f} ms against "
                "the row above: the host bash and corral's script around the command "
                "(interleaved with it)",
            )
        )
        if paired:
            rows.append(
                Row(
                    "hook + rewritten true, kept sandbox, interleaved with raw bwrap "
                    "(agent profile)",
                    kept_paired,
                    samples=ctx.runs,
                    baseline="raw bwrap, the same rounds",
                    target="<= 2x",
                    note=f"{ratio(kept_paired, raw_paired)} of raw bwrap in the same rounds "
                    f"({raw_paired:.2f} ms)",
                )
            )
    rows += _sdk_rows(ctx, raw)
    return rows


def _interleaved_ms(ctx: Context, fns: Sequence[Callable[[], object]]) -> list[float]:
    """Median wall time (ms) of each of *fns*, measured in rounds that run each once."""
    for _ in range(2):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(ctx.runs):
        for fn, samples in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1000)
    return [statistics.median(samples) for samples in times]


def _command(ctx: Context, argv: list[str], env: dict[str, str]) -> Callable[[], object]:
    """Run *argv* in the workspace with *env*, stdin ``/dev/null`` (as Claude Code gives a
    command) and output discarded; raise if it fails."""
    return lambda: subprocess.run(
        argv,
        cwd=ctx.workspace,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        check=True,
    )


def _tool_call(
    ctx: Context,
    payload: bytes,
    env: dict[str, str] | None,
    *,
    hook: list[str] | None = None,
    rewritten: str | None = None,
    keep: bool = True,
) -> Callable[[], None]:
    """One Bash tool call: the hook, then bash running its rewritten command.

    *rewritten* replaces the hook's command (the same words with another corral);
    without *keep* the rewritten command runs without ``--keep`` (a fresh sandbox
    per call, as before kept sessions).
    """

    def once() -> None:
        answer = _hook(ctx, payload, env, hook)
        command = str(answer["hookSpecificOutput"]["updatedInput"]["command"])  # type: ignore[index]
        command = rewritten or command
        if not keep:
            command = command.replace(" --keep ", " ", 1)
        subprocess.run(["bash", "-c", command], cwd=ctx.workspace, env=env, check=True)

    return once


def _check_kept(ctx: Context, env: dict[str, str], hook: list[str]) -> None:
    """Raise unless the hook's rewritten command runs in the kept sandbox (its init is pid 1)."""
    probe = _payload(ctx, "Bash", {"command": "cat /proc/1/cmdline"})
    answer = _hook(ctx, probe, env, hook)
    command = str(answer["hookSpecificOutput"]["updatedInput"]["command"])  # type: ignore[index]
    result = subprocess.run(
        ["bash", "-c", command], cwd=ctx.workspace, env=env, capture_output=True, check=False
    )
    if b"--serve" not in result.stdout:
        raise RuntimeError(
            "the hook's command did not run in a kept sandbox: the kept-session row would "
            f"measure something else ({result.stderr.decode()[-300:]})"
        )


def _sdk_rows(ctx: Context, raw: float | None) -> list[Row]:
    from .._sandbox import Sandbox

    def bare() -> None:
        os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)

    spawned = ctx.median_ms(bare)
    with Sandbox(workspace=ctx.workspace) as sandbox:
        resident = ctx.median_ms(lambda: sandbox.exec(["true"]).check())
    fresh_env = {**os.environ, "CORRAL_RESIDENT": "0"}
    with Sandbox(workspace=ctx.workspace, environ=fresh_env) as sandbox:
        fresh = ctx.median_ms(lambda: sandbox.exec(["true"]).check())
    return [
        Row("posix_spawn true + waitpid (bare process, from Python)", spawned, samples=ctx.runs),
        Row(
            "SDK session exec(['true']), resident sandbox",
            resident,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=f"{ratio(resident, raw)} of raw bwrap, {ratio(resident, spawned)} of bare; "
            "target <= 2 ms",
        ),
        Row(
            "SDK session exec(['true']), a fresh sandbox each (CORRAL_RESIDENT=0)",
            fresh,
            samples=ctx.runs,
            baseline="raw bwrap",
            note=ratio(fresh, raw),
        ),
    ]
