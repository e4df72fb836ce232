"""The SDK's VM sessions: one micro-VM for a whole :class:`~corral.Sandbox` (a mixin).

A session whose policy asks for ``isolation: "vm"`` (or ``backend:
"microvm"``) keeps one VM (:class:`corral.pipeline._vm_session.VmSession`)
and runs every command, ``run_code`` and file call in it; its boot starts when
the session is made (in the background), and the VM is destroyed
when the session closes (or is dropped, or its process dies). Commands the
kept VM cannot run as planned (another policy from ``rules``, a background
``spawn``, a terminal) run in a fresh VM as before. Where the VM cannot run
at all (not root, no VM image) the error is the one a fresh run raises:
nothing falls back to a weaker backend.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .pipeline._outcome import Outcome
    from .pipeline._request import ExecRequest
    from .pipeline._vm_session import VmSession
    from .policy import Policy
    from .preview import Preview

__all__ = ["VmSessions"]


class VmSessions:
    """The kept VM of a session, for :class:`corral._sandbox.BaseSandbox` (a mixin)."""

    _environ: Mapping[str, str]
    _state_dir: str
    _preview: Preview | None
    _closed: bool
    _digest: tuple[Policy | None, str]
    _resident_lock: Any
    _policy: Policy
    _vm_session: VmSession | None = None

    def _request(self, command: list[str]) -> ExecRequest:
        raise NotImplementedError  # BaseSandbox's

    def _run_vm(
        self,
        request: ExecRequest,
        policy: Policy,
        cancellation: Any,
        streams: tuple[int, int, int] | None,
    ) -> Outcome | None:
        """Run *request* in the session's VM (booted on first use), audited.

        ``None``: the policy does not ask for a VM, or this request must run
        in a fresh one (see :mod:`corral.pipeline._vm_session`).
        """
        from .pipeline._vm_session import wants_vm

        if self._closed or not wants_vm(policy):
            return None
        from .pipeline._runner import audit_outcome
        from .policy import policy_digest

        session = self._session_vm()
        extra: dict[str, Any] = {}
        if cancellation is not None:
            extra["on_start"] = cancellation.started
        if streams is not None:
            extra["streams"] = streams
        outcome = session.run(request, policy, preview=self._preview, **extra)
        if outcome is None:
            return None
        if self._digest[0] is not policy:
            self._digest = (policy, policy_digest(policy))
        outcome = outcome.replace(policy_digest=self._digest[1])
        preview = self._preview
        problem = audit_outcome(
            outcome,
            request,
            state_dir=self._state_dir,
            extra={"preview": preview.id} if preview is not None else None,
        )
        if problem is not None:
            from ._exceptions import CorralError

            raise CorralError(f"Failed to record the run: {problem}")
        if cancellation is not None and cancellation.cancelled:
            outcome = outcome.replace(stopped=cancellation.reason)
        return outcome

    def _session_vm(self) -> VmSession:
        from .pipeline._vm_session import VmSession

        with self._resident_lock:
            session = self._vm_session
            if session is None:
                import weakref

                session = self._vm_session = VmSession(self._environ)
                # a session dropped without close(): its VM ends with the object
                weakref.finalize(self, session.close)
            return session

    def _boot_vm_ahead(self) -> None:
        """Start booting the session's VM in the background when its policy asks for one
        (at construction): the first command then waits only for what is left of the
        boot. A refusal or a failed boot is raised by that command; ``close()`` before
        the boot finished stops it and leaves nothing."""
        from .pipeline._vm_session import wants_vm

        if self._closed or not wants_vm(self._policy):
            return
        request = self._request(["true"])
        self._session_vm().start_background(request, self._policy, preview=self._preview)

    def _start_vm(self) -> bool:
        """Boot the session's VM now (blocking) when its policy asks for one.

        False: the policy does not ask for a VM. The MCP server calls it at
        ``sandbox_create``, so a refusal (not root, no VM image, a rule the
        VM cannot enforce) comes at once and the first command finds the VM
        booted.

        Raises:
            CorralError: the VM cannot run here, or did not boot.
        """
        from .pipeline._vm_session import wants_vm

        if self._closed or not wants_vm(self._policy):
            return False
        request = self._request(["true"])
        return self._session_vm().open(request, self._policy, preview=self._preview)

    def _retire_vm(self) -> None:
        """The preview was applied or discarded: the next command gets a new VM.

        The kept VM's view is the preview's overlay, mounted when the VM was
        attached; apply and discard rewrite its layers under it, so the VM is
        destroyed (its ``/tmp`` with it) rather than left on a stale view.
        """
        session = self._vm_session
        if session is not None:
            session.retire()

    def _close_vm(self) -> None:
        session, self._vm_session = self._vm_session, None
        if session is not None:
            session.close()
