"""The user's other terminals are out of a sandbox's reach.

A terminal the user types into (another ssh session, the terminal a kept
shell was started from) is a pseudo-terminal of the user's uid on the host's
``/dev/pts``. A sandboxed command that can open it reads the keys typed there
(a password at a ``sudo`` prompt) and writes text that looks like the
terminal's own. The test plays the user's terminal with a host pty holding a
typed line, runs a command that tries to open that pty by path for reading
and for writing, and checks on the host that the line is still unread and
nothing was written.
"""

from __future__ import annotations

import os
import select

import pytest

from tests.conftest import PROBE_PYTHON, World, is_root, needs_bwrap

TYPED = b"hunter2-typed-on-the-host\n"

_ATTEMPT = (
    "import os, sys\n"
    "path = sys.argv[1]\n"
    "try:\n"
    "    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)\n"
    "    try:\n"
    "        print('READ', os.read(fd, 100))\n"
    "    except OSError as e:\n"
    "        print('read', e.errno)\n"
    "except OSError as e:\n"
    "    print('open-read', e.errno)\n"
    "try:\n"
    "    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY)\n"
    "    os.write(fd, b'SPOOFED')\n"
    "    print('WROTE')\n"
    "except OSError as e:\n"
    "    print('open-write', e.errno)\n"
)

_LANDLOCK = ("--isolation", "process", "--backend", "landlock") + (
    ("--allow-degraded", "isolation") if is_root() else ()
)


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param(("--backend", "bubblewrap"), marks=needs_bwrap, id="bubblewrap"),
        pytest.param(
            _LANDLOCK,
            id="landlock",
            marks=pytest.mark.xfail(
                strict=True,
                reason="landlock grants /dev/pts wholesale (DEVICE_RULES: 'the pseudo-terminals "
                "it created'), so every pty of the user's uid - the user's other terminals - "
                "opens for reading and writing; Landlock cannot name only the ptys the "
                "command created",
            ),
        ),
    ],
)
def test_a_sandbox_cannot_read_or_write_the_users_other_terminal(
    world: World, backend: tuple[str, ...]
) -> None:
    master, slave = os.openpty()
    try:
        os.write(master, TYPED)  # typed at the user's terminal, not read by anyone yet
        path = os.ttyname(slave)
        attempt = World.write(world.ws("attempt.py"), _ATTEMPT)
        result = world.corral("run", *backend, "--", PROBE_PYTHON, attempt, path)
        assert result.returncode == 0, result.stderr
        out = result.stdout.decode()
        assert "READ" not in out and "WROTE" not in out, out
        # on the host: the typed line is still there for the terminal's own reader...
        os.set_blocking(slave, False)
        assert os.read(slave, 100) == TYPED
        # ...and the terminal showed nothing the sandbox wrote (only the echo of the typing)
        shown = b""
        while select.select([master], [], [], 0.2)[0]:
            shown += os.read(master, 4096)
        assert b"SPOOFED" not in shown, shown
    finally:
        os.close(master)
        os.close(slave)
