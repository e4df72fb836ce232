"""The policy: what a sandboxed command may do, as frozen, validated data.

A :class:`Policy` is fully resolved: paths are absolute, sizes are bytes,
durations are seconds, and every built-in default has already been merged in
(see :mod:`corral.policy._defaults`). It holds no I/O and imports nothing from
the rest of corral; backends translate it into mechanisms, and the settings
loader (:mod:`corral.policy._settings`) builds it from layered JSON files.

Example::

    from corral.policy import Policy, FilesystemPolicy, ResourceLimits

    policy = Policy.for_workspace("/src/app", home="/home/me").replace(
        resources=ResourceLimits(memory=512 << 20, timeout=30.0),
    )
"""

from __future__ import annotations

from .._frozen import Record

__all__ = [
    "ISOLATION_LEVELS",
    "NETWORK_MODES",
    "Credential",
    "EnvPolicy",
    "FilesystemPolicy",
    "NetworkPolicy",
    "Policy",
    "ResourceLimits",
    "isolation_rank",
]

#: Isolation levels, weakest first. ``none`` is only reachable by choosing the
#: ``none`` backend explicitly; it is never a valid *minimum*.
ISOLATION_LEVELS: tuple[str, ...] = ("none", "process", "namespace", "kernel", "vm")

#: Network modes, tightest first.
NETWORK_MODES: tuple[str, ...] = ("none", "allowlist", "open")


def isolation_rank(level: str) -> int:
    """Return the position of *level* in :data:`ISOLATION_LEVELS` (higher is stronger).

    Raises:
        ValueError: if *level* is not a known isolation level.
    """
    return ISOLATION_LEVELS.index(level)


class FilesystemPolicy(Record):
    """Which paths the sandbox may read and write.

    Attributes:
        workspace: absolute path of the project directory; writable unless
            ``read_only``. Everything else outside the sandbox's private
            TMPDIR is read-only.
        read_only: mount the workspace read-only as well.
        allow_home_workspace: the workspace may be the home directory or a
            directory above it (refused otherwise, when the settings load).
        allow_write: absolute paths writable in addition to the workspace.
        deny_write: path patterns that stay read-only even inside writable
            areas. Absolute patterns name host paths; relative ones are
            relative to the workspace; ``**`` matches any number of
            directories (``**/*.pem``).
        deny_read: absolute paths that are unreadable (hidden) in the sandbox.
        allow_read: absolute paths re-exposed, read-only, beneath a
            ``deny_read`` entry or inside the sandbox's private ``/tmp``.
        protect: workspace-relative patterns of persistence points (shell rc
            files, ``.git/hooks``, agent configs ...) that may not be
            created, modified, renamed or deleted at any depth, whether or not
            they exist when the command starts.
    """

    workspace: str
    read_only: bool = False
    allow_home_workspace: bool = False
    allow_write: tuple[str, ...] = ()
    deny_write: tuple[str, ...] = ()
    deny_read: tuple[str, ...] = ()
    allow_read: tuple[str, ...] = ()
    protect: tuple[str, ...] = ()


class NetworkPolicy(Record):
    """What the sandbox may reach over the network.

    Attributes:
        mode: ``"none"`` (own empty network namespace), ``"allowlist"`` (no
            route out; egress only through corral's proxy to ``allow`` minus
            ``deny``) or ``"open"`` (the host network).
        allow: host patterns for allowlist mode (``host``, ``*.host``,
            ``host:port``, IP literals, CIDRs).
        deny: host patterns refused even when ``allow`` matches.
        allow_unix_sockets: ``True``: let the command create ``AF_UNIX``
            sockets (and so connect to host sockets such as ``docker.sock``
            that it can see); a tuple of absolute paths: only those host
            sockets are reachable (bubblewrap; see docs/egress.md).
            ``socketpair`` works either way.
        allow_requests, deny_requests: request rules (``"METHOD host/path"``
            globs, see :mod:`corral.egress._rules`) for the hosts whose
            traffic the proxy reads: plain HTTP, and HTTPS to hosts it
            terminates TLS for (every host a rule or a masked credential names).
    """

    mode: str = "none"
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    allow_unix_sockets: bool | tuple[str, ...] = False
    allow_requests: tuple[str, ...] = ()
    deny_requests: tuple[str, ...] = ()


class ResourceLimits(Record):
    """Bounds on what the command tree may consume. ``None`` means unbounded.

    Attributes:
        memory: bytes of memory for the whole tree (cgroup).
        pids: number of processes and threads alive at once (cgroup).
        cpus: CPU bandwidth in cores, e.g. ``1.5`` (cgroup).
        cpu_time: CPU seconds per process (``RLIMIT_CPU``).
        timeout: wall-clock seconds before the tree is stopped (exit 124).
        output: bytes of stdout plus stderr kept; the rest is dropped and
            reported.
        kill_grace: seconds between SIGTERM and SIGKILL when stopping the tree.
        disk: bytes the command may store in each private temporary directory
            (``/tmp``, ``/var/tmp``); with a writable workspace, ``allowWrite``
            or ``caches`` it cannot be enforced there and the run is refused
            (see docs/policy-reference.md).
    """

    memory: int | None = None
    pids: int | None = None
    cpus: float | None = None
    cpu_time: float | None = None
    timeout: float | None = None
    output: int | None = None
    kill_grace: float = 2.0
    disk: int | None = None


class EnvPolicy(Record):
    """The command's environment: an allowlist, never the host's whole environment.

    Attributes:
        pass_through: names or globs (``LC_*``) copied from the host environment.
        set: ``(name, value)`` pairs set in the sandbox (after pass-through).
        deny: names or globs never passed, even when ``pass_through`` matches.
    """

    pass_through: tuple[str, ...] = ()
    set: tuple[tuple[str, str], ...] = ()
    deny: tuple[str, ...] = ()


class Credential(Record):
    """A secret injected into the sandbox only for matching commands.

    Attributes:
        name: the environment variable name inside the sandbox.
        source: where the value comes from: ``"env:NAME"`` or ``"file:/path"``.
        commands: command globs (``"npm publish*"``) that receive it.
        hosts: host patterns it is meant for; it is injected only while all of
            them are reachable under the network policy.
        mode: ``"env"`` (plain variable) or ``"mask"`` (the sandbox gets a
            random per-run placeholder; the egress proxy puts the secret in its
            place only in requests to ``hosts``; see docs/egress.md).
        headers: for ``"mask"``: the request headers (lower case) in which the
            proxy replaces the placeholder; ``Authorization`` when empty.
        query: for ``"mask"``: also replace it in the request URL's query
            string (``?access_token=...``).
    """

    name: str
    source: str
    commands: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    mode: str = "env"
    headers: tuple[str, ...] = ()
    query: bool = False


class Policy(Record):
    """The complete, resolved policy for one sandboxed command.

    Attributes:
        backend: ``"auto"`` or a backend name.
        isolation: the minimum isolation level the backend must provide.
        filesystem, network, resources, env: see the respective classes.
        credentials: scoped secrets (see :class:`Credential`).
        caches: ``(name, absolute path)`` persistent cache volumes.
        image: container/VM image reference, OCI layout dir or rootfs dir.
        allow_degraded: rule names (e.g. ``"resources.memory"``) the caller
            accepts to run without when this machine cannot enforce them.
            Each weakening that happens is recorded on the Outcome.
    """

    backend: str = "auto"
    isolation: str = "namespace"
    filesystem: FilesystemPolicy
    network: NetworkPolicy = NetworkPolicy()
    resources: ResourceLimits = ResourceLimits()
    env: EnvPolicy = EnvPolicy()
    credentials: tuple[Credential, ...] = ()
    caches: tuple[tuple[str, str], ...] = ()
    image: str | None = None
    allow_degraded: frozenset[str] = frozenset()

    @classmethod
    def for_workspace(cls, workspace: str, *, home: str) -> Policy:
        """Return the built-in default policy for *workspace*.

        Args:
            workspace: absolute path of the project directory.
            home: the user's home directory; the default secret paths
                (``~/.ssh`` ...) are resolved against it.
        """
        from ._defaults import default_policy

        return default_policy(workspace, home=home)
