"""The ``landlock`` backend: Landlock + seccomp + rlimits, no namespaces needed.

It runs where bubblewrap cannot (inside unprivileged containers, with user
namespaces disabled): the exec helper applies everything in the child right
before ``exec`` - no capabilities, ``no_new_privs``, a Landlock ruleset, the
seccomp deny filter and the write broker's notification filter.

Guarantees (with the default policy):
  * nothing outside the workspace and a private TMPDIR is writable (Landlock);
    protected paths (``filesystem.protect``, ``denyWrite``) are refused at any
    depth, existing or not, through the write broker, exactly as with
    bubblewrap; metadata changes (chmod, chown, utimes, xattrs) that Landlock
    does not govern are refused outside the writable areas by the broker;
  * secret paths (``denyRead``) are unreadable, also for root (Landlock's
    "allow read on every sibling" split, see :mod:`._landlock_rules`);
    ``allowRead`` carve-outs work;
  * no capabilities, even for a root caller; ``no_new_privs``;
  * ``network.mode = "none"``: no IPv4/IPv6/packet sockets (seccomp) and no
    TCP bind/connect (Landlock ABI >= 4); no ``AF_UNIX`` sockets by default;
    abstract unix sockets and signals stay inside the sandbox (ABI >= 6);
  * the seccomp deny filter of bubblewrap (ptrace, mount, namespaces,
    keyrings, bpf, io_uring ...) plus chattr-style ioctls and TIOCSTI;
  * memory, pids and CPU through a cgroup; CPU time, wall clock and output
    as with every backend; the tree is stopped through the cgroup's freezer;
  * the user's other terminals (every other pty of the caller's uid: keys
    typed there, text shown there) neither open for reading nor for writing:
    ``/dev/pts`` is hidden like ``/tmp`` (:data:`HIDDEN_BY_DEFAULT`) and
    granted by no rule. The command keeps the terminal it was given (its
    inherited fds 0-2; ``/dev/tty`` when that is its controlling terminal, as
    in ``corral shell``) and the ptys it creates: ``/dev/ptmx`` opens, and the
    other end is opened by the write broker for a master the command holds
    (``TIOCGPTPEER``, :mod:`._broker_pty`), so ``openpty()``,
    ``os.openpty()``, ``pty.fork()`` and ``script`` work
    (``tests/integration/test_host_terminals.py``);
  * no process the command started outlives the run (its end, timeout,
    cancel, a kept shell's ``--stop``, corral's death), however it detached,
    with or without a cgroup: the exec helper stays its parent outside its
    Landlock domain as a child subreaper and kills the whole tree
    (``--reaper``; docs/threat-model.md). Without a cgroup this needs Landlock
    ABI >= 6 (signal scope, or the command could kill the helper): refused
    there (exit 125; ``--allow-degraded isolation`` records it).

Refused for a root caller (exit 125; ``--allow-degraded isolation`` accepts it):
  * without a user namespace the command would hold the host's uid 0 - no
    capabilities, but the owner of every root-only file (``/etc/shadow``).
    ``auto`` picks bubblewrap instead.

Not expressible here (refused, exit 125, where the policy asks for it):
  * ``network.mode = "allowlist"``: Landlock filters TCP by port, not by
    host, and without a network namespace the proxy could be bypassed;
  * ``credentials`` (they need the egress proxy).

Not guaranteed (no policy key asks for these; ask for ``isolation:
"namespace"`` to get them):
  * host processes stay visible in ``/proc`` (command lines, not memory or
    environment: Landlock blocks ptrace-style access across domains);
  * with Landlock ABI < 6, signals to the user's other processes;
  * the host's ``/tmp`` is hidden (read split) and TMPDIR is a private
    directory ``/tmp/corral-<id>``, but programs that hard-code ``/tmp/x``
    paths get EACCES instead of a private ``/tmp``;
  * listing an ancestor of a hidden path (``ls ~``) fails; entries created in
    such an ancestor after the start are unreadable;
  * SysV IPC and the network are the host's when ``network.mode = "open"``;
  * a pty's ``/dev/pts`` entry does not open by path, even for a pty the
    command created or the terminal it was given: Tcl Expect's ``spawn`` and
    other code that opens ``ptsname()`` (rather than using ``openpty()``),
    or that reopens ``ttyname(0)``, gets EACCES (see the terminals guarantee
    above); ``ls /dev/pts`` and ``ls /dev`` fail (``/dev`` is an ancestor of
    a hidden path, like ``/``);
  * protection from kernel exploits.
"""

from __future__ import annotations

import os
import signal

from .._exceptions import BackendUnavailable, EnforcementUnavailable
from ..pipeline._request import redact
from ._landlock_rules import (
    FS_IOCTL_DEV,
    FS_READ,
    FS_TRUNCATE,
    FS_WRITE_FILE,
    LandlockRule,
    ancestors_to_list,
    encode_spec,
    fs_rights,
    handled_net,
    scoped,
    split_readable,
)
from ._plan import BrokerSpec, FdSpec, LaunchPlan
from .base import (
    Backend,
    Degradations,
    broker_patterns,
    cache_dirs,
    cgroup_limits,
    checked_workspace,
    disk_limit,
    refuse_image,
)
from .bubblewrap import sandbox_env, user_git_configs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import ClassVar

    from ..pipeline._cgroups import Cgroup, CgroupLayout
    from ..pipeline._engine import Running
    from ..pipeline._outcome import Outcome
    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._plan import HostFacts

__all__ = ["DEVICE_RULES", "HIDDEN_BY_DEFAULT", "LandlockBackend", "private_tmp"]

FD_STATUS, FD_LANDLOCK, FD_SECCOMP, FD_NOTIFY_BPF, FD_NOTIFY_SOCK, FD_WAIT = 3, 4, 5, 6, 7, 8
#: The signal that makes the exec helper (``--reaper``) kill the command's whole tree.
REAP_SIGNAL = int(signal.SIGRTMIN)

#: Host directories whose contents stay unreadable (the private-/tmp
#: substitute): (path, reason).
HIDDEN_BY_DEFAULT: tuple[tuple[str, str], ...] = (
    ("/tmp", "other programs' temporary files; the sandbox gets a private TMPDIR instead"),
    ("/var/tmp", "other programs' temporary files"),
    (
        "/dev/pts",
        "the user's other terminals (keys typed there, text shown there); the command keeps "
        "the terminal it was given (fds 0-2, /dev/tty) and opens the ptys it creates through "
        "the broker (TIOCGPTPEER)",
    ),
)

#: Devices the command may open for writing: (path, reason).
DEVICE_RULES: tuple[tuple[str, str], ...] = (
    ("/dev/null", "discarding output"),
    ("/dev/zero", "reading zeros opened read-write (mmap)"),
    ("/dev/full", "tests of full-disk handling"),
    ("/dev/tty", "the command's own controlling terminal"),
    (
        "/dev/ptmx",
        "creating pseudo-terminals (openpty, script, pty tests; the broker opens their other end)",
    ),
)

_CACHE_KEY = "landlock-abi"


def private_tmp(sandbox_id: str) -> str:
    """The host directory that is the sandbox's TMPDIR."""
    return f"/tmp/corral-{sandbox_id}"


def landlock_abi() -> int:
    """The running kernel's Landlock ABI version (0: Landlock unavailable); cached per boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip().decode()
    except OSError:
        boot = ""
    from .. import _state

    key = f"{_CACHE_KEY}:{os.uname().release}:{boot}"
    cached = _state.cache_get(key) if boot else None
    if isinstance(cached, int):
        return cached
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr = {"x86_64": 444, "aarch64": 444}.get(os.uname().machine)
    abi = 0
    if nr is not None:
        value = libc.syscall(ctypes.c_long(nr), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        abi = max(0, int(value))
    if boot:
        _state.cache_put(key, abi)
    return abi


def _list_dir(path: str) -> tuple[tuple[str, str], ...]:
    entries = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                if entry.is_symlink():
                    kind = "symlink"
                elif entry.is_dir(follow_symlinks=False):
                    kind = "dir"
                elif entry.is_file(follow_symlinks=False):
                    kind = "file"
                else:
                    kind = "other"
                entries.append((entry.name, kind))
    except OSError:
        return ()
    return tuple(sorted(entries))


class LandlockBackend(Backend):
    """Landlock + seccomp + rlimits in the child; see the module docstring."""

    name = "landlock"
    isolation = "process"
    cost_ms = 2.0
    uses_broker = True
    not_expressible: ClassVar[dict[str, str]] = {
        "host processes": "no pid namespace: host processes stay visible in /proc (their memory and "
        "environment do not: Landlock blocks ptrace-style access)",
    }

    def problem(self, facts: HostFacts) -> str | None:
        if facts.helper is None:
            return (
                "corral's exec helper (corral-exec) is missing: reinstall corral with a C compiler "
                "available (apt-get install gcc libc6-dev)"
            )
        if facts.arch not in ("x86_64", "aarch64"):
            return f"seccomp rules exist for x86_64 and aarch64 only, not {facts.arch}"
        if facts.landlock_abi < 1:
            return (
                "Landlock is not enabled in this kernel: it needs Linux 5.13 or newer built with "
                "CONFIG_SECURITY_LANDLOCK and 'landlock' in the lsm= boot parameter"
            )
        if facts.broker_problem is not None:
            return (
                f"the write broker cannot run here ({facts.broker_problem}); without it metadata "
                "changes outside the workspace cannot be confined"
            )
        return None

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        fs = policy.filesystem
        paths = {fs.workspace, *fs.allow_write, *fs.deny_read, *fs.allow_read}
        paths.update(path for _name, path in policy.caches)
        if request.cwd:
            paths.add(request.cwd)
        return paths

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        fs = policy.filesystem
        hidden = (*fs.deny_read, *(p for p, _ in HIDDEN_BY_DEFAULT))
        dirs = ancestors_to_list("/", hidden)
        for root in (fs.workspace, *fs.allow_write):
            dirs |= ancestors_to_list(root, tuple(fs.deny_read))
        return {"listings": tuple(sorted((d, _list_dir(d)) for d in dirs))}

    def plan(self, request: ExecRequest, policy: Policy, facts: HostFacts) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the landlock backend: {problem}")
        assert facts.helper is not None
        from ._seccomp import compile_filter
        from ._seccomp_rules import (
            BROKER_RULES,
            DENY_RULES,
            INET_SOCKET_RULES,
            METADATA_BROKER_RULES,
            PROCESS_LEVEL_DENY_RULES,
            PTY_PEER_BROKER_RULES,
            SYSCALLS,
            unix_socket_rule,
        )

        fs, net, res = policy.filesystem, policy.network, policy.resources
        degrade = Degradations(policy.allow_degraded)
        if facts.uid == 0:
            # no user namespace: the command would be the host's uid 0 (without
            # capabilities), the owner of /etc/shadow and every other root-only file
            degrade.cannot(
                "isolation",
                "a root caller's command would keep the host's root identity on the landlock "
                "backend (root-only files such as /etc/shadow stay readable)",
                fix="use --backend bubblewrap, or run corral as a non-root user",
            )
        refuse_image(policy, degrade, self.name)
        disk_limit(policy, ["its TMPDIR (a host directory)"], degrade, self.name)
        abi = facts.landlock_abi
        workspace = checked_workspace(fs, facts, allow_write=True)
        cwd = request.cwd or workspace

        # --- network: what a process-level sandbox can and cannot express
        if net.mode == "allowlist":
            raise EnforcementUnavailable(
                "Failed to enforce network.mode=allowlist on the landlock backend: Landlock filters TCP "
                "by port, not by host, and without a network namespace the egress proxy could be bypassed",
                rule="network.mode",
                hint="use a namespace backend (--backend bubblewrap), or --net none / --net open",
            )
        if policy.credentials:
            raise EnforcementUnavailable(
                "Failed to enforce credentials on the landlock backend: scoped credentials need the "
                "egress proxy",
                rule="credentials",
                hint="remove the credentials setting",
            )

        # --- Landlock: read everywhere except hidden paths; write nowhere directly
        read, write = fs_rights(abi)
        listings: dict[str, tuple[tuple[str, str], ...]] = dict(facts.detail("listings", ()))  # type: ignore[call-overload]
        hidden = (*fs.deny_read, *(p for p, _ in HIDDEN_BY_DEFAULT))
        tmp = private_tmp(request.sandbox_id)
        rules: list[LandlockRule] = split_readable("/", hidden, listings, "readable system")
        writable = [] if fs.read_only else [workspace]
        writable += [p.rstrip("/") or "/" for p in fs.allow_write if facts.kind(p) == "dir"]
        for area in dict.fromkeys([workspace, *writable]):
            rules += split_readable(
                area,
                tuple(fs.deny_read),
                listings,
                "the workspace" if area == workspace else "filesystem.allowWrite",
            )
        for carve in fs.allow_read:
            if facts.kind(carve) != "missing":
                rules.append(LandlockRule("path", FS_READ, "filesystem.allowRead", path=carve))
        caches = cache_dirs(policy, facts, degrade)
        rules.append(LandlockRule("path", read | write, "the private TMPDIR", path=tmp))
        for path in caches:
            rules.append(LandlockRule("path", read | write, "caches", path=path))
        device_access = FS_WRITE_FILE | FS_READ | (FS_TRUNCATE & write) | (FS_IOCTL_DEV & write)
        for path, reason in DEVICE_RULES:
            rules.append(LandlockRule("path", device_access, reason, path=path))
        net_handled = handled_net(abi) if net.mode == "none" else 0
        spec = encode_spec(
            handled_fs=read | write, handled_net=net_handled, scoped=scoped(abi), rules=rules
        )
        if len(spec) > 60_000:
            raise EnforcementUnavailable(
                "Failed to enforce filesystem.denyRead on the landlock backend: hiding those paths needs "
                f"{len(rules)} Landlock rules (a directory beside them has too many entries)",
                rule="filesystem.denyRead",
                hint="use --backend bubblewrap, or hide fewer paths",
            )

        # --- the write broker: protected paths at any depth, metadata confinement
        patterns = broker_patterns(fs, writable)
        column = 0 if facts.arch == "x86_64" else 1
        broker_rules = (*BROKER_RULES, *METADATA_BROKER_RULES, *PTY_PEER_BROKER_RULES)
        names = sorted(
            {
                (nr, name)
                for rule in broker_rules
                for name in rule[0]
                if (nr := SYSCALLS[name][column]) is not None
            }
        )
        open_roots = (tmp, *caches)
        broker = BrokerSpec(
            roots=tuple((w, w) for w in dict.fromkeys([*writable, *open_roots])),
            patterns=tuple(patterns),
            syscall_names=tuple(names),
            open_roots=open_roots,
            confine_metadata=True,
            git_configs=user_git_configs(facts),
        )

        # --- seccomp
        deny_rules = (*DENY_RULES, *PROCESS_LEVEL_DENY_RULES)
        if net.allow_unix_sockets is not True:  # a list of sockets is refused before the plan
            deny_rules = (*deny_rules, unix_socket_rule())
        if net.mode == "none":
            deny_rules = (*deny_rules, *INET_SOCKET_RULES)

        # --- limits, and the end of every process the command started
        cgroup = cgroup_limits(res, facts, degrade)
        if cgroup is None and abi < 6:
            degrade.cannot(
                "isolation",
                "without a cgroup, only the exec helper ends what the command started, and with "
                f"Landlock ABI {abi} (< 6, Linux 6.12) the command could kill it and leave "
                "detached (setsid) processes running after the run",
                fix="set a resources.memory or resources.pids limit (a cgroup), or use "
                "--backend bubblewrap",
            )

        fds = [
            FdSpec(number=FD_STATUS, kind="status"),
            FdSpec(number=FD_LANDLOCK, kind="data", data=spec),
            FdSpec(
                number=FD_SECCOMP,
                kind="data",
                data=compile_filter(deny_rules, arch=facts.arch, deny_unknown=True),
            ),
            FdSpec(
                number=FD_NOTIFY_BPF,
                kind="data",
                data=compile_filter(broker_rules, arch=facts.arch, deny_unknown=False),
            ),
            FdSpec(number=FD_NOTIFY_SOCK, kind="notify-sock"),
        ]
        helper = [
            facts.helper,
            "--status-fd",
            str(FD_STATUS),
            "--setsid",
            "--die-with-parent",
            "0",
            "--chdir",
            cwd,
            "--drop-caps",
            "--reaper",
            str(REAP_SIGNAL),
            "--landlock-fd",
            str(FD_LANDLOCK),
            "--seccomp-fd",
            str(FD_SECCOMP),
            "--notify-fd",
            str(FD_NOTIFY_BPF),
            "--notify-sock",
            str(FD_NOTIFY_SOCK),
        ]
        if cgroup is not None:
            helper += ["--wait-fd", str(FD_WAIT)]
            fds.append(FdSpec(number=FD_WAIT, kind="block"))
        if res.cpu_time is not None:
            seconds = max(1, int(res.cpu_time))
            helper += ["--rlimit", f"cpu={seconds}:{seconds + 1}"]
        if request.tty:
            helper.append("--ctty")
        env = dict(sandbox_env(request, policy, facts.environ))
        env["TMPDIR"] = tmp
        return LaunchPlan(
            backend=self.name,
            sandbox_id=request.sandbox_id,
            argv=(*helper, "--", *request.argv),
            env=tuple(env.items()),
            cwd=cwd,
            fds=tuple(fds),
            broker=broker,
            cgroup=cgroup,
            timeout=request.timeout if request.timeout is not None else res.timeout,
            kill_grace=res.kill_grace,
            output_limit=res.output,
            degraded=degrade.recorded,
            display_argv=redact(request.argv),
            reaper=REAP_SIGNAL,
        )

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
        """Create the private TMPDIR (and cache dirs), run, then remove the TMPDIR."""
        tmp = private_tmp(plan.sandbox_id)
        os.mkdir(tmp, 0o700)
        try:
            if plan.broker is not None:
                for path in plan.broker.open_roots:
                    if path != tmp:
                        os.makedirs(path, mode=0o700, exist_ok=True)
            return super().launch(
                plan,
                request,
                cgroup_layout=cgroup_layout,
                on_start=on_start,
                stdio=stdio,
                cgroup=cgroup,
                streams=streams,
            )
        finally:
            _remove_tree(tmp)


def _remove_tree(path: str) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return
    except OSError:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
