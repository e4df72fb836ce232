"""The SDK's sandbox options: keyword arguments -> a settings-shaped flags dict.

``AsyncSandbox``/``Sandbox`` and :func:`corral.run` take the same keyword
options; :class:`SandboxOptions` names them (for ``**options`` forwarding,
e.g. ``run()``), :func:`options_to_flags` turns them into the last settings
layer exactly like ``corral run``'s command-line options.
"""

from __future__ import annotations

from typing import TypedDict

from ._exceptions import InvalidRequest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Literal

    from .policy import Policy


class SandboxOptions(TypedDict, total=False):
    """The keyword options of :class:`corral.AsyncSandbox` that :func:`corral.run` forwards.

    (``timeout``, ``env`` and ``cwd`` are ``run()``'s own: they apply to the
    command.) See :class:`corral.AsyncSandbox` for their meaning.
    """

    policy: Policy | None
    workspace: str | None
    preview: bool
    profile: str | None
    settings_files: Sequence[str]
    agent_session: str | None
    environ: Mapping[str, str] | None
    state_dir: str | None
    backend: str | None
    isolation: Literal["process", "namespace", "kernel", "vm"] | None
    read_only: bool | None
    network: Literal["none", "allowlist", "open"] | None
    allow_unix_sockets: bool | None
    memory: int | str | None
    pids: int | str | None
    cpus: float | str | None
    cpu_time: float | str | None
    max_output: int | str | None
    allow_write: Sequence[str] | None
    deny_write: Sequence[str] | None
    allow_read: Sequence[str] | None
    deny_read: Sequence[str] | None
    allow_hosts: Sequence[str] | None
    pass_env: Sequence[str] | None
    allow_degraded: Sequence[str] | None
    settings: Mapping[str, Any] | None


__all__ = ["LIST_OPTIONS", "SCALAR_OPTIONS", "SandboxOptions", "options_to_flags"]

#: Keyword options that map one-to-one to a settings key.
SCALAR_OPTIONS: dict[str, str] = {
    "backend": "backend",
    "isolation": "isolation",
    "read_only": "filesystem.readOnly",
    "network": "network.mode",
    "allow_unix_sockets": "network.allowUnixSockets",
    "memory": "resources.memory",
    "pids": "resources.pids",
    "cpus": "resources.cpus",
    "cpu_time": "resources.cpuTime",
    "timeout": "resources.timeout",
    "max_output": "resources.output",
}
LIST_OPTIONS: dict[str, str] = {
    "allow_write": "filesystem.allowWrite",
    "deny_write": "filesystem.denyWrite",
    "allow_read": "filesystem.allowRead",
    "deny_read": "filesystem.denyRead",
    "allow_hosts": "network.allow",
    "pass_env": "env.pass",
    "allow_degraded": "allowDegraded",
}


def _set(flags: dict[str, Any], dotted: str, value: Any) -> None:
    node = flags
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = [*into[key], *value]
        else:
            into[key] = value


def options_to_flags(options: Mapping[str, Any]) -> dict[str, Any]:
    """Turn SDK keyword options into a flags dict in the settings-JSON shape.

    ``None`` means "not given"; the string ``"none"`` removes a resource limit
    (as on the command line). ``env`` (a mapping) becomes ``env.set``;
    ``allow_hosts`` implies ``network.mode = "allowlist"`` unless ``network``
    is given; ``settings`` (a settings-shaped dict) is merged last.

    Raises:
        InvalidRequest: an unknown option or a value of the wrong shape.
    """
    flags: dict[str, Any] = {}
    for name, value in options.items():
        if value is None or name == "settings":
            continue
        if name in SCALAR_OPTIONS:
            key = SCALAR_OPTIONS[name]
            if key.startswith("resources.") and isinstance(value, str) and value.lower() == "none":
                value = None  # explicitly no limit
            _set(flags, key, value)
        elif name in LIST_OPTIONS:
            if isinstance(value, str) or not hasattr(value, "__iter__"):
                raise InvalidRequest(
                    f"Failed to build the sandbox: {name} must be a list of strings, "
                    f"not {type(value).__name__}"
                )
            _set(flags, LIST_OPTIONS[name], list(value))
        elif name == "env":
            if not hasattr(value, "items"):
                raise InvalidRequest(
                    "Failed to build the sandbox: env must be a mapping of names to values"
                )
            _set(flags, "env.set", {str(k): str(v) for k, v in value.items()})
        else:
            import difflib

            known = [*SCALAR_OPTIONS, *LIST_OPTIONS, "env", "settings"]
            close = difflib.get_close_matches(name, known, n=1)
            raise InvalidRequest(
                f"Failed to build the sandbox: unknown option {name!r}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
            )
    if "allow_hosts" in options and options["allow_hosts"] and options.get("network") is None:
        _set(flags, "network.mode", "allowlist")
    settings = options.get("settings")
    if settings is not None:
        if not isinstance(settings, dict):
            raise InvalidRequest(
                "Failed to build the sandbox: settings must be a dict shaped like a settings file"
            )
        _merge(flags, settings)
    return flags
