"""``corral ui``: a local web page to review runs, violations, network attempts and previews.

Listens on loopback only (a random free port unless ``--port``), prints the
URL with a per-start secret token, and opens it in the browser where there is
a graphical one (``--no-open``). Needs the optional extra: ``pip install
'corral[ui]'``. See docs/ui.md.
"""

from __future__ import annotations

import argparse

from .. import EXIT_USAGE, print_error

__all__ = ["main"]


def main(args: list[str]) -> int:
    """Entry point."""
    from ..._exceptions import CorralError
    from ..._state import state_dir

    parser = argparse.ArgumentParser(prog="corral ui", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--port", type=int, default=0, help="port to listen on (default: a random free port)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="loopback address to listen on (default 127.0.0.1; ::1 also works; others are refused)",
    )
    parser.add_argument("--no-open", action="store_true", help="do not open a browser")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    if not 0 <= ns.port <= 65535:
        print_error(f"--port {ns.port}: not a port number")
        return EXIT_USAGE
    try:
        import jinja2  # noqa: F401 - the extra's libraries, checked before anything starts
        import pygments  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401

        from ...ui import serve
    except ImportError as exc:
        print_error(
            f"corral ui needs the optional extra 'ui' ({exc.name or exc} is missing)",
            "pip install 'corral[ui]'",
        )
        return EXIT_USAGE
    try:
        serve(state_dir(), host=ns.host, port=ns.port, open_browser=not ns.no_open)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    except OSError as exc:
        print_error(f"Failed to start corral ui: {exc.strerror or exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 0
    return 0
