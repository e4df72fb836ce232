"""A stable digest of a Policy, for the audit log (DESIGN §9).

:func:`policy_digest` hashes a canonical JSON form of the policy: records
become objects with sorted keys, tuples become arrays, frozensets sorted
arrays, so the digest does not depend on dict or set ordering.
:mod:`hashlib` is not imported: the ``_sha256`` accelerator is enough and
cheaper to import.
"""

from __future__ import annotations

from .._frozen import Record
from .._jsonfast import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from hashlib import sha256 as _sha256
    from typing import Any

    from ._model import Policy
else:
    try:
        from _sha256 import sha256 as _sha256  # CPython <= 3.11
    except ImportError:  # pragma: no cover - depends on the Python version
        try:
            from _sha2 import sha256 as _sha256  # CPython >= 3.12
        except ImportError:
            from hashlib import sha256 as _sha256

__all__ = ["policy_data", "policy_digest", "sha256_hex"]


def sha256_hex(data: bytes) -> str:
    """Return the SHA-256 of *data* as 64 lower-case hex digits."""
    return str(_sha256(data).hexdigest())


def policy_data(value: Any) -> Any:
    """Return *value* (a Policy or part of one) as plain JSON data, canonically ordered."""
    if isinstance(value, Record):
        return {name: policy_data(item) for name, item in value.fields().items()}
    if isinstance(value, (tuple, list)):
        return [policy_data(item) for item in value]
    if isinstance(value, frozenset):
        return sorted(policy_data(item) for item in value)
    return value


#: digests of the policies asked about lately, by identity: ``id -> (policy, digest)``. A
#: policy is immutable, so its digest never changes; the corral server asks for the digest
#: of the same (cached) policy on every run. The policy is kept in the entry, so its id
#: cannot be reused while the entry lives.
_DIGESTS: dict[int, tuple[Policy, str]] = {}
_DIGESTS_MAX = 64  # a bound, not a tuning knob


def policy_digest(policy: Policy) -> str:
    """Return the SHA-256 hex digest of *policy*'s canonical JSON.

    Example::

        policy_digest(default_policy("/src/app", home="/home/me"))  # "3f1c..."
    """
    entry = _DIGESTS.get(id(policy))
    if entry is not None and entry[0] is policy:
        return entry[1]
    digest = sha256_hex(dumps(policy_data(policy), sort_keys=True).encode("ascii"))
    if len(_DIGESTS) >= _DIGESTS_MAX:
        _DIGESTS.clear()
    _DIGESTS[id(policy)] = (policy, digest)
    return digest
