"""Scale-out: the SDK's sandboxes on a Ray cluster (the optional extra ``corral[ray]``).

Nothing of Ray is imported until a cluster is used. The names and results
are the SDK's::

    import corral.cluster

    with corral.cluster.connect("ray://head:10001") as cluster:
        outcome = cluster.run(["pytest", "-q"], workspace="/src/app", timeout="10m")
        with cluster.Sandbox(workspace="/src/app", memory="2G") as sbx:
            print(sbx.exec("make test").returncode, sbx.node)
        report = cluster.map("make test", ["/src/a", "/src/b"], concurrency=8, timeout="5m")
        print(report.table())

One agent actor per node (pinned there, created on first use) runs the
node's sandboxes with the node's own settings and backends; each sandbox is
placed by Ray through a placement group asking for the custom ``corral``
resource plus its ``cpus`` and ``memory``. Outcomes, preview diffs and audit
records come back; each record lands in the caller's audit log with the node
named. See docs/cluster.md.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..policy import Policy
    from ._batch import MapReport
    from ._client import AsyncSandbox, Cluster, NoCapacity, NodeLost, Sandbox

__all__ = [
    "AsyncSandbox",
    "Cluster",
    "MapReport",
    "NoCapacity",
    "NodeLost",
    "Sandbox",
    "connect",
    "map",
]

_LAZY = {
    "AsyncSandbox": "._client",
    "Cluster": "._client",
    "NoCapacity": "._client",
    "NodeLost": "._client",
    "Sandbox": "._client",
    "MapReport": "._batch",
}


def connect(address: str | None = None, **options: Any) -> Cluster:
    """Connect to the Ray cluster at *address*; see :class:`Cluster` for the options."""
    from ._client import Cluster

    return Cluster(address, **options)


def map(
    command: str | Sequence[str],
    workspaces: Sequence[str],
    policy: Policy | None = None,
    *,
    address: str | None = None,
    **kwargs: Any,
) -> MapReport:
    """Run *command* in each of *workspaces* on the cluster at *address*; the report.

    A one-shot :meth:`Cluster.map`: connects, runs, closes. See
    :func:`corral.cluster._batch.run_map` for the keywords.
    """
    with connect(address) as cluster:
        return cluster.map(command, workspaces, policy, **kwargs)  # type: ignore[no-any-return]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'corral.cluster' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
