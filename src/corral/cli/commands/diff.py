"""``corral diff [ID]``: review a preview's change set.

A summary line per change (``--stat``), or the full review: what happened to
each path, mode changes, symlink targets, and unified diffs for text
(binary and very large files: size and sha256). ``--json`` prints the
change set as data. Colour on a terminal (``--color``). Everything the
sandboxed command wrote is shown with control characters escaped.
"""

from __future__ import annotations

import argparse
import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error
from .._preview_lookup import add_lookup_arguments, find_preview, use_color

__all__ = ["main"]


def main(args: list[str]) -> int:
    """Entry point."""
    from ..._state import state_dir
    from ...preview import render_diff, render_stat

    parser = argparse.ArgumentParser(prog="corral diff", description=__doc__.split("\n\n")[0])
    add_lookup_arguments(parser)
    parser.add_argument("--stat", action="store_true", help="one line per changed path")
    parser.add_argument("--json", action="store_true", help="the change set as JSON")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    try:
        preview = find_preview(ns.id, ns.workspace, state_dir=state_dir())
        changes = preview.changes()
        if ns.json:
            from ..._jsonfast import dumps

            data = changes.to_json()
            data["conflicts"] = [{"path": p, "why": why} for p, why in preview.conflicts(changes)]
            data["protected"] = [{"path": p, "rule": r} for p, r in preview.protected(changes)]
            sys.stdout.write(dumps(data) + "\n")
            return 0
        color = use_color(ns.color, sys.stdout)
        out = sys.stdout
        out.write(
            f"preview {preview.id} of {preview.workspace} ({preview.mechanism}, "
            f"{preview.runs} run(s)): {changes.summary()}\n"
        )
        lines = render_stat(changes, color=color) if ns.stat else render_diff(changes, color=color)
        for line in lines:
            out.write(line + "\n")
        for path, why in preview.conflicts(changes):
            out.write(f"conflict: {path}: {why}\n")
        for path, rule in preview.protected(changes):
            out.write(f"protected: {path} ({rule}): apply needs --allow-protected\n")
        out.flush()
    except BrokenPipeError:
        return 0
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    return 0
