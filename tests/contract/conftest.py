"""Which backends work on this machine (probed once), for the contract suite."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Iterator

import pytest


def _available() -> dict[str, str | None]:
    """backend -> None if usable here, else why not."""
    from corral.backends import BACKENDS, get_backend, inspect_host
    from corral.pipeline._request import ExecRequest
    from corral.policy import Policy

    result: dict[str, str | None] = {}
    workspace = os.getcwd()
    for name in sorted(BACKENDS):
        backend = get_backend(name)
        image = "corral:python" if name in ("podman", "docker") else None
        policy = Policy.for_workspace(workspace, home=os.environ.get("HOME", "/root")).replace(
            image=image
        )
        facts, _ = inspect_host(backend, ExecRequest.from_argv(["true"]), policy, dict(os.environ))
        problem = backend.problem(facts)
        if problem is None and image is not None:
            ref = facts.detail("image")
            problem = getattr(ref, "problem", None)
        result[name] = problem
    return result


_AVAILABLE: dict[str, str | None] | None = None


def available() -> dict[str, str | None]:
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = _available()
    return _AVAILABLE


@pytest.fixture(scope="session", autouse=True)
def docker_engine() -> Iterator[None]:
    """A private Docker engine for the docker column, when none runs and dockerd is installed.

    Root only. The engine lives in its own directory (data, exec root, socket)
    under the test root, with iptables and the bridge off (the recipe that
    works in this VM), and is stopped and removed when the session ends.
    ``DOCKER_HOST`` points at it for the session. Where it cannot start, the
    docker column skips with the backend's own reason and a warning says why.
    """
    from corral.backends.docker import DockerBackend

    dockerd, docker = shutil.which("dockerd"), shutil.which("docker")
    if os.geteuid() != 0 or not dockerd or not docker:
        yield
        return
    if DockerBackend().engine_problem(dict(os.environ)) is None:
        yield  # an engine runs already: use it
        return
    base = os.environ.get("CORRAL_TEST_ROOT", "/var/lib/corral-tests")
    root = os.path.join(base, f"dockerd-{os.getpid()}")
    os.makedirs(root, mode=0o700, exist_ok=True)
    sock = os.path.join(root, "docker.sock")
    argv = [
        dockerd,
        f"--data-root={root}/data",
        f"--exec-root={root}/exec",
        f"--pidfile={root}/docker.pid",
        f"--host=unix://{sock}",
        "--iptables=false",
        "--ip6tables=false",
        "--bridge=none",
        "--exec-opt=native.cgroupdriver=cgroupfs",
    ]
    with open(os.path.join(root, "log"), "wb") as log:
        daemon = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    saved = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = f"unix://{sock}"
    try:
        deadline = time.monotonic() + 30
        while DockerBackend().engine_problem(dict(os.environ)) is not None:
            if daemon.poll() is not None or time.monotonic() > deadline:
                with open(os.path.join(root, "log"), "rb") as f:
                    tail = f.read()[-400:].decode(errors="replace")
                warnings.warn(f"a private dockerd did not start: {tail}", stacklevel=1)
                break
            time.sleep(0.1)
        yield
    finally:
        if saved is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = saved
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            mounts = [line.split()[4] for line in f]
        for point in sorted((m for m in mounts if m.startswith(root + "/")), reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def python_image(docker_engine: None) -> None:
    """Build (or reuse from the cache) the corral:python image the container probes run in.

    mmdebstrap from apt only: ~30 s the first time on this class of machine,
    instant afterwards. Skipped (with the reason) where it cannot be built.
    """
    if os.geteuid() != 0 or shutil.which("mmdebstrap") is None or shutil.which("podman") is None:
        return
    from corral.cli.commands.image import _engines
    from corral.images import build_image
    from corral.images._build import ImageBuildFailed

    try:
        build_image("python", engines=_engines(dict(os.environ)), environ=dict(os.environ))
    except ImageBuildFailed:
        return  # the backends then report the image as not built, and skip with that reason
