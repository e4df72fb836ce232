"""LaunchPlan and its parts: pure, comparable data between ``plan`` and ``launch``.

``Backend.plan(request, policy, facts)`` turns a policy into a plan without
side effects; ``Backend.launch(plan)`` carries it out. Unit tests compare whole
plans, and ``corral explain``/``corral policy --plan`` prints them.

:class:`HostFacts` is the snapshot of the machine a plan depends on (which
binaries exist, which policy paths exist and what they are), gathered once
by :func:`corral.backends.inspect_host` so that ``plan`` itself stays pure.
"""

from __future__ import annotations

from .._frozen import Record

__all__ = [
    "CONSOLE_SOCKET",
    "NETNS_PATH",
    "BrokerSpec",
    "CgroupSpec",
    "EgressSpec",
    "FdSpec",
    "HostFacts",
    "LaunchPlan",
    "PreviewSpec",
]


class FdSpec(Record):
    """A file descriptor the launched program receives.

    Attributes:
        number: the fd number in the child.
        kind: ``"data"`` (a pipe carrying ``data``, e.g. a BPF program),
            ``"status"`` (the exec helper's status pipe), ``"notify-sock"``
            (the socket the broker's seccomp listener arrives on), ``"info"``
            (bubblewrap's ``--info-fd``), ``"block"`` (bubblewrap's
            ``--block-fd``: the command starts when corral writes to it),
            ``"control"`` (a resident session's socket to its init, ``--serve``)
            or ``"pass"`` (an fd the backend's ``launch`` opened, its number in
            ``data``: the microvm backend's connection to a booted guest).
        data: the bytes for ``"data"`` fds.
    """

    number: int
    kind: str
    data: bytes = b""


class BrokerSpec(Record):
    """What the write broker supervises (see :mod:`corral.backends._broker`).

    Attributes:
        roots: ``(path inside the sandbox, path on the host)`` of each
            supervised root; both are mounted so the same directory is
            read-only inside and writable for the broker.
        patterns: ``(pattern, rule label)``: relative patterns apply to the
            path relative to its root, absolute ones to the sandbox path.
        syscall_names: ``(number, name)`` of the trapped syscalls for this
            architecture.
        open_roots: sandbox paths of roots the patterns do not apply to
            (e.g. the landlock backend's private TMPDIR): the broker only
            performs operations there.
        confine_metadata: refuse metadata changes (chmod, chown, utimes,
            xattrs, truncate, also through file descriptors) outside the
            supervised roots instead of letting the kernel decide. For
            backends without a read-only mount as backstop (``landlock``:
            Landlock does not govern metadata).
        launcher_ns: the host paths of ``roots`` are resolved in the mount
            namespace of the launched process (``/proc/<pid>/root``), not
            corral's: a preview's overlay is mounted there (see
            :class:`PreviewSpec`).
        idmapped_id: the unprivileged host uid/gid a root caller's sandbox
            runs as, whose files are root's on disk (idmapped mounts, see
            docs/design.md "Never the host's root identity"): the broker
            stores an owner the sandbox names as that id as 0.
        through_idmap: the roots are reached through idmapped layers (a root
            caller's overlay preview: overlayfs over idmapped clones, where
            root's files appear as ``idmapped_id``): the broker acts with
            fsuid/fsgid ``idmapped_id`` (stored as 0 by the layers) and keeps
            the owners the sandbox names as they are.
        unix_sockets: host paths of the sockets ``network.allowUnixSockets``
            names: the broker performs every ``connect()`` of the sandbox and
            allows a pathname unix socket only when it resolves, in the
            sandbox's view, to one of these inodes (empty: connect() is not
            trapped).
        git_configs: the caller's global git configs (``~/.gitconfig``, the XDG
            one, or ``GIT_CONFIG_GLOBAL``): the ``core.hooksPath`` and
            ``core.fsmonitor`` targets they name inside a root are protected
            (see :func:`user_git_configs`).
    """

    roots: tuple[tuple[str, str], ...]
    patterns: tuple[tuple[str, str], ...]
    syscall_names: tuple[tuple[int, str], ...] = ()
    open_roots: tuple[str, ...] = ()
    confine_metadata: bool = False
    launcher_ns: bool = False
    idmapped_id: int | None = None
    through_idmap: bool = False
    git_configs: tuple[str, ...] = ()
    unix_sockets: tuple[str, ...] = ()


class EgressSpec(Record):
    """Egress through corral's proxy (``network.mode = "allowlist"``).

    Attributes:
        allow, deny: host patterns (see :mod:`corral.egress`).
        port: the loopback port the proxy listens on inside the sandbox.
        token: the per-sandbox proxy credential (in the proxy URL).
        hosts_file: a hosts(5) file that replaces DNS for the proxy
            (``CORRAL_EGRESS_HOSTS``), or ``None`` for the system resolver.
        allow_requests, deny_requests: request rules (``network.*Requests``).
        masks: the masked credentials (:class:`corral.egress._rules.MaskSpec`
            fields as ``(name, placeholder, secret, hosts, headers, query)``).
        ca: the per-run CA ``(certificate PEM, key PEM)`` for terminated
            tunnels (empty without rules and masks). The key stays in corral.
        forwards: ``(port, rule)`` of the host's loopback services that
            ``network.allow`` names (``localhost:PORT``, ``127.0.0.1:PORT``):
            the proxy listens on ``127.0.0.1:PORT`` inside the sandbox too and
            relays each connection to the host's ``127.0.0.1:PORT``.
        upstream_ca: a PEM file that replaces the system trust store when
            the proxy verifies terminated hosts (``CORRAL_EGRESS_UPSTREAM_CA``).
        netns: where the proxy listens. ``"sandbox"``: in the network
            namespace of the sandbox's first process, once it exists
            (bubblewrap's ``--unshare-net``). ``"fresh"``: in a namespace the
            engine creates before the spawn; every :data:`NETNS_PATH` in the
            plan's argv is replaced by the path that names it (podman's
            ``--network=ns:PATH``). ``"unix"``: on the host, on a unix socket
            at *socket* (the micro-VM's qemu forwards the guest's connections
            to it; *forwards* are not served).
        socket: the unix socket's path for ``netns = "unix"`` (its directory
            exists and is private to corral; the engine binds it before the
            spawn and removes it afterwards).
    """

    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    port: int = 3128
    token: str = ""
    hosts_file: str | None = None
    allow_requests: tuple[str, ...] = ()
    deny_requests: tuple[str, ...] = ()
    masks: tuple[tuple[str, str, str, tuple[str, ...], tuple[str, ...], bool], ...] = ()
    ca: tuple[bytes, bytes] | tuple[()] = ()
    upstream_ca: str | None = None
    forwards: tuple[tuple[int, str], ...] = ()
    netns: str = "sandbox"
    socket: str = ""

    def __repr__(self) -> str:  # the token, the secrets and the CA key never print
        return (
            f"EgressSpec(allow={self.allow!r}, deny={self.deny!r}, port={self.port}, "
            f"rules={len(self.allow_requests) + len(self.deny_requests)}, "
            f"masks={[m[0] for m in self.masks]!r}, forwards={self.forwards!r}, "
            f"netns={self.netns!r})"
        )


#: In a plan's argv: the path of the network namespace the engine creates
#: for an ``EgressSpec(netns="fresh")`` (see :class:`EgressSpec`).
NETNS_PATH = "@corral-netns@"

#: In a plan's ``terminal_argv``: the path of the unix socket on which the
#: engine receives the command's pty master (runsc's ``--console-socket``). The
#: engine listens on it in a private directory of its own, relays the master to
#: the user's terminal and removes both when the run ends
#: (:mod:`corral.pipeline._console`).
CONSOLE_SOCKET = "@corral-console@"


class CgroupSpec(Record):
    """Limits enforced through a cgroup created for the run (None: not set)."""

    memory: int | None = None
    pids: int | None = None
    cpus: float | None = None


class PreviewSpec(Record):
    """Run against a preview: a copy-on-write view of the workspace (``corral preview``).

    Attributes:
        id: the preview's id (``pv-...``).
        mechanism: ``"overlay"`` (kernel overlayfs mounted by the exec helper
            before bubblewrap), ``"fuse-overlayfs"`` (the same with a
            fuse-overlayfs daemon) or ``"copy"`` (a full copy of the
            workspace bound at the workspace's path).
        workspace: the real workspace (the read-only lower layer).
        upper, work: the overlay's upper and work directories.
        tree: the copy (``"copy"`` only).
        fuse_binary: absolute path of fuse-overlayfs (``"fuse-overlayfs"`` only).
        hidden: corral's preview directory, hidden from the sandbox.
    """

    id: str
    mechanism: str
    workspace: str
    upper: str = ""
    work: str = ""
    tree: str = ""
    fuse_binary: str = ""
    hidden: str = ""


class HostFacts(Record):
    """What ``plan`` needs to know about the machine (gathered by ``inspect_host``).

    Attributes:
        uid, gid: the invoking user's ids.
        home: the invoking user's home directory.
        arch: machine name (``x86_64``, ``aarch64``).
        bwrap: absolute path of the bubblewrap binary, or ``None``.
        bwrap_version: its version as a tuple, e.g. ``(0, 8, 0)``.
        helper: absolute path of corral's exec helper, or ``None``.
        broker_problem: why the write broker cannot run here, or ``None``.
        cgroup_problem: why cgroup limits cannot be enforced here, or ``None``.
        landlock_abi: the kernel's Landlock ABI version (0: none).
        path_kinds: ``(path, kind)`` for the paths the policy names, kind one
            of ``"dir"``, ``"file"``, ``"socket"``, ``"other"``, ``"missing"``.
        environ: the host environment (the policy's allowlist picks from it).
        details: backend-specific facts gathered by ``Backend.inspect`` (tool
            paths, engine state, directory listings), as ``(name, value)``.
        egress_token: a fresh random secret for the egress proxy's URL, drawn
            by ``inspect_host`` in allowlist mode so that ``plan`` stays pure.
        credential_files: ``("file:/path", contents)`` of the credential
            files this command receives (read by ``inspect_host``).
        egress_ca: a fresh per-run CA ``(certificate PEM, key PEM)`` when the
            proxy terminates TLS (request rules, masked credentials), else ``()``.
        trust_bundle: ``(path, contents)``: the host's CA bundle with that CA
            appended, mounted over the same path in the sandbox, else ``()``.
    """

    uid: int
    gid: int
    home: str
    arch: str
    bwrap: str | None = None
    bwrap_version: tuple[int, ...] = ()
    helper: str | None = None
    broker_problem: str | None = None
    cgroup_problem: str | None = None
    landlock_abi: int = 0
    path_kinds: tuple[tuple[str, str], ...] = ()
    environ: tuple[tuple[str, str], ...] = ()
    details: tuple[tuple[str, object], ...] = ()

    def detail(self, name: str, default: object = None) -> object:
        """The backend-specific fact *name* (see ``Backend.inspect``), or *default*."""
        for known, value in self.details:
            if known == name:
                return value
        return default

    egress_token: str = ""
    credential_files: tuple[tuple[str, str], ...] = ()
    egress_ca: tuple[bytes, bytes] | tuple[()] = ()
    trust_bundle: tuple[str, bytes] | tuple[()] = ()

    def kind(self, path: str) -> str:
        """The kind recorded for *path* (``"missing"`` when not inspected)."""
        for known, kind in self.path_kinds:
            if known == path:
                return kind
        return "missing"


class LaunchPlan(Record):
    """Everything needed to start one sandboxed command.

    Attributes:
        backend: the backend name.
        sandbox_id: the sandbox's id.
        argv: the full argv to spawn; ``argv[0]`` is an absolute path.
        env: the exact environment of the spawned program.
        cwd: host directory to spawn in. The engine honours it for the
            container engines' CLIs (their helpers write there: conmon's
            ``oom`` file); other first processes (bubblewrap, the exec
            helper, which changes directory itself) do not depend on it and
            start in the caller's directory.
        fds: extra fds the child receives.
        broker: the write broker's configuration, or ``None``.
        cgroup: cgroup limits, or ``None``.
        egress: the egress proxy's configuration, or ``None``.
        timeout: wall-clock seconds, or ``None``.
        kill_grace: seconds between SIGTERM and SIGKILL on timeout.
        output_limit: bytes of output kept, or ``None``.
        degraded: rules not enforced on this run (opted in by the caller).
        display_argv: the command as recorded in the audit log (redacted).
        unsandboxed: the plan runs the command without isolation.
        files: ``(path, content)`` files the backend's ``launch`` writes
            before spawning (e.g. an OCI bundle's ``config.json``) and
            removes afterwards; the engine itself ignores them.
        credentials: names (never values) of the credentials injected.
        terminal_argv: the argv to spawn instead of *argv* when the command's
            stdin, stdout and stderr are all one terminal (``corral run`` at a
            terminal on podman/docker: the engine's ``-i -t``; on gVisor, runsc
            with ``process.terminal`` and ``--console-socket``
            :data:`CONSOLE_SOCKET`); empty: *argv* always.
        reaper: the signal that makes the exec helper's ``--reaper`` kill
            every process the command started and exit (0: no reaper). The
            engine sends it instead of SIGKILLing the helper, which would
            orphan what left the command's process group.
    """

    backend: str
    sandbox_id: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    fds: tuple[FdSpec, ...] = ()
    broker: BrokerSpec | None = None
    cgroup: CgroupSpec | None = None
    egress: EgressSpec | None = None
    timeout: float | None = None
    kill_grace: float = 2.0
    output_limit: int | None = None
    degraded: tuple[str, ...] = ()
    display_argv: tuple[str, ...] = ()
    unsandboxed: bool = False
    files: tuple[tuple[str, bytes], ...] = ()
    credentials: tuple[str, ...] = ()
    terminal_argv: tuple[str, ...] = ()
    reaper: int = 0

    def fd(self, kind: str) -> FdSpec | None:
        """The first fd of *kind*, or ``None``."""
        for spec in self.fds:
            if spec.kind == kind:
                return spec
        return None
