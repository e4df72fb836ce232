"""Which backends work on this machine (probed once), for the contract suite."""

from __future__ import annotations

import os

import pytest


def _available() -> dict[str, str | None]:
    """backend -> None if usable here, else why not."""
    from corral._request import ExecRequest
    from corral.backends import BACKENDS, get_backend, inspect_host
    from corral.policy import Policy

    result: dict[str, str | None] = {}
    workspace = os.getcwd()
    for name in sorted(BACKENDS):
        backend = get_backend(name)
        image = "corral:python" if name in ("podman", "docker") else None
        policy = Policy.for_workspace(workspace, home=os.environ.get("HOME", "/root")).replace(
            image=image
        )
        facts, _ = inspect_host(backend, ExecRequest.from_argv(["true"]), policy, dict(os.environ))
        problem = backend.problem(facts)
        if problem is None and image is not None:
            ref = facts.detail("image")
            problem = getattr(ref, "problem", None)
        result[name] = problem
    return result


_AVAILABLE: dict[str, str | None] | None = None


def available() -> dict[str, str | None]:
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = _available()
    return _AVAILABLE


@pytest.fixture(scope="session", autouse=True)
def python_image() -> None:
    """Build (or reuse from the cache) the corral:python image the container probes run in.

    mmdebstrap from apt only: ~30 s the first time on this class of machine,
    instant afterwards. Skipped (with the reason) where it cannot be built.
    """
    import shutil

    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None or shutil.which("podman") is None:
        return
    from corral.cli.commands.image import _engines
    from corral.images import build_image
    from corral.images._build import ImageBuildFailed

    try:
        build_image("python", engines=_engines(dict(os.environ)), environ=dict(os.environ))
    except ImageBuildFailed:
        return  # the backends then report the image as not built, and skip with that reason
