"""``corral previews``: list the previews that exist (newest last)."""

from __future__ import annotations

import argparse
import sys
import time

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error

__all__ = ["main"]


def main(args: list[str]) -> int:
    """Entry point."""
    from ..._state import state_dir
    from ...preview import Preview
    from .._preview_lookup import current_workspace

    parser = argparse.ArgumentParser(prog="corral previews", description=__doc__)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--here", action="store_true", help="only previews of the current workspace"
    )
    parser.add_argument("--workspace", metavar="DIR", help="only previews of this workspace")
    parser.add_argument("--changes", action="store_true", help="also count each preview's changes")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    workspace = current_workspace(ns.workspace) if (ns.here or ns.workspace) else None
    try:
        previews = Preview.list(state_dir=state_dir(), workspace=workspace)
        rows = []
        for preview in previews:
            row = preview.to_json()
            if ns.changes:
                row["changes"] = preview.changes().counts()
            rows.append(row)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    if ns.json:
        from ..._jsonfast import dumps

        sys.stdout.write(dumps(rows) + "\n")
        return 0
    if not rows:
        sys.stdout.write("no previews\n")
        return 0
    for row in rows:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(row["created"])))  # type: ignore[arg-type]
        line = (
            f"{row['id']}  {created}  {row['mechanism']:<14} runs={row['runs']:<3} "
            f"{row['workspace']}"
        )
        if ns.changes:
            counts = row["changes"]
            assert isinstance(counts, dict)
            line += "  " + (", ".join(f"{n} {k}" for k, n in counts.items()) or "no changes")
        sys.stdout.write(line + "\n")
    return 0
