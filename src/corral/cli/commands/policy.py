"""``corral policy [--explain] [--json]``: the effective policy for this directory.

The text form (with or without ``--explain``) shows every value with the
settings layer it came from; ``--json`` prints the effective settings as a
settings file (it loads back to the same policy). Warnings (ignored
untrusted values ...) go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error

__all__ = ["main"]


def main(args: list[str]) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="corral policy", description="Show the effective policy for this directory."
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="show the layer each value comes from (the default text form)",
    )
    parser.add_argument("--json", action="store_true", help="print the effective settings as JSON")
    parser.add_argument("--workspace", help="project directory (default: git top-level, else cwd)")
    parser.add_argument("--profile", help="apply the named settings profile")
    try:
        opts = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    from ...policy import effective_settings_json, explain, load_settings

    try:
        resolved = load_settings(environ=os.environ, workspace=opts.workspace, profile=opts.profile)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    for warning in resolved.warnings:
        print_error(warning)
    if opts.json:
        import json

        sys.stdout.write(json.dumps(effective_settings_json(resolved), indent=2) + "\n")
    else:
        sys.stdout.write(explain(resolved).rstrip("\n") + "\n")
    return 0
