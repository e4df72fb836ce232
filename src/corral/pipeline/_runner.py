"""Run one request under one policy: pick the backend, plan, launch, audit.

This is the single path every entry point takes (``corral run`` in its own
process or in the corral server, the hook's rewritten command, the SDK, the
MCP server)::

    prepared = prepare(request, policy, environ=os.environ)   # backend + facts + plan
    outcome = launch(prepared, request, on_start=...)          # runs it
    audit_outcome(outcome, ...)                                 # one hash-chained record

:func:`execute` does all three. :class:`SignalRelay` carries signals for a
command that may not have started yet.

With ``preview=`` (a :class:`corral.preview.Preview`) the command runs
against the preview's copy-on-write view of the workspace: only backends
that can mount it are used, the preview's directory is hidden from the
sandbox, the preview is held exclusively while the command runs, and what
the run touched is recorded for conflict detection afterwards.
"""

from __future__ import annotations

import os

from .._exceptions import BackendUnavailable, CorralError, EnforcementUnavailable, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ..backends import Backend, HostFacts, LaunchPlan, PreviewSpec
    from ..policy._model import Policy
    from ..preview import Preview  # typing only: the preview layer sits above this module
    from ._cgroups import Cgroup, CgroupLayout
    from ._engine import Running
    from ._outcome import Outcome
    from ._request import ExecRequest

__all__ = ["Prepared", "SignalRelay", "audit_outcome", "execute", "launch", "prepare"]


class Prepared:
    """A planned run: the backend, what it learned about the host, and the plan."""

    __slots__ = ("backend", "facts", "layout", "plan", "policy", "preview")

    def __init__(
        self,
        backend: Backend,
        facts: HostFacts,
        layout: CgroupLayout | None,
        plan: LaunchPlan,
        policy: Policy,
        preview: Preview | None = None,
    ) -> None:
        self.backend = backend
        self.facts = facts
        self.layout = layout
        self.plan = plan
        self.policy = policy
        self.preview = preview


class SignalRelay:
    """Signals meant for a command: delivered to it once it runs, held until then.

    ``corral run`` feeds it from its signal handlers; the corral server from
    its client's messages. :meth:`deliver`, :meth:`stop` and :meth:`kill` may
    be called from a signal handler (in the main thread, between any two
    bytecodes of the run) or from another thread; none takes a lock, so none
    can deadlock against :meth:`started`. Every held signal is delivered
    exactly once: both sides publish first, then drain the shared list with
    atomic ``pop``.

    Example::

        relay = SignalRelay()
        relay.deliver(2)                      # SIGINT before the start: held
        launch(..., on_start=relay.started)   # delivered to the command now
    """

    __slots__ = ("_pending", "_running", "_stop")

    def __init__(self, pending: tuple[int, ...] = ()) -> None:
        self._running: Running | None = None
        self._pending: list[int] = list(pending)
        self._stop = ""  # "", "stop" (TERM, grace, KILL) or "kill" (KILL now)

    def deliver(self, signum: int) -> None:
        """Send *signum* to the command (held until it has started).

        SIGTERM is a request to stop, which a command may ignore: it stops the
        whole sandbox as a timeout would (TERM to every process, SIGKILL after
        ``resources.killGrace``).
        """
        if signum == 15:
            self.stop()
            return
        self._pending.append(signum)
        self._drain()

    def stop(self) -> None:
        """Stop the command as a timeout would (SIGTERM, grace, SIGKILL), now or at its start."""
        self._stop = self._stop or "stop"
        self._apply()

    def kill(self) -> None:
        """The caller is gone: stop the whole sandbox (SIGKILL) now or as soon as it starts."""
        self._stop = "kill"
        self._apply()

    @property
    def stopped(self) -> str:
        """``""``, or ``"stop"``/``"kill"`` once :meth:`stop`/:meth:`kill` was called."""
        return self._stop

    def started(self, running: Running) -> None:
        """The command was released: deliver what is held (the ``on_start`` callback)."""
        self._running = running
        self._apply()
        self._drain()

    def _apply(self) -> None:
        running = self._running
        if running is None:
            return
        if self._stop == "kill":
            running.kill()
        elif self._stop == "stop":
            running.cancel()

    def _drain(self) -> None:
        running = self._running
        if running is None:
            return
        while self._pending:
            try:
                signum = self._pending.pop(0)
            except IndexError:
                return  # the other side took the last one
            running.send_signal(signum)


def _plan(
    backend: Backend,
    request: ExecRequest,
    policy: Policy,
    facts: HostFacts,
    spec: PreviewSpec | None,
) -> LaunchPlan:
    if spec is None:
        return backend.plan(request, policy, facts)
    return backend.plan(request, policy, facts, preview=spec)  # type: ignore[call-arg]


def _policy_for_preview(policy: Policy, spec: PreviewSpec, state_dir: str) -> Policy:
    """The policy for a run in a preview: same workspace, and corral's state dir hidden.

    The state dir holds every preview's layers and the apply journals: a
    sandboxed command must not read another preview, nor slip changes into
    one. Settings loaded by ``load_settings`` hide it already; a policy built
    another way (the SDK) gets it added here.
    """
    fs = policy.filesystem
    if os.path.realpath(fs.workspace) != spec.workspace:
        raise UsageError(
            f"Failed to run in preview {spec.id}: it belongs to the workspace {spec.workspace}, "
            f"not {fs.workspace}",
            hint=f"run it with --workspace {spec.workspace}",
        )
    hidden = os.path.realpath(state_dir)
    deny_read = fs.deny_read
    if not any(hidden == d or hidden.startswith(d.rstrip("/") + "/") for d in deny_read):
        deny_read = (*deny_read, hidden)
    return policy.replace(filesystem=fs.replace(workspace=spec.workspace, deny_read=deny_read))


def _hide_broker_locks(policy: Policy) -> Policy:
    """*policy* with the user's private broker lock directory hidden (and read-only where
    it lies in a writable area), whatever built the policy.

    A sandboxed process that could open a lock file could hold it and stall every
    write broker of the user's sandboxes for :data:`~corral.backends._broker_lock.LOCK_BOUND`
    per operation; one that could replace it would split the brokers that lock
    through it (``backends/_broker_lock.py``). A root caller's sandbox sees its
    caller's home, so the default secret paths alone do not keep it out.
    """
    from ..backends._broker_lock import lock_directory

    locks = lock_directory()
    if locks is None:
        return policy
    fs = policy.filesystem

    def under(path: str, area: str) -> bool:
        return path == area or path.startswith(area.rstrip("/") + "/")

    deny_read, deny_write = fs.deny_read, fs.deny_write
    if not any(under(locks, d) for d in deny_read):
        deny_read = (*deny_read, locks)
    writable = (fs.workspace, *fs.allow_write, *(path for _name, path in policy.caches))
    if any(under(locks, w) or under(w, locks) for w in writable):
        deny_write = (*deny_write, *(p for p in (locks, locks + "/**") if p not in deny_write))
    if (deny_read, deny_write) == (fs.deny_read, fs.deny_write):
        return policy
    return policy.replace(filesystem=fs.replace(deny_read=deny_read, deny_write=deny_write))


def prepare(
    request: ExecRequest,
    policy: Policy,
    *,
    environ: Mapping[str, str],
    preview: Preview | None = None,
) -> Prepared:
    """Choose the backend (``auto``: cheapest that works and meets ``isolation``) and plan.

    With *preview*, only a backend that supports the preview's mechanism is
    used, and the plan runs the command against the preview.

    Raises:
        UsageError: bad backend name or a policy/backend mismatch (or a
            preview of another workspace, or a ``denyRead`` glob too broad to expand).
        BackendUnavailable: nothing suitable works here.
        EnforcementUnavailable: a rule cannot be enforced (and was not allowed to degrade).
    """
    from ..backends import BACKEND_TRAITS, get_backend, inspect_host
    from ..policy._model import isolation_rank

    env = dict(environ)
    spec = None
    if preview is not None:
        spec = preview.spec()
        policy = _policy_for_preview(policy, spec, preview.state_dir)
    if policy.backend != "none":
        from ..policy._expand import expand_deny_read

        policy = expand_deny_read(policy)  # globs -> the paths they match now (bounded walk)
        policy = _hide_broker_locks(policy)
    if policy.backend != "auto":
        from ..backends import select_backend

        backend = select_backend(policy)
        if spec is not None and spec.mechanism not in backend.preview_mechanisms:
            raise UsageError(
                f"Failed to run in preview {spec.id}: the {backend.name} backend cannot run "
                f"a preview ({spec.mechanism})",
                hint="use a backend that can (bubblewrap), or drop --backend",
            )
        facts, layout = inspect_host(backend, request, policy, env)
        problem = backend.problem(facts)
        if problem is not None:
            raise BackendUnavailable(
                f"Failed to use the {backend.name} backend: {problem}",
                hint="run 'corral doctor' to see what works here",
            )
        plan = _plan(backend, request, policy, facts, spec)
        return Prepared(backend, facts, layout, plan, policy, preview)
    reasons: list[str] = []
    refusals: list[EnforcementUnavailable] = []
    minimum = isolation_rank(policy.isolation)
    names = sorted(
        (
            name
            for name, (level, _cost, explicit) in BACKEND_TRAITS.items()
            if not explicit and isolation_rank(level) >= minimum
        ),
        key=lambda name: BACKEND_TRAITS[name][1],
    )
    for name in names:
        backend = get_backend(name)
        if spec is not None and spec.mechanism not in backend.preview_mechanisms:
            reasons.append(f"{name}: cannot run a preview ({spec.mechanism})")
            continue
        facts, layout = inspect_host(backend, request, policy, env)
        problem = backend.problem(facts)
        if problem is not None:
            reasons.append(f"{name}: {problem}")
            continue
        try:
            plan = _plan(backend, request, policy, facts, spec)
        except EnforcementUnavailable as exc:
            refusals.append(exc)  # this one cannot express the policy: try the next
            reasons.append(f"{name}: {exc.message}")
            continue
        except BackendUnavailable as exc:
            reasons.append(f"{name}: {exc.message}")
            continue
        return Prepared(backend, facts, layout, plan, policy, preview)
    if refusals:
        # the backends that work here refused a rule: the cheapest one's refusal is the
        # actionable message (it names the rule and --allow-degraded)
        raise refusals[0]
    raise BackendUnavailable(
        f"Failed to find a backend with at least {policy.isolation!r} isolation"
        + (f": {'; '.join(reasons)}" if reasons else ""),
        hint="run 'corral doctor' for what works here and how to fix the rest",
    )


def launch(
    prepared: Prepared,
    request: ExecRequest,
    *,
    on_start: Callable[[Running], None] | None = None,
    stdio: tuple[int, int, int] | None = None,
    cgroup: Cgroup | None = None,
    streams: tuple[int, int, int] = (0, 1, 2),
) -> Outcome:
    """Run a prepared plan; *on_start* receives the running handle (signals, cancel).

    *stdio*, *cgroup* and *streams* go to :meth:`Backend.launch
    <corral.backends.Backend.launch>`: a pty handed over as is; a group
    prepared ahead (the caller's until the launch takes it); the fds an
    inherited stdin comes from and streamed output goes to.

    In a preview the preview is held for the whole run (a second command in
    the same preview is refused meanwhile: ``PreviewError``) and what the run
    touched is recorded afterwards, even when the launch failed.
    """

    def launch() -> Outcome:
        return prepared.backend.launch(
            prepared.plan,
            request,
            cgroup_layout=prepared.layout,
            on_start=on_start,
            stdio=stdio,
            cgroup=cgroup,
            streams=streams,
        )

    preview = prepared.preview
    if preview is None:
        return launch()
    with preview.hold():
        try:
            outcome = launch()
        except BaseException:
            try:
                preview.record_run(prepared.policy)
            except (CorralError, OSError):
                pass  # the launch's own error matters more; apply re-checks conservatively
            raise
        preview.record_run(prepared.policy)
        return outcome


def audit_outcome(
    outcome: Outcome,
    request: ExecRequest,
    *,
    state_dir: str,
    extra: dict[str, object] | None = None,
) -> str | None:
    """Append the audit record; return an error message instead of raising."""
    from .. import _audit

    try:
        _audit.append(
            state_dir,
            _audit.record_for(
                outcome,
                cwd=request.cwd or os.getcwd(),
                agent_session=request.agent_session,
                extra=extra,
            ),
        )
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
    preview: Preview | None = None,
    streams: tuple[int, int, int] = (0, 1, 2),
) -> Outcome:
    """Prepare, launch and audit one request; return its Outcome.

    *preview* runs the command against that preview's copy-on-write view of
    the workspace (the real workspace is not written); the audit record
    names the preview. *streams*: where a request with ``capture=False``
    streams its output (see :func:`launch`; the SDK passes pipes it reads live).

    Raises:
        CorralError: the sandbox could not be provided (nothing ran); see
            :mod:`corral._exceptions`.
    """
    prepared = prepare(request, policy, environ=environ, preview=preview)
    outcome = launch(prepared, request, on_start=on_start, streams=streams)
    if policy_digest:
        outcome = outcome.replace(policy_digest=policy_digest)
    if state_dir is not None:
        extra: dict[str, object] | None = {"preview": preview.id} if preview is not None else None
        problem = audit_outcome(outcome, request, state_dir=state_dir, extra=extra)
        if problem is not None:
            raise CorralError(f"Failed to record the run: {problem}")
    return outcome
