"""``corral preview``: run a command against a copy-on-write view of the workspace.

::

    corral preview [RUN OPTIONS] [--id ID] [--keep] [--apply-on-success] -- COMMAND...

Without ``--id`` a new preview is created; with it, the command runs in that
preview (its earlier changes visible). Afterwards corral prints the change
set's summary on stderr; ``corral diff``/``apply``/``discard`` take it from
there. ``--apply-on-success`` applies the changes when the command exits 0
(refusing protected paths and conflicts as ``corral apply`` does) and drops
them otherwise. A new preview that ends with nothing to review (no changes,
applied, or a failed ``--apply-on-success`` run) is removed unless
``--keep``.

The exit status is the command's; 125 when corral refused (including an
``--apply-on-success`` apply that was refused).
"""

from __future__ import annotations

import os
import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error
from .._options import parse_run_options, run_options_help

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...policy import Policy
    from ...preview import Preview

__all__ = ["main"]

SUMMARY = (
    "Run COMMAND against a copy-on-write view of the workspace: the real workspace is not "
    "written; review with 'corral diff', land with 'corral apply'."
)

EXTRA = {
    "--id": "value",
    "--keep": "flag",
    "--apply-on-success": "flag",
    "--allow-protected": "append",
    "--force": "flag",
    "--skip-conflicts": "flag",
    "--mechanism": "value",
}
EXTRA_HELP = (
    ("--id ID", "run in the existing preview ID (default: create a new one)"),
    ("--keep", "keep the preview even when nothing is left to review"),
    ("--apply-on-success", "apply the changes if the command exits 0, drop them otherwise"),
    (
        "--allow-protected P",
        "with --apply-on-success: accept changes to protected path P (repeatable)",
    ),
    ("--force", "with --apply-on-success: overwrite files changed meanwhile in the workspace"),
    ("--skip-conflicts", "with --apply-on-success: leave such files out"),
    ("--mechanism M", "auto, overlay, fuse-overlayfs or copy (new previews)"),
)


def main(args: list[str]) -> int:
    """``corral preview [OPTIONS] -- COMMAND...``"""
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(run_options_help("preview", SUMMARY, EXTRA_HELP))
        return 0
    try:
        return _main(args)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE


def _main(args: list[str]) -> int:
    from ..._state import state_dir
    from ...preview import Preview
    from .run import execute_options, resolve

    opts = parse_run_options(args, extra=EXTRA)
    extra = opts.extra
    environ = os.environ
    state = state_dir(environ)
    existing: Preview | None = None
    if extra.get("--id"):
        existing = Preview.open(str(extra["--id"]), state_dir=state)
        opts.flags.setdefault("filesystem", {}).setdefault("workspace", existing.workspace)
    resolved = resolve(opts, environ)
    if existing is not None:
        preview = existing
    else:
        mechanism = str(extra.get("--mechanism") or "auto")
        if mechanism == "auto" and resolved.policy.backend != "auto":
            from ...backends import get_backend

            mechanism = get_backend(resolved.policy.backend).preview_mechanism()
        preview = Preview.create(resolved.workspace, state_dir=state, mechanism=mechanism)
        print_error(f"preview {preview.id} of {preview.workspace} ({preview.mechanism})")
    try:
        status = execute_options(opts, resolved=resolved, preview=preview)
    except BaseException:
        if existing is None and not extra.get("--keep"):
            _drop_if_empty(preview)
        raise
    return _after_run(preview, status, opts.extra, new=existing is None, policy=resolved.policy)


def _after_run(
    preview: Preview, status: int, extra: dict[str, object], *, new: bool, policy: Policy
) -> int:
    from ...preview._preview import _policy_patterns

    keep = bool(extra.get("--keep"))
    try:
        changes = preview.changes()
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    if extra.get("--apply-on-success"):
        if status != 0:
            print_error(f"the command failed (exit status {status}): nothing applied")
            if not keep:
                preview.discard()
                print_error(f"discarded preview {preview.id} ({changes.summary()})")
            return status
        if not changes:
            print_error(f"preview {preview.id}: no changes to apply")
            if not keep:
                preview.discard()
            return status
        try:
            allowed = extra.get("--allow-protected") or []
            assert isinstance(allowed, list)
            result = preview.apply(
                allow_protected=tuple(str(p) for p in allowed),
                force=bool(extra.get("--force")),
                skip_conflicts=bool(extra.get("--skip-conflicts")),
                protect=_policy_patterns(policy, preview.workspace),
                keep=keep,
            )
        except CorralError as exc:
            print_error(exc.message, exc.hint)
            print_error(f"the preview {preview.id} is kept: 'corral diff {preview.id}' to review")
            return EXIT_USAGE
        from .apply import report

        report(result)
        return EXIT_USAGE if result.failed else status
    if not changes and new and not keep:
        preview.discard()
        print_error(f"preview {preview.id}: no changes (discarded)")
        return status
    print_error(
        f"preview {preview.id}: {changes.summary()}; review: 'corral diff {preview.id}', "
        f"land: 'corral apply {preview.id}', drop: 'corral discard {preview.id}'"
    )
    return status


def _drop_if_empty(preview: Preview) -> None:
    try:
        if not preview.changes():
            preview.discard()
    except CorralError:
        pass
