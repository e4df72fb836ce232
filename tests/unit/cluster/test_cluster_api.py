"""corral.cluster without a cluster: no Ray import until used, the batch report, bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from corral.cluster._batch import MapItem, MapReport
from corral.pipeline._outcome import Outcome


def test_importing_the_cluster_module_imports_no_ray():
    code = (
        "import sys, corral.cluster, corral.cluster.k8s; "
        "corral.cluster.MapReport; print('ray' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def _outcome(**fields) -> Outcome:
    return Outcome(sandbox_id="sbx-1", backend="bubblewrap", argv=("make", "test"), **fields)


def test_the_report_keeps_every_item_and_counts_them():
    items = [
        MapItem(workspace="/w/a", node="n" * 56, outcome=_outcome(exit_code=0), duration=1.0),
        MapItem(workspace="/w/b", node="m" * 56, outcome=_outcome(exit_code=2), duration=2.0),
        MapItem(workspace="/w/c", outcome=_outcome(signal=15, timed_out=True), duration=3.0),
        MapItem(workspace="/w/d", error="Failed to place the sandbox: no node had room"),
    ]
    report = MapReport(items, 4.0)
    assert [item.status for item in report] == ["ok", "failed", "timeout", "error"]
    assert report.counts() == {"ok": 1, "failed": 1, "timeout": 1, "error": 1}
    assert not report.ok
    lines = report.table().splitlines()
    assert lines[0].split() == ["workspace", "status", "exit", "node", "seconds", "detail"]
    assert lines[1].split()[:4] == ["/w/a", "ok", "0", "n" * 12]
    assert lines[3].split()[:3] == ["/w/c", "timeout", "124"]
    assert "no node had room" in lines[4]
    assert lines[-1] == "4 items in 4.0 s: 1 ok, 1 failed, 1 timeout, 1 error"


def test_environ_is_refused_on_a_cluster():
    from corral import InvalidRequest
    from corral.cluster._client import _Remote

    with pytest.raises(InvalidRequest, match="environ"):
        _Remote(cluster=None, environ={"A": "1"})  # type: ignore[arg-type]
