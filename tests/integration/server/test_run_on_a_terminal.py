"""``corral run`` at a terminal behaves as the command would there without corral.

A real pty is the terminal: the test writes Ctrl-C (byte 0x03) to it, as a
user's keyboard does, and compares with the same shell command run directly on
a pty in the same test - in-process, through the corral server with the Python
client, and with the compiled ``corral-client``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import select
import time
from collections.abc import Callable

from tests.conftest import World, client_command

from ..test_images_and_containers import (
    built_python,
    needs_build,
    needs_podman,
    needs_root,
    needs_runsc,
)

__all__ = ["built_python"]  # the module's fixture: one image build for the podman test

READY = b"ready"


def on_pty(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    keys: bytes = b"",
    *,
    wait_for: bytes = READY,
    then: Callable[[], None] | None = None,
    modes: list[list[object]] | None = None,
    resize: tuple[int, int] | None = None,
) -> tuple[int, bytes]:
    """Run *argv* with a new pty as its controlling terminal; once *wait_for* shows, type *keys*,
    give the terminal the size *resize* (rows, columns) and call *then*. *modes* receives the
    terminal's mode (``tcgetattr``) before and after.

    Returns the exit status (negative: killed by that signal) and all it wrote.
    """
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child is a session leader; the pty is its terminal
        try:
            os.chdir(cwd)
            os.execvpe(argv[0], argv, env)
        finally:
            os._exit(127)
    if modes is not None:
        modes.append(termios.tcgetattr(fd))
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
            if keys:
                time.sleep(0.3)  # let the shell reach its wait for sleep
                os.write(fd, keys)
            if resize is not None:
                import fcntl
                import struct

                time.sleep(0.3)  # let the shell set its trap
                fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("hhhh", *resize, 0, 0))
            if then is not None:
                then()
            typed = True
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    if modes is not None:
        modes.append(termios.tcgetattr(fd))
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


def _runs(served: World, client: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """How to start ``corral``: in-process, and through the server with *client*."""
    return {
        "in-process": (client_command("corral"), {**served.environ, "CORRAL_SERVER": "off"}),
        client: (client_command(client), dict(served.environ)),
    }


def test_output_is_live_on_a_terminal(served: World, client: str) -> None:
    # Python block-buffers a pipe: 'ready' shows before the command ends only on a terminal
    script = (
        "import os, sys, time\n"
        "print('ready')\n"
        "while not os.path.exists('go'): time.sleep(0.05)\n"
        "print('done')\n"
    )
    World.write(served.ws("live.py"), script)
    for name, (argv, env) in _runs(served, client).items():
        go = served.ws("go")
        code, out = on_pty(
            [*argv, "run", "--timeout", "20s", "--", "/usr/bin/python3", "live.py"],
            env,
            served.workspace,
            then=lambda go=go: World.write(go, ""),
        )
        os.unlink(go)
        assert code == 0, (name, out)
        assert out.split() == [b"ready", b"done"], (name, out)


def test_the_command_sees_a_terminal_and_colours_unless_no_tty(served: World, client: str) -> None:
    script = (
        "echo ready; test -t 0 && echo in-tty; test -t 1 && echo out-tty; "
        "test -t 2 && echo err-tty >&2; ls --color=auto -d /"
    )
    for name, (argv, env) in _runs(served, client).items():
        env = {**env, "TERM": "xterm"}  # ls colours only a terminal type it knows
        code, out = on_pty([*argv, "run", "-c", script], env, served.workspace)
        assert code == 0, (name, out)
        # stdout and stderr are two streams (each digested): their order may vary
        assert {b"ready", b"in-tty", b"out-tty", b"err-tty"} <= set(out.split()), (name, out)
        assert b"\x1b[" in out, f"{name}: ls printed no colour ({out!r})"
        # --no-tty: as before, pipes (the terminal stays only stdin)
        code, out = on_pty([*argv, "run", "--no-tty", "-c", script], env, served.workspace)
        assert code == 0, (name, out)
        assert out.split() == [b"ready", b"in-tty", b"/"], (name, out)


def test_the_pty_keeps_the_output_cap_and_the_audit_digests(served: World, client: str) -> None:
    for name, (argv, env) in _runs(served, client).items():
        code, out = on_pty(
            [*argv, "run", "-c", "echo ready; printf 'a\\nb\\n'"],
            env,
            served.workspace,
        )
        assert code == 0, (name, out)
        record = json.loads(served.corral("audit", "--json", "-n", "1").stdout)
        # the bytes the command wrote, not the terminal's \r\n
        assert record["stdout"]["sha256"] == hashlib.sha256(b"ready\na\nb\n").hexdigest(), name
        code, out = on_pty(
            [*argv, "run", "--max-output", "1K", "-c", "echo ready; head -c 100000 /dev/zero"],
            env,
            served.workspace,
        )
        assert code == 0, (name, out)
        assert len(out) < 2000, f"{name}: the cap did not hold ({len(out)} bytes)"
        assert b"output limit (resources.output) reached" in out, (name, out[-300:])


def test_ctrl_c_as_an_unprivileged_user(world: World) -> None:
    # no writable cgroup and no bubblewrap info fd: the sandbox's init is found another way
    import pytest

    import corral
    from tests.conftest import corral_command, unreadable_for

    if os.geteuid() != 0:
        prefix: list[str] = []
    else:
        problem = unreadable_for(65534, corral_command()[0], os.path.dirname(corral.__file__))
        if problem is not None:
            pytest.skip(problem)
        for directory, dirs, files in os.walk(world.root):
            for name in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
                os.lchown(name, 65534, 65534)
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    options = ["run", "--memory", "none", "--pids", "none", "-c"]
    for script in SCRIPTS:
        bare = on_pty(["/bin/sh", "-c", script], world.environ, world.workspace, b"\x03")
        started = time.monotonic()
        code, out = on_pty(
            [*prefix, *corral_command(), *options, script], world.environ, world.workspace, b"\x03"
        )
        assert time.monotonic() - started < 30, out
        assert code == _as_exit_status(bare[0]), (script, code, bare, out)
        assert out.replace(b"^C", b"").split() == bare[1].replace(b"^C", b"").split()


def test_ctrl_backslash_and_a_resize_reach_the_command(served: World, client: str) -> None:
    import fcntl
    import struct
    import termios

    quit_script = "trap 'echo quit; exit 3' QUIT; echo ready; sleep 100; echo after"
    winch_script = (
        "trap 'echo size $(stty size <&2); exit 0' WINCH; echo ready; "
        "i=0; while [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done; echo timeout"
    )
    bare = on_pty(["/bin/sh", "-c", quit_script], served.environ, served.workspace, b"\x1c")
    assert bare[0] == 3 and b"quit" in bare[1]
    for name, (argv, env) in _runs(served, client).items():
        code, out = on_pty([*argv, "run", "-c", quit_script], env, served.workspace, b"\x1c")
        # dash reports its child's "Quit" on stderr: in any order with stdout's lines
        expected = (3, sorted(bare[1].replace(b"^\\", b"").split()))
        assert (code, sorted(out.replace(b"^\\", b"").split())) == expected, (name, out, bare)

        pid, fd = pty.fork()
        if pid == 0:
            try:
                os.chdir(served.workspace)
                os.execvpe(argv[0], [*argv, "run", "-c", winch_script], env)
            finally:
                os._exit(127)
        out = b""
        resized = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if not resized and READY in out:
                time.sleep(0.3)
                # the test's own terminal (the pty master it reads) gets a new size
                fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("hhhh", 33, 77, 0, 0))
                resized = True
        _, status = os.waitpid(pid, 0)
        os.close(fd)
        assert os.waitstatus_to_exitcode(status) == 0, (name, out)
        assert out.split() == [b"ready", b"size", b"33", b"77"], (name, out)


class Terminal:
    """An interactive bash with job control on a new pty: type lines, wait for output."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.chdir(cwd)
                argv = ["bash", "--norc", "--noprofile", "-i"]
                os.execvpe("bash", argv, {**env, "PS1": "$ ", "TERM": "dumb"})
            finally:
                os._exit(127)
        self.out = b""

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait_for(self, what: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while what not in self.out:
            assert time.monotonic() < deadline, (what, self.out)
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                self.out += os.read(self.fd, 4096)

    def close(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)


def _states(marker: str) -> dict[str, str]:
    """The state letter of each process whose command line holds *marker*: the sandboxed
    ``sh`` as ``"sh"``, ``corral run`` (or ``corral-client run``) as ``"corral"``."""
    found = {}
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
            if not any(marker.encode() in word for word in words):
                continue
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except (OSError, ValueError):
            continue
        state = stat[stat.rfind(b")") + 2 :].split()[0].decode()
        if words[0] == b"/bin/sh":
            found["sh"] = state
        elif b"run" in words[:3]:
            found["corral"] = state
    return found


def _stop_while_counting(terminal: Terminal, line: str, counter: str) -> str:
    """Type *line* (a command that writes a growing count to *counter*); once it counts, type
    Ctrl-Z. Returns the count, checked to stay the same while the job is stopped."""
    terminal.type(line)
    terminal.wait_for(b"ready")
    deadline = time.monotonic() + 30
    while not os.path.exists(counter):
        assert time.monotonic() < deadline, terminal.out
        time.sleep(0.05)
    terminal.type("\x1a")
    terminal.wait_for(b"Stopped")
    time.sleep(0.3)
    with open(counter, encoding="utf-8") as f:
        stopped_at = f.read()
    time.sleep(0.5)
    with open(counter, encoding="utf-8") as f:
        assert f.read() == stopped_at, terminal.out  # nothing in the sandbox runs
    return stopped_at


def test_ctrl_z_stops_the_whole_sandbox_and_fg_continues_it(served: World, client: str) -> None:
    """Ctrl-Z at a shell with job control: the job stops - corral and every process in its
    sandbox, also one that ignores SIGTSTP - and ``fg`` continues it to its normal end."""
    counter = os.path.join(served.workspace, "count")
    runs = _runs(served, client)
    if client != "corral":
        del runs["in-process"]  # once is enough: the corral client's pass runs it
    for name, (argv, env) in runs.items():
        marker = f"ctrl-z-{name}"
        script = (  # typed into bash in single quotes; re""ady: the echoed line is no match
            f'trap "" TSTP; echo {marker} >/dev/null; echo re""ady; '
            "i=0; while [ $i -lt 30 ]; do i=$((i+1)); echo $i > count; sleep 0.1; done; "
            'echo fini""shed'
        )
        terminal = Terminal(env, served.workspace)
        if os.path.exists(counter):
            os.unlink(counter)
        try:
            _stop_while_counting(terminal, f"{' '.join(argv)} run -c '{script}'\n", counter)
            assert _states(marker) == {"sh": "T", "corral": "T"}, name
            terminal.type("fg\n")
            terminal.wait_for(b"finished")
            terminal.type("echo status=$?\n")
            terminal.wait_for(b"status=0")
            with open(counter, encoding="utf-8") as f:
                assert f.read() == "30\n"
        finally:
            terminal.close()


def _engine_runs(
    served: World, client: str, engine: str
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """:func:`_runs` with *engine* (settings in the world): podman and docker with the built
    ``corral:python`` image, gVisor over the host's ``/``."""
    settings = os.path.join(served.root, f"{engine}.json")
    values: dict[str, object] = {"backend": engine}
    if engine != "gvisor":
        values["image"] = "corral:python"
    if engine in ("docker", "gvisor"):  # neither can take corral's write broker (refusals)
        values["allowDegraded"] = ["filesystem.protect"]
    with open(settings, "w") as f:
        json.dump(values, f)
    # one pass per client parameter (each pass starts containers): in-process with the Python
    # client's, through the server with the fast client's (the server's side is the same)
    runs = _runs(served, client)
    del runs["corral" if client == "corral" else "in-process"]
    # the image the fixture built, in the caller's cache (the world has a home of its own)
    extra = {"XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")}
    if "DOCKER_HOST" in os.environ:  # e.g. the private engine of tests/contract's conftest
        extra["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
    return {
        name: ([*argv, "run", "--settings", settings], {**env, **extra})
        for name, (argv, env) in runs.items()
    }


def _shown(out: bytes) -> list[bytes]:
    """The words of *out* without corral's warning about an allowed degradation."""
    lines = out.replace(b"^C", b"").splitlines()
    return b" ".join(line for line in lines if not line.startswith(b"corral: warning:")).split()


def _engine_at_a_terminal(served: World, client: str, engine: str) -> None:
    """At a terminal the engine gives the command a pty (``-i -t``; gVisor: runsc, through
    the console socket): it sees a terminal on
    stdin, stdout and stderr; it reads the typed line; Ctrl-C reaches its trap; the output cap
    and the audit digest hold over the engine's one stream (stdout and stderr merged, with the
    pty's ``\\r\\n``); the terminal's mode, which the engine sets raw, is restored after every run,
    also after a Ctrl-C and a timeout."""
    for name, (command, env) in _engine_runs(served, client, engine).items():
        modes: list[list[object]] = []
        script = (
            "import sys; print('ready', *(s.isatty() for s in (sys.stdin, sys.stdout, sys.stderr)))"
        )
        code, out = on_pty(
            [*command, "--", "python3", "-c", script], env, served.workspace, modes=modes
        )
        assert (code, _shown(out)) == (0, [b"ready", b"True", b"True", b"True"]), (name, out)
        assert modes[0] == modes[1], name

        script = "echo ready; read line; echo got=$line; echo err >&2"
        code, out = on_pty([*command, "-c", script], env, served.workspace, b"hello\n", modes=modes)
        assert (code, _shown(out)) == (0, [b"ready", b"hello", b"got=hello", b"err"]), (name, out)
        assert modes[2] == modes[3], name
        record = json.loads(served.corral("audit", "--json", "-n", "1").stdout)
        merged = b"ready\r\nhello\r\ngot=hello\r\nerr\r\n"  # the typed line is the pty's echo
        assert record["stdout"]["sha256"] == hashlib.sha256(merged).hexdigest(), (name, record)

        script = "trap 'echo trapped; exit 7' INT; echo ready; sleep 100 & wait"
        code, out = on_pty([*command, "-c", script], env, served.workspace, b"\x03", modes=modes)
        assert (code, _shown(out)) == (7, [b"ready", b"trapped"]), (name, out)
        assert modes[4] == modes[5], name

        script = "echo ready; head -c 100000 /dev/zero; echo after"
        code, out = on_pty(
            [*command, "--max-output", "1K", "-c", script], env, served.workspace, modes=modes
        )
        assert code == 0, (name, out[-300:])
        assert len(out) < 2000, f"{name}: the cap did not hold ({len(out)} bytes)"
        assert b"output limit (resources.output) reached" in out, (name, out[-300:])
        assert modes[6] == modes[7], name

        code, out = on_pty(
            [*command, "--timeout", "1s", "-c", "echo ready; sleep 100"],
            env,
            served.workspace,
            modes=modes,
        )
        assert code != 0 and b"ready" in out, (name, out)
        assert modes[8] == modes[9], name
        if engine == "gvisor":  # runsc, its gofer and its sandbox are gone
            assert _gvisor_processes(served) == [], name

        # a resize reaches the engine CLI, which resizes the container's pty (gVisor: corral
        # resizes the pty whose master it relays)
        script = (
            "trap 'echo size $(stty size); exit 0' WINCH; echo ready; "
            "i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; echo timeout"
        )
        code, out = on_pty([*command, "-c", script], env, served.workspace, resize=(33, 77))
        # the engine's signal proxy may pass the SIGWINCH on too: the trap can run twice.
        # podman may log on the terminal that a resize came before it marked the container
        # running (`level=error msg="container not running"`): its own line, not the command's
        lines = out.splitlines(keepends=True)
        out = b"".join(line for line in lines if b'msg="container not running"' not in line)
        assert (code, _shown(out)[:4]) == (0, [b"ready", b"size", b"33", b"77"]), (name, out)

        # --no-tty: pipes, as before (the terminal stays only stdin)
        code, out = on_pty(
            [*command, "--no-tty", "-c", "test -t 1 || echo no-tty; echo ready"],
            env,
            served.workspace,
        )
        assert (code, _shown(out)) == (0, [b"no-tty", b"ready"]), (name, out)


@needs_root
@needs_build
@needs_podman
def test_podman_at_a_terminal_gives_the_command_a_pty(
    served: World, client: str, built_python: str
) -> None:
    _engine_at_a_terminal(served, client, "podman")


@needs_root
@needs_build
def test_docker_at_a_terminal_gives_the_command_a_pty(
    served: World, client: str, built_python: str
) -> None:
    import pytest

    from corral.backends.docker import DockerBackend

    problem = DockerBackend().engine_problem(dict(os.environ))
    if problem is not None:  # tests/contract's conftest starts a private dockerd (DOCKER_HOST)
        pytest.skip(f"no Docker engine runs: {problem}")
    _engine_at_a_terminal(served, client, "docker")


@needs_root
@needs_build
@needs_podman
def test_podman_with_a_file_on_stdin_keeps_pipes_and_takes_ctrl_c(
    served: World, client: str, built_python: str
) -> None:
    """podman used to stop (SIGTTIN/SIGTTOU) with the terminal on its stdin: in a session of
    its own it runs, and Ctrl-C reaches the command's trap. With a file on its
    stdin the command gets pipes for its output (the engine's pty needs all three on the
    terminal), and Ctrl-C still reaches it (as a signal corral relays: no raw mode)."""
    for name, (command, env) in _engine_runs(served, client, "podman").items():
        World.write(served.ws("typed"), "hello\n")
        piped = ["/bin/sh", "-c", 'exec "$@" <typed', "sh", *command, "-c"]
        script = "test -t 1 || echo no-tty; echo ready; read line; echo got=$line"
        code, out = on_pty([*piped, script], env, served.workspace)
        assert (code, out.split()) == (0, [b"no-tty", b"ready", b"got=hello"]), (name, out)
        script = "trap 'echo trapped; exit 7' INT; echo ready; sleep 100 & wait"
        code, out = on_pty([*piped, script], env, served.workspace, b"\x03")
        assert (code, out.replace(b"^C", b"").split()) == (7, [b"ready", b"trapped"]), (
            name,
            out,
        )


def _command_lines() -> dict[int, str]:
    """Every process's command line (words joined by spaces), by pid."""
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
    return found


def _gvisor_processes(world: World) -> list[str]:
    """Command lines of runsc processes (runsc, its gofer, its sandbox) of *world*'s state."""
    state = os.path.join(world.state_dir, "gvisor")
    return [f"{pid}: {line}" for pid, line in _command_lines().items() if state in line]


@needs_root
@needs_runsc
def test_gvisor_at_a_terminal_gives_the_command_a_pty(served: World, client: str) -> None:
    """At a terminal runsc gives the command a pty (``process.terminal``) and hands its master
    to corral over the console socket: what :func:`_engine_at_a_terminal` checks for podman
    and docker holds; Ctrl-C is its pty's (a Python program's KeyboardInterrupt, exit 130) and
    leaves no runsc process. With stdout not a terminal the command keeps pipes."""
    _engine_at_a_terminal(served, client, "gvisor")
    for name, (command, env) in _engine_runs(served, client, "gvisor").items():
        modes: list[list[object]] = []
        script = "import time; print('ready', flush=True); time.sleep(100); print('after')"
        started = time.monotonic()
        code, out = on_pty(
            [*command, "--", "python3", "-c", script], env, served.workspace, b"\x03", modes=modes
        )
        assert time.monotonic() - started < 30, (name, out)
        assert code == 130 and b"KeyboardInterrupt" in out and b"after" not in out, (name, out)
        assert modes[0] == modes[1], name
        assert _gvisor_processes(served) == [], name

        # stdout not a terminal (stdin and stderr still are): pipes, as before
        piped = ["/bin/sh", "-c", 'exec "$@" >piped', "sh", *command, "--", "python3", "-c"]
        script = "import sys; print('tty', sys.stdout.isatty())"
        code, out = on_pty([*piped, script], env, served.workspace, wait_for=b"\0")
        with open(served.ws("piped"), "rb") as f:
            assert (code, f.read().split()) == (0, [b"tty", b"False"]), (name, out)


@needs_root
@needs_runsc
def test_gvisor_at_a_terminal_fails_closed_without_a_pty(world: World) -> None:
    """A runtime that connects to the console socket but hands over no terminal: the run fails
    (exit 125, a clear error), nothing it started is left running, the terminal's mode is
    restored and the socket's private (0700) directory is gone. A runtime that exits before it
    connects fails the run the same way, with its own message."""
    fake = os.path.join(world.root, "fake-bin")
    os.makedirs(fake)
    pids = os.path.join(world.root, "fake.pid")
    exits = os.path.join(world.root, "fake-exits")
    World.write(
        os.path.join(fake, "runsc"),
        "#!/usr/bin/python3\n"
        "import os, socket, sys, time\n"
        "args = sys.argv[1:]\n"
        "if '--version' in args: print('runsc version 0.0~20221219.0'); sys.exit(0)\n"
        "if 'run' not in args: sys.exit(0)\n"
        "path = args[args.index('--console-socket') + 1]\n"
        "mode = oct(os.stat(os.path.dirname(path)).st_mode & 0o777)\n"
        f"open({pids!r}, 'a').write(f'{{os.getpid()}} {{mode}} {{path}}\\n')\n"
        f"if os.path.exists({exits!r}): print('runsc: cannot boot', file=sys.stderr); sys.exit(3)\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(path); s.send(b'no terminal here')\n"
        "time.sleep(60)\n",
    )
    os.chmod(os.path.join(fake, "runsc"), 0o755)
    env = {**world.environ, "CORRAL_SERVER": "off", "PATH": f"{fake}:{world.environ['PATH']}"}
    modes: list[list[object]] = []
    command = [*client_command("corral"), "run", "--backend", "gvisor"]
    command += ["--allow-degraded", "filesystem.protect", "--", "true"]
    started = time.monotonic()
    code, out = on_pty(command, env, world.workspace, wait_for=b"\0", modes=modes)
    assert time.monotonic() - started < 30, out
    assert code == 125, out
    assert b"console socket" in out and b"expected one pty" in out, out
    assert modes[0] == modes[1]
    with open(pids) as f:
        pid, mode, path = f.read().split()
    assert mode == "0o700", path  # only corral's user reaches the socket
    assert not os.path.exists(f"/proc/{pid}"), out
    assert not os.path.exists(os.path.dirname(path)), path

    # a runtime that exits before it connects: the same, with its own message
    World.write(exits, "")
    code, out = on_pty(command, env, world.workspace, wait_for=b"\0", modes=modes)
    assert code == 125 and b"console socket" in out and b"runsc: cannot boot" in out, out
    assert modes[2] == modes[3]


def _mode(terminal: Terminal, tag: str) -> bytes:
    """The terminal's mode as ``stty -g`` prints it in *terminal*'s shell now."""
    terminal.type(f'stty -g; echo {tag}-""mode\n')  # -"": the echoed line is no match
    terminal.wait_for(f"\r\n{tag}-mode\r\n$ ".encode())  # and the next prompt
    lines = terminal.out.split(b"\r\n")
    return lines[lines.index(f"{tag}-mode".encode()) - 1]


@needs_root
@needs_runsc
def test_gvisor_at_a_terminal_ctrl_z_stops_the_job_and_fg_makes_the_terminal_raw_again(
    served: World, client: str
) -> None:
    """The terminal is raw while corral relays, but Ctrl-Z keeps its meaning there: corral's
    job stops with the sandbox, the shell gets its terminal back in its own mode, and ``fg``
    continues both with the terminal raw again (Ctrl-C then reaches the command's trap).
    corral stopped from outside (SIGTERM; through the server, its client killed) restores the
    terminal too and leaves no runsc process."""
    counter = os.path.join(served.workspace, "count")
    runs = _engine_runs(served, client, "gvisor")
    for name, (command, env) in runs.items():
        script = (  # typed into bash in single quotes; re""ady: the echoed line is no match
            'trap "echo trapped; exit 7" INT; echo re""ady; '
            "i=0; while [ $i -lt 100 ]; do i=$((i+1)); echo $i > count; sleep 0.1; done; "
            'echo fini""shed'
        )
        terminal = Terminal(env, served.workspace)
        if os.path.exists(counter):
            os.unlink(counter)
        try:
            before = _mode(terminal, "before")
            stopped_at = _stop_while_counting(
                terminal, f"{' '.join(command)} -c '{script}'\n", counter
            )
            assert _mode(terminal, "stopped") == before, (name, terminal.out)
            terminal.type("fg\n")
            deadline = time.monotonic() + 30
            with open(counter, encoding="utf-8") as f:
                while f.read() == stopped_at:
                    assert time.monotonic() < deadline, terminal.out
                    time.sleep(0.05)
                    f.seek(0)
            terminal.type("\x03")
            terminal.wait_for(b"trapped")
            terminal.wait_for(b"allowDegraded)\r\n$ ")  # typed earlier, keys go to the command
            terminal.type("echo status=$?\n")
            terminal.wait_for(b"status=7")
            assert b"finished" not in terminal.out, name
            assert _mode(terminal, "after") == before, (name, terminal.out)

            if name == "in-process":
                # a background job keeps pipes: corral reads no keys (SIGTTIN would stop it)
                terminal.out = b""
                script = 'test -t 1 || echo pi""ped; echo do""ne'
                terminal.type(f"{' '.join(command)} -c '{script}' &\n")
                terminal.wait_for(b"done")
                terminal.type("wait; jobs; echo status=$?\n")
                terminal.wait_for(b"status=0")
                assert b"piped" in terminal.out and b"Stopped" not in terminal.out, terminal.out

            # corral stopped from outside: SIGTERM in-process; through the server, its client
            # killed (SIGKILL: the server stops the run) - the terminal is restored all the same
            marker = f"gone-{name}-{os.path.basename(served.root)}"
            script = f'echo {marker} >/dev/null; echo re""ady; sleep 100'
            terminal.out = b""
            terminal.type(f"{' '.join(command)} -c '{script}'\n")
            terminal.wait_for(b"ready")
            (pid,) = [  # corral run, or corral-client run (not the sandbox's sh)
                p
                for p, line in _command_lines().items()
                if marker in line and not line.startswith("/bin/sh")
            ]
            os.kill(pid, 15 if name == "in-process" else 9)
            deadline = time.monotonic() + 30
            # the run is over once corral has exited and (through the server) runsc is gone
            while os.path.exists(f"/proc/{pid}") or _gvisor_processes(served):
                assert time.monotonic() < deadline, _gvisor_processes(served)
                time.sleep(0.1)
            assert _mode(terminal, "gone") == before, (name, terminal.out)
        finally:
            terminal.close()
