"""``corral mcp``: the MCP server on stdio (see :mod:`corral.integrations.mcp_server`).

Needs the ``mcp`` package (``pip install 'corral[mcp]'``); without it the
command says so and exits 125.
"""

from __future__ import annotations

import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error

__all__ = ["main"]

USAGE = """usage: corral mcp

Serve corral's sandboxes as MCP tools over stdin/stdout (sandbox_create,
sandbox_exec, sandbox_write_file, sandbox_read_file, sandbox_list_files,
sandbox_list, sandbox_diff, sandbox_apply, sandbox_destroy). The settings are
loaded for the current directory, like 'corral run'.

options:
  -h, --help  show this help message and exit
"""


def main(args: list[str]) -> int:
    """Entry point: serve until the client disconnects."""
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    if args:
        print_error(f"corral mcp takes no arguments, got {' '.join(args)!r}")
        return EXIT_USAGE
    try:
        import anyio
        import mcp  # noqa: F401
    except ImportError:
        print_error("the MCP server needs the mcp package (2.x)", "pip install 'corral[mcp]'")
        return EXIT_USAGE
    from ...integrations.mcp_server import serve

    try:
        anyio.run(serve)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    except BaseExceptionGroup as group:
        _, rest = group.split((BrokenPipeError, ConnectionResetError))
        if rest is not None:
            raise
        # the client went away while we were answering: sandboxes are closed, nothing to report
    return 0
