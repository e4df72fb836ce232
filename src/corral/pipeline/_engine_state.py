"""What every part of a running plan shares: its fields, output streams and constants.

:class:`~corral.pipeline._engine.Running` is put together from
:class:`_State` (the fields, made here), the set-up half
(:mod:`._engine_setup`), the control half (:mod:`._engine_control`) and the
supervision in :mod:`._engine`.
"""

from __future__ import annotations

import _thread
import os

from .._hashing import sha256 as _sha256
from ._terminal import ENGINE_CLI_BACKENDS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..backends._broker import Broker
    from ..backends._plan import LaunchPlan
    from ..egress import EgressHandle
    from ._cgroups import Cgroup, CgroupLayout
    from ._console import ConsoleRelay, ConsoleSocket

_POLLIN, _POLLOUT, _POLLERR, _POLLHUP, _POLLNVAL = 0x001, 0x004, 0x008, 0x010, 0x020
_CHUNK = 65536
_DRAIN_AFTER_EXIT = 2.0
_SETUP_TIMEOUT = 30.0


def _sigterm() -> int:
    return 15


class _Stream:
    """One output stream: read end, destination, digest, kept bytes."""

    __slots__ = ("buf", "digest", "dropped", "fd", "sink", "size", "truncated")

    def __init__(self, fd: int, sink: int | None) -> None:
        self.fd = fd
        self.sink = sink  # our fd to copy to (streaming), or None (capture)
        self.buf = bytearray()
        self.digest = _sha256()
        self.size = 0
        self.dropped = 0
        self.truncated = False

    def count(self, chunk: bytes, limit: int | None, kept: int) -> bytes:
        """Digest and count *chunk*; the part of it within the output cap (*kept* so far)."""
        self.digest.update(chunk)
        self.size += len(chunk)
        if limit is None or kept + len(chunk) <= limit:
            return chunk
        keep = chunk[: max(0, limit - kept)]
        self.dropped += len(chunk) - len(keep)
        self.truncated = True
        return keep


class _State:
    """The fields of one launched plan (see :class:`~corral.pipeline._engine.Running`)."""

    def __init__(
        self,
        plan: LaunchPlan,
        *,
        stdin_mode: str = "null",
        stdin_data: bytes = b"",
        capture: bool = True,
        output_tty: bool = False,
        cgroup_layout: CgroupLayout | None = None,
        streams: tuple[int, int, int] = (0, 1, 2),
        stdio: tuple[int, int, int] | None = None,
        cgroup: Cgroup | None = None,
    ) -> None:
        self.plan = plan
        # a container engine's CLI relays the command's stdio itself (the command would see
        # no terminal through a pty of ours), and podman with terminals on both its stdin and
        # its stdout hung (observed through the server, where it has no controlling terminal)
        self._output_tty = output_tty and plan.backend not in ENGINE_CLI_BACKENDS
        self._ptys: list[tuple[int, int]] = []  # (pty master, the terminal it relays to)
        # the engine CLI's terminal mode (decided at the spawn: _on_one_terminal)
        self._may_use_terminal = (
            output_tty and not capture and stdio is None and stdin_mode == "inherit"
        )
        self._terminal = False
        self._saved_mode: tuple[int, list[Any]] | None = None  # (fd, termios attributes)
        self._console: ConsoleSocket | None = None  # where runsc sends the command's pty master
        self._relay: ConsoleRelay | None = None  # keystrokes into that master
        self._stdin_mode = stdin_mode
        self._stdin_data = memoryview(stdin_data)
        self._capture = capture
        self._layout = cgroup_layout
        self._streams_in = streams[0]
        self._sinks = streams[1:]
        self._stdio = stdio
        self.pid = -1
        self.sandbox_pid = -1  # bubblewrap's pid 1 in the sandbox (host pid)
        self._pidfd = -1
        self._parent_fds: dict[str, int] = {}
        self._streams: list[_Stream] = []
        self._out: _Stream | None = None
        self._err: _Stream | None = None
        self._stdin_fd = -1
        self._cgroup: Cgroup | None = None
        self._prestaged = cgroup
        self._born_inside = False  # the first process was spawned inside self._prestaged
        self._reaped = False  # waitpid() returned: signals must not go to its (reusable) pids
        self._broker: Broker | None = None
        self._egress: EgressHandle | None = None
        self._status = bytearray()
        self._started = 0.0
        self._wall_start = 0.0
        self._timed_out = False
        self._cancelled = False
        self._kill_at: float | None = None
        self._wake_fd = -1  # an eventfd: cancel()/kill() from elsewhere wake wait()'s poll
        self._wake_lock = _thread.allocate_lock()  # closing it never races a write to it
        self._reached = False
        self._held_stderr = bytearray()


def _write_all(fd: int | None, data: bytes) -> None:
    if fd is None:
        return
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            import select

            select.select([], [fd], [], 1.0)
            continue
        except (BrokenPipeError, OSError):
            return  # our reader went away; keep draining the command
        view = view[n:]
