"""The write broker and the git check: what they add to a run.

Per supervised operation: a sandboxed ``python3`` creates, writes and then
deletes N files (two supervised operations each: the create-open and the
unlink) once in the workspace, where the broker performs them, and once in
the sandbox's private ``/tmp``, where the kernel does (same sandbox, same
policy, measured in the same run). That difference also holds what the
workspace's filesystem costs over a tmpfs (on an ext4 that allocates inodes
slowly, most of it); the broker's own cost per operation is taken against
the same script run on the host in the same directory instead, each side
less its empty run (a sandboxed ``pass``, a bare interpreter).

The git check: after a run that touched 1, 1,000 and 50,000 files (in
directories of 100, every file and directory journaled as created, the way
the broker journals a run), the median time of
:func:`~corral.backends._gitcheck.check_root` over that tree - the work the
run does after its command when the broker ran - next to the median
``corral run`` that created those files (bubblewrap, in-process CLI), for the
ratio. That run includes its own check: without it, a run would take the
difference. A run that writes nothing in the workspace pays nothing: the
check is skipped when the journal is empty.

The roots' lock: one uncontended acquire and release of the flocks a broker
on the workspace holds around each operation it performs (its root and
ancestors; see :mod:`corral.backends._broker_lock`), which the per-operation
rows above are too noisy to show.
"""

from __future__ import annotations

import os

from . import Context, Row, ratio

__all__ = ["run"]

NO_LIMITS = ["--memory", "none", "--pids", "none", "--timeout", "none", "--max-output", "none"]
PROBE = "/usr/bin/python3"  # visible in every sandbox
OPS_FILES = 2000
CHECK_SIZES = (1, 1000, 50_000)

_CREATE = (
    "import os, sys\n"
    "base, n = sys.argv[1], int(sys.argv[2])\n"
    "os.makedirs(base, exist_ok=True)\n"
    "for i in range(n):\n"
    "    d = os.path.join(base, 'd%d' % (i // 100))\n"
    "    if i % 100 == 0: os.makedirs(d, exist_ok=True)\n"
    "    with open(os.path.join(d, 'f%d' % i), 'w') as f: f.write('x')\n"
)
_CREATE_AND_DELETE = _CREATE + (
    "import shutil\nshutil.rmtree(base)\n"  # the unlinks and rmdirs go through the broker too
)


def _corral_run(ctx: Context, script: str, *args: str) -> list[str]:
    return [*ctx.corral, "run", "--backend", "bubblewrap", *NO_LIMITS, "--", PROBE, "-c", script,
            *args]  # fmt: skip


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""
    from ..cli.commands.doctor import check_backends

    works = {e["backend"]: bool(e["works"]) for e in check_backends()}
    if not works.get("bubblewrap"):
        return [Row("broker rows", float("nan"), note="bubblewrap is unavailable here")]
    env = {**os.environ, "CORRAL_SERVER": "off"}
    rows: list[Row] = []
    n = str(OPS_FILES)
    in_tmp = ctx.median_cmd_ms(_corral_run(ctx, _CREATE_AND_DELETE, "/tmp/b", n), env=env)
    rows.append(
        Row(f"{OPS_FILES} files created+deleted in /tmp (kernel)", in_tmp, samples=ctx.runs)
    )
    target = os.path.join(ctx.workspace, ".bench-broker")
    in_ws = ctx.median_cmd_ms(_corral_run(ctx, _CREATE_AND_DELETE, target, n), env=env)
    rows.append(
        Row(
            f"{OPS_FILES} files created+deleted in the workspace (broker)",
            in_ws,
            samples=ctx.runs,
            baseline="the same in /tmp",
            note=f"{ratio(in_ws, in_tmp)} of /tmp",
        )
    )
    per_op_us = (in_ws - in_tmp) * 1000 / (2 * OPS_FILES)
    rows.append(
        Row(
            "workspace against /tmp, per supervised operation",
            per_op_us,
            unit="us",
            note="includes what the workspace's filesystem costs over the sandbox's tmpfs",
        )
    )
    # The broker alone: the same script in the same directory on the host (no sandbox), and
    # a sandbox that runs the interpreter only, take out the filesystem and the sandbox.
    on_host = ctx.median_cmd_ms([PROBE, "-c", _CREATE_AND_DELETE, target, n])
    bare = ctx.median_cmd_ms([PROBE, "-c", "pass"])
    empty = ctx.median_cmd_ms(_corral_run(ctx, "pass"), env=env)
    rows.append(
        Row(
            f"{OPS_FILES} files created+deleted in the workspace, on the host (no sandbox)",
            on_host,
            samples=ctx.runs,
        )
    )
    broker_us = ((in_ws - empty) - (on_host - bare)) * 1000 / (2 * OPS_FILES)
    rows.append(
        Row(
            "broker cost per supervised operation",
            broker_us,
            unit="us",
            note="(sandboxed - an empty sandboxed run) - (on the host - an empty interpreter), "
            f"per operation; {OPS_FILES * 2} operations",
        )
    )
    rows.append(_lock_row(ctx))
    rows += _check_rows(ctx, env)
    return rows


def _lock_row(ctx: Context) -> Row:
    """What the supervised roots' lock adds to each operation the broker performs: one
    acquire and release of :class:`~corral.backends._broker_lock.RootLocks` on the
    workspace (its root and ancestors, as a broker on it locks them), uncontended."""
    from ..backends._broker_lock import RootLocks

    locks = RootLocks()
    fd = os.open(ctx.workspace, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        locks.add_root(fd)
    finally:
        os.close(fd)
    rounds, count = 1000, locks.count

    def take() -> None:
        for _ in range(rounds):
            locks.acquire()
            locks.release()

    try:
        per_op_us = ctx.median_ms(take) * 1000 / rounds
    finally:
        locks.close()
    return Row(
        "the roots' lock per supervised operation",
        per_op_us,
        unit="us",
        samples=ctx.runs,
        note=f"flock and unlock of the workspace and its ancestors ({count} directories),"
        " uncontended",
    )


def _check_rows(ctx: Context, env: dict[str, str]) -> list[Row]:
    import shutil
    from functools import partial

    from ..backends._gitcheck import Journal, check_root

    rows: list[Row] = []
    for size in CHECK_SIZES:
        target = os.path.join(ctx.workspace, f".bench-gitcheck-{size}")
        shutil.rmtree(target, ignore_errors=True)
        runs = ctx.runs if size < 10_000 else max(3, ctx.runs // 5)

        def create(size: int = size, target: str = target) -> None:
            shutil.rmtree(target, ignore_errors=True)
            import subprocess

            subprocess.run(
                _corral_run(ctx, _CREATE, target, str(size)),
                env=env,
                cwd=ctx.workspace,
                check=True,
                stdout=subprocess.DEVNULL,
            )

        run_ms = ctx.median_ms(create, runs=runs, warmup=0)
        root = ctx.workspace
        journal = Journal()
        base = os.path.relpath(target, root)
        journal.create(root, base)
        for directory, dirs, files in os.walk(target):
            rel = os.path.relpath(directory, root)
            for name in (*dirs, *files):
                journal.create(root, f"{rel}/{name}")
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            check_ms = ctx.median_ms(partial(check_root, fd, root, journal), runs=runs)
        finally:
            os.close(fd)
        shutil.rmtree(target, ignore_errors=True)
        rows.append(Row(f"corral run creating {size} files", run_ms, samples=runs))
        rows.append(
            Row(
                f"git check after a run that touched {size} files",
                check_ms,
                samples=runs,
                baseline=f"corral run creating {size} files",
                note=f"{ratio(check_ms, run_ms)} of that run",
            )
        )
    return rows
