"""The ``gvisor`` backend: the command runs on gVisor's user-space kernel (``runsc``).

Each run is ``runsc run`` of a generated OCI bundle: the command's system
calls are served by gVisor's Sentry, not the host kernel, so a kernel
exploit in the command attacks gVisor first (``isolation: "kernel"``).

Guarantees (with the default policy):
  * a read-only root: the host's ``/`` (default) or an image rootfs
    (``image``: ``corral:NAME`` or a rootfs directory); private tmpfs
    ``/tmp`` and ``/var/tmp``; the workspace read-write at its own path (files
    owned by the invoking user, who is the command's uid); secret paths
    masked (empty read-only tmpfs, or ``/dev/null`` for files);
  * a root caller's command over the host's ``/`` runs as uid 65533, not 0
    (root-only host files such as ``/etc/shadow`` are not its): runsc starts
    in a private mount namespace where the writable roots and the homes are
    idmapped clones (``corral-exec --as-user --keep-root``), so the command
    owns root's files there and what it creates is stored as root's;
    ``--allow-degraded isolation`` keeps uid 0. With an ``image`` it stays
    the image's uid 0 (the image's files, not the host's);
  * ``--network=none`` (loopback only) or the host network for ``open``;
  * no host unix sockets (runsc's default ``--host-uds=none``), own pid,
    ipc and uts namespaces, no capabilities, no new privileges;
  * memory, pids and CPU as OCI ``linux.resources``, which runsc applies to
    the cgroup it puts its Sentry and Gofer in (gVisor's own threads count
    against ``pids``: corral adds :data:`PIDS_HEADROOM`); the memory limit
    kills the whole sandbox (exit 137); CPU time as ``RLIMIT_CPU`` inside;
    wall clock and output as everywhere.

Refused unless degraded (``allowDegraded``): ``filesystem.protect`` and glob
``denyWrite`` rules (the write broker needs host seccomp, which gVisor's
syscalls never reach); and, as for the containers, ``network.mode =
"allowlist"`` and ``credentials``.

At a terminal (``corral run`` with stdin, stdout and stderr one terminal) the
plan's ``terminal_argv`` runs a second bundle with ``process.terminal`` and
``--console-socket``: runsc creates the command's pty and hands its master to
the engine, which relays it (:mod:`corral.pipeline._console`).

Known limits of Debian's runsc 20221219: coreutils ``ls``/``stat`` fail
(statx with ``AT_NO_AUTOMOUNT``); runsc garbles a regular file as stdout, so
corral always pipes it; the KVM platform is not used (``ptrace`` here,
``systrap`` on runsc builds from mid-2023 on).
"""

from __future__ import annotations

import os

from .._exceptions import BackendUnavailable, EnforcementUnavailable, UsageError
from ..pipeline._request import STDIN_INHERIT, redact
from ._plan import CONSOLE_SOCKET, FdSpec, LaunchPlan
from .base import (
    Backend,
    Degradations,
    cache_dirs,
    cgroup_limits,
    checked_workspace,
    disk_limit,
    is_under,
    paths_of_policy,
)
from .bubblewrap import ROOT_HOME, ROOT_SANDBOX_ID, SYSTEM_DIRS, sandbox_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..pipeline._cgroups import Cgroup, CgroupLayout
    from ..pipeline._engine import Running
    from ..pipeline._outcome import Outcome
    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._image_ref import ImageRef
    from ._plan import HostFacts

__all__ = ["PIDS_HEADROOM", "GvisorBackend", "oci_spec"]

FD_STATUS = 3

#: Threads of gVisor itself (Sentry, Gofer, ptrace stubs) that count against
#: the cgroup's pids limit on top of the command's own.
PIDS_HEADROOM = 512

PRIVATE_TMP = ("/tmp", "/var/tmp")


def _runsc_version(path: str) -> int:
    """runsc's release date as YYYYMMDD (0 if unknown); cached by the binary's identity."""
    from .. import _state

    st = os.stat(path)
    key = f"runsc:{path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    cached = _state.cache_get(key)
    if isinstance(cached, int):
        return cached
    import subprocess

    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    version = 0
    for word in out.replace("~", " ").replace("-", " ").split():
        digits = word.split(".")[0]
        if len(digits) == 8 and digits.isdigit():
            version = int(digits)
            break
    _state.cache_put(key, version)
    return version


def oci_spec(
    *,
    argv: tuple[str, ...],
    env: tuple[tuple[str, str], ...],
    cwd: str,
    uid: int,
    gid: int,
    root: str,
    mounts: list[dict[str, object]],
    cpu_time: float | None,
    network_namespace: bool = True,
    resources: dict[str, object] | None = None,
    cgroups_path: str = "",
) -> dict[str, object]:
    """The OCI runtime ``config.json`` for one command (pure).

    Without *network_namespace* the sandbox uses the host network
    (``runsc --network=host`` needs that). *resources* are OCI
    ``linux.resources`` (runsc applies them to *cgroups_path*).
    """
    linux: dict[str, object] = {
        "namespaces": [
            {"type": t}
            for t in ("pid", "network", "ipc", "uts", "mount")
            if t != "network" or network_namespace
        ]
    }
    if resources:
        linux["resources"] = resources
        linux["cgroupsPath"] = cgroups_path
    rlimits: list[dict[str, object]] = [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 1024}]
    if cpu_time is not None:
        seconds = max(1, int(cpu_time))
        rlimits.append({"type": "RLIMIT_CPU", "hard": seconds + 1, "soft": seconds})
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": list(argv),
            "env": [f"{name}={value}" for name, value in env],
            "cwd": cwd,
            "capabilities": {
                "bounding": [],
                "effective": [],
                "inheritable": [],
                "permitted": [],
                "ambient": [],
            },
            "noNewPrivileges": True,
            "rlimits": rlimits,
        },
        "root": {"path": root, "readonly": True},
        "hostname": "corral",
        "mounts": mounts,
        "linux": linux,
    }


class GvisorBackend(Backend):
    """gVisor's runsc with a generated OCI bundle; see the module docstring."""

    name = "gvisor"
    isolation = "kernel"
    cost_ms = 250.0

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        from ._container import find_program
        from ._image_ref import resolve_image

        runsc = find_program("runsc", environ) or next(
            (p for p in ("/usr/sbin/runsc", "/usr/local/sbin/runsc") if os.access(p, os.X_OK)), None
        )
        from .. import _state

        return {
            "runsc": runsc,
            "runsc_version": _runsc_version(runsc) if runsc else 0,
            "image": resolve_image(policy.image, environ),
            "state": os.path.join(_state.state_dir(environ), "gvisor"),
        }

    def problem(self, facts: HostFacts) -> str | None:
        if facts.detail("runsc") is None:
            return (
                "runsc (gVisor) is not installed; install it (Debian/Ubuntu: apt-get install runsc)"
            )
        if facts.helper is None:
            return (
                "corral's exec helper (corral-exec) is missing: reinstall corral with a C compiler "
                "available (apt-get install gcc libc6-dev)"
            )
        if facts.uid != 0:
            return "this build runs gVisor as root only (runsc's rootless mode cannot bind the workspace)"
        return None

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        return paths_of_policy(request, policy) | {ROOT_HOME}

    def platform(self, facts: HostFacts) -> str:
        """``systrap`` where runsc has it (mid-2023 on), else ``ptrace``; never KVM by default."""
        version = int(facts.detail("runsc_version", 0))  # type: ignore[call-overload]
        return "systrap" if version >= 20230601 else "ptrace"

    def plan(self, request: ExecRequest, policy: Policy, facts: HostFacts) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the gvisor backend: {problem}")
        import json

        assert facts.helper is not None
        fs, net, res = policy.filesystem, policy.network, policy.resources
        degrade = Degradations(policy.allow_degraded)
        image: ImageRef = facts.detail("image")  # type: ignore[assignment]
        workspace = checked_workspace(fs, facts)
        if image.problem is not None:
            raise UsageError(f"Failed to use the image {image.value!r}: {image.problem}")
        if image.kind in ("ref", "oci") or (image.kind != "host" and image.rootfs is None):
            raise UsageError(
                f"Failed to use the image {image.value!r} with gvisor: it needs a root filesystem "
                "directory or corral:NAME",
                hint="run 'corral image build NAME'",
            )
        root = "/" if image.kind == "host" else str(image.rootfs)
        cwd = request.cwd or workspace
        if net.mode == "allowlist":
            raise EnforcementUnavailable(
                "Failed to enforce network.mode=allowlist on the gvisor backend: the egress proxy is not "
                "available to gVisor in this build",
                rule="network.mode",
                hint="use --net none or --net open",
            )
        if policy.credentials:
            raise EnforcementUnavailable(
                "Failed to enforce credentials on the gvisor backend: scoped credentials need the egress proxy",
                rule="credentials",
                hint="remove the credentials setting",
            )

        writable = [] if fs.read_only else [workspace]
        writable += [p.rstrip("/") or "/" for p in fs.allow_write if facts.kind(p) == "dir"]
        globs = [p for p in fs.deny_write if any(c in p for c in "*?[") or not p.startswith("/")]
        if writable and fs.protect:
            degrade.cannot(
                "filesystem.protect",
                "gVisor's system calls never reach the host seccomp filter "
                "the write broker relies on",
                fix="use --backend bubblewrap or podman",
            )
        if writable and globs:
            degrade.cannot(
                "filesystem.denyWrite",
                "pattern rules need the write broker, which gVisor cannot host",
                fix="use --backend bubblewrap or podman, or name existing paths",
            )

        # --- mounts (in order: later ones cover earlier ones)
        caches = cache_dirs(policy, facts, degrade)
        disk = disk_limit(policy, [*writable, *caches], degrade, self.name)
        sized = [f"size={disk}"] if disk else []
        mounts: list[dict[str, object]] = [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "mode=755"],
            },
        ]
        if disk:  # /dev/shm is writable too: the quota holds there as well
            mounts.append(
                {
                    "destination": "/dev/shm",
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": ["nosuid", "nodev", "mode=1777", *sized],
                }
            )
        for tmp in PRIVATE_TMP:
            mounts.append(
                {
                    "destination": tmp,
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": ["nosuid", "nodev", "mode=1777", *sized],
                }
            )
        mounts.append(
            {
                "destination": workspace,
                "type": "bind",
                "source": workspace,
                "options": ["rbind", "ro" if fs.read_only else "rw"],
            }
        )
        for extra in fs.allow_write:
            if facts.kind(extra) == "dir" and not fs.read_only:
                mounts.append(
                    {
                        "destination": extra,
                        "type": "bind",
                        "source": extra,
                        "options": ["rbind", "rw"],
                    }
                )
        for cache in caches:
            mounts.append(
                {"destination": cache, "type": "bind", "source": cache, "options": ["rbind", "rw"]}
            )
        visible = [workspace, *writable] if image.kind != "host" else ["/"]
        for path in fs.deny_write:
            if (
                path.startswith("/")
                and facts.kind(path) in ("dir", "file")
                and any(is_under(path, v) for v in visible)
            ):
                mounts.append(
                    {
                        "destination": path,
                        "type": "bind",
                        "source": path,
                        "options": ["rbind", "ro"],
                    }
                )
        for secret in sorted(fs.deny_read):
            kind = facts.kind(secret)
            if kind == "missing" or not any(is_under(secret, v) for v in visible):
                continue
            if (
                image.kind == "host"
                and any(is_under(secret, t) for t in PRIVATE_TMP)
                and not any(is_under(secret, w) for w in writable)
            ):
                continue  # already hidden by the private /tmp
            if kind == "dir":
                mounts.append(
                    {
                        "destination": secret,
                        "type": "tmpfs",
                        "source": "tmpfs",
                        "options": ["ro", "nosuid", "nodev", "mode=700"],
                    }
                )
            else:
                mounts.append(
                    {
                        "destination": secret,
                        "type": "bind",
                        "source": "/dev/null",
                        "options": ["rbind", "ro"],
                    }
                )
        if image.kind == "host":
            for carve in fs.allow_read:
                if facts.kind(carve) != "missing":
                    mounts.append(
                        {
                            "destination": carve,
                            "type": "bind",
                            "source": carve,
                            "options": ["rbind", "ro"],
                        }
                    )

        # --- limits: runsc moves its Sentry and Gofer into a cgroup of its own,
        # so they go into the spec (linux.resources), not around the runsc process
        resources: dict[str, object] = {}
        limits = cgroup_limits(res, facts, degrade)
        if limits is not None:
            if limits.memory is not None:
                resources["memory"] = {"limit": limits.memory, "swap": limits.memory}
            if limits.pids is not None:
                resources["pids"] = {"limit": limits.pids + PIDS_HEADROOM}
            if limits.cpus is not None:
                resources["cpu"] = {"quota": int(limits.cpus * 100_000), "period": 100_000}
        env = sandbox_env(request, policy, facts.environ)
        uid, gid = facts.uid, facts.gid
        stage: list[str] = []
        if facts.uid == 0 and image.kind == "host":
            # over the host's /, uid 0 would read root-only files (/etc/shadow)
            if {"isolation", "*"} & policy.allow_degraded:
                degrade.cannot(
                    "isolation",
                    "kept the host's root identity for a root caller",
                    fix="(not refused: allowed by allowDegraded)",
                )
            else:
                uid = gid = ROOT_SANDBOX_ID
                stage = _idmap_stage(facts, [*writable, *caches])
        if disk and uid == 0:
            # runsc ignores size= on the /dev tmpfs, and a read-only /dev refuses even
            # writes to /dev/null there: a command that is uid 0 inside could fill /dev
            degrade.cannot(
                "resources.disk",
                "gVisor's /dev is a tmpfs runsc does not size, writable by the command's uid 0",
                fix="run without an image and without --allow-degraded isolation (the command "
                "is then not uid 0), use --backend bubblewrap, or unset resources.disk",
            )
        spec = oci_spec(
            argv=request.argv,
            env=env,
            cwd=cwd,
            uid=uid,
            gid=gid,
            root=root,
            mounts=mounts,
            cpu_time=res.cpu_time,
            network_namespace=net.mode != "open",
            resources=resources,
            cgroups_path=f"/corral/{request.sandbox_id}",
        )
        state = str(facts.detail("state"))
        bundle = os.path.join(state, "bundles", request.sandbox_id)
        fds = [FdSpec(number=FD_STATUS, kind="status")]
        helper = [facts.helper, "--status-fd", str(FD_STATUS), "--setsid", "--die-with-parent", "0"]
        runsc = [
            str(facts.detail("runsc")),
            "--root",
            os.path.join(state, "runsc"),
            f"--network={'host' if net.mode == 'open' else 'none'}",
            f"--platform={self.platform(facts)}",
            "run",
            "--bundle",
            bundle,
            request.sandbox_id,
        ]
        files = [(os.path.join(bundle, "config.json"), json.dumps(spec, indent=1).encode())]
        terminal_argv: tuple[str, ...] = ()
        if (
            request.output_tty
            and not request.tty
            and not request.capture
            and request.stdin_mode == STDIN_INHERIT
        ):
            # at a terminal (decided at launch): runsc gives the command a pty of its own and
            # sends its master to corral, which relays, caps and digests it (docs/design.md,
            # "Output on a terminal")
            process = spec["process"]
            assert isinstance(process, dict)
            on_terminal = {**spec, "process": {**process, "terminal": True}}
            tty_bundle = f"{bundle}-tty"
            files.append(
                (
                    os.path.join(tty_bundle, "config.json"),
                    json.dumps(on_terminal, indent=1).encode(),
                )
            )
            run = runsc.index("run")
            tty_runsc = [*runsc[:run], "run", "--console-socket", CONSOLE_SOCKET, *runsc[run + 1 :]]
            tty_runsc[tty_runsc.index(bundle)] = tty_bundle
            terminal_argv = (*helper, "--", *stage, *tty_runsc)
        return LaunchPlan(
            backend=self.name,
            sandbox_id=request.sandbox_id,
            argv=(*helper, "--", *stage, *runsc),
            terminal_argv=terminal_argv,
            env=(("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),),
            cwd="/",
            fds=tuple(fds),
            timeout=request.timeout if request.timeout is not None else res.timeout,
            kill_grace=res.kill_grace,
            output_limit=res.output,
            degraded=degrade.recorded,
            display_argv=redact(request.argv),
            files=tuple(files),
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
        """Write the bundle, run runsc, then delete the sandbox's state and the bundle."""
        import shutil

        runsc_argv = plan.argv[len(plan.argv) - plan.argv[::-1].index("--") :]
        root = runsc_argv[runsc_argv.index("--root") + 1]
        for path, data in plan.files:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        if stdio is not None and any(not _is_pipe_or_tty(fd) for fd in stdio[1:]):
            stdio = None  # runsc garbles regular files as stdout: let the engine pipe
        try:
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
            import subprocess

            subprocess.run(
                [runsc_argv[0], "--root", root, "delete", "-force", plan.sandbox_id],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
                timeout=60,
            )
            for path, _data in plan.files:
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _idmap_stage(facts: HostFacts, owned: list[str]) -> list[str]:
    """The exec helper's ``--as-user --keep-root`` stage for a root caller's run over the host's /.

    The command runs as :data:`ROOT_SANDBOX_ID` on gVisor's kernel, which
    takes file ownership from the host: runsc (root) is started in a private
    mount namespace where the writable roots and the homes are idmapped
    clones (root's files appear as that id), as bubblewrap's sandbox sees them.
    """
    assert facts.helper is not None
    stage = [facts.helper, "--as-user", str(ROOT_SANDBOX_ID), "--keep-root"]
    for home in (facts.home, ROOT_HOME):  # read-only inside, but root's 0700 homes stay usable
        if facts.kind(home) == "dir" and home not in SYSTEM_DIRS:
            owned = [*owned, home]
    mapped: list[str] = []
    for path in sorted(set(owned), key=len):
        if not any(is_under(path, p) for p in mapped):
            mapped.append(path)
            stage += ["--idmap", path]
    return [*stage, "--status-fd", str(FD_STATUS), "--"]


def _is_pipe_or_tty(fd: int) -> bool:
    import stat

    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)
