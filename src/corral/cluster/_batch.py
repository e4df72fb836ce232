"""Batch runs for evaluations: one command in each of N workspaces, across the cluster.

:func:`run_map` (``Cluster.map`` / ``corral.cluster.map``) opens one sandbox
per workspace, at most *concurrency* at a time, runs the command with the
per-item *timeout* (the sandbox's wall-clock limit: a timed-out item is an
Outcome with ``timed_out``), prints one progress line per finished item, and
returns a :class:`MapReport` with one :class:`MapItem` per workspace in the
order given. A failure - the command's exit status, a timeout, a refused
policy, a lost node - is that item's result; it never hides the others.
"""

from __future__ import annotations

import time

from .._frozen import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO

    from ..pipeline._outcome import Outcome
    from ..policy import Policy
    from ._client import Cluster

__all__ = ["MapItem", "MapReport", "arun_map", "run_map"]

#: extra seconds the caller waits past an item's timeout before giving up on its node
_GRACE = 30.0


class MapItem(Record):
    """The result of one workspace of a batch.

    Attributes:
        workspace: the workspace (a path on the nodes).
        node: the node that ran it ("" when it was never placed).
        outcome: the command's Outcome, or ``None`` when it did not run to an end.
        error: why there is no outcome (the error's message), else "".
        duration: seconds from placement to result, as the caller saw it.
    """

    workspace: str
    node: str = ""
    outcome: Outcome | None = None
    error: str = ""
    duration: float = 0.0

    @property
    def status(self) -> str:
        """``ok``, ``failed`` (non-zero exit), ``timeout`` or ``error`` (no outcome)."""
        if self.outcome is None:
            return "error"
        if self.outcome.timed_out:
            return "timeout"
        return "ok" if self.outcome.returncode == 0 else "failed"


class MapReport:
    """The items of a batch, in the order of the workspaces, and a summary."""

    __slots__ = ("duration", "items")

    def __init__(self, items: Sequence[MapItem], duration: float) -> None:
        self.items = tuple(items)
        self.duration = duration

    def __iter__(self) -> Any:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def counts(self) -> dict[str, int]:
        """How many items ended in each status."""
        counts = {"ok": 0, "failed": 0, "timeout": 0, "error": 0}
        for item in self.items:
            counts[item.status] += 1
        return counts

    @property
    def ok(self) -> bool:
        """Every item exited 0."""
        return all(item.status == "ok" for item in self.items)

    def table(self) -> str:
        """The summary table: one row per item, then the counts."""
        rows = [("workspace", "status", "exit", "node", "seconds", "detail")]
        for item in self.items:
            exit_status = "" if item.outcome is None else str(item.outcome.returncode)
            detail = item.error
            if item.outcome is not None and item.outcome.violations:
                detail = f"{len(item.outcome.violations)} violation(s)"
            rows.append(
                (
                    item.workspace,
                    item.status,
                    exit_status,
                    item.node[:12],
                    f"{item.duration:.2f}",
                    detail,
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        counts = ", ".join(f"{n} {status}" for status, n in self.counts().items() if n)
        lines.append(f"{len(self.items)} items in {self.duration:.1f} s: {counts}")
        return "\n".join(lines)


async def arun_map(
    cluster: Cluster,
    command: str | Sequence[str],
    workspaces: Sequence[str],
    policy: Policy | None = None,
    *,
    concurrency: int = 16,
    timeout: float | str | None = None,  # noqa: ASYNC109 - each item's wall-clock limit
    progress: TextIO | None = None,
    **options: Any,
) -> MapReport:
    """The async form of :func:`run_map`."""
    import asyncio

    from .._exceptions import CorralError, InvalidRequest

    if concurrency < 1:
        raise InvalidRequest("Failed to start the batch: concurrency must be at least 1")
    limit: float | None = None
    if timeout is not None:
        from ..policy._units import parse_duration

        try:
            limit = parse_duration(timeout)
        except ValueError as exc:
            raise InvalidRequest(f"Failed to start the batch: timeout: {exc}") from None
    gate = asyncio.Semaphore(concurrency)
    results: list[MapItem | None] = [None] * len(workspaces)
    done = 0
    started = time.monotonic()

    async def one(index: int, workspace: str) -> None:
        nonlocal done
        async with gate:
            begin = time.monotonic()
            if policy is not None:
                own = policy.replace(filesystem=policy.filesystem.replace(workspace=workspace))
                sandbox = cluster.AsyncSandbox(own, **options)
            else:
                sandbox = cluster.AsyncSandbox(workspace=workspace, **options)
            item: MapItem
            try:
                async with sandbox:
                    run = sandbox.exec(command, timeout=limit)
                    wait = None if limit is None else limit + _GRACE
                    outcome = await asyncio.wait_for(run, wait)
                item = MapItem(
                    workspace=workspace,
                    node=sandbox.node,
                    outcome=outcome,
                    duration=time.monotonic() - begin,
                )
            except (CorralError, TimeoutError) as exc:
                message = str(exc) or f"no result within {limit}+{_GRACE:g} s"
                item = MapItem(
                    workspace=workspace,
                    node=sandbox.node,
                    error=message,
                    duration=time.monotonic() - begin,
                )
            results[index] = item
            done += 1
            if progress is not None:
                progress.write(
                    f"[{done}/{len(workspaces)}] {item.status:7} {workspace} {item.node[:12]} {item.duration:.2f}s\n"
                )
                progress.flush()

    await asyncio.gather(*(one(i, w) for i, w in enumerate(workspaces)))
    return MapReport([item for item in results if item is not None], time.monotonic() - started)


def run_map(
    cluster: Cluster,
    command: str | Sequence[str],
    workspaces: Sequence[str],
    policy: Policy | None = None,
    *,
    concurrency: int = 16,
    timeout: float | str | None = None,
    progress: TextIO | None = None,
    **options: Any,
) -> MapReport:
    """Run *command* once in each of *workspaces* on the cluster; the report.

    Args:
        command: a shell string or an argv list, the same for every item.
        workspaces: workspace directories as the nodes see them.
        policy: a complete Policy for every item (its ``filesystem.workspace``
            is replaced by each item's workspace); without it each
            item loads the node's settings with ``workspace=`` and *options*.
        concurrency: items running at the same time.
        timeout: each item's wall-clock limit (``"5m"``, seconds).
        progress: where to print one line per finished item (``None``: quiet).
        options: the sandbox options (``memory=``, ``network=`` ...).
    """
    import asyncio

    return asyncio.run(
        arun_map(
            cluster,
            command,
            workspaces,
            policy,
            concurrency=concurrency,
            timeout=timeout,
            progress=progress,
            **options,
        )
    )
