"""Run one request under one policy: pick the backend, plan, launch, audit.

This is the single path every entry point takes (``corral run``, the hook's
rewritten command, the SDK, the MCP server)::

    prepared = prepare(request, policy, environ=os.environ)   # backend + facts + plan
    outcome = launch(prepared, request, on_start=...)          # runs it
    audit_outcome(outcome, ...)                                 # one hash-chained record

:func:`execute` does all three.
"""

from __future__ import annotations

import os

from ._exceptions import BackendUnavailable, CorralError, EnforcementUnavailable, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ._cgroups import Cgroup, CgroupLayout
    from ._engine import Running
    from ._outcome import Outcome
    from ._request import ExecRequest
    from .backends import Backend, HostFacts, LaunchPlan
    from .policy._model import Policy

__all__ = ["Prepared", "audit_outcome", "execute", "launch", "prepare"]


class Prepared:
    """A planned run: the backend, what it learned about the host, and the plan."""

    __slots__ = ("backend", "facts", "layout", "plan", "policy")

    def __init__(self, backend: Backend, facts: HostFacts, layout: CgroupLayout | None,
                 plan: LaunchPlan, policy: Policy) -> None:
        self.backend = backend
        self.facts = facts
        self.layout = layout
        self.plan = plan
        self.policy = policy


def prepare(request: ExecRequest, policy: Policy, *, environ: Mapping[str, str]) -> Prepared:
    """Choose the backend (``auto``: cheapest that works and meets ``isolation``) and plan.

    Raises:
        UsageError: bad backend name or a policy/backend mismatch.
        BackendUnavailable: nothing suitable works here.
        EnforcementUnavailable: a rule cannot be enforced (and was not allowed to degrade).
    """
    from .backends import BACKEND_TRAITS, get_backend, inspect_host
    from .policy._model import isolation_rank

    env = dict(environ)
    if policy.backend != "auto":
        from .backends import select_backend

        backend = select_backend(policy)
        facts, layout = inspect_host(backend, request, policy, env)
        problem = backend.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the {backend.name} backend: {problem}",
                                     hint="run 'corral doctor' to see what works here")
        return Prepared(backend, facts, layout, backend.plan(request, policy, facts), policy)
    reasons: list[str] = []
    refusals: list[EnforcementUnavailable] = []
    minimum = isolation_rank(policy.isolation)
    names = sorted(
        (name for name, (level, _cost, explicit) in BACKEND_TRAITS.items()
         if not explicit and isolation_rank(level) >= minimum),
        key=lambda name: BACKEND_TRAITS[name][1],
    )
    for name in names:
        backend = get_backend(name)
        facts, layout = inspect_host(backend, request, policy, env)
        problem = backend.problem(facts)
        if problem is not None:
            reasons.append(f"{name}: {problem}")
            continue
        try:
            return Prepared(backend, facts, layout, backend.plan(request, policy, facts), policy)
        except EnforcementUnavailable as exc:
            refusals.append(exc)  # this one cannot express the policy: try the next
            reasons.append(f"{name}: {exc.message}")
        except (BackendUnavailable, UsageError) as exc:
            reasons.append(f"{name}: {exc.message}")
    if refusals:
        # the backends that work here refused a rule: the cheapest one's refusal is the
        # actionable message (it names the rule and --allow-degraded)
        raise refusals[0]
    raise BackendUnavailable(
        f"Failed to find a backend with at least {policy.isolation!r} isolation"
        + (f": {'; '.join(reasons)}" if reasons else ""),
        hint="run 'corral doctor' for what works here and how to fix the rest",
    )


def launch(prepared: Prepared, request: ExecRequest, *,
           on_start: Callable[[Running], None] | None = None,
           stdio: tuple[int, int, int] | None = None,
           cgroup: Cgroup | None = None) -> Outcome:
    """Run a prepared plan; *on_start* receives the running handle (signals, cancel)."""
    return prepared.backend.launch(prepared.plan, request, cgroup_layout=prepared.layout,
                                   on_start=on_start, stdio=stdio, cgroup=cgroup)


def audit_outcome(outcome: Outcome, request: ExecRequest, *, state_dir: str,
                  extra: dict[str, object] | None = None) -> str | None:
    """Append the audit record; return an error message instead of raising."""
    from . import _audit

    try:
        _audit.append(state_dir, _audit.record_for(
            outcome, cwd=request.cwd or os.getcwd(), agent_session=request.agent_session, extra=extra))
    except OSError as exc:
        return f"could not write the audit log in {state_dir}: {exc.strerror}"
    return None


def execute(
    request: ExecRequest,
    policy: Policy,
    *,
    environ: Mapping[str, str],
    state_dir: str | None = None,
    policy_digest: str = "",
    on_start: Callable[[Running], None] | None = None,
) -> Outcome:
    """Prepare, launch and audit one request; return its Outcome.

    Raises:
        CorralError: the sandbox could not be provided (nothing ran); see
            :mod:`corral._exceptions`.
    """
    prepared = prepare(request, policy, environ=environ)
    outcome = launch(prepared, request, on_start=on_start)
    if policy_digest:
        outcome = outcome.replace(policy_digest=policy_digest)
    if state_dir is not None:
        problem = audit_outcome(outcome, request, state_dir=state_dir)
        if problem is not None:
            raise CorralError(f"Failed to record the run: {problem}")
    return outcome
