"""Kubernetes manifests from a corral policy (``corral k8s render``); see docs/kubernetes.md.

Two layers, like a local run under a container backend: the Pod is the outer
wall (a gVisor ``RuntimeClass``, no host mounts but the workspace volume,
non-root, no capabilities, a read-only root filesystem, no service-account
token, resource limits, a ``NetworkPolicy`` for the network mode), and
``corral run`` inside it enforces the fine-grained rules (hidden paths,
protected persistence points, the write broker) from the same settings,
shipped as a ConfigMap.

What a manifest cannot express is left to ``corral run`` in the Pod, which
enforces it or refuses the run (exit 125) exactly as on a workstation: a host
allowlist (a ``NetworkPolicy`` matches addresses, not host names: the Pod may
reach DNS and ports 80/443, corral's egress proxy in the Pod decides per
host), the ``pids`` limit (a kubelet setting, not a Pod field), hidden paths
and protected persistence points inside the workspace.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..policy import Policy

__all__ = ["RUNTIME_CLASS", "render"]

#: the RuntimeClass every sandbox Pod names (handler: runsc)
RUNTIME_CLASS = "gvisor"
#: where the settings ConfigMap is mounted in the Pod
SETTINGS_DIR = "/etc/corral"
#: the unprivileged user the Pod runs as
POD_USER = 65534


def _labels(name: str, digest: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "corral-sandbox",
        "app.kubernetes.io/instance": name,
        "corral.dev/policy-digest": digest[:40],
    }


def _quantity_cpu(cpus: float) -> str:
    return f"{round(cpus * 1000)}m"


def _pod_spec(
    policy: Policy, *, name: str, image: str, claim: str, command: Sequence[str]
) -> dict[str, Any]:
    fs, res = policy.filesystem, policy.resources
    limits: dict[str, str] = {}
    if res.memory is not None:
        limits["memory"] = str(res.memory)
    if res.cpus is not None:
        limits["cpu"] = _quantity_cpu(res.cpus)
    env = [{"name": key, "value": value} for key, value in sorted(policy.env.set)]
    env.append({"name": "CORRAL_SERVER", "value": "off"})
    spec: dict[str, Any] = {
        "runtimeClassName": RUNTIME_CLASS,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": POD_USER,
            "runAsGroup": POD_USER,
            "fsGroup": POD_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "sandbox",
                "image": image,
                "command": [
                    "corral",
                    "run",
                    "--settings",
                    f"{SETTINGS_DIR}/settings.json",
                    "--",
                    *command,
                ],
                "workingDir": fs.workspace,
                "env": env,
                "resources": {"limits": limits, "requests": dict(limits)},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "workspace", "mountPath": fs.workspace, "readOnly": fs.read_only},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "settings", "mountPath": SETTINGS_DIR, "readOnly": True},
                ],
            }
        ],
        "volumes": [
            {
                "name": "workspace",
                "persistentVolumeClaim": {"claimName": claim, "readOnly": fs.read_only},
            },
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "settings", "configMap": {"name": f"{name}-policy"}},
        ],
    }
    if res.timeout is not None:
        spec["activeDeadlineSeconds"] = max(1, int(res.timeout))
    return spec


def _network_policy(policy: Policy, name: str, labels: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/instance": labels["app.kubernetes.io/instance"]}
        },
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [],
    }
    if policy.network.mode == "open":
        spec["egress"] = [{}]  # one empty rule: all egress
    elif policy.network.mode == "allowlist":
        # DNS and web ports only; corral's egress proxy in the Pod allows or denies each host
        spec["egress"] = [
            {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
            {"ports": [{"protocol": "TCP", "port": 80}, {"protocol": "TCP", "port": 443}]},
        ]
    else:
        spec["egress"] = []  # none: nothing leaves the Pod
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-network", "labels": labels},
        "spec": spec,
    }


def render(
    policy: Policy,
    settings: dict[str, Any],
    *,
    name: str = "corral-sandbox",
    image: str = "corral:base",
    claim: str | None = None,
    command: Sequence[str] = ("sleep", "infinity"),
    warm: int = 0,
) -> list[dict[str, Any]]:
    """The manifests for *policy*: RuntimeClass, ConfigMap, NetworkPolicy, and a Pod or a warm Deployment.

    Args:
        policy: the effective policy (its workspace is the mount path in the Pod).
        settings: the effective settings (``corral policy --json``) for ``corral run`` in the Pod.
        name: the name of the objects (a DNS label).
        image: the container image (with corral and the agent's tools).
        claim: the PersistentVolumeClaim holding the workspace (default ``<name>-workspace``).
        command: the command the Pod runs under corral.
        warm: with N > 0, a Deployment of N idle sandbox Pods (a warm pool:
            commands arrive with ``kubectl exec ... corral run``) instead of one Pod.

    """
    import json

    from ..policy import policy_digest

    digest = policy_digest(policy)
    labels = _labels(name, digest)
    spec = _pod_spec(
        policy, name=name, image=image, claim=claim or f"{name}-workspace", command=command
    )
    manifests: list[dict[str, Any]] = [
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": RUNTIME_CLASS},
            "handler": "runsc",
            "overhead": {"podFixed": {"memory": "64Mi", "cpu": "50m"}},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{name}-policy", "labels": labels},
            "data": {"settings.json": json.dumps(settings, indent=2, sort_keys=True) + "\n"},
        },
        _network_policy(policy, name, labels),
    ]
    if warm > 0:
        spec = {**spec, "restartPolicy": "Always"}
        spec.pop("activeDeadlineSeconds", None)
        manifests.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": f"{name}-warm", "labels": labels},
                "spec": {
                    "replicas": warm,
                    "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
                    "template": {"metadata": {"labels": labels}, "spec": spec},
                },
            }
        )
    else:
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {**spec, "restartPolicy": "Never"},
            }
        )
    return manifests
