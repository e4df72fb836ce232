"""Session ``TMPDIR``s in corral's state directory: removing them, and sweeping dead ones.

Used by the SDK's sessions (:mod:`corral._sandbox_base`) and the corral
server's kept sandboxes (:mod:`corral.server._kept`); below both layers.
"""

from __future__ import annotations

import os

__all__ = ["remove_tree", "sweep_sessions"]


def sweep_sessions(directory: str) -> None:
    """Remove the TMPDIRs of sessions whose process no longer exists (killed, not closed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    alive: dict[str, bool] = {}  # one look per owner: a node agent owns hundreds of them
    for name in names:
        pid = name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        if pid not in alive:
            alive[pid] = os.path.exists(f"/proc/{pid}")
        if not alive[pid]:
            remove_tree(os.path.join(directory, name))


def remove_tree(path: str) -> None:
    """Remove a session directory, whatever modes the sandbox left inside it.

    Never follows a symlink the sandbox planted (see
    :func:`corral.preview._mechanism.remove_tree`).
    """
    from .preview._mechanism import remove_tree as remove_without_following

    remove_without_following(path)
