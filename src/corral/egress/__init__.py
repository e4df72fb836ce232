"""Network egress through corral's allowlist proxy (``network.mode = "allowlist"``).

Not implemented yet in this build: :func:`start_for_sandbox` raises
:class:`~corral.ProxyStartFailed`, and the bubblewrap backend refuses
allowlist mode before any launch.
"""

from __future__ import annotations

from .._exceptions import ProxyStartFailed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .._outcome import NetworkAttempt
    from ..backends._plan import EgressSpec

__all__ = ["EgressHandle", "start_for_sandbox"]


class EgressHandle:
    """A running proxy serving one sandbox; :meth:`close` returns its attempts."""

    def close(self) -> list[NetworkAttempt]:
        """Stop the proxy and return every connection attempt it saw."""
        return []


def start_for_sandbox(spec: EgressSpec, *, sandbox_pid: int) -> EgressHandle:
    """Start the proxy listening inside the network namespace of *sandbox_pid*."""
    del spec, sandbox_pid
    raise ProxyStartFailed("Failed to start the egress proxy: not available in this build")
