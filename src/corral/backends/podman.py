"""The ``podman`` backend: OCI containers through the podman CLI.

Guarantees (with the default policy): everything of :mod:`._container`
(own network, pid, ipc, uts and mount namespaces; no capabilities; no new
privileges; read-only image root; private tmpfs /tmp; the workspace at its
own path; files created there owned by the invoking user; memory, pids and
CPU limits in podman's cgroups), plus, through corral's exec helper inside
the container (``--preserve-fds``): corral's seccomp deny filter, no
``AF_UNIX`` sockets by default, and protected paths refused at any depth by
the write broker.

Egress (``network.mode = "allowlist"``, scoped ``credentials``), as root:
the engine creates an empty network namespace with corral's proxy already
listening on its loopback, and podman starts the container in it
(``--network=ns:/proc/<corral>/fd/<n>``); the proxy environment and the
credentials that apply go into the env file. Rootless podman cannot join a
namespace corral creates, and sessions keep no proxy: both refuse.

Not guaranteed: protection from kernel exploits.

Host requirements: podman 4. On hosts where podman's defaults fail (a hard
``nofile`` limit below 1048576 without CAP_SYS_RESOURCE, or crun on a hybrid
cgroup layout), corral runs podman with its own ``containers.conf``: low
``default_ulimits`` and runtime ``runc`` when installed.
"""

from __future__ import annotations

import os

from ._container import ContainerBackend
from ._plan import NETNS_PATH

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy
    from ._image_ref import ImageRef
    from ._plan import HostFacts

__all__ = ["PodmanBackend", "podman_config"]


def podman_config(environ: dict[str, str]) -> str:
    """Write (if needed) and return corral's ``containers.conf`` for podman.

    ``default_ulimits`` stay below this process's hard limits, so the runtime
    never needs CAP_SYS_RESOURCE to apply them.
    """
    import resource

    from .. import _state

    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = min(1024 * 1024, nofile_hard if nofile_hard != resource.RLIM_INFINITY else 1024 * 1024)
    nproc = min(32768, nproc_hard if nproc_hard != resource.RLIM_INFINITY else 32768)
    runtime = (
        "runc"
        if any(
            os.access(os.path.join(d, "runc"), os.X_OK)
            for d in ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")
        )
        else ""
    )
    text = (
        "# Written by corral for its podman runs; see corral/backends/podman.py.\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={min(1024, nofile)}:{nofile}", "nproc={min(1024, nproc)}:{nproc}"]\n'
        "[engine]\n"
        + (f'runtime = "{runtime}"\n' if runtime else "")
        + 'cgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
    )
    directory = _state.ensure_dir(os.path.join(_state.state_dir(environ), "podman"))
    path = os.path.join(directory, "containers.conf")
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return path
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return path


class PodmanBackend(ContainerBackend):
    """OCI containers through podman; see the module docstring."""

    name = "podman"
    cost_ms = 150.0
    passes_fds = True
    uses_broker = True
    program = "podman"
    rm_options = ("-t", "0")

    def missing_engine_hint(self) -> str:
        return "podman is not installed; install it (Debian/Ubuntu: apt-get install podman runc)"

    def engine_problem(self, environ: dict[str, str]) -> str | None:
        # podman is daemonless: an installed CLI is a working engine; the
        # doctor's smoke run catches the rest.
        del environ
        return None

    def inspect(
        self, request: ExecRequest, policy: Policy, environ: dict[str, str]
    ) -> dict[str, object]:
        details = super().inspect(request, policy, environ)
        details["containers_conf"] = podman_config(environ) if details["engine"] else None
        return details

    def engine_env(self, facts: HostFacts) -> dict[str, str]:
        env = super().engine_env(facts)
        conf = facts.detail("containers_conf")
        if conf:
            env["CONTAINERS_CONF"] = str(conf)
        return env

    def egress_problem(self, facts: HostFacts, *, detached: bool) -> str | None:
        if facts.uid != 0:
            return (
                "rootless podman cannot join a network namespace corral creates (it is owned "
                "by another user namespace than podman's)"
            )
        if detached:
            return "sessions keep no egress proxy (one-shot runs do)"
        return None

    def network_option(self, mode: str) -> str:
        if mode == "allowlist":
            # a namespace the engine creates, the proxy already listening inside
            return f"--network=ns:{NETNS_PATH}"
        return super().network_option(mode)

    def run_options(self, facts: HostFacts) -> list[str]:
        options = ["--read-only-tmpfs=false", "--log-driver=none", "--ipc=private"]
        image: ImageRef = facts.detail("image")  # type: ignore[assignment]
        if image.kind == "corral":
            options.append("--pull=never")
        if facts.uid != 0:
            options.append(
                "--userns=keep-id"
            )  # rootless: the user's uid inside is the user's uid outside
        return options

    def tmpfs(self, path: str, *, read_only: bool = False, size: int | None = None) -> list[str]:
        # notmpcopyup: never copy the image's (or host's) files into the tmpfs
        extra = f",size={size}" if size else ""
        mode = "ro" if read_only else "rw"
        return ["--tmpfs", f"{path}:{mode},nosuid,nodev,notmpcopyup{extra}"]

    def cache_volume(self, name: str, path: str) -> list[str]:
        return ["-v", f"corral-cache-{name}:{path}:U"]  # U: owned by the container user

    def image_options(self, image: ImageRef) -> list[str]:
        if image.kind == "oci":
            return [f"oci:{image.oci_layout}"]
        if image.kind == "rootfs":
            return ["--rootfs", f"{image.rootfs}:O"]  # overlay: the directory stays untouched
        return super().image_options(image)
