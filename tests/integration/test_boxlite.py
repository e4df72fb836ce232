"""The boxlite backend against the real BoxLite package and, where KVM boots guests, real VMs.

On this project's CI machines ``/dev/kvm`` is a nested PVM that hangs
guests: the backend must refuse there with the probe's reason (exit 125)
and the boot tests skip with it. The boot tests are written to run
unchanged on a host whose KVM works.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from corral.backends.boxlite import kvm_state
from tests.integration.conftest import corral_cli

from .test_images_and_containers import needs_build, needs_root

CORRAL = [sys.executable, "-m", "corral"]


def test_the_relay_builds_boxlites_own_options_from_a_plan() -> None:
    """What the plan writes is accepted by BoxLite's own ``BoxOptions`` as meant."""
    boxlite = pytest.importorskip("boxlite", reason="pip install 'corral[boxlite]'")
    from corral.backends._boxlite_run import box_options

    config = {
        "box": {
            "rootfs_path": "/cache/images/python-1/oci",
            "cpus": 2,
            "memory_mib": 672,
            "working_dir": "/work/proj",
            "volumes": [["/state/previews/pv-1/tree", "/work/proj", False]],
        }
    }
    options = box_options(boxlite, config)
    assert options.rootfs_path == "/cache/images/python-1/oci"
    assert options.image is None  # never a registry pull
    assert (options.cpus, options.memory_mib, options.working_dir) == (2, 672, "/work/proj")
    assert options.auto_remove is True
    assert 'mode: "disabled"' in repr(options.network)  # no network interface at all


def test_where_kvm_does_not_boot_guests_the_run_is_refused_with_the_reason(
    tmp_path: object,
) -> None:
    pytest.importorskip("boxlite", reason="pip install 'corral[boxlite]'")
    problem = kvm_state(dict(os.environ))
    if problem is None:
        pytest.skip("KVM boots guests here: the boot tests below cover the backend")
    workspace = str(tmp_path)
    result = corral_cli("run", "--backend", "boxlite", "--read-only", "--", "true", cwd=workspace)
    assert result.returncode == 125, result.stderr
    assert "Failed to use the boxlite backend: BoxLite needs KVM that boots guests" in result.stderr
    assert problem.split("(")[0] in result.stderr
    doctor = corral_cli("doctor", cwd=workspace)
    row = next(line for line in doctor.stdout.splitlines() if " boxlite " in line)
    assert "[no ]" in row and "KVM" in row


def _boots() -> str | None:
    """Why BoxLite cannot boot a guest here (the reason tests skip with), or None."""
    try:
        import boxlite  # noqa: F401
    except ImportError:
        return "pip install 'corral[boxlite]'"
    problem = kvm_state(dict(os.environ))
    return f"BoxLite needs KVM that boots guests: {problem}" if problem else None


_BOOT_PROBLEM = _boots()  # probed once for the module (the KVM probe is cached per boot)
needs_kvm = pytest.mark.skipif(_BOOT_PROBLEM is not None, reason=str(_BOOT_PROBLEM))


@pytest.fixture(scope="module")
def image() -> None:
    result = subprocess.run(
        [*CORRAL, "image", "build", "python", "--no-import"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr


@needs_kvm
@needs_root
@needs_build
def test_the_command_runs_on_the_guests_kernel_and_sees_no_host_secret(
    image: None, tmp_path: object
) -> None:
    workspace = str(tmp_path)
    script = (
        "import os, platform; "
        "print(platform.release()); print(os.environ.get('SECRET_TOKEN', 'none')); "
        "print(sorted(os.listdir('/sys/class/net')))"
    )
    result = corral_cli(
        "run", "--backend", "boxlite", "--read-only", "--", "python3", "-c", script,
        cwd=workspace, env={"SECRET_TOKEN": "s3cret"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    release, secret, nics = result.stdout.splitlines()
    assert release != platform.release()
    assert secret == "none"
    assert nics == "['lo']"


@needs_kvm
@needs_root
@needs_build
def test_a_writable_run_changes_only_a_preview(image: None, tmp_path: object) -> None:
    workspace = os.path.join(str(tmp_path), "ws")
    os.mkdir(workspace)
    with open(os.path.join(workspace, "a.txt"), "w") as f:
        f.write("old\n")
    result = corral_cli(
        "run", "--backend", "boxlite", "--", "sh", "-c", "echo new > a.txt; echo x > b.txt",
        cwd=workspace,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with open(os.path.join(workspace, "a.txt")) as f:
        assert f.read() == "old\n"
    assert not os.path.exists(os.path.join(workspace, "b.txt"))
    previews = json.loads(corral_cli("previews", "--json", cwd=workspace).stdout)
    assert any(p["workspace"] == workspace for p in previews)


@needs_kvm
@needs_root
@needs_build
def test_a_timeout_stops_the_vm_and_leaves_nothing(image: None, tmp_path: object) -> None:
    workspace = str(tmp_path)
    result = corral_cli(
        "run", "--backend", "boxlite", "--read-only", "--timeout", "5", "--", "sleep", "600",
        cwd=workspace,
    )  # fmt: skip
    assert result.returncode == 124, result.stderr
    left = subprocess.run(["pgrep", "-f", "boxlite"], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", left.stdout
