"""The whole exception hierarchy of corral.

Three kinds of "no" stay apart (docs/design.md, "Errors"):

* a **policy denial** is data on the :class:`~corral.Outcome` (``violations``);
  :meth:`Outcome.raise_for_denial` turns it into :class:`PolicyDenied` on request;
* a **broken or unavailable sandbox** is a :class:`SandboxError`;
* **caller misuse** (bad settings, bad flags, bad arguments) is a :class:`UsageError`.

::

    CorralError
    ├── UsageError (also RuntimeError)       caller misuse; nothing ran
    │   ├── SettingsError                     a settings file or value is invalid
    │   └── InvalidRequest                    an ExecRequest/SDK call is malformed
    ├── SandboxError                          the sandbox could not be provided
    │   ├── BackendUnavailable                the chosen backend cannot run here
    │   ├── EnforcementUnavailable            a rule or limit cannot be enforced here
    │   ├── LaunchFailed                      setting up the sandbox failed; nothing ran
    │   ├── BrokerFailed                      the write broker stopped working mid-run
    │   ├── ProxyStartFailed                  the egress proxy could not start
    │   ├── PreviewError                      a preview could not be created, diffed or applied
    │   │   └── ApplyConflict                 the real workspace changed under the preview
    │   └── SessionClosed                     the sandbox session was already closed
    ├── ServerError                           the corral server could not start or answer
    ├── CommandFailed                         Outcome.check(): the command failed
    └── PolicyDenied                          Outcome.raise_for_denial(): something was blocked

Every error has a stable kebab-case :attr:`~CorralError.reference` (for docs
and scripts), a message that reads "Failed to <verb> <object>: <cause>" or
names the offending file and key, and an optional :attr:`~CorralError.hint`
that says how to fix it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .pipeline._outcome import Outcome

__all__ = [
    "ApplyConflict",
    "BackendUnavailable",
    "BrokerFailed",
    "CommandFailed",
    "CorralError",
    "EnforcementUnavailable",
    "InvalidRequest",
    "LaunchFailed",
    "PolicyDenied",
    "PreviewError",
    "ProxyStartFailed",
    "SandboxError",
    "ServerError",
    "SessionClosed",
    "SettingsError",
    "UsageError",
]


class CorralError(Exception):
    """Base class of every error corral raises on purpose."""

    reference = "corral-error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UsageError(CorralError, RuntimeError):
    """The caller asked for something invalid; nothing ran."""

    reference = "usage-error"


class SettingsError(UsageError):
    """A settings file or value is invalid.

    Attributes:
        source: the file (or ``"flags"``, ``"environment"``) the value came from.
        key: the dotted key path, e.g. ``"resources.memory"``.
        reason: the message without the source and key.
    """

    reference = "invalid-settings"

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = ": ".join(part for part in (source, key) if part)
        super().__init__(f"{where}: {message}" if where else message, hint=hint)
        self.source = source
        self.key = key
        self.reason = message


class InvalidRequest(UsageError):
    """An SDK call or request is malformed (empty argv, bad timeout, ...)."""

    reference = "invalid-request"


class SandboxError(CorralError):
    """The sandbox could not be provided or broke; see the subclasses."""

    reference = "sandbox-error"


class BackendUnavailable(SandboxError):
    """The chosen backend cannot run on this machine (the hint says how to fix it)."""

    reference = "backend-unavailable"


class EnforcementUnavailable(SandboxError):
    """A requested rule or limit cannot be enforced here.

    corral never weakens a policy silently: the run is refused unless the
    caller opts into the weaker run for exactly this rule (``allowDegraded``),
    which is then recorded on the Outcome and in the audit log.

    Attributes:
        rule: the policy key that cannot be enforced, e.g. ``"resources.memory"``.
    """

    reference = "enforcement-unavailable"

    def __init__(self, message: str, *, rule: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.rule = rule


class LaunchFailed(SandboxError):
    """Setting up the sandbox failed before the command ran."""

    reference = "launch-failed"


class BrokerFailed(SandboxError):
    """The write broker (protected paths at any depth) stopped working."""

    reference = "broker-failed"


class ProxyStartFailed(SandboxError):
    """The egress proxy could not be started."""

    reference = "proxy-start-failed"


class PreviewError(SandboxError):
    """A preview could not be created, diffed, applied or discarded."""

    reference = "preview-error"


class ApplyConflict(PreviewError):
    """Files changed in the real workspace since the preview started.

    Attributes:
        paths: the workspace-relative paths in conflict.
    """

    reference = "apply-conflict"

    def __init__(self, message: str, *, paths: tuple[str, ...], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.paths = paths


class SessionClosed(SandboxError):
    """The sandbox session was used after it was closed."""

    reference = "session-closed"


class ServerError(CorralError):
    """The corral server (``corral server``) could not start, or did not answer.

    ``corral run`` never shows this: without a usable server it runs the
    command in its own process.
    """

    reference = "server-error"


class CommandFailed(CorralError):
    """Raised by :meth:`Outcome.check` when the command did not succeed.

    Attributes:
        outcome: the full :class:`~corral.Outcome`, output included.
    """

    reference = "command-failed"

    def __init__(self, message: str, *, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome


class PolicyDenied(CorralError):
    """Raised by :meth:`Outcome.raise_for_denial` when the policy blocked something.

    Attributes:
        outcome: the full :class:`~corral.Outcome`; ``outcome.violations`` says what.
    """

    reference = "policy-denied"

    def __init__(self, message: str, *, outcome: Outcome) -> None:
        super().__init__(message)
        self.outcome = outcome
