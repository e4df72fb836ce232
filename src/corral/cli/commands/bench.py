"""``corral bench``: overhead benchmarks, medians against same-run baselines."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from .. import EXIT_USAGE

__all__ = ["main"]


def main(args: list[str]) -> int:
    """Entry point."""
    from ...benchmarks import SUITES, Context, default_corral_command, run_suites

    parser = argparse.ArgumentParser(prog="corral bench", description=__doc__)
    parser.add_argument(
        "suites", nargs="*", help=f"suites to run (default: all of {', '.join(SUITES)})"
    )
    parser.add_argument(
        "-n", "--runs", type=int, default=30, help="samples per measurement (default 30)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    unknown = [s for s in ns.suites if s not in SUITES]
    if unknown:
        sys.stderr.write(
            f"corral: unknown benchmark suite(s): {', '.join(unknown)} (known: {', '.join(SUITES)})\n"
        )
        return EXIT_USAGE
    # Every run measured here is in-process unless a suite says otherwise (core's
    # warm-server rows start their own server): none may start the user's server.
    os.environ["CORRAL_SERVER"] = "off"
    with tempfile.TemporaryDirectory(
        prefix="corral-bench-", dir=os.environ.get("CORRAL_BENCH_DIR")
    ) as ws:
        ctx = Context(runs=ns.runs, workspace=ws, corral=default_corral_command())
        results = run_suites(ns.suites or list(SUITES), ctx)
    if ns.json:
        from ..._jsonfast import dumps

        sys.stdout.write(
            dumps({name: [r.to_json() for r in rows] for name, rows in results.items()}) + "\n"
        )
        return 0
    for name, rows in results.items():
        sys.stdout.write(f"\n== {name} (median of {ns.runs}) ==\n")
        width = max(len(r.name) for r in rows)
        for r in rows:
            extra = "  ".join(
                x
                for x in (
                    f"target {r.target}" if r.target else "",
                    f"vs {r.baseline}: {r.note}" if r.baseline else r.note,
                )
                if x
            )
            sys.stdout.write(f"  {r.name.ljust(width)}  {r.value:9.2f} {r.unit}  {extra}\n")
    return 0
