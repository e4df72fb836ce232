"""sha256 without importing :mod:`hashlib` (OpenSSL bindings, ~2.5 ms on the hot path)."""

from __future__ import annotations

try:
    from _sha256 import sha256  # type: ignore[import-not-found]  # CPython's built-in module
except ImportError:  # pragma: no cover - other Python builds
    from hashlib import sha256

__all__ = ["sha256"]
