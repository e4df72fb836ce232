"""``corral apply [ID]``: land a preview's changes in the real workspace.

Refuses changes to protected paths unless each is named with
``--allow-protected PATH`` (a directory covers what is below it); refuses
when files changed in the real workspace since the preview began, listing
them (``--force`` overwrites them, ``--skip-conflicts`` leaves them out).
Each file is written to a temporary name and renamed into place, under a
journal: an apply killed at any point is completed by the next corral
command. The preview is removed afterwards unless ``--keep`` (or something
was skipped).
"""

from __future__ import annotations

import argparse
import sys

from ..._exceptions import ApplyConflict, CorralError
from .. import EXIT_USAGE, print_error
from .._preview_lookup import add_lookup_arguments, find_preview

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...preview import ApplyResult, Preview

__all__ = ["apply_with_settings", "main", "report", "settings_protections"]


def settings_protections(workspace: str) -> list[tuple[str, str]]:
    """The protections of today's settings for *workspace*, as ``(pattern, rule)``.

    An apply honours them as well as those the preview's runs saw.
    """
    from ...policy import load_settings
    from ...preview._preview import _policy_patterns

    return _policy_patterns(load_settings(workspace=workspace).policy, workspace)


def apply_with_settings(
    preview: Preview,
    *,
    allow_protected: tuple[str, ...] = (),
    force: bool = False,
    skip_conflicts: bool = False,
    keep: bool = False,
) -> ApplyResult:
    """What ``corral apply`` does to *preview* (``corral ui``'s Apply button does the same).

    Raises:
        PreviewError: protected paths changed and not allowed, or the preview is busy or gone.
        ApplyConflict: files changed in the workspace meanwhile and neither option was given.
    """
    return preview.apply(
        allow_protected=allow_protected,
        force=force,
        skip_conflicts=skip_conflicts,
        protect=settings_protections(preview.workspace),
        keep=keep,
    )


def report(result: ApplyResult) -> None:
    """Say on stderr what an apply did."""
    lines = [f"applied {len(result.applied)} path(s) from preview {result.preview_id}"]
    if result.skipped_conflicts:
        lines.append(
            f"left out {len(result.skipped_conflicts)} conflicting path(s): "
            + ", ".join(result.skipped_conflicts[:10])
        )
    if result.skipped_unsupported:
        lines.append(
            "not applied (FIFOs, sockets, devices): " + ", ".join(result.skipped_unsupported[:10])
        )
    for path, error in result.failed:
        lines.append(f"failed: {path}: {error}")
    for path, why in result.quarantined:
        lines.append(f"git check: {path}: {why}")
    lines.append(
        "the preview was removed"
        if result.preview_removed
        else f"the preview {result.preview_id} is kept"
    )
    sys.stderr.write("".join(f"corral: {line}\n" for line in lines))
    sys.stderr.flush()


def main(args: list[str]) -> int:
    """Entry point."""
    from ..._state import state_dir

    parser = argparse.ArgumentParser(prog="corral apply", description=__doc__.split("\n\n")[0])
    add_lookup_arguments(parser)
    parser.add_argument(
        "--allow-protected",
        action="append",
        default=[],
        metavar="PATH",
        help="accept the change to this protected path (repeatable)",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--force", action="store_true", help="overwrite files that changed in the workspace"
    )
    group.add_argument("--skip-conflicts", action="store_true", help="leave files that changed out")
    parser.add_argument("--keep", action="store_true", help="keep the preview after applying")
    parser.add_argument("--json", action="store_true", help="print what was applied as JSON")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    try:
        preview = find_preview(ns.id, ns.workspace, state_dir=state_dir())
        result = apply_with_settings(
            preview,
            allow_protected=tuple(ns.allow_protected),
            force=ns.force,
            skip_conflicts=ns.skip_conflicts,
            keep=ns.keep,
        )
    except ApplyConflict as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    if ns.json:
        from ..._jsonfast import dumps

        sys.stdout.write(dumps(result.to_json()) + "\n")
    report(result)
    return EXIT_USAGE if result.failed else 0
