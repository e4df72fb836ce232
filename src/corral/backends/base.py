"""The Backend contract every isolation mechanism implements.

::

    backend.problem(facts)                 -> None if usable here, else why (and the fix)
    backend.paths_to_inspect(req, policy)  -> host paths whose kind the plan depends on
    backend.inspect(req, policy, environ)  -> backend-specific facts (may do I/O)
    backend.plan(req, policy, facts)       -> LaunchPlan      (pure: no I/O)
    backend.launch(plan, req, ...)         -> Outcome

A backend states what it guarantees (``isolation``) and refuses what it
cannot express: ``plan`` raises :class:`~corral.EnforcementUnavailable`
naming the rule, unless the caller listed that rule in
``policy.allow_degraded``, in which case the weakening is recorded in
``LaunchPlan.degraded`` and on the Outcome.
"""

from __future__ import annotations

from .._exceptions import EnforcementUnavailable, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import ClassVar

    from ..pipeline._cgroups import Cgroup, CgroupLayout
    from ..pipeline._engine import Running
    from ..pipeline._outcome import Outcome
    from ..pipeline._request import ExecRequest
    from ..policy._model import FilesystemPolicy, Policy, ResourceLimits
    from ._plan import CgroupSpec, HostFacts, LaunchPlan

__all__ = [
    "Backend",
    "Degradations",
    "cache_dirs",
    "cgroup_limits",
    "checked_workspace",
    "disk_limit",
    "is_under",
    "paths_of_policy",
    "refuse_image",
]


class Degradations:
    """Collects rules a plan cannot enforce: raise, or record when opted in.

    Example::

        d = Degradations(policy.allow_degraded)
        if facts.cgroup_problem and limits.memory:
            d.cannot("resources.memory", facts.cgroup_problem, fix="...")
        plan = LaunchPlan(..., degraded=d.recorded)
    """

    __slots__ = ("_allowed", "recorded")

    def __init__(self, allowed: frozenset[str]) -> None:
        self._allowed = allowed
        self.recorded: tuple[str, ...] = ()

    def cannot(self, rule: str, why: str, *, fix: str) -> None:
        """Raise EnforcementUnavailable for *rule*, unless the caller allowed degrading it."""
        if rule in self._allowed or "*" in self._allowed:
            self.recorded = (*self.recorded, rule)
            return
        raise EnforcementUnavailable(
            f"Failed to enforce {rule}: {why}",
            rule=rule,
            hint=f"{fix}; or accept running without it: --allow-degraded {rule}",
        )


def is_under(path: str, base: str) -> bool:
    """Whether *path* is *base* or lies below it (both absolute, normalised)."""
    return path == base or path.startswith(base.rstrip("/") + "/")


def broker_patterns(fs: FilesystemPolicy, writable: list[str]) -> list[tuple[str, str]]:
    """The write broker's ``(pattern, rule label)`` rows for *fs* over the *writable* roots.

    Every backend with a broker uses these rows, so a rule means the same
    everywhere:

    * ``filesystem.protect`` rows; a row ``dir/**`` also covers the name
      ``dir`` itself (a file, a directory or a symlink to a payload directory
      would otherwise stand in for the protected directory);
    * ``filesystem.denyWrite``: patterns as they are; an absolute path covers
      itself and everything below it, existing or not;
    * ``filesystem.denyRead`` paths inside a writable root: creating,
      opening for writing (which also reads), renaming or deleting them is
      refused, so the broker never acts on the host file a mask hides.
    """
    rows: list[tuple[str, str]] = []

    def add(pattern: str, label: str) -> None:
        rows.append((pattern, label))
        if pattern.endswith("/**") and len(pattern) > 3:
            rows.append((pattern[:-3], label))

    for p in fs.protect:
        add(p, f"filesystem.protect: {p}")
    for p in fs.deny_write:
        if p.startswith("/") and not any(c in p for c in "*?["):
            base = p.rstrip("/") or "/"
            rows.append((base, f"filesystem.denyWrite: {p}"))
            rows.append(((base if base != "/" else "") + "/**", f"filesystem.denyWrite: {p}"))
        else:
            add(p, f"filesystem.denyWrite: {p}")
    for secret in fs.deny_read:
        if any(is_under(secret, area) for area in writable):
            base = secret.rstrip("/") or "/"
            rows.append((base, f"filesystem.denyRead: {secret}"))
            rows.append((base + "/**", f"filesystem.denyRead: {secret}"))
    return rows


def checked_workspace(fs: FilesystemPolicy, facts: HostFacts, *, allow_write: bool = False) -> str:
    """The workspace path, after checking it can be the sandbox's workspace.

    It must be an existing directory, and it must not lie inside a secret
    path (``filesystem.denyRead``): hiding the secret would hide it too. With
    *allow_write*, the ``filesystem.allowWrite`` paths must not either.

    Raises:
        UsageError: naming the path, the secret and the setting.
    """
    workspace = fs.workspace.rstrip("/") or "/"
    if facts.kind(workspace) != "dir":
        raise UsageError(
            f"Failed to use the workspace {workspace}: it is not an existing directory"
        )
    areas = [(workspace, "filesystem.workspace")]
    if allow_write:
        areas += [(p, "filesystem.allowWrite") for p in fs.allow_write]
    for secret in fs.deny_read:
        for area, key in areas:
            if is_under(area, secret):
                raise UsageError(
                    f"Failed to use {key} {area}: it lies inside the secret path {secret} "
                    "(filesystem.denyRead)"
                )
    return workspace


def paths_of_policy(request: ExecRequest, policy: Policy, *, allow_read: bool = True) -> set[str]:
    """The host paths a filesystem plan looks at: workspace, cwd, writable, secret, carve-out
    (with *allow_read*) and literal absolute write-denied paths."""
    fs = policy.filesystem
    paths = {fs.workspace, *fs.allow_write, *fs.deny_read, *(p for _n, p in policy.caches)}
    if allow_read:
        paths.update(fs.allow_read)
    paths.update(p for p in fs.deny_write if p.startswith("/") and not any(c in p for c in "*?["))
    if request.cwd:
        paths.add(request.cwd)
    return paths


def cache_dirs(policy: Policy, facts: HostFacts, degrade: Degradations) -> list[str]:
    """The ``caches`` host directories a backend sharing the host filesystem makes writable.

    On bubblewrap, gVisor, Landlock and Seatbelt a cache is its host
    directory, mounted (or allowed) read-write at the same path, so it
    persists across runs. A cache whose directory does not exist is refused
    through *degrade* (exit 125 unless ``--allow-degraded caches``), never
    silently skipped. (Container backends use named volumes instead.)
    """
    dirs: list[str] = []
    for name, path in policy.caches:
        if facts.kind(path) == "dir":
            dirs.append(path.rstrip("/") or "/")
        else:
            degrade.cannot(
                "caches",
                f"the directory of cache {name!r} ({path}) does not exist",
                fix=f"create it (mkdir -p {path})",
            )
    return dirs


def disk_limit(
    policy: Policy, writable: Sequence[str], degrade: Degradations, backend: str
) -> int | None:
    """The size of each private tmpfs under ``resources.disk``, or None when unset.

    The limit holds only where every writable place is a tmpfs corral sizes:
    with *writable* host places (workspace, ``allowWrite``, ``caches``, a
    TMPDIR that is a host directory) the rule is refused through *degrade* (or recorded when allowed, and the
    temporary directories are still capped).
    """
    size = policy.resources.disk
    if size is None:
        return None
    if writable:
        degrade.cannot(
            "resources.disk",
            f"on the {backend} backend, writes to {', '.join(sorted(writable))} go to the host "
            "filesystem, which has no per-sandbox quota",
            fix="run with --read-only and without allowWrite or caches on bubblewrap, gvisor, "
            "podman or docker, or unset resources.disk",
        )
    return size


def refuse_image(policy: Policy, degrade: Degradations, backend: str) -> None:
    """Refuse ``image`` on a backend that runs the host's own root filesystem.

    An image there would be silently ignored; with ``backend: "auto"`` the
    refusal moves the choice on to a backend that runs images (podman,
    docker, gVisor).
    """
    if policy.image is not None:
        degrade.cannot(
            "image",
            f"the {backend} backend runs the host's root filesystem, not an image",
            fix="use --backend podman, docker or gvisor, or unset image",
        )


def cgroup_limits(
    res: ResourceLimits, facts: HostFacts, degrade: Degradations
) -> CgroupSpec | None:
    """The cgroup limits a plan asks for (memory, pids, cpus), or None when it asks for none.

    Where cgroups cannot be used here (``facts.cgroup_problem``), each limit
    that was asked for is refused through *degrade* (raised, or recorded when
    the caller allowed degrading it) and the result is None.
    """
    if res.memory is None and res.pids is None and res.cpus is None:
        return None
    if facts.cgroup_problem is not None:
        for rule, value in (
            ("resources.memory", res.memory),
            ("resources.pids", res.pids),
            ("resources.cpus", res.cpus),
        ):
            if value is not None:
                degrade.cannot(rule, facts.cgroup_problem, fix=f"unset {rule}")
        return None
    from ._plan import CgroupSpec

    return CgroupSpec(memory=res.memory, pids=res.pids, cpus=res.cpus)


class Backend:
    """Base class of the backends (designed for extension)."""

    #: the name used in settings and on the command line
    name: ClassVar[str] = ""
    #: the isolation level it provides: process, namespace, kernel or vm
    isolation: ClassVar[str] = ""
    #: rough cost of one run in milliseconds, used by ``auto`` to pick the fastest
    cost_ms: ClassVar[float] = 1000.0
    #: never chosen by ``auto`` (only ``none``)
    explicit_only: ClassVar[bool] = False
    #: plans may ask for the write broker (``inspect_host`` then checks the kernel)
    uses_broker: ClassVar[bool] = False
    #: guarantees of the conformance matrix (:mod:`corral.testing.conformance`)
    #: this backend has no mechanism for, with the reason
    not_expressible: ClassVar[dict[str, str]] = {}
    #: preview mechanisms ``plan(..., preview=spec)`` accepts (see ``PreviewSpec``);
    #: a backend without any never receives a preview: ``_runner`` refuses first
    preview_mechanisms: ClassVar[tuple[str, ...]] = ()
    #: the backend writes the workspace only through a preview (``microvm``): a
    #: writable ``corral run`` creates one, and a plan without one refuses
    writes_through_preview: ClassVar[bool] = False

    def preview_mechanism(self) -> str:
        """The ``mechanism`` a new preview for this backend is created with.

        ``"auto"`` (overlay where it works) when the backend runs overlay views,
        else the one it runs (``boxlite``: ``"copy"``).
        """
        if "overlay" in self.preview_mechanisms or not self.preview_mechanisms:
            return "auto"
        return self.preview_mechanisms[0]

    def problem(self, facts: HostFacts) -> str | None:
        """Why this backend cannot run here (with the fix), or ``None``."""
        raise NotImplementedError

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        """Host paths whose kind (dir/file/missing) ``plan`` needs in ``facts``."""
        del request, policy
        return set()

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        """Backend-specific facts for ``plan`` (tools found, engine state ...).

        Called by :func:`~corral.backends.inspect_host` before ``plan``; may do
        I/O. The values land in ``HostFacts.details`` and must be hashable
        (strings, numbers, tuples, ``None``).
        """
        del request, policy, environ
        return {}

    def plan(self, request: ExecRequest, policy: Policy, facts: HostFacts) -> LaunchPlan:
        """Translate *policy* for *request* into a LaunchPlan. Pure.

        Raises:
            BackendUnavailable: the backend cannot run here.
            EnforcementUnavailable: a rule cannot be enforced and was not
                listed in ``policy.allow_degraded``.
        """
        raise NotImplementedError

    def launch(
        self,
        plan: LaunchPlan,
        request: ExecRequest,
        *,
        cgroup_layout: CgroupLayout | None = None,
        on_start: Callable[[Running], None] | None = None,
        stdio: tuple[int, int, int] | None = None,
        cgroup: Cgroup | None = None,
        streams: tuple[int, int, int] = (0, 1, 2),
    ) -> Outcome:
        """Run *plan* and return the Outcome (default: corral's local process engine).

        *on_start* is called with the running handle once the command has
        been released (for signal forwarding and cancellation). *stdio*
        replaces the command's stdin/stdout/stderr (e.g. a pty). *cgroup* is
        a group prepared ahead (see :class:`corral.pipeline._cgroups.Prestage` and
        :class:`corral.pipeline._launchers.LauncherPool`). *streams* are the fds an
        inherited stdin comes from and streamed output goes to (default this
        process's 0, 1, 2; the corral server passes its client's).
        """
        from ..pipeline._engine import Running

        running = Running(
            plan,
            stdin_mode=request.stdin_mode,
            stdin_data=request.stdin,
            capture=request.capture,
            output_tty=request.output_tty,
            cgroup_layout=cgroup_layout,
            stdio=stdio,
            cgroup=cgroup,
            streams=streams,
        )
        running.start()
        if on_start is not None:
            on_start(running)
        return running.wait()
