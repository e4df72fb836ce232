"""One real Ray cluster for the module: a head (no sandboxes) and two worker nodes.

Every node is a ``ray start --block`` process on this machine with its own
raylet; the workers offer the ``corral`` resource, the head does not, so
every sandbox of these tests runs on a worker. The nodes' HOME is a world
made for the module (secrets in ``~/.ssh``), so the node's own default policy
is what hides them.
"""

from __future__ import annotations

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

    def __init__(self, world: World, local: object, cluster: object, workers: list[str]) -> None:
        self.world = world
        self.local = local
        self.cluster = cluster
        self.workers = workers


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
    local = LocalCluster(workers=2, slots=50, head_slots=0, env=env)
    try:
        cluster = connect(local.address, state_dir=os.path.join(root, "caller-state"))
        try:
            workers = [node["id"] for node in cluster.nodes()]
            assert len(workers) == 2, workers
            yield ClusterWorld(world, local, cluster, workers)
        finally:
            cluster.close()
    finally:
        local.shutdown()
        shutil.rmtree(root, ignore_errors=True)
