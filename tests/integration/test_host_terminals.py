"""The user's other terminals are out of a sandbox's reach.

A terminal the user types into (another ssh session, the terminal a kept
shell was started from) is a pseudo-terminal of the user's uid on the host's
``/dev/pts``. A sandboxed command that can open it reads the keys typed there
(a password at a ``sudo`` prompt) and writes text that looks like the
terminal's own. The test plays the user's terminal with a host pty holding a
typed line, runs a command that tries to open that pty by path for reading
and for writing, and checks on the host that the line is still unread and
nothing was written. The rule keeps the ptys a command creates usable
(``openpty()``, ``pty.fork()``, ``script``): on landlock the write broker
opens their other end, which Landlock would refuse under ``/dev/pts``.
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
_BACKENDS = [
    pytest.param(("--backend", "bubblewrap"), marks=needs_bwrap, id="bubblewrap"),
    pytest.param(_LANDLOCK, id="landlock"),
]


@pytest.mark.parametrize("backend", _BACKENDS)
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


_OWN_PTYS = (
    "import os, pty, subprocess, tty\n"
    "master, slave = os.openpty()\n"  # glibc's openpty(): /dev/ptmx + TIOCGPTPEER
    "tty.setraw(slave)\n"  # no echo: each side reads only what the other wrote
    "os.write(master, b'to-the-slave\\n')\n"
    "print('slave', os.read(slave, 100))\n"
    "os.write(slave, b'to-the-master')\n"
    "print('master', os.read(master, 100))\n"
    "pid, fd = pty.fork()\n"  # the child's controlling terminal is the new pty
    "if pid == 0:\n"
    "    os.execvp('sh', ['sh', '-c', 'test -t 0 && echo child-on-a-tty'])\n"
    "out = b''\n"
    "while True:\n"
    "    try:\n"
    "        chunk = os.read(fd, 100)\n"
    "    except OSError:\n"
    "        break\n"
    "    if not chunk:\n"
    "        break\n"
    "    out += chunk\n"
    "print('fork', out, os.waitpid(pid, 0)[1])\n"
    "r = subprocess.run(['script', '-qec', 'test -t 1 && echo script-on-a-tty', '/dev/null'],\n"
    "                   stdin=subprocess.DEVNULL, capture_output=True)\n"
    "print('script', r.returncode, r.stdout, r.stderr)\n"
)


@pytest.mark.parametrize("backend", _BACKENDS)
def test_a_sandbox_uses_the_ptys_it_creates(world: World, backend: tuple[str, ...]) -> None:
    attempt = World.write(world.ws("own_ptys.py"), _OWN_PTYS)
    result = world.corral("run", *backend, "--", PROBE_PYTHON, attempt)
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert "slave b'to-the-slave\\n'" in out, out
    assert "master b'to-the-master'" in out, out
    assert "fork b'child-on-a-tty\\r\\n' 0" in out, out
    assert "script 0 b'script-on-a-tty\\r\\n'" in out, out
