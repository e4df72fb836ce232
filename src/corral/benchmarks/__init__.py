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
from contextlib import contextmanager

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = ["SUITES", "Context", "Row", "ratio", "run_suites"]

#: suite name -> module (imported on demand)
SUITES: dict[str, str] = {
    "core": "corral.benchmarks.core",
    "backends": "corral.benchmarks.backends",
    "integrations": "corral.benchmarks.integrations",
    "preview": "corral.benchmarks.preview",
    "egress": "corral.benchmarks.egress",
    "broker": "corral.benchmarks.broker",
    "ui": "corral.benchmarks.ui",
    "cluster": "corral.benchmarks.cluster",
    "firecracker": "corral.benchmarks.firecracker",
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
        """A JSON-ready dict; a value not measured here (NaN) is ``null``."""
        data = {name: getattr(self, name) for name in self.__slots__}
        if self.value != self.value:  # NaN: e.g. a backend unavailable here
            data["value"] = None
        return data


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

    @contextmanager
    def warm_server(self, **extra: str) -> Iterator[WarmServer]:
        """A corral server of its own (private state directory), started and stopped here.

        *extra* variables go into its environment (and its clients'), e.g.
        ``CORRAL_WARM_MAX="0"``.

        ``corral run`` with :attr:`WarmServer.env` is served by it - the way
        ``corral run`` normally runs. :meth:`WarmServer.status` is its
        ``corral server --status --json``, to check afterwards that it served
        what the rows measured.
        """
        import tempfile

        with tempfile.TemporaryDirectory(prefix="corral-bench-server-") as state_home:
            env = {**os.environ, "XDG_STATE_HOME": state_home, **extra}
            env.pop("CORRAL_SERVER", None)
            started = subprocess.run(
                [*self.corral, "server", "--detach"], env=env, capture_output=True, check=False
            )
            if started.returncode != 0:
                raise RuntimeError(f"could not start a corral server: {started.stderr.decode()}")
            try:
                yield WarmServer(self.corral, env)
            finally:
                subprocess.run(
                    [*self.corral, "server", "--stop"], env=env, capture_output=True, check=False
                )

    def raw_bwrap_argv(self) -> list[str] | None:
        """Raw ``bwrap`` with the agent profile running ``true``; None without bwrap.

        The profile of docs/design.md: the same namespaces as corral's sandbox,
        read-only root, private /dev, /proc and /tmp, the workspace bound.
        """
        from ..backends import _find_bwrap

        bwrap = _find_bwrap(dict(os.environ))
        if bwrap is None:
            return None
        ws = self.workspace
        mounts = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        rest = ["--bind", ws, ws, "--unshare-all", "--die-with-parent", "--new-session", "true"]
        return [bwrap, *mounts, *rest]

    def raw_bwrap_ms(self) -> float | None:
        """Median of :meth:`raw_bwrap_argv`; None without bwrap."""
        argv = self.raw_bwrap_argv()
        return None if argv is None else self.median_cmd_ms(argv)


class WarmServer:
    """A running corral server for a suite (see :meth:`Context.warm_server`)."""

    def __init__(self, corral: Sequence[str], env: dict[str, str]) -> None:
        self.corral = list(corral)
        self.env = env  # the environment whose ``corral run`` it serves

    def status(self) -> dict[str, object]:
        """``corral server --status --json`` (an empty dict if it answered nothing)."""
        import json

        result = subprocess.run(
            [*self.corral, "server", "--status", "--json"],
            env=self.env,
            capture_output=True,
            check=False,
        )
        data: dict[str, object] = json.loads(result.stdout or b"null") or {}
        return data


def ratio(value: float, base: float | None) -> str:
    """``value / base`` as ``"1.23x"``; ``"n/a"`` without a baseline."""
    return f"{value / base:.2f}x" if base else "n/a"


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
