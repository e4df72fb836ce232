"""The ``none`` backend: no isolation at all, for comparison and explicit opt-out.

Guarantees: only what corral does outside the sandbox - the environment
allowlist, the wall-clock timeout, the output cap, cgroup limits where
available, and killing whatever the command leaves behind when it exits.

Not guaranteed: everything else. The command sees and can change the whole
filesystem, network and process table with the user's rights. ``auto`` never
picks this backend, and every Outcome it produces has ``unsandboxed=True``.
"""

from __future__ import annotations

from .._exceptions import BackendUnavailable
from ..pipeline._request import redact
from ._egress import injected_credentials
from ._plan import FdSpec, LaunchPlan
from .base import Backend, Degradations, cgroup_limits
from .bubblewrap import sandbox_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar

    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._plan import HostFacts

__all__ = ["UnsandboxedBackend"]

FD_STATUS, FD_WAIT = 3, 4


class UnsandboxedBackend(Backend):
    """Plain process under corral's supervision; never chosen by ``auto``."""

    name = "none"
    isolation = "none"
    cost_ms = 1.0
    explicit_only = True
    not_expressible: ClassVar[dict[str, str]] = dict.fromkeys(
        (
            "fs write outside",
            "secret read",
            "secret glob",
            "protected path",
            "network egress",
            "host processes",
            "unix socket",
        ),
        "no sandbox: the command runs with the user's full rights",
    )

    def problem(self, facts: HostFacts) -> str | None:
        if facts.helper is None:
            return (
                "corral's exec helper (corral-exec) is missing: reinstall corral with a C compiler"
            )
        return None

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        return {policy.filesystem.workspace, *([request.cwd] if request.cwd else [])}

    def plan(self, request: ExecRequest, policy: Policy, facts: HostFacts) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the none backend: {problem}")
        assert facts.helper is not None
        res = policy.resources
        degrade = Degradations(policy.allow_degraded)
        cgroup = cgroup_limits(res, facts, degrade)
        credentials = injected_credentials(request, policy, facts)
        cwd = request.cwd or policy.filesystem.workspace
        helper = [
            facts.helper,
            "--status-fd",
            str(FD_STATUS),
            "--setsid",
            "--die-with-parent",
            "0",
            "--chdir",
            cwd,
        ]
        fds = [FdSpec(number=FD_STATUS, kind="status")]
        if cgroup is not None:
            helper += ["--wait-fd", str(FD_WAIT)]
            fds.append(FdSpec(number=FD_WAIT, kind="block"))
        if res.cpu_time is not None:
            seconds = max(1, int(res.cpu_time))
            helper += ["--rlimit", f"cpu={seconds}:{seconds + 1}"]
        if request.tty:
            helper.append("--ctty")
        env = sandbox_env(request, policy, facts.environ)
        if request.tmp_dir is not None:  # no mounts here: point TMPDIR at the session's directory
            env = tuple((n, request.tmp_dir if n == "TMPDIR" else v) for n, v in env)
        return LaunchPlan(
            backend=self.name,
            sandbox_id=request.sandbox_id,
            argv=(*helper, "--", *request.argv),
            env=(*env, *credentials),
            cwd=cwd,
            fds=tuple(fds),
            cgroup=cgroup,
            timeout=request.timeout if request.timeout is not None else res.timeout,
            kill_grace=res.kill_grace,
            output_limit=res.output,
            degraded=degrade.recorded,
            display_argv=redact(request.argv, [value for _name, value in credentials]),
            unsandboxed=True,
            credentials=tuple(name for name, _value in credentials),
        )
