"""``corral run`` at a terminal behaves as the command would there without corral.

A real pty is the terminal: the test writes Ctrl-C (byte 0x03) to it, as a
user's keyboard does, and compares with the same shell command run directly on
a pty in the same test - in-process, through the corral server with the Python
client, and with the compiled ``corral-client``.
"""

from __future__ import annotations

import os
import pty
import select
import time

from tests.conftest import World, client_command

READY = b"ready"


def on_pty(
    argv: list[str], env: dict[str, str], cwd: str, keys: bytes, *, wait_for: bytes = READY
) -> tuple[int, bytes]:
    """Run *argv* with a new pty as its controlling terminal; type *keys* once *wait_for* shows.

    Returns the exit status (negative: killed by that signal) and all it wrote.
    """
    pid, fd = pty.fork()
    if pid == 0:  # the child is a session leader; the pty is its terminal
        try:
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    out = b""
    typed = False
    deadline = time.monotonic() + 35
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: every process holding the pty is gone
                break
            if not chunk:
                break
            out += chunk
        if not typed and wait_for in out:
            time.sleep(0.3)  # let the shell reach its wait for sleep
            os.write(fd, keys)
            typed = True
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out


def landlock_works(world: World) -> bool:
    """Whether the landlock backend runs a command on this machine."""
    result = world.corral(
        "run",
        "--backend",
        "landlock",
        "--isolation",
        "process",
        "--",
        "true",
        env={"CORRAL_SERVER": "off"},
    )
    return result.returncode == 0


def _as_exit_status(code: int) -> int:
    """A shell's view of a child's end: killed by signal N is 128 + N."""
    return 128 - code if code < 0 else code


SCRIPTS = [
    "echo ready; sleep 100; echo after",
    "trap 'echo trapped; exit 7' INT; echo ready; sleep 100; echo after",
]


def test_ctrl_c_interrupts_the_foreground_command(served: World, client: str) -> None:
    for script in SCRIPTS:
        started = time.monotonic()
        bare = on_pty(["/bin/sh", "-c", script], served.environ, served.workspace, b"\x03")
        assert time.monotonic() - started < 30
        in_process = {**served.environ, "CORRAL_SERVER": "off"}
        runs = {
            "in-process": (client_command("corral"), in_process, ()),
            client: (client_command(client), dict(served.environ), ()),
        }
        if landlock_works(served):  # the exec helper starts the session (no pid namespace)
            landlock = ("--backend", "landlock", "--isolation", "process")
            runs["landlock"] = (client_command("corral"), in_process, landlock)
        for name, (argv, env, options) in runs.items():
            started = time.monotonic()
            command = [*argv, "run", *options, "-c", script]
            code, out = on_pty(command, env, served.workspace, b"\x03")
            elapsed = time.monotonic() - started
            assert elapsed < 30, f"{name}: Ctrl-C did not stop sleep ({out!r})"
            assert b"after" not in out, (name, out)
            assert code == _as_exit_status(bare[0]), (name, script, code, bare, out)
            assert out.replace(b"^C", b"").split() == bare[1].replace(b"^C", b"").split(), (
                name,
                out,
                bare,
            )
