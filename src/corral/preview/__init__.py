"""Previews: run commands against a copy-on-write view of the workspace, review, apply.

``corral preview -- CMD`` runs CMD with the workspace seen through an overlay
(the real workspace is the read-only lower layer; every write, deletion and
rename lands in a private upper layer in corral's state dir). The change set
is then reviewed (``corral diff``), and landed (``corral apply``) or dropped
(``corral discard``). See docs/preview.md.

Example::

    from corral.preview import Preview

    preview = Preview.create("/src/app", state_dir=state_dir)
    corral.pipeline._runner.execute(request, policy, environ=os.environ, preview=preview)
    for change in preview.changes():
        print(change.kind, change.path)
    preview.apply()
"""

from __future__ import annotations

from ._apply import ApplyResult
from ._changes import Change, ChangeSet
from ._mechanism import MECHANISMS
from ._preview import Preview
from ._recovery import recover_interrupted
from ._render import render_diff, render_stat

__all__ = [
    "MECHANISMS",
    "ApplyResult",
    "Change",
    "ChangeSet",
    "Preview",
    "recover_interrupted",
    "render_diff",
    "render_stat",
]
