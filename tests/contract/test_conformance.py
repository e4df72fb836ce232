"""One suite of harmless/malicious probe pairs against every backend available here.

Every (backend, guarantee) cell must match what the backend claims: enforced,
refused (exit 125 with the rule named), or not expressible (declared with its
reason). A VIOLATED cell is a sandbox escape; an error cell a broken backend.
"""

from __future__ import annotations

import pytest

from corral.testing.conformance import GUARANTEES, check, expected

from .conftest import available

BACKENDS = ("bubblewrap", "landlock", "gvisor", "podman", "docker", "none")


@pytest.mark.parametrize("guarantee", GUARANTEES, ids=lambda g: g.name.replace(" ", "-"))
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_keeps_its_promise(backend: str, guarantee: object) -> None:
    problem = available().get(backend, "not registered")
    if problem is not None:
        pytest.skip(f"{backend} is not available here: {problem}")
    verdict = check(backend, guarantee)  # type: ignore[arg-type]
    assert verdict.status == expected(backend, verdict.guarantee), verdict.detail
