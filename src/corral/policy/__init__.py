"""Policy: what a sandboxed command may do (pure data, no OS access).

See :mod:`corral.policy._model` for the types and
:mod:`corral.policy._defaults` for the built-in rows.
"""

from ._defaults import ENV_PASS, PROTECTED_PATTERNS, SECRET_PATHS, default_policy
from ._glob import PathPattern, match_word
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

__all__ = [
    "ENV_PASS",
    "ISOLATION_LEVELS",
    "NETWORK_MODES",
    "PROTECTED_PATTERNS",
    "SECRET_PATHS",
    "Credential",
    "EnvPolicy",
    "FilesystemPolicy",
    "NetworkPolicy",
    "PathPattern",
    "Policy",
    "ResourceLimits",
    "default_policy",
    "isolation_rank",
    "match_word",
]
