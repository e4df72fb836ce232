"""Creating the proxy's listener inside a sandbox's network namespace from the host side."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import pytest

from corral._exceptions import ProxyStartFailed
from corral.egress._netns import open_listener

BWRAP = shutil.which("bwrap")
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__import__("corral").__file__)))
needs_bwrap = pytest.mark.skipif(
    BWRAP is None, reason="bubblewrap is not installed (apt-get install bubblewrap)"
)

#: Starts a sandbox held on --block-fd, listens inside it with open_listener,
#: releases it and serves one connection from inside. Runs as any user.
SCRIPT = r"""
import json, os, socket, subprocess, sys
from corral.egress._netns import open_listener
info_r, info_w = os.pipe()
block_r, block_w = os.pipe()
code = ("import socket; s = socket.create_connection(('127.0.0.1', 3128)); "
        "s.sendall(b'hello from inside')")
sandbox = subprocess.Popen(
    [sys.argv[1], "--unshare-user", "--unshare-net", "--unshare-pid", "--die-with-parent",
     "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
     "--info-fd", str(info_w), "--block-fd", str(block_r), sys.argv[2], "-I", "-S", "-c", code],
    pass_fds=(info_w, block_r))
os.close(info_w)
os.close(block_r)
info = b""
while b"}" not in info:
    info += os.read(info_r, 4096)
pid = json.loads(info)["child-pid"]
fd = open_listener(pid, 3128)
os.write(block_w, b"g")
listener = socket.socket(fileno=fd)
listener.settimeout(20)
conn, _ = listener.accept()
print(conn.recv(100).decode(), "| uid", os.getuid())
sys.exit(sandbox.wait())
"""


@needs_bwrap
def test_listens_inside_the_sandbox_namespace(tmp_path: Any) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, BWRAP, sys.executable],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": SRC},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"hello from inside | uid {os.getuid()}\n"


@needs_bwrap
@pytest.mark.privileged
def test_listens_inside_the_sandbox_namespace_as_an_unprivileged_user() -> None:
    """Without CAP_SYS_ADMIN the helper interpreter joins the sandbox's user namespace first."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user for the test")
    setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
    if setpriv is None or not os.access(python, os.X_OK):
        pytest.skip("needs setpriv (util-linux) and /usr/bin/python3 to run as uid 65534")
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info >= (3, 11))"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if version != "True":
        pytest.skip("/usr/bin/python3 is older than 3.11")
    with tempfile.TemporaryDirectory() as scratch:
        # corral's sources, readable by the unprivileged user
        shutil.copytree(
            os.path.join(SRC, "corral"),
            os.path.join(scratch, "corral"),
            ignore=shutil.ignore_patterns("_bin", "__pycache__"),
        )
        for root, dirs, files in os.walk(scratch):
            for name in [*dirs, *files]:
                os.chmod(os.path.join(root, name), 0o755)
        os.chmod(scratch, 0o755)
        result = subprocess.run(
            [
                setpriv,
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                python,
                "-c",
                SCRIPT,
                BWRAP,
                python,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": scratch, "PYTHONDONTWRITEBYTECODE": "1"},
            check=False,
        )
    if (
        "setting up uid map" in result.stderr
        or "No permissions to create new namespace" in result.stderr
    ):
        pytest.skip(f"unprivileged user namespaces are not available: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello from inside | uid 65534\n"


def test_refuses_to_listen_in_corral_s_own_namespace() -> None:
    with pytest.raises(ProxyStartFailed, match="shares corral's network namespace"):
        open_listener(os.getpid(), 3128)


def test_reports_a_sandbox_that_is_gone() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(ProxyStartFailed, match="cannot open the sandbox's network namespace"):
        open_listener(child.pid, 3128)


@needs_bwrap
def test_reports_a_port_that_is_taken(tmp_path: Any) -> None:
    assert BWRAP is not None
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    sandbox = subprocess.Popen(
        [
            BWRAP,
            "--unshare-user",
            "--unshare-net",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--info-fd",
            str(info_w),
            "--block-fd",
            str(block_r),
            "true",
        ],
        pass_fds=(info_w, block_r),
    )
    os.close(info_w)
    os.close(block_r)
    try:
        info = b""
        while b"}" not in info:
            info += os.read(info_r, 4096)
        pid = json.loads(info)["child-pid"]
        first = open_listener(pid, 3128)
        try:
            with pytest.raises(ProxyStartFailed, match=r"on 127\.0\.0\.1:3128 inside the sandbox"):
                open_listener(pid, 3128)
        finally:
            os.close(first)
    finally:
        os.write(block_w, b"g")
        os.close(block_w)
        os.close(info_r)
        sandbox.wait(10)
