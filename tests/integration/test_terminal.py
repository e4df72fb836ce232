"""The user's terminal handed to a sandboxed command cannot act on the host.

The command gets a real pty slave as stdin/stdout (what ``corral run`` on a
terminal hands it); it tries to inject keystrokes (TIOCSTI), paste through the
console (TIOCLINUX), take the console output (TIOCCONS) and change the line
discipline (TIOCSETD). Every attempt is refused, and the host side of the pty
reads nothing that the command pushed into its input.
"""

from __future__ import annotations

import os
import select
import subprocess

import pytest

from tests.conftest import PROBE_PYTHON, World, client_command, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.backend("bubblewrap")]

PROBE = r"""
import errno, fcntl, struct, sys
results = []
for name, cmd, arg in (
    ("TIOCSTI", 0x5412, b"X"),
    ("TIOCLINUX", 0x541C, bytes([2]) + b"\0" * 16),
    ("TIOCCONS", 0x541D, b""),
    ("TIOCSETD", 0x5423, struct.pack("i", 0)),
    ("TIOCSTI-high-bits", 0xFFFFFFFF00005412, b"Y"),
):
    try:
        fcntl.ioctl(0, cmd, arg)
        results.append(name + "=ALLOWED")
    except OverflowError:
        results.append(name + "=overflow")
    except OSError as exc:
        results.append(name + "=" + errno.errorcode.get(exc.errno, str(exc.errno)))
print(" ".join(results), flush=True)
"""


@pytest.mark.parametrize("backend", ["bubblewrap", "landlock"])
def test_terminal_ioctls_are_refused_and_nothing_is_injected(world: World, backend: str) -> None:
    master, slave = os.openpty()
    try:
        options = ["--backend", backend] + (
            ["--isolation", "process"] if backend == "landlock" else []
        )
        if backend == "landlock" and os.geteuid() == 0:
            options += ["--allow-degraded", "isolation"]  # it refuses a root caller otherwise
        result = subprocess.run(
            [*client_command("corral"), "run", *options, "--", PROBE_PYTHON, "-c", PROBE],
            stdin=slave,
            capture_output=True,
            env=world.environ,
            cwd=world.workspace,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        out = result.stdout.decode()
        for name in ("TIOCSTI", "TIOCLINUX", "TIOCCONS", "TIOCSETD"):
            assert f"{name}=EPERM" in out, out
        assert "ALLOWED" not in out, out
        # the host side: nothing was pushed into the terminal's input
        os.set_blocking(slave, False)
        readable, _, _ = select.select([slave], [], [], 0.3)
        pushed = os.read(slave, 1024) if readable else b""
        assert b"X" not in pushed and b"Y" not in pushed, pushed
    finally:
        os.close(master)
        os.close(slave)
