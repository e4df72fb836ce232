"""`corral k8s render`: the manifests validate against the official Kubernetes client's models.

Each manifest is deserialised into its ``kubernetes.client`` model (client-side
validation on: required fields and enums are checked) and serialised back; the
round trip must give the manifest unchanged, so a misspelt or unknown field
(which the models would drop) fails the test. No cluster is needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

kubernetes = pytest.importorskip("kubernetes")

MODELS = {
    ("v1", "Pod"): "V1Pod",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
    ("node.k8s.io/v1", "RuntimeClass"): "V1RuntimeClass",
}


def render(workspace: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "corral", "k8s", "render", "--workspace", workspace, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "CORRAL_SERVER": "off"},
        check=False,
    )


def validate(manifest: dict) -> None:
    from kubernetes.client import ApiClient

    api = ApiClient()
    model = MODELS[(manifest["apiVersion"], manifest["kind"])]
    obj = api._ApiClient__deserialize(manifest, model)  # the models' own validation
    assert api.sanitize_for_serialization(obj) == manifest


@pytest.mark.parametrize(
    ("args", "kinds"),
    [
        (
            ["--memory", "2G", "--cpus", "1.5", "--", "make", "test"],
            ["RuntimeClass", "ConfigMap", "NetworkPolicy", "Pod"],
        ),
        (
            ["--net", "open", "--warm", "3"],
            ["RuntimeClass", "ConfigMap", "NetworkPolicy", "Deployment"],
        ),
        (
            ["--allow-host", "pypi.org", "--read-only", "--timeout", "10m"],
            ["RuntimeClass", "ConfigMap", "NetworkPolicy", "Pod"],
        ),
    ],
)
def test_manifests_validate(tmp_path, args, kinds):
    done = render(str(tmp_path), *args)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert listing["kind"] == "List"
    assert [m["kind"] for m in listing["items"]] == kinds
    for manifest in listing["items"]:
        validate(manifest)


def test_the_pod_carries_the_policy(tmp_path):
    listing = json.loads(
        render(
            str(tmp_path), "--memory", "2G", "--cpus", "1.5", "--read-only", "--", "make", "test"
        ).stdout
    )
    items = {m["kind"]: m for m in listing["items"]}
    pod = items["Pod"]["spec"]
    container = pod["containers"][0]
    assert pod["runtimeClassName"] == items["RuntimeClass"]["metadata"]["name"] == "gvisor"
    assert items["RuntimeClass"]["handler"] == "runsc"
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["limits"] == {"memory": str(2 * 1024**3), "cpu": "1500m"}
    assert container["command"][-2:] == ["make", "test"] and container["command"][:2] == [
        "corral",
        "run",
    ]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert (
        mounts["workspace"]["mountPath"] == str(tmp_path)
        and mounts["workspace"]["readOnly"] is True
    )
    # nothing of a host is mounted: only the claim, an emptyDir and the ConfigMap
    assert all("hostPath" not in v for v in pod["volumes"])
    settings = json.loads(items["ConfigMap"]["data"]["settings.json"])
    assert settings["filesystem"]["readOnly"] is True
    # network none (the default): the NetworkPolicy lets nothing in or out
    net = items["NetworkPolicy"]["spec"]
    assert (
        net["egress"] == []
        and net["ingress"] == []
        and set(net["policyTypes"]) == {"Ingress", "Egress"}
    )


def test_a_bad_option_is_refused(tmp_path):
    done = render(str(tmp_path), "--warm", "many")
    assert done.returncode == 125 and "--warm" in done.stderr
