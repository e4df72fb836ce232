"""OCI containers through an engine CLI: what podman and docker share.

A run is ``ENGINE run --rm`` with ``--network=none`` (or the host network for
``open``; for ``allowlist``, where the engine can join a namespace by path,
a namespace the engine creates with corral's proxy in it: see
:meth:`ContainerBackend.egress_problem`), ``--cap-drop=ALL``,
``--security-opt=no-new-privileges``, a ``--read-only`` root with private tmpfs ``/tmp`` and ``/var/tmp``, the
limits as ``--memory``/``--pids-limit``/``--cpus``, the workspace mounted at
its own absolute path, the host uid/gid (``--user``) so that files created in
the workspace belong to the invoking user, and the environment passed as an
env file on a file descriptor (never on the command line).

Engines that can pass file descriptors into a container (podman:
``--preserve-fds``) also get corral's exec helper bind-mounted read-only at
``/dev/.corral-exec``: it installs corral's seccomp deny filter and the write
broker's notification filter inside the container, so protected paths are
refused at any depth exactly as with bubblewrap. Engines that cannot (docker)
still run every process under the helper and its deny filter (bound in as a
file, the helper as the entrypoint), but refuse the broker's rules unless the
caller allows degrading them.

Sessions (:class:`ContainerSession`): ``ENGINE run -d`` once with an init
process, then ``ENGINE exec`` per command, ``ENGINE rm -f`` on close.
"""

from __future__ import annotations

import os

from .._exceptions import BackendUnavailable, EnforcementUnavailable, LaunchFailed, UsageError
from ..pipeline._request import STDIN_INHERIT, redact
from ._egress import egress_spec, injected_credentials
from ._plan import BrokerSpec, EgressSpec, FdSpec, LaunchPlan
from .base import (
    Backend,
    Degradations,
    broker_patterns,
    checked_workspace,
    disk_limit,
    is_under,
    paths_of_policy,
)
from .bubblewrap import SANDBOX_HELPER, command_env, user_git_configs

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

__all__ = ["ContainerBackend", "ContainerSession", "container_name"]

FD_STATUS, FD_SECCOMP, FD_NOTIFY_BPF, FD_NOTIFY_SOCK, FD_ENV = 3, 4, 5, 6, 9

#: Where an engine that cannot pass fds (docker) finds corral's deny filter:
#: the compiled program, bound read-only from corral's state dir.
SANDBOX_FILTER = "/dev/.corral-seccomp"

#: Directories that get a private, empty tmpfs in every container.
PRIVATE_TMP = ("/tmp", "/var/tmp")

#: The size of the /dev tmpfs podman and docker give a container (corral cannot set it).
CONTAINER_DEV_SIZE = 64 << 20

#: The engine CLI's own environment: only what it needs (never the sandbox's).
_ENGINE_ENV = (
    "PATH",
    "HOME",
    "XDG_RUNTIME_DIR",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "CONTAINER_HOST",
)


def container_name(sandbox_id: str) -> str:
    """The engine-side name of the sandbox's container."""
    return f"corral-{sandbox_id}"


def write_filter_files(plan: LaunchPlan) -> None:
    """Write the plan's content-addressed filter programs that are not on disk yet.

    Each name is the hash of its content, so an existing file is the same
    program; a new one appears whole (written aside, then renamed).
    """
    for path, data in plan.files:
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        scratch = f"{path}.{os.getpid()}.tmp"
        with open(scratch, "wb") as f:
            f.write(data)
        os.chmod(scratch, 0o644)
        os.replace(scratch, path)


def engine_directory(facts: HostFacts) -> str:
    """Where the engine CLI runs: corral's private ``engine`` directory in the state directory.

    Never the caller's directory (often the workspace): conmon, podman's
    monitor, writes an ``oom`` file into its working directory when the
    container is OOM-killed.
    """
    return str(facts.detail("engine_dir") or "/")


def make_engine_directory(path: str) -> None:
    """Create :func:`engine_directory` (0700) if it does not exist."""
    if path != "/":
        os.makedirs(path, mode=0o700, exist_ok=True)


def find_program(name: str, environ: dict[str, str]) -> str | None:
    """*name* resolved once on the absolute entries of ``PATH``."""
    for directory in environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":"):
        if not directory.startswith("/"):
            continue
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


class ContainerBackend(Backend):
    """Base of the podman and docker backends (designed for extension)."""

    isolation = "namespace"
    #: the engine passes fds into containers (the helper and the broker work)
    passes_fds = False
    #: the CLI program
    program = ""
    #: extra options of ``rm -f`` (podman: no stop timeout)
    rm_options: tuple[str, ...] = ()

    # ------------------------------------------------------------ facts
    def engine_env(self, facts: HostFacts) -> dict[str, str]:
        """The environment the engine CLI runs with."""
        host = dict(facts.environ)
        env = {name: host[name] for name in _ENGINE_ENV if name in host}
        env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        return env

    def engine_problem(self, environ: dict[str, str]) -> str | None:
        """Why the engine cannot run containers here (checked in ``inspect``), or None."""
        raise NotImplementedError

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        from ._image_ref import DEFAULT_CONTAINER_IMAGE, resolve_image

        engine = find_program(self.program, environ)
        details: dict[str, object] = {
            "engine": engine,
            "image": resolve_image(policy.image or DEFAULT_CONTAINER_IMAGE, environ),
            "image_is_default": policy.image is None,
        }
        details["engine_problem"] = self.engine_problem(environ) if engine is not None else None
        from .. import _state

        # the engine CLI's working directory: conmon writes an "oom" file into it
        details["engine_dir"] = os.path.join(_state.state_dir(environ), "engine")
        if not self.passes_fds:
            details["filters"] = os.path.join(_state.state_dir(environ), "filters")
        return details

    def problem(self, facts: HostFacts) -> str | None:
        if facts.detail("engine") is None:
            return self.missing_engine_hint()
        engine_problem = facts.detail("engine_problem")
        if engine_problem:
            return str(engine_problem)
        if facts.helper is None:
            return (
                "corral's exec helper (corral-exec) is missing: reinstall corral with a C compiler "
                "available (apt-get install gcc libc6-dev)"
            )
        return None

    def missing_engine_hint(self) -> str:
        """The message when the engine's CLI is not installed."""
        raise NotImplementedError

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        return paths_of_policy(request, policy, allow_read=False)

    # ------------------------------------------------------------ engine specifics
    def run_options(self, facts: HostFacts) -> list[str]:
        """Engine-specific ``run`` options (rootless user namespace, config ...)."""
        del facts
        return []

    def egress_problem(self, facts: HostFacts, *, detached: bool) -> str | None:
        """Why the egress proxy (allowlist mode, credentials) is unavailable here, or None.

        The default: the engine cannot join a network namespace corral
        prepares, so the proxy has nowhere to listen.
        """
        del facts, detached
        return (
            f"{self.name} cannot join a network namespace corral prepares, so the egress "
            "proxy has nowhere to listen"
        )

    def network_option(self, mode: str) -> str:
        """The engine's network option for ``network.mode`` *mode*."""
        if mode == "open":
            return "--network=host"
        return "--network=none"

    def tmpfs(self, path: str, *, read_only: bool = False, size: int | None = None) -> list[str]:
        """Options mounting an empty tmpfs at *path* (of *size* bytes when given)."""
        extra = f",size={size}" if size else ""
        return ["--tmpfs", f"{path}:{'ro' if read_only else 'rw'},nosuid,nodev{extra}"]

    def cache_volume(self, name: str, path: str) -> list[str]:
        """Options mounting the named cache volume at *path*."""
        return ["-v", f"corral-cache-{name}:{path}"]

    def image_options(self, image: ImageRef) -> list[str]:
        """The image argument(s) for *image*.

        Raises:
            UsageError: the image kind cannot be used by this engine.
        """
        if image.engine_ref is None:
            raise UsageError(
                f"Failed to use the image {image.value!r} with {self.name}: "
                "give a registry reference or corral:NAME"
            )
        return [image.engine_ref]

    # ------------------------------------------------------------ plan
    def plan(self, request: ExecRequest, policy: Policy, facts: HostFacts) -> LaunchPlan:
        plan = self._plan(request, policy, facts, session=None)
        if (
            request.output_tty
            and not request.tty
            and not request.capture
            and request.stdin_mode == STDIN_INHERIT
        ):
            # at a terminal (decided at launch) the engine gives the command a pty of its own
            # (-i -t); its output - stdout and stderr merged by the engine - still reaches
            # corral, which relays, caps and digests it (docs/design.md, "Output on a terminal")
            on_terminal = self._plan(
                request.replace(tty=True, output_tty=False), policy, facts, session=None
            )
            plan = plan.replace(terminal_argv=on_terminal.argv)
        return plan

    def plan_exec(
        self, request: ExecRequest, policy: Policy, facts: HostFacts, container: str
    ) -> LaunchPlan:
        """The plan of one command in the running session container *container*."""
        return self._plan(request, policy, facts, session=container)

    def plan_session(self, policy: Policy, facts: HostFacts, sandbox_id: str) -> tuple[str, ...]:
        """The argv that creates a session container (``run -d`` with an init and ``sleep``)."""
        from ..pipeline._request import ExecRequest

        request = ExecRequest.from_argv(
            ["sleep", "infinity"], cwd=policy.filesystem.workspace, sandbox_id=sandbox_id
        )
        plan = self._plan(request, policy, facts, session=None, detached=True)
        return plan.argv

    def _plan(
        self,
        request: ExecRequest,
        policy: Policy,
        facts: HostFacts,
        *,
        session: str | None,
        detached: bool = False,
    ) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(
                f"Failed to use the {self.name} backend: {problem}",
                hint="run 'corral doctor' to see what works here",
            )
        engine = str(facts.detail("engine"))
        image: ImageRef = facts.detail("image")  # type: ignore[assignment]
        fs, net, res = policy.filesystem, policy.network, policy.resources
        degrade = Degradations(policy.allow_degraded)
        workspace = checked_workspace(fs, facts)
        if image.problem is not None and facts.detail("image_is_default"):
            # not caller misuse when `auto` merely considered this backend: it cannot run here as
            # configured, so the next candidate is tried
            raise BackendUnavailable(
                f"Failed to choose an image for the {self.name} backend: the 'image' setting is "
                f"empty and the default image {image.value} is not built yet",
                hint=f"run 'corral image build {str(image.value).partition(':')[2]}' once (a few "
                "minutes, from apt); then this command runs as it is",
            )
        if image.problem is not None:
            raise UsageError(f"Failed to use the image {image.value!r}: {image.problem}")
        cwd = request.cwd or workspace

        # --- network: allowlist joins a namespace corral makes, the proxy listening inside
        egress: EgressSpec | None = None
        if net.mode == "allowlist" or policy.credentials:
            rule = "network.mode" if net.mode == "allowlist" else "credentials"
            why = self.egress_problem(facts, detached=detached)
            if why is not None:
                raise EnforcementUnavailable(
                    f"Failed to enforce {rule} on the {self.name} backend: {why}",
                    rule=rule,
                    hint="use --backend bubblewrap, or --net none / --net open",
                )
        if net.mode == "allowlist":
            egress = egress_spec(policy, facts, backend=self.name).replace(netns="fresh")
        credentials = injected_credentials(request, policy, facts)

        # --- protected paths: the broker through the helper, or refuse
        writable = [] if fs.read_only else [workspace]
        writable += [p.rstrip("/") or "/" for p in fs.allow_write if facts.kind(p) == "dir"]
        patterns = broker_patterns(fs, writable)
        use_broker = bool(patterns and writable) and self.passes_fds
        if patterns and writable and not self.passes_fds:
            # without the broker, mounts still enforce the denyRead masks and the
            # write-denied paths that exist (read-only volumes below); the rest is refused
            denied_mounts = {
                p.rstrip("/") or "/"
                for p in fs.deny_write
                if p.startswith("/")
                and not any(c in p for c in "*?[")
                and facts.kind(p) in ("dir", "file")
            }
            for rule in sorted(
                {
                    label.partition(":")[0]
                    for p, label in patterns
                    if not label.startswith("filesystem.denyRead")
                    and p.removesuffix("/**") not in denied_mounts
                }
            ):
                degrade.cannot(
                    rule,
                    f"{self.name} cannot pass corral's write broker into the container",
                    fix="use --backend podman or bubblewrap",
                )
        if use_broker and facts.broker_problem is not None:
            degrade.cannot(
                "filesystem.protect",
                f"the write broker cannot run here ({facts.broker_problem})",
                fix="use Linux 5.14 or newer",
            )
            use_broker = False

        # --- limits (the engine's own cgroups)
        if facts.uid != 0 and facts.cgroup_problem is not None:
            for rule, value in (
                ("resources.memory", res.memory),
                ("resources.pids", res.pids),
                ("resources.cpus", res.cpus),
            ):
                if value is not None:
                    degrade.cannot(
                        rule,
                        f"rootless {self.name} cannot set cgroup limits here "
                        f"({facts.cgroup_problem})",
                        fix=f"unset {rule}",
                    )

        # --- environment: an env file on a descriptor, never argv
        lines = []
        for var, env_value in command_env(request, policy, facts.environ, egress, credentials):
            if "\n" in env_value or "\0" in env_value:
                raise UsageError(
                    f"Failed to pass the environment variable {var} to {self.name}: its value "
                    "contains a newline (container env files cannot carry it)"
                )
            lines.append(f"{var}={env_value}\n")
        env_file = "".join(lines).encode()

        # --- argv
        cname = session or container_name(request.sandbox_id)
        args: list[str] = [engine]
        fds = [FdSpec(number=FD_ENV, kind="data", data=env_file)]
        stdin_opts = ["-i"] if request.stdin_mode != "null" else []
        if request.tty:
            stdin_opts.append("-t")
        if session is not None:
            args += [
                "exec",
                *stdin_opts,
                "--user",
                f"{facts.uid}:{facts.gid}",
                "--workdir",
                cwd,
                "--env-file",
                f"/dev/fd/{FD_ENV}",
            ]
        else:
            args += [
                "run",
                "--rm" if not detached else "-d",
                "--name",
                cname,
                "--label",
                f"corral.sandbox={request.sandbox_id}",
                *([] if detached else stdin_opts),
                *self.run_options(facts),
                self.network_option(net.mode),
                "--cap-drop=ALL",
                "--security-opt=no-new-privileges",
                "--hostname",
                "corral",
                "--read-only",
                "--user",
                f"{facts.uid}:{facts.gid}",
                "--workdir",
                cwd,
                "--env-file",
                f"/dev/fd/{FD_ENV}",
            ]
            volumes = [f"the cache volume corral-cache-{name}" for name, _path in policy.caches]
            disk = disk_limit(policy, [*writable, *volumes], degrade, self.name)
            if disk and disk < CONTAINER_DEV_SIZE and facts.uid == 0:
                # the engine's own /dev tmpfs is writable by the container's uid 0
                degrade.cannot(
                    "resources.disk",
                    f"{self.name}'s /dev is its own 64 MiB tmpfs, writable by the command's "
                    "uid 0, so a smaller quota would not hold there",
                    fix="set resources.disk to 64M or more, run as a non-root user, or use "
                    "--backend bubblewrap",
                )
            for tmp in PRIVATE_TMP:
                # before the binds: a workspace under /tmp is mounted over it
                args += self.tmpfs(tmp, size=disk)
            if disk:  # /dev/shm is writable too (64 MiB unless told)
                args += ["--shm-size", str(disk)]
            if res.memory is not None:
                args += ["--memory", str(res.memory), "--memory-swap", str(res.memory)]
            if res.pids is not None:
                args += ["--pids-limit", str(res.pids)]
            if res.cpus is not None:
                args += ["--cpus", f"{res.cpus:g}"]
            if res.cpu_time is not None and not self.passes_fds:
                seconds = max(1, int(res.cpu_time))
                args += ["--ulimit", f"cpu={seconds}:{seconds + 1}"]
            ws_mode = "ro" if (fs.read_only or use_broker) else "rw"
            args += ["-v", f"{workspace}:{workspace}:{ws_mode}"]
            for extra in writable[1:] if not fs.read_only else writable:
                args += ["-v", f"{extra}:{extra}:{'ro' if use_broker else 'rw'}"]
            mounted = [workspace, *writable]
            for path in fs.deny_write:
                if (
                    path.startswith("/")
                    and facts.kind(path) in ("dir", "file")
                    and any(is_under(path, m) for m in mounted)
                ):
                    args += ["-v", f"{path}:{path}:ro"]
            for secret in sorted(fs.deny_read):
                if not any(is_under(secret, m) for m in mounted):
                    continue  # not visible in the container at all
                kind = facts.kind(secret)
                if kind == "dir":
                    args += self.tmpfs(secret, read_only=True)
                elif kind != "missing":
                    args += ["-v", f"/dev/null:{secret}:ro"]
            for name, path in policy.caches:
                args += self.cache_volume(name, path)
            args += ["-v", f"{facts.helper}:{SANDBOX_HELPER}:ro"]
        broker = None
        from ._seccomp import compile_filter
        from ._seccomp_rules import BROKER_RULES, DENY_RULES, SYSCALLS, unix_socket_rule

        # a list of sockets is refused before the plan (check_unix_sockets): fail closed
        unix = net.allow_unix_sockets is True
        deny_rules = DENY_RULES if unix else (*DENY_RULES, unix_socket_rule())
        files: tuple[tuple[str, bytes], ...] = ()
        if not self.passes_fds:
            # every process runs under corral's filter: the helper, bound in with
            # the program as a file, is the entrypoint - pid 1 in --init mode (not
            # dumpable; forks the command once the filter is installed), or the
            # session's --hold init - and each `docker exec` starts under it too
            program = compile_filter(deny_rules, arch=facts.arch, deny_unknown=True)
            import hashlib

            digest = hashlib.sha256(program).hexdigest()[:32]
            filters = facts.detail("filters")
            if not isinstance(filters, str):
                raise BackendUnavailable(
                    f"Failed to use the {self.name} backend: no directory for corral's "
                    "seccomp filter files was inspected"
                )
            host_filter = os.path.join(filters, f"{digest}.bpf")
            files = ((host_filter, program),)
            if session is None:
                args += ["-v", f"{host_filter}:{SANDBOX_FILTER}:ro"]
                args += ["--entrypoint", SANDBOX_HELPER]
            if detached:
                command = ["--hold"]
            elif session is not None:
                command = [SANDBOX_HELPER, "--seccomp-file", SANDBOX_FILTER, "--", *request.argv]
            else:
                # on a terminal the command must keep docker's pty as its controlling
                # terminal, so it is pid 1 itself (under the filter all the same)
                init = [] if request.tty else ["--init"]
                command = [*init, "--seccomp-file", SANDBOX_FILTER, "--", *request.argv]
        else:
            fds += [
                FdSpec(number=FD_STATUS, kind="status"),
                FdSpec(
                    number=FD_SECCOMP,
                    kind="data",
                    data=compile_filter(deny_rules, arch=facts.arch, deny_unknown=True),
                ),
            ]
            helper = [
                SANDBOX_HELPER,
                "--status-fd",
                str(FD_STATUS),
                "--seccomp-fd",
                str(FD_SECCOMP),
            ]
            preserved = 2
            if use_broker:
                column = 0 if facts.arch == "x86_64" else 1
                names = sorted(
                    (nr, name)
                    for rule in BROKER_RULES
                    for name in rule[0]
                    if (nr := SYSCALLS[name][column]) is not None
                )
                broker = BrokerSpec(
                    roots=tuple((w, w) for w in writable),
                    patterns=tuple(patterns),
                    syscall_names=tuple(names),
                    git_configs=user_git_configs(facts),
                )
                fds += [
                    FdSpec(
                        number=FD_NOTIFY_BPF,
                        kind="data",
                        data=compile_filter(BROKER_RULES, arch=facts.arch, deny_unknown=False),
                    ),
                    FdSpec(number=FD_NOTIFY_SOCK, kind="notify-sock"),
                ]
                helper += ["--notify-fd", str(FD_NOTIFY_BPF), "--notify-sock", str(FD_NOTIFY_SOCK)]
                preserved = 4
            if res.cpu_time is not None:
                seconds = max(1, int(res.cpu_time))
                helper += ["--rlimit", f"cpu={seconds}:{seconds + 1}"]
            if request.tty:
                helper.append("--ctty")
            if not detached:
                args += ["--preserve-fds", str(preserved)]
                command = [*helper, "--", *request.argv]
            else:
                # the session's pid 1: corral's helper, not dumpable (see --hold in native/exec/init.c)
                command = [SANDBOX_HELPER, "--hold"]
        if session is not None:
            args.append(cname)
        else:
            args += self.image_options(image)
        args += command
        timeout = request.timeout if request.timeout is not None else res.timeout
        return LaunchPlan(
            backend=self.name,
            sandbox_id=request.sandbox_id,
            argv=tuple(args),
            env=tuple(self.engine_env(facts).items()),
            cwd=engine_directory(facts),
            fds=tuple(fds),
            broker=broker,
            timeout=timeout,
            kill_grace=res.kill_grace,
            output_limit=res.output,
            degraded=degrade.recorded,
            display_argv=redact(request.argv, [value for _name, value in credentials]),
            egress=egress,
            credentials=tuple(name for name, _value in credentials),
            files=files,
        )

    # ------------------------------------------------------------ launch
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
        """Run the engine CLI; remove the container if the CLI was stopped before it."""
        if cgroup is not None:
            cgroup.remove()  # the engine applies the limits in its own cgroups
        write_filter_files(plan)
        make_engine_directory(plan.cwd)
        try:
            outcome = super().launch(
                plan,
                request,
                cgroup_layout=None,
                on_start=on_start,
                stdio=stdio,
                streams=streams,
            )
        except BaseException:
            self.remove_container(plan, container_name(plan.sandbox_id))
            raise
        if outcome.timed_out or outcome.signal is not None:
            self.remove_container(plan, container_name(plan.sandbox_id))
        return outcome

    def remove_container(self, plan: LaunchPlan, name: str) -> None:
        """Force-remove *name* (no error if it is already gone)."""
        import subprocess

        subprocess.run(
            [plan.argv[0], "rm", "-f", *self.rm_options, name],
            env=dict(plan.env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=60,
        )

    # ------------------------------------------------------------ sessions
    def open_session(self, policy: Policy, facts: HostFacts, sandbox_id: str) -> ContainerSession:
        """Create the session container and return the session (``close()`` removes it)."""
        return ContainerSession(self, policy, facts, sandbox_id)


class ContainerSession:
    """A container created once and used for many commands.

    Example::

        session = backend.open_session(policy, facts, new_sandbox_id())
        try:
            outcome = session.exec(ExecRequest.from_argv(["pytest", "-q"]))
        finally:
            session.close()

    Limits (memory, pids, CPU) bound the whole session. A command that times
    out is stopped with everything else running in the session at that
    moment (the init process stays).
    """

    def __init__(
        self, backend: ContainerBackend, policy: Policy, facts: HostFacts, sandbox_id: str
    ) -> None:
        import subprocess

        self.backend = backend
        self.policy = policy
        self.facts = facts
        self.sandbox_id = sandbox_id
        self.name = container_name(sandbox_id)
        self.closed = False
        argv = backend.plan_session(policy, facts, sandbox_id)
        env = backend.engine_env(facts)
        from ..pipeline._request import ExecRequest

        env_plan = backend.plan(
            ExecRequest.from_argv(["true"], sandbox_id=sandbox_id), policy, facts
        )
        env_data = next(f.data for f in env_plan.fds if f.number == FD_ENV)
        write_filter_files(env_plan)  # the session's plan binds the same filter
        read_fd, write_fd = os.pipe()
        os.write(write_fd, env_data)
        os.close(write_fd)
        argv = tuple(f"/dev/fd/{read_fd}" if word == f"/dev/fd/{FD_ENV}" else word for word in argv)
        directory = engine_directory(facts)
        make_engine_directory(directory)
        try:
            result = subprocess.run(
                list(argv),
                env=env,
                cwd=directory,  # conmon, which lives as long as the container, writes there
                capture_output=True,
                text=True,
                check=False,
                pass_fds=(read_fd,),
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(read_fd)
        if result.returncode != 0:
            raise LaunchFailed(
                f"Failed to create the {backend.name} session container: "
                f"{result.stderr.strip()[-400:]}"
            )
        inspect = subprocess.run(
            [argv[0], "inspect", "-f", "{{.State.Pid}}", self.name],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            self.init_pid = int(inspect.stdout.strip())
        except ValueError:
            self.close()
            raise LaunchFailed(
                f"Failed to find the session container's init: {inspect.stderr.strip()}"
            ) from None

    def exec(self, request: ExecRequest) -> Outcome:
        """Run *request* in the session and return its Outcome.

        Raises:
            SessionClosed: the session was closed.
        """
        from .._exceptions import SessionClosed
        from ..pipeline._engine import Running

        if self.closed:
            raise SessionClosed(f"Failed to run in session {self.sandbox_id}: it is closed")
        plan = self.backend.plan_exec(request, self.policy, self.facts, self.name)
        running = Running(
            plan, stdin_mode=request.stdin_mode, stdin_data=request.stdin, capture=request.capture
        )
        running.start()
        outcome = running.wait()
        if outcome.timed_out or outcome.signal is not None:
            self._stop_commands()
        return outcome.replace(sandbox_id=self.sandbox_id)

    def _stop_commands(self) -> None:
        """SIGKILL every process of the session except its init (corral's ``--hold``)."""
        from ..pipeline._engine_control import _pids_in_pidns_of

        keep = {self.init_pid}
        for pid in _pids_in_pidns_of(self.init_pid):
            if pid not in keep:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        """Remove the container (idempotent)."""
        if self.closed:
            return
        self.closed = True
        import subprocess

        subprocess.run(
            [str(self.facts.detail("engine")), "rm", "-f", *self.backend.rm_options, self.name],
            env=self.backend.engine_env(self.facts),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=60,
        )

    def __enter__(self) -> ContainerSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
