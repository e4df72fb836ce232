"""A kept session's next shell, started ahead of its call (issue 12: the Bash call's floor).

Each Bash call of a Claude Code session runs ``bash -c SCRIPT`` in the session's
kept sandbox (:mod:`corral.server._kept`). The sandbox's own ``bash`` start -
fork, exec, the dynamic loader, the locale - is the largest single piece of
such a call that corral does not share with a call without corral (~0.7 ms of
~9). So once a call has ended, the shell of the *next* call is started ahead:
the same program, in the same sandbox, directory and environment the next call
will have, its output on fresh pipes, its stdin ``/dev/null``, holding the
session's state channel (descriptor 63), and it waits on a pipe of its own:

    bash -c 'SECONDS=0; read -rn1 __corral_g <&62 || exit 125; ...; eval "$__corral_p"'

When the call comes, the server checks that it is what the shell was started
for - the same program with ``-c`` and one script, the same working directory,
the same environment to the byte (its sandbox id is the one chosen ahead), the
same state channel and ``/dev/null`` as stdin, and the shell still waiting -
writes the script to the shell's script channel (a ``memfd``: descriptor 61,
read in one piece) and one byte to its go pipe (descriptor 62); the shell
reads the script and ``eval``\\ s it, as ``bash -c SCRIPT`` would run it. Else
the shell is killed (the init's ``K``) and the call starts its own as before.

What the command sees is what ``bash -c SCRIPT`` gives it, except
``$BASH_EXECUTION_STRING`` (the loader) and ``$SECONDS`` (reset when the
script begins, not when bash started). Nothing of an earlier call reaches the
shell: it is started after the init swept every process of that call (the end
``D`` was read first), and its three channels are created for it alone - no
process of the sandbox but the shell itself holds them, and only the server
holds their other ends. Between calls it is a process of the sandbox, under the
sandbox's filters, blocked in ``read``; while it waits, the session's sandbox
counts as idle (the kept sandboxes' idle bound ends both).
"""

from __future__ import annotations

import os
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..backends._plan import LaunchPlan
    from ._outcome import Outcome
    from ._request import ExecRequest
    from ._resident import Resident, ResidentCommand, _Launched

__all__ = ["LOADER", "NextShell"]

#: what the shell started ahead runs: wait for the go, read the script (one piece: the
#: script channel is a memfd, which bash reads in blocks), close both channels, run it
LOADER = (
    "read -rn1 __corral_g <&62 || exit 125; exec 62<&-; unset __corral_g; SECONDS=0; "
    "IFS= read -r -d '' __corral_p <&61; exec 61<&-; eval \"$__corral_p\""
)
_SCRIPT_FD, _GO_FD = 61, 62  # where corral-exec --serve puts a request's 5th and 6th fds
#: how long a discarded shell may take to be killed and reaped before the sandbox is retired
_DISCARD_WITHIN = 5.0


class NextShell:
    """A shell started ahead, waiting in a resident sandbox (see the module docstring)."""

    __slots__ = ("argv0", "cwd", "environ", "go", "launched", "sandbox_id", "script", "state")

    def __init__(
        self,
        *,
        argv0: str,
        cwd: str,
        environ: bytes,
        launched: _Launched,
        script: int,
        go: int,
        sandbox_id: str,
        state: tuple[int, int],
    ) -> None:
        self.argv0 = argv0
        self.cwd = cwd
        self.environ = environ
        self.launched = launched
        self.script = script
        self.go = go
        self.sandbox_id = sandbox_id
        #: the state channel's identity (device, inode): a descriptor number can be reused
        self.state = state

    def fits(
        self,
        request: ExecRequest,
        cwd: str,
        argv: tuple[str, ...],
        environ: bytes,
        state_fd: int | None,
        streams: tuple[int, int, int],
    ) -> bool:
        """Whether the call planned as *cwd*, *argv*, *environ* is what this shell waits for."""
        return (
            len(argv) == 3
            and argv[0] == self.argv0
            and argv[1] == "-c"
            and cwd == self.cwd
            and environ == self.environ
            and state_fd is not None
            and _identity(state_fd) == self.state != (-1, -1)
            and request.sandbox_id == self.sandbox_id
            and not request.tty
            and (
                request.stdin_mode == "null"
                or (request.stdin_mode == "inherit" and _is_dev_null(streams[0]))
            )
        )

    def close(self) -> None:
        """Release our ends of its channels and output (the shell itself is the init's)."""
        for fd in (self.script, self.go, *self.launched.ours):
            try:
                os.close(fd)
            except OSError:
                pass
        self.script = self.go = -1
        self.launched.ours.clear()


def start_next(resident: Resident, request: ExecRequest, *, state_fd: int) -> NextShell | None:
    """Start the shell of *request* (``[shell, "-c", LOADER]``) ahead in *resident*, holding
    *state_fd* as its 63; the waiting shell, or ``None`` (not started: nothing is left over).

    The caller holds the resident's lock; no command runs there.
    """
    found = resident._plan(request)
    if found is None:
        return None
    plan, cwd, argv, environ = found
    if argv[1:] != ("-c", LOADER):
        return None
    body = resident._body(cwd, argv, environ)
    if body is None:
        return None
    script = os.memfd_create("corral-next-script", os.MFD_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    launched = None
    try:
        launched = resident._launch(request, body, (-1, -1, -1), (state_fd, script, go_r))
    finally:
        os.close(go_r)
        if launched is None:
            os.close(script)
            os.close(go_w)
    if launched is None:
        return None
    shell = NextShell(
        argv0=argv[0],
        cwd=cwd,
        environ=environ,
        launched=launched,
        script=script,
        go=go_w,
        sandbox_id=plan.sandbox_id,
        state=_identity(state_fd),
    )
    # the init answers P at once, or E (it spawned nothing) and D
    reply = _read_reply(resident, time.monotonic() + _DISCARD_WITHIN)
    if reply is None or not reply.startswith(b"P"):
        shell.close()
        if reply is None or reply.startswith(b"Einit-changed\t"):
            # no answer: its replies may be out of step now; or a command changed what
            # every command inherits from the init (native/exec/serve.c): retire it
            resident.broken = True
        elif not reply.startswith(b"D"):
            _drain_until_end(resident, time.monotonic() + _DISCARD_WITHIN)
        return None
    return shell


def waiting(resident: Resident) -> bool:
    """Whether the shell started ahead still waits: nothing from the init since its ``P``
    (an ``X`` - its exec failed - or its end ``D`` are read here and mean no)."""
    import select

    poller = select.poll()
    poller.register(resident._control, 0x001)
    if not poller.poll(0):
        return True
    _drain_until_end(resident, time.monotonic() + _DISCARD_WITHIN)
    return False


def discard(resident: Resident, shell: NextShell) -> bool:
    """Kill the shell started ahead and read the init's end of it; whether the sandbox can
    go on (one whose init does not answer within :data:`_DISCARD_WITHIN` s is retired)."""
    shell.close()
    resident.control(b"K")
    if _drain_until_end(resident, time.monotonic() + _DISCARD_WITHIN) and not resident.broken:
        return True
    resident.broken = True
    return False


def run_next(
    resident: Resident,
    shell: NextShell,
    request: ExecRequest,
    script: str,
    plan: LaunchPlan,
    on_start: Callable[[ResidentCommand], None] | None,
    streams: tuple[int, int, int],
) -> Outcome:
    """Give the waiting *shell* its *script* and supervise it as the command of *request*."""
    from ._resident import ResidentCommand

    launched = shell.launched
    for stream, index in zip(launched.outs, (1, 2), strict=True):
        stream.sink = None if request.capture else streams[index]
    data = os.fsencode(script) + b"\0"
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        offset += os.pwrite(shell.script, view[offset:], offset)
    handle = ResidentCommand(resident, plan.kill_grace, wakeable=on_start is not None)
    started, wall = time.monotonic(), time.time()
    try:
        os.write(shell.go, b"g")
    except OSError:
        pass  # it ended meanwhile: its D comes, and the outcome says how
    os.close(shell.go)
    os.close(shell.script)
    shell.go = shell.script = -1
    resident.commands += 1
    if on_start is not None:
        on_start(handle)
    return resident._supervise(plan, request, launched, handle, started, wall)


def _read_reply(resident: Resident, deadline: float) -> bytes | None:
    """The init's next message, or ``None`` (gone, or nothing before *deadline*)."""
    import select

    poller = select.poll()
    poller.register(resident._control, 0x001)
    left = deadline - time.monotonic()
    if left <= 0 or not poller.poll(left * 1000):
        return None
    try:
        reply = os.read(resident._control, 4096)
    except OSError:
        return None
    if not reply:
        resident.broken = True
        return None
    return reply


def _drain_until_end(resident: Resident, deadline: float) -> bool:
    """Read the init's messages up to the end of its command (``D``); whether it came."""
    while True:
        reply = _read_reply(resident, deadline)
        if reply is None:
            return False
        if reply.startswith(b"D"):
            return True


def _identity(fd: int) -> tuple[int, int]:
    """The (device, inode) of the open file *fd*; (-1, -1) when it cannot be told."""
    try:
        st = os.fstat(fd)
    except OSError:
        return (-1, -1)
    return (st.st_dev, st.st_ino)


def _is_dev_null(fd: int) -> bool:
    """Whether *fd* is the null device (what the shell started ahead has as its stdin)."""
    try:
        mine = os.fstat(fd)
        null = os.stat("/dev/null")
    except OSError:
        return False
    return stat.S_ISCHR(mine.st_mode) and mine.st_rdev == null.st_rdev
