"""corral: run an AI coding agent's commands in a sandbox under one policy.

The public API (everything importable from ``corral``) is listed in
``__all__``; names are imported lazily on first use so that ``import corral``
stays cheap on the command line's hot path.

Example::

    import corral

    outcome = corral.run(["pytest", "-q"], workspace="/src/app", timeout=300)
    print(outcome.returncode, outcome.violations)
"""

from __future__ import annotations

from ._version import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._api import arun, run
    from ._exceptions import (
        ApplyConflict,
        BackendUnavailable,
        BrokerFailed,
        CommandFailed,
        CorralError,
        EnforcementUnavailable,
        InvalidRequest,
        LaunchFailed,
        PolicyDenied,
        PreviewError,
        ProxyStartFailed,
        SandboxError,
        SessionClosed,
        SettingsError,
        UsageError,
    )
    from ._sandbox import AsyncSandbox, FileInfo, Sandbox
    from ._streaming import AsyncProcess, Process
    from .pipeline._outcome import NetworkAttempt, Outcome, Violation
    from .pipeline._request import ExecRequest
    from .policy import (
        Credential,
        EnvPolicy,
        FilesystemPolicy,
        NetworkPolicy,
        Policy,
        ResourceLimits,
    )

_LAZY = {
    "ApplyConflict": "._exceptions",
    "BackendUnavailable": "._exceptions",
    "BrokerFailed": "._exceptions",
    "CommandFailed": "._exceptions",
    "CorralError": "._exceptions",
    "EnforcementUnavailable": "._exceptions",
    "InvalidRequest": "._exceptions",
    "LaunchFailed": "._exceptions",
    "PolicyDenied": "._exceptions",
    "PreviewError": "._exceptions",
    "ProxyStartFailed": "._exceptions",
    "SandboxError": "._exceptions",
    "SessionClosed": "._exceptions",
    "SettingsError": "._exceptions",
    "UsageError": "._exceptions",
    "NetworkAttempt": ".pipeline._outcome",
    "Outcome": ".pipeline._outcome",
    "Violation": ".pipeline._outcome",
    "ExecRequest": ".pipeline._request",
    "AsyncSandbox": "._sandbox",
    "FileInfo": "._files",
    "Sandbox": "._sandbox",
    "Process": "._streaming",
    "AsyncProcess": "._streaming",
    "arun": "._api",
    "run": "._api",
    "Credential": ".policy",
    "EnvPolicy": ".policy",
    "FilesystemPolicy": ".policy",
    "NetworkPolicy": ".policy",
    "Policy": ".policy",
    "ResourceLimits": ".policy",
}

__all__ = [
    "ApplyConflict",
    "AsyncProcess",
    "AsyncSandbox",
    "BackendUnavailable",
    "BrokerFailed",
    "CommandFailed",
    "CorralError",
    "Credential",
    "EnforcementUnavailable",
    "EnvPolicy",
    "ExecRequest",
    "FileInfo",
    "FilesystemPolicy",
    "InvalidRequest",
    "LaunchFailed",
    "NetworkAttempt",
    "NetworkPolicy",
    "Outcome",
    "Policy",
    "PolicyDenied",
    "PreviewError",
    "Process",
    "ProxyStartFailed",
    "ResourceLimits",
    "Sandbox",
    "SandboxError",
    "SessionClosed",
    "SettingsError",
    "UsageError",
    "Violation",
    "__version__",
    "arun",
    "run",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
