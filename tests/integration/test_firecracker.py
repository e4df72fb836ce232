"""The firecracker backend: refused here with every reason, and real boots where they work.

On this project's machines there is no ``firecracker`` binary (Debian 12 has
none) and ``/dev/kvm`` is a nested PVM that hangs standard guests: a run is
refused (exit 125) naming both, ``corral doctor`` shows the same, and the
boot tests skip with that reason. The boot tests are written to run
unchanged on an x86_64 host with working KVM and Firecracker 1.8 or newer on
PATH (as root).
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from corral.backends.boxlite import kvm_state
from tests.integration.conftest import corral_cli

CORRAL = [sys.executable, "-m", "corral"]


def _firecracker() -> str | None:
    """The firecracker binary on PATH, if any (looked up as the backend does: it has no
    Debian package, so CI cannot install it and these tests skip there)."""
    from corral.backends._container import find_program

    return find_program("firecracker", dict(os.environ))


def _boot_problem() -> str | None:
    """Why Firecracker cannot boot a guest here (the reason the boot tests skip with)."""
    problems = []
    if _firecracker() is None:
        problems.append("no firecracker binary on PATH (not packaged by Debian 12)")
    kvm = kvm_state(dict(os.environ))
    if kvm:
        problems.append(f"KVM does not run standard guests here: {kvm}")
    if os.geteuid() != 0:
        problems.append("this build runs Firecracker VMs as root only")
    return "; ".join(problems) or None


_BOOT_PROBLEM = _boot_problem()  # once for the module (the KVM probe is cached per boot)
needs_firecracker = pytest.mark.skipif(_BOOT_PROBLEM is not None, reason=str(_BOOT_PROBLEM))


def test_where_firecracker_cannot_boot_the_run_is_refused_with_every_reason(
    tmp_path: object,
) -> None:
    if _BOOT_PROBLEM is None:
        pytest.skip("Firecracker boots guests here: the boot tests below cover the backend")
    workspace = str(tmp_path)
    result = corral_cli(
        "run", "--backend", "firecracker", "--read-only", "--", "true", cwd=workspace
    )
    assert result.returncode == 125, result.stderr
    assert "Failed to use the firecracker backend: " in result.stderr
    for reason in _BOOT_PROBLEM.split("; "):
        assert reason.split("(")[0].split(":")[0] in result.stderr, reason
    # corral doctor's row (and doctor --matrix's): the same check, in-process (the CLI
    # would smoke-test every other backend too, a qemu boot among them)
    from corral.cli.commands.doctor import _check_backend

    row = _check_backend("firecracker", workspace)
    assert row["works"] is False
    reason = str(row["reason"])
    assert ("firecracker binary" in reason) == (_firecracker() is None)
    assert ("KVM does not run standard guests" in reason) == (
        kvm_state(dict(os.environ)) is not None
    )


@pytest.fixture(scope="module")
def image() -> None:
    result = subprocess.run(
        [*CORRAL, "image", "build", "python", "--vm"],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr


def _run_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("corral-vm-")}


_BEFORE = _run_dirs()  # the run directories of other VMs, not this module's


def _leftovers() -> tuple[list[str], list[str]]:
    """Firecracker processes, and VM run directories (the workspace image, the sockets,
    the config file) of this module's runs, if any."""
    procs = subprocess.run(
        ["pgrep", "-x", "firecracker"], capture_output=True, text=True, check=False
    ).stdout.split()
    return procs, sorted(_run_dirs() - _BEFORE)


@needs_firecracker
def test_the_command_runs_on_the_guests_kernel_without_network_or_secrets(
    image: None, tmp_path: object
) -> None:
    workspace = str(tmp_path)
    with open(os.path.join(workspace, ".env"), "w") as f:
        f.write("TOKEN=s3cret\n")
    script = (
        "import os, platform; print(platform.release()); "
        "print(os.environ.get('SECRET_TOKEN', 'none')); print(sorted(os.listdir('/sys/class/net'))); "
        "print(open('.env').read() or 'empty')"
    )
    result = corral_cli(
        "run", "--backend", "firecracker", "--read-only", "--deny-read", ".env", "--",
        "python3", "-c", script, cwd=workspace, env={"SECRET_TOKEN": "s3cret"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    release, secret, nics, env_file = result.stdout.splitlines()
    assert release != platform.release()
    assert secret == "none"
    assert nics == "['lo']"  # no network interface at all
    assert "s3cret" not in env_file


@needs_firecracker
def test_a_writable_run_comes_back_only_through_a_preview(image: None, tmp_path: object) -> None:
    workspace = os.path.join(str(tmp_path), "ws")
    os.mkdir(workspace)
    for name, text in (("a.txt", "old\n"), ("gone.txt", "bye\n")):
        with open(os.path.join(workspace, name), "w") as f:
            f.write(text)
    result = corral_cli(
        "run", "--backend", "firecracker", "--", "sh", "-c",
        "echo new > a.txt; echo x > b.txt; rm gone.txt; ln -s a.txt l", cwd=workspace,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with open(os.path.join(workspace, "a.txt")) as f:
        assert f.read() == "old\n"  # the workspace itself is untouched
    assert not os.path.exists(os.path.join(workspace, "b.txt"))
    previews = json.loads(corral_cli("previews", "--json", cwd=workspace).stdout)
    preview = next(p for p in previews if p["workspace"] == workspace)
    applied = corral_cli("apply", preview["id"], cwd=workspace)
    assert applied.returncode == 0, applied.stderr
    with open(os.path.join(workspace, "a.txt")) as f:
        assert f.read() == "new\n"
    assert os.readlink(os.path.join(workspace, "l")) == "a.txt"
    assert not os.path.exists(os.path.join(workspace, "gone.txt"))
    assert _leftovers() == ([], [])


@needs_firecracker
def test_a_timeout_or_a_killed_corral_leaves_no_vm_behind(image: None, tmp_path: object) -> None:
    workspace = str(tmp_path)
    result = corral_cli(
        "run", "--backend", "firecracker", "--read-only", "--timeout", "3", "--", "sleep", "100",
        cwd=workspace,
    )  # fmt: skip
    assert result.returncode == 124, result.stderr
    assert _leftovers() == ([], [])
    proc = subprocess.Popen(
        [*CORRAL, "run", "--backend", "firecracker", "--read-only", "--", "sleep", "100"],
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not _leftovers()[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers()[0], "firecracker never started"
    time.sleep(1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while _leftovers()[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers()[0] == []  # firecracker died with corral (PR_SET_PDEATHSIG)
    # its run directory (with the workspace image) is swept by the next VM's start
    again = corral_cli(
        "run", "--backend", "firecracker", "--read-only", "--", "true", cwd=workspace
    )
    assert again.returncode == 0, again.stderr
    assert _leftovers() == ([], [])
