"""Benchmarks behind ``corral bench``: medians and ratios against baselines
measured in the same run (these machines are noisy; absolute numbers from
different runs do not compare).

Suites register themselves in :data:`SUITES` (name -> module path); each
module has ``run(ctx) -> list[Row]``. :class:`Context` carries the options
and helpers every suite uses (timing loops, the interpreter, a scratch
workspace).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["SUITES", "Context", "Row", "run_suites"]

#: suite name -> module (imported on demand)
SUITES: dict[str, str] = {
    "core": "corral.benchmarks.core",
    "backends": "corral.benchmarks.backends",
    "integrations": "corral.benchmarks.integrations",
    "preview": "corral.benchmarks.preview",
    "egress": "corral.benchmarks.egress",
}


class Row:
    """One measured quantity."""

    __slots__ = ("baseline", "name", "note", "samples", "target", "unit", "value")

    def __init__(
        self,
        name: str,
        value: float,
        *,
        unit: str = "ms",
        samples: int = 0,
        baseline: str | None = None,
        target: str | None = None,
        note: str = "",
    ) -> None:
        self.name = name
        self.value = value
        self.unit = unit
        self.samples = samples
        self.baseline = baseline
        self.target = target
        self.note = note

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {name: getattr(self, name) for name in self.__slots__}


class Context:
    """Options and helpers shared by the suites."""

    def __init__(self, *, runs: int, workspace: str, corral: Sequence[str]) -> None:
        self.runs = runs
        self.workspace = workspace
        self.corral = list(corral)  # how to start the corral CLI
        self.python = sys.executable

    def median_ms(
        self, fn: Callable[[], object], runs: int | None = None, warmup: int = 2
    ) -> float:
        """Median wall time of *fn* in milliseconds."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(runs or self.runs):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1000)
        return statistics.median(times)

    def median_cmd_ms(
        self,
        argv: Sequence[str],
        runs: int | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> float:
        """Median wall time of running *argv* to completion (output discarded)."""

        def once() -> None:
            result = subprocess.run(
                list(argv),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                cwd=cwd or self.workspace,
                check=False,
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"{argv[:3]}... exited {result.returncode}: "
                    f"{result.stderr.decode(errors='replace')[-300:]}"
                )

        return self.median_ms(once, runs)


def run_suites(names: Sequence[str], ctx: Context) -> dict[str, list[Row]]:
    """Run the named suites in order; unknown names raise KeyError."""
    import importlib

    results: dict[str, list[Row]] = {}
    for name in names:
        module = importlib.import_module(SUITES[name])
        results[name] = module.run(ctx)
    return results


def default_corral_command() -> list[str]:
    """The installed ``corral`` next to this interpreter, else ``python -m corral``."""
    candidate = os.path.join(os.path.dirname(sys.executable), "corral")
    if os.access(candidate, os.X_OK):
        return [candidate]
    return [sys.executable, "-m", "corral"]
