"""No backend silently ignores a rule it cannot enforce: each refuses with exit 125 and names the rule."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import available

#: backend -> (extra settings, the rule the refusal must name)
CANNOT: dict[str, tuple[dict[str, object], str]] = {
    "landlock": ({"network": {"mode": "allowlist", "allow": ["example.org"]}}, "network.mode"),
    "gvisor": ({}, "filesystem.protect"),
    "podman": (
        {
            "image": "corral:python",
            "network": {"mode": "allowlist", "allow": ["example.org"]},
            # rootful podman runs the egress proxy but cannot give the container the
            # per-run CA: masked credentials are bubblewrap's only
            "credentials": [
                {
                    "name": "TOKEN",
                    "from": "env:HOME",
                    "commands": ["*"],
                    "hosts": ["example.org"],
                    "mode": "mask",
                }
            ],
        },
        "credentials" if os.geteuid() == 0 else "network.mode",
    ),
    "docker": ({"image": "corral:python"}, "filesystem.protect"),
    # bubblewrap enforces masked credentials and request rules through its proxy;
    # with the host's network ("open") nothing would check the rules
    "bubblewrap": (
        {"network": {"mode": "open", "denyRequests": ["POST */git-receive-pack"]}},
        "network.denyRequests",
    ),
}
ISOLATION = {"landlock": "process", "gvisor": "kernel"}


@pytest.mark.parametrize("backend", sorted(CANNOT))
def test_refuses_what_it_cannot_enforce(backend: str, tmp_path: object) -> None:
    problem = available().get(backend)
    if problem is not None:
        pytest.skip(f"{backend} is not available here: {problem}")
    import json

    settings, rule = CANNOT[backend]
    settings = {**settings, "backend": backend, "isolation": ISOLATION.get(backend, "namespace")}
    if backend == "landlock" and os.geteuid() == 0:
        settings["allowDegraded"] = ["isolation"]  # else its refusal of a root caller comes first
    path = os.path.join(str(tmp_path), "settings.json")
    with open(path, "w") as f:
        json.dump(settings, f)
    marker = os.path.join(str(tmp_path), "ran")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "run",
            "--workspace",
            str(tmp_path),
            "--settings",
            path,
            "--",
            "touch",
            marker,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 125, result.stderr
    assert f"Failed to enforce {rule}" in result.stderr
    assert "--allow-degraded" in result.stderr or "hint" in result.stderr
    assert not os.path.exists(marker)  # nothing ran
