"""A root caller's writable roots must be paths only root can re-point.

For a root caller, corral resolves the workspace, each ``allowWrite`` path,
each cache and the caller's home (read-only inside) *by path, with root's
rights*: the ``--as-user`` stage clones and idmaps them (the sandbox then owns
what root owns there), the write broker opens them as its roots, Landlock,
gVisor and the container engines bind or allow them. If another host user
can change a directory on the way to such a path (``/home/alice/proj/out``
with ``/home/alice`` hers), she can replace a component by a symbolic link to
any root-owned directory (``/etc``), before the run or in the instant between
two of those steps, and the sandbox gets that directory instead of hers. The
policy named a path, not a directory, so the only complete rule is about who
can change what the path names (:mod:`corral.policy._owners`, with root the
only owner allowed): then nothing on the way can change except by root,
before or during the run. Checked on every run; nothing is remembered.
"""

from __future__ import annotations

from .._exceptions import UsageError
from ..policy._owners import describe, is_host_root, redirectable_by

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy._model import Policy

__all__ = ["refuse_redirectable_roots"]


def refuse_redirectable_roots(policy: Policy, home: str) -> None:
    """Refuse (exit 125) a root caller's writable root that another user can re-point.

    *home* (the caller's ``$HOME``) is checked too: the stage idmaps it like
    the writable roots (read-only inside). Only for the host's root
    (:func:`is_host_root`).

    Raises:
        UsageError: naming the path, the setting and the directory another user controls.
    """
    if not is_host_root():
        return
    fs = policy.filesystem
    roots = [(fs.workspace, "filesystem.workspace")]
    roots += [(p, "filesystem.allowWrite") for p in fs.allow_write]
    roots += [(p, f"caches.{name}") for name, p in policy.caches]
    roots.append((home, "the home directory"))
    for path, key in roots:
        found = redirectable_by(path)
        if found is not None:
            where, owner = found
            raise UsageError(
                f"Failed to use {key} {path} for a root caller: {describe(owner)} can change "
                f"{where} on the way to it, and could point it at any of root's directories "
                "(docs/threat-model.md, 'Never the host's root identity')",
                hint="run corral as the user who owns that directory, or use a path "
                "only root can change",
            )
