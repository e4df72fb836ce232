"""Policy: what a sandboxed command may do (pure data), and the settings that produce it.

See :mod:`corral.policy._model` for the types, :mod:`corral.policy._defaults`
for the built-in rows, :mod:`corral.policy._keys` for the settings keys and
:mod:`corral.policy._settings` for loading the layered settings files.
"""

from ._defaults import ENV_PASS, PROTECTED_PATTERNS, SECRET_PATHS, default_policy
from ._digest import policy_digest
from ._glob import PathPattern, match_word
from ._keys import BACKEND_ISOLATION, BACKENDS, KEYS, Key, KeyTable
from ._locations import config_dir, state_dir
from ._model import (
    ISOLATION_LEVELS,
    NETWORK_MODES,
    Credential,
    EnvPolicy,
    FilesystemPolicy,
    NetworkPolicy,
    Policy,
    ResourceLimits,
    isolation_rank,
)
from ._settings import LayerInfo, ResolvedSettings, find_workspace, load_settings
from ._units import format_duration, format_size, parse_duration, parse_size

__all__ = [
    "BACKENDS",
    "BACKEND_ISOLATION",
    "ENV_PASS",
    "ISOLATION_LEVELS",
    "KEYS",
    "NETWORK_MODES",
    "PROTECTED_PATTERNS",
    "SECRET_PATHS",
    "Credential",
    "EnvPolicy",
    "FilesystemPolicy",
    "Key",
    "KeyTable",
    "LayerInfo",
    "NetworkPolicy",
    "PathPattern",
    "Policy",
    "ResolvedSettings",
    "ResourceLimits",
    "TrustStatus",
    "config_dir",
    "default_policy",
    "effective_settings_json",
    "explain",
    "find_workspace",
    "format_duration",
    "format_size",
    "isolation_rank",
    "load_settings",
    "match_word",
    "parse_duration",
    "parse_size",
    "policy_digest",
    "state_dir",
    "trust_project",
    "trust_status",
]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._explain import effective_settings_json, explain
    from ._trust import TrustStatus, trust_project, trust_status

# Cold helpers (``corral policy``, ``corral trust``) load on first use: the run
# path imports this package and should not pay for them.
_LAZY = {
    "effective_settings_json": "._explain",
    "explain": "._explain",
    "TrustStatus": "._trust",
    "trust_project": "._trust",
    "trust_status": "._trust",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'corral.policy' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
