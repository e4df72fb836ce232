"""Which preview a ``diff``/``apply``/``discard`` command means, and its shared options.

``corral diff [ID]``: with an ID, that preview; without, the newest preview
of the current workspace (``--workspace DIR``, else the git top-level above
the current directory, else the current directory) - the same workspace
``corral run`` would use.
"""

from __future__ import annotations

import os

from .._exceptions import PreviewError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from ..preview import Preview

__all__ = ["add_lookup_arguments", "current_workspace", "find_preview", "use_color"]


def add_lookup_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ID`` and ``--workspace`` arguments every preview command takes."""
    parser.add_argument(
        "id", nargs="?", help="preview id (default: the newest preview of this workspace)"
    )
    parser.add_argument(
        "--workspace", metavar="DIR", help="the workspace whose newest preview to use"
    )


def current_workspace(explicit: str | None) -> str:
    """The workspace ``corral run`` would pick here (no settings files are read)."""
    from ..policy._settings import find_workspace

    if explicit:
        return os.path.realpath(explicit)
    home = os.environ.get("HOME") or os.path.expanduser("~")
    workspace, _label = find_workspace(os.getcwd(), home=home)
    return os.path.realpath(workspace)


def find_preview(preview_id: str | None, workspace: str | None, *, state_dir: str) -> Preview:
    """The preview the user means.

    Raises:
        PreviewError: no such preview, or none for the workspace.
    """
    from ..preview import Preview

    if preview_id:
        return Preview.open(preview_id, state_dir=state_dir)
    ws = current_workspace(workspace)
    found = Preview.list(state_dir=state_dir, workspace=ws)
    if not found:
        raise PreviewError(
            f"Failed to find a preview of {ws}",
            hint="'corral previews' lists every preview; name one by its id",
        )
    return found[-1]


def use_color(mode: str, stream: object) -> bool:
    """Colour for ``--color auto|always|never`` (auto: a terminal and no ``NO_COLOR``)."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    isatty = getattr(stream, "isatty", None)
    return (
        bool(isatty and isatty())
        and "NO_COLOR" not in os.environ
        and os.environ.get("TERM") != "dumb"
    )
