"""``corral trust``: trust this project's settings files.

A project's ``.corral/settings.json`` and ``.corral/settings.local.json`` live
in the repository the agent works on, so corral applies only the values that
*tighten* the policy until you trust them. ``corral trust`` validates the
files and records the sha256 of their exact bytes; editing a file makes it
untrusted again. ``--status`` shows the state without changing it.
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
    parser = argparse.ArgumentParser(prog="corral trust", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workspace", help="the project directory (default: git top-level, else cwd)"
    )
    parser.add_argument("--status", action="store_true", help="show whether the files are trusted")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    from ...policy import find_workspace, trust_project, trust_status

    try:
        home = os.environ.get("HOME") or os.path.expanduser("~")
        workspace = (
            os.path.abspath(ns.workspace)
            if ns.workspace
            else find_workspace(os.getcwd(), home=home)[0]
        )
        if ns.status:
            rows = trust_status(workspace, environ=os.environ)
            for row in rows:
                sys.stdout.write(f"{row.state:<10} {row.path}\n")
            return 0
        trusted = trust_project(workspace, environ=os.environ)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    if not trusted:
        sys.stdout.write(f"no project settings files in {workspace}/.corral: nothing to trust\n")
        return 0
    for path in trusted:
        sys.stdout.write(f"trusted {path}\n")
    return 0
