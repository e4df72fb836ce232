"""The ``docker`` backend: OCI containers through the Docker engine (CLI).

Guarantees (with the default policy, where it is accepted): own network,
pid, ipc, uts and mount namespaces; no capabilities; no new privileges;
Docker's default seccomp profile; read-only image root; private tmpfs /tmp;
the workspace at its own path with files owned by the invoking user
(``--user``); memory, pids and CPU limits in Docker's cgroups; and corral's
own seccomp deny filter (AF_UNIX sockets included) in every process: the
Docker daemon cannot pass file descriptors into a container, so corral's
exec helper is bound in read-only with the compiled filter as a file
(content-addressed, in corral's state dir) and is the entrypoint - pid 1 in
``--init`` mode (not dumpable; it forks the command once the filter is
installed; a command on a terminal is pid 1 itself, filtered), and a
session's ``--hold`` init whose ``docker exec`` commands start under the
helper too. Docker's own init (``--init``) is not used.

Refused unless the caller allows degrading them (``allowDegraded``), because
the write broker's listener cannot come back out of the container:

* ``filesystem.protect`` and glob ``filesystem.denyWrite`` rules (protected
  paths at any depth): use podman or bubblewrap;

and always refused: ``network.mode = "allowlist"`` and ``credentials``
(docker cannot start a container in a network namespace corral prepares,
so the egress proxy has nowhere to listen; rootful podman can).

Host requirements: a running Docker engine (``DOCKER_HOST`` or
``/var/run/docker.sock``); images come from ``corral image build`` (imported
as ``localhost/corral-NAME``) or a registry.
"""

from __future__ import annotations

import os

from ._container import ContainerBackend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._image_ref import ImageRef
    from ._plan import HostFacts

__all__ = ["DockerBackend", "docker_socket"]


def docker_socket(environ: dict[str, str]) -> str | None:
    """The unix socket path of the Docker engine the CLI would use, if it is a unix socket."""
    host = environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        return host[len("unix://") :]
    return None


class DockerBackend(ContainerBackend):
    """OCI containers through Docker; see the module docstring."""

    name = "docker"
    cost_ms = 200.0
    passes_fds = False
    program = "docker"

    def missing_engine_hint(self) -> str:
        return "docker is not installed; install it (Debian/Ubuntu: apt-get install docker.io)"

    def engine_problem(self, environ: dict[str, str]) -> str | None:
        path = docker_socket(environ)
        if path is None:
            return None  # a TCP/SSH engine: the smoke run decides
        import _socket

        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(2.0)
            sock.connect(path)
        except OSError as exc:
            return (
                f"the Docker engine is not running ({path}: {os.strerror(exc.errno or 0)}); start it "
                "(systemctl start docker, or dockerd with iptables and the bridge off) or set DOCKER_HOST"
            )
        finally:
            sock.close()
        return None

    def run_options(self, facts: HostFacts) -> list[str]:
        image: ImageRef = facts.detail("image")  # type: ignore[assignment]
        return [
            "--log-driver=none",
            "--ipc=private",
            *(["--pull=never"] if image.kind == "corral" else []),
        ]
