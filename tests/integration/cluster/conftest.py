"""One real Ray cluster for the module: a head (no sandboxes) and two worker nodes.

Every node is a ``ray start --block`` process on this machine with its own
raylet; the workers offer the ``corral`` resource, the head does not, so
every sandbox of these tests runs on a worker. The nodes' HOME is a world
made for the module (secrets in ``~/.ssh``), so the node's own default policy
is what hides them.

Where the microvm backend works (root, qemu, the python VM image built or
buildable from the cache), the second worker's own settings file
(``CORRAL_SETTINGS``) sets ``integrations.cluster.warmVms = 1``: its agent
keeps a booted micro-VM ready; the first worker has no pool.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator

import pytest

from tests.conftest import TEST_ROOT, World

try:
    import ray  # noqa: F401

    RAY_PROBLEM = None
except ImportError:
    RAY_PROBLEM = "Ray is not installed (pip install 'corral[ray]')"


class ClusterWorld:
    """The module's world, the local Ray cluster and the caller's connection."""

    def __init__(
        self,
        world: World,
        local: object,
        cluster: object,
        workers: list[str],
        vm_problem: str | None,
    ) -> None:
        self.world = world
        self.local = local
        self.cluster = cluster
        self.workers = workers
        #: why no worker has a warm micro-VM pool (None: the second worker started has one)
        self.vm_problem = vm_problem


def _vm_problem() -> str | None:
    """Why micro-VMs cannot run here, or None once the python VM image is built (cached)."""
    if (
        os.geteuid() != 0
        or not shutil.which("qemu-system-x86_64")
        or not shutil.which("mmdebstrap")
    ):
        return "the microvm backend needs root, qemu-system-x86 and (for its image) mmdebstrap"
    from corral.images import build_image
    from corral.images._build import ImageBuildFailed
    from corral.images._vm import build_vm_image

    try:
        build_vm_image(build_image("python", environ=dict(os.environ)))
    except ImageBuildFailed as exc:
        return f"the python VM image cannot be built here: {exc.message}"
    return None


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[ClusterWorld]:
    if RAY_PROBLEM:
        pytest.skip(RAY_PROBLEM)
    from corral.cluster import connect
    from corral.cluster._local import LocalCluster

    os.makedirs(TEST_ROOT, exist_ok=True)
    root = os.path.join(TEST_ROOT, f"c-{uuid.uuid4().hex[:12]}")
    os.makedirs(root)
    world = World(root)
    env = {"HOME": world.home, "CORRAL_SERVER": "off"}
    vm_problem = _vm_problem()
    node_env: list[dict[str, str]] = []
    if vm_problem is None:
        from corral.images import cache_root

        # the VM image from this machine's cache (built once), for every node
        env["XDG_CACHE_HOME"] = os.path.dirname(os.path.dirname(cache_root(dict(os.environ))))
        warm_settings = os.path.join(root, "warm-node-settings.json")
        with open(warm_settings, "w", encoding="utf-8") as f:
            json.dump({"integrations": {"cluster": {"warmVms": 1}}}, f)
        node_env = [{}, {"CORRAL_SETTINGS": warm_settings}]
    local = LocalCluster(workers=2, slots=50, head_slots=0, env=env, node_env=node_env)
    try:
        cluster = connect(local.address, state_dir=os.path.join(root, "caller-state"))
        try:
            workers = [node["id"] for node in cluster.nodes()]
            assert len(workers) == 2, workers
            yield ClusterWorld(world, local, cluster, workers, vm_problem)
        finally:
            cluster.close()
    finally:
        local.shutdown()
        shutil.rmtree(root, ignore_errors=True)
