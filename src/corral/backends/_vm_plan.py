"""What the VM backends (``microvm``, ``boxlite``) decide alike when they plan a run.

Only the workspace is shared with a guest, secrets never enter it, and a
writable workspace is written only through a preview; these helpers raise or
record (``Degradations``) the same refusals, with the backend named.
"""

from __future__ import annotations

from .._exceptions import EnforcementUnavailable, UsageError
from .base import checked_workspace, is_under

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..pipeline._request import ExecRequest
    from ..policy._model import FilesystemPolicy, Policy
    from ._plan import HostFacts, PreviewSpec
    from .base import Degradations

__all__ = [
    "guest_env",
    "only_the_workspace",
    "refuse_credentials",
    "require_preview",
    "vm_workspace",
    "whole_vcpus",
]


def vm_workspace(
    backend: str, request: ExecRequest, fs: FilesystemPolicy, facts: HostFacts
) -> tuple[str, str]:
    """``(workspace, cwd)`` of a run in a guest, where only the workspace exists.

    Raises:
        UsageError: the workspace is unusable, or the cwd lies outside it.
    """
    workspace = checked_workspace(fs, facts)
    cwd = request.cwd or workspace
    if not is_under(cwd, workspace):
        raise UsageError(
            f"Failed to run in {cwd} on the {backend} backend: only the workspace "
            f"({workspace}) exists in the guest",
            hint="run from inside the workspace, or pass --workspace",
        )
    return workspace, cwd


def refuse_credentials(backend: str, policy: Policy) -> None:
    """Refuse ``credentials`` (exit 125): secrets never enter a guest."""
    if policy.credentials:
        raise EnforcementUnavailable(
            f"Failed to enforce credentials on the {backend} backend: secrets never enter "
            "the guest",
            rule="credentials",
            hint="remove the credentials setting",
        )


def require_preview(backend: str, preview: PreviewSpec | None, fs: FilesystemPolicy) -> None:
    """Refuse a writable workspace without a preview: a VM writes it only through one."""
    if preview is None and not fs.read_only:
        raise EnforcementUnavailable(
            f"Failed to enforce filesystem.workspace on the {backend} backend: the VM writes "
            "the workspace only through a preview",
            rule="filesystem.workspace",
            hint=f"run it with 'corral preview --backend {backend}', or with --read-only",
        )


def only_the_workspace(policy: Policy, degrade: Degradations) -> None:
    """``filesystem.allowWrite`` and ``caches`` are refused (or recorded): only the
    workspace is shared with a guest."""
    if policy.filesystem.allow_write:
        degrade.cannot(
            "filesystem.allowWrite",
            "only the workspace is shared with the VM",
            fix="put the files in the workspace",
        )
    if policy.caches:
        degrade.cannot("caches", "only the workspace is shared with the VM", fix="unset caches")


def whole_vcpus(cpus: float | None, degrade: Degradations) -> int:
    """The VM's vCPUs for ``resources.cpus`` (1 when unset); a fraction is refused."""
    if cpus is None:
        return 1
    whole = max(1, int(cpus))
    if whole != cpus:
        degrade.cannot(
            "resources.cpus",
            f"a VM's CPU limit is a whole number of vCPUs (not {cpus})",
            fix="use a whole number of CPUs",
        )
    return whole


def guest_env(
    request: ExecRequest, policy: Policy, facts: HostFacts, *, home: str
) -> tuple[tuple[str, str], ...]:
    """The command's environment in the guest: the policy's allowlist as everywhere,
    ``TMPDIR`` the guest's own ``/tmp`` and ``HOME`` *home* (the host's home
    directory does not exist in the guest)."""
    from .bubblewrap import sandbox_env

    env = dict(sandbox_env(request, policy, facts.environ))
    env["TMPDIR"] = "/tmp"
    env["HOME"] = home
    return tuple(env.items())
