"""``corral discard [ID]``: drop a preview; the real workspace is not touched."""

from __future__ import annotations

import argparse

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error
from .._preview_lookup import add_lookup_arguments, find_preview

__all__ = ["main"]


def main(args: list[str]) -> int:
    """Entry point."""
    from ..._state import state_dir
    from ...preview import Preview

    parser = argparse.ArgumentParser(prog="corral discard", description=__doc__)
    add_lookup_arguments(parser)
    parser.add_argument(
        "--all", action="store_true", help="discard every preview of every workspace"
    )
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    try:
        if ns.all:
            if ns.id:
                print_error("give either an ID or --all")
                return EXIT_USAGE
            previews = Preview.list(state_dir=state_dir())
        else:
            previews = [find_preview(ns.id, ns.workspace, state_dir=state_dir())]
        for preview in previews:
            preview.discard()
            print_error(f"discarded preview {preview.id} of {preview.workspace}")
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    return 0
