"""The ``seatbelt`` backend (macOS): ``/usr/bin/sandbox-exec`` with a generated profile.

Guarantees (on macOS): a deny-by-default Seatbelt profile generated from the
policy (:mod:`._sbpl`): the system readable except ``denyRead`` paths
(``allowRead`` re-exposes); writes only to the workspace, ``allowWrite`` and a
private TMPDIR; protected paths and glob ``denyWrite`` rules refused at any
depth by path regexes, their ancestors protected from rename and removal; no
network (``none``) or the host network (``open``); signals to its own
processes only. Untrusted strings reach the profile only as ``-D``
parameters. ``sandbox-exec`` is run by absolute path.

Not expressible (refused): ``network.mode = "allowlist"`` (no egress proxy in
this build), ``credentials``; memory/pids/CPU limits (macOS has no cgroups:
refused unless degraded); host processes stay visible (no pid namespace).

Here (Linux) the backend reports itself unavailable; the profile generator is
unit-tested on every platform, and a test runs a generated profile through
``sandbox-exec`` on macOS.
"""

from __future__ import annotations

import sys

from .._exceptions import BackendUnavailable, EnforcementUnavailable
from ..pipeline._request import redact
from ._plan import LaunchPlan
from ._sbpl import build_profile
from .base import Backend, Degradations, cache_dirs, disk_limit, refuse_image
from .bubblewrap import sandbox_env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import ClassVar

    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._plan import HostFacts

__all__ = ["SANDBOX_EXEC", "SeatbeltBackend"]

#: By absolute path, never looked up on PATH: a sandboxed or hostile PATH
#: could otherwise put its own "sandbox-exec" first.
SANDBOX_EXEC = "/usr/bin/sandbox-exec"


class SeatbeltBackend(Backend):
    """macOS Seatbelt; see the module docstring."""

    name = "seatbelt"
    isolation = "process"
    cost_ms = 3.0
    not_expressible: ClassVar[dict[str, str]] = {
        "host processes": "no pid namespace on macOS: other processes stay visible",
        "limits": "macOS has no cgroups: memory, pids and CPU limits are refused",
    }

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        import os

        return {"platform": sys.platform, "sandbox_exec": os.access(SANDBOX_EXEC, os.X_OK)}

    def problem(self, facts: HostFacts) -> str | None:
        if facts.detail("platform") != "darwin":
            return f"Seatbelt exists on macOS only (this is {facts.detail('platform')})"
        if not facts.detail("sandbox_exec"):
            return f"{SANDBOX_EXEC} is missing"
        return None

    def paths_to_inspect(self, request: ExecRequest, policy: Policy) -> set[str]:
        del request
        return {path for _name, path in policy.caches}  # cache_dirs needs their kind

    def plan(self, request: ExecRequest, policy: Policy, facts: HostFacts) -> LaunchPlan:
        problem = self.problem(facts)
        if problem is not None:
            raise BackendUnavailable(f"Failed to use the seatbelt backend: {problem}")
        return self.plan_profile(request, policy, facts)

    def plan_profile(self, request: ExecRequest, policy: Policy, facts: HostFacts) -> LaunchPlan:
        """The plan without the platform check (pure; the unit tests use it on Linux)."""
        fs, net, res = policy.filesystem, policy.network, policy.resources
        degrade = Degradations(policy.allow_degraded)
        refuse_image(policy, degrade, self.name)
        disk_limit(policy, ["its TMPDIR (a host directory)"], degrade, self.name)
        if net.mode == "allowlist":
            raise EnforcementUnavailable(
                "Failed to enforce network.mode=allowlist on the seatbelt backend: the egress proxy is not "
                "available in this build",
                rule="network.mode",
                hint="use --net none or --net open",
            )
        if policy.credentials:
            raise EnforcementUnavailable(
                "Failed to enforce credentials on the seatbelt backend: they need the egress proxy",
                rule="credentials",
                hint="remove the credentials setting",
            )
        for rule, value in (
            ("resources.memory", res.memory),
            ("resources.pids", res.pids),
            ("resources.cpus", res.cpus),
        ):
            if value is not None:
                degrade.cannot(rule, "macOS has no cgroups", fix=f"unset {rule}")
        tmpdir = f"/private/tmp/corral-{request.sandbox_id}"
        profile = build_profile(
            workspace=fs.workspace,
            tmpdir=tmpdir,
            read_only=fs.read_only,
            allow_write=(*fs.allow_write, *cache_dirs(policy, facts, degrade)),
            deny_read=fs.deny_read,
            allow_read=fs.allow_read,
            protect=fs.protect,
            deny_write=fs.deny_write,
            network_mode=net.mode,
        )
        env = dict(sandbox_env(request, policy, facts.environ))
        env["TMPDIR"] = tmpdir
        return LaunchPlan(
            backend=self.name,
            sandbox_id=request.sandbox_id,
            argv=(SANDBOX_EXEC, *profile.argv(), *request.argv),
            env=tuple(env.items()),
            cwd=request.cwd or fs.workspace,
            timeout=request.timeout if request.timeout is not None else res.timeout,
            kill_grace=res.kill_grace,
            output_limit=res.output,
            degraded=degrade.recorded,
            display_argv=redact(request.argv),
        )
