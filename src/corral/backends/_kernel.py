"""Cheap checks of what this kernel offers (no imports beyond os)."""

from __future__ import annotations

import os

__all__ = ["broker_supported", "kernel_version"]

_BROKER_ARCHES = ("x86_64", "aarch64")


def kernel_version() -> tuple[int, int]:
    """``(major, minor)`` of the running kernel, ``(0, 0)`` if unparsable."""
    release = os.uname().release.split(".")
    try:
        return int(release[0]), int(release[1].split("-")[0].split("+")[0])
    except (ValueError, IndexError):
        return 0, 0


def broker_supported() -> str | None:
    """Why the write broker cannot run on this kernel, or ``None`` if it can.

    Needs seccomp user notification with ``SECCOMP_ADDFD_FLAG_SEND`` (Linux
    5.14) and ``openat2`` (5.6), on an architecture corral has tables for.
    """
    machine = os.uname().machine
    if machine not in _BROKER_ARCHES:
        return f"the write broker does not support the {machine} architecture"
    version = kernel_version()
    if version < (5, 14):
        return (
            f"Linux {version[0]}.{version[1]} lacks seccomp ADDFD_FLAG_SEND (needs 5.14 or newer)"
        )
    return None
