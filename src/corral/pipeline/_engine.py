"""Carry out a LaunchPlan: spawn, contain, supervise, stop, and report an Outcome.

One synchronous engine serves every backend that runs a local process tree
(bubblewrap, landlock, none) and both faces of the SDK (the async twin runs
it in a worker thread). It uses only ``posix_spawn`` and ``poll`` - no
:mod:`subprocess`, :mod:`asyncio`, :mod:`signal` or :mod:`selectors`, whose
imports alone would cost more than the whole launch (docs/design.md,
"Start-up budget").

Sequence for one run::

    create fds (status pipe, BPF memfds, broker socket, info/block pipes, stdio)
    posix_spawn(plan.argv)                      bwrap or the exec helper
                                                (or a launcher thread's spawn from
                                                inside the run's cgroup: born there)
    [read bwrap --info-fd: the sandbox's first pid]
    [create the cgroup, move the sandbox's pids into it (unless born inside)]
    release --block-fd / --wait-fd               the command may start now
                                                (born inside, no proxy: written before the spawn)
    [receive the seccomp listener -> start the write broker]
    poll: relay output (cap, hash), feed stdin, watch the status pipe,
          the pidfd and the deadline (TERM -> grace -> KILL of the whole tree)
    reap; drain; collect OOM, violations; remove the cgroup

The exec helper's status pipe distinguishes "the sandbox could not be set up"
(:class:`~corral.LaunchFailed`, exit 125) from "the command ran" and from "the
command was not found/executable" (127/126).
"""

from __future__ import annotations

import _thread
import errno
import os
import sys
import time

from .._exceptions import BrokerFailed, LaunchFailed, ProxyStartFailed
from .._hashing import sha256 as _sha256
from ._outcome import NetworkAttempt, Outcome, Violation, command_status

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from ..backends._broker import Broker
    from ..backends._plan import LaunchPlan
    from ..egress import EgressHandle
    from ._cgroups import Cgroup, CgroupLayout
    from ._console import ConsoleRelay, ConsoleSocket

__all__ = ["Running", "run_plan"]

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


class Running:
    """A launched plan. Use :func:`run_plan` unless you need :meth:`send_signal`.

    ``start()`` raises :class:`~corral.LaunchFailed` if the sandbox cannot be
    set up; ``wait()`` returns the :class:`~corral.Outcome`. Thread-safe
    methods: :meth:`send_signal`, :meth:`cancel` and :meth:`kill` (e.g. from a
    signal handler or another thread).

    *streams* are the fds the command's stdin is inherited from
    (``stdin_mode="inherit"``) and its output is relayed to (default: this
    process's 0, 1, 2; the corral server passes its client's); with
    *output_tty* an output stream whose destination is a terminal is relayed
    from a pseudo-terminal instead of a pipe (:func:`_output_pty`; not for the
    container engines' CLIs, :data:`_ENGINE_CLI_BACKENDS`: pipes as with ``--no-tty``,
    unless stdin, stdout and stderr are one terminal and the plan has a
    ``terminal_argv``: then the engine gives the command a pty of its own, its
    CLI's output comes through a pty of corral's - relayed, capped, digested -
    and the terminal's mode, which the engine sets raw, is restored at the end; when that
    argv names :data:`~corral.backends._plan.CONSOLE_SOCKET` (runsc), the command's pty
    master comes over that socket and this engine relays it: :mod:`._console`). *stdio*
    instead hands three fds to the command as they are (a pty: no relay, no
    cap). *cgroup* is a group prepared ahead; when it has a ``spawner``
    (:mod:`corral.pipeline._launchers`) the first process is started by it, born
    inside the group, and is not moved afterwards.
    """

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
        self._output_tty = output_tty and plan.backend not in _ENGINE_CLI_BACKENDS
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

    # ------------------------------------------------------------ start
    def start(self) -> None:
        """Spawn the sandbox and release the command. Raises LaunchFailed.

        On any failure everything acquired so far (fds, the process, the
        prepared cgroup and its launcher) is released before the error
        propagates.
        """
        try:
            self._spawn()
            self._setup_phase()
        except BaseException:
            self._abort()
            raise

    def _spawn(self) -> None:
        plan = self.plan
        self._terminal = self._on_one_terminal()
        argv = plan.terminal_argv if self._terminal else plan.argv
        if self._terminal:
            from ..backends._plan import CONSOLE_SOCKET

            if any(CONSOLE_SOCKET in word for word in argv):
                from ._console import ConsoleSocket

                self._console = ConsoleSocket()
                path = self._console.path
                argv = tuple(word.replace(CONSOLE_SOCKET, path) for word in argv)
        if plan.egress is not None and plan.egress.netns == "fresh":
            # the sandbox joins a namespace by path as it starts: make it (the
            # proxy listening inside) first, and name it in the argv
            from ..backends._plan import NETNS_PATH
            from ..egress import start_in_fresh_namespace

            self._egress = start_in_fresh_namespace(plan.egress)
            path = self._egress.netns_path or ""
            argv = tuple(word.replace(NETNS_PATH, path) for word in argv)
        elif plan.egress is not None and plan.egress.netns == "unix":
            # the micro-VM's qemu connects to it per guest connection
            from ..egress import start_on_unix_socket

            self._egress = start_on_unix_socket(plan.egress)
        child_fds: list[tuple[int, int]] = []  # (parent fd, child number)
        to_close_after_spawn: list[int] = []
        try:
            for spec in plan.fds:
                if spec.kind == "data":
                    fd = os.memfd_create(f"corral-{spec.number}", os.MFD_CLOEXEC)
                    os.write(fd, spec.data)
                    os.lseek(fd, 0, os.SEEK_SET)
                    child_fds.append((fd, spec.number))
                    to_close_after_spawn.append(fd)
                elif spec.kind in ("status", "info"):
                    r, w = os.pipe2(os.O_CLOEXEC)
                    self._parent_fds[spec.kind] = r
                    child_fds.append((w, spec.number))
                    to_close_after_spawn.append(w)
                elif spec.kind == "block":
                    r, w = os.pipe2(os.O_CLOEXEC)
                    self._parent_fds["block"] = w
                    child_fds.append((r, spec.number))
                    to_close_after_spawn.append(r)
                elif spec.kind == "control":
                    # a resident session's control socket (the init's --serve)
                    import _socket

                    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
                    self._parent_fds["control"] = ours.detach()
                    fd = theirs.detach()
                    os.set_inheritable(fd, False)
                    os.set_inheritable(self._parent_fds["control"], False)
                    child_fds.append((fd, spec.number))
                    to_close_after_spawn.append(fd)
                elif spec.kind == "notify-sock":
                    import _socket  # not socket: its import (enum, selectors) costs ~4 ms

                    ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
                    self._parent_fds["notify"] = ours.detach()
                    fd = theirs.detach()
                    os.set_inheritable(fd, False)
                    os.set_inheritable(self._parent_fds["notify"], False)
                    child_fds.append((fd, spec.number))
                    to_close_after_spawn.append(fd)
                elif spec.kind == "pass":
                    # an fd the backend's launch opened (data: its number here); it stays
                    # the backend's to close
                    child_fds.append((int(spec.data), spec.number))
                else:
                    raise LaunchFailed(
                        f"Failed to prepare fd {spec.number}: unknown kind {spec.kind!r}"
                    )

            stdio = self._prepare_stdio(to_close_after_spawn)
            actions = _dup_actions([*zip(stdio, (0, 1, 2), strict=True), *child_fds])
            self._started = time.monotonic()
            self._wall_start = time.time()
            spawn = self._spawner()
            if self._born_inside and plan.egress is None and "block" in self._parent_fds:
                # Nothing to wait for: the cgroup is the one it is born in, and no proxy
                # has to listen first. The go-ahead is in the pipe before the spawn, so
                # bubblewrap (--block-fd) or the helper (--wait-fd) never stops on it.
                block = self._parent_fds.pop("block")
                os.write(block, b"g")
                os.close(block)
            try:
                # Python ignores SIGPIPE/SIGXFSZ; ignored dispositions survive exec,
                # so restore the defaults for the child (as subprocess does).
                group: dict[str, Any] = {"setpgroup": 0}
                if _starts_a_session(argv):
                    group = {}
                elif plan.backend in _ENGINE_CLI_BACKENDS and spawn is os.posix_spawn:
                    # a session of its own: the user's terminal on its stdin must not be
                    # its controlling terminal, or reading it from a background group stops it
                    group = {"setsid": True}
                self.pid = spawn(
                    argv[0],
                    list(argv),
                    dict(plan.env),
                    file_actions=actions,
                    setsigdef=(13, 25),
                    **group,
                )
            except OSError as exc:
                raise LaunchFailed(
                    f"Failed to start {plan.argv[0]}: {exc.strerror}",
                    hint="run 'corral doctor' to check the backend",
                ) from exc
            self._pidfd = os.pidfd_open(self.pid)
        finally:
            for fd in to_close_after_spawn:
                os.close(fd)
        for fd in self._parent_fds.values():
            os.set_blocking(fd, False)
        if self._stdin_fd >= 0:
            os.set_blocking(self._stdin_fd, False)
        for stream in self._streams:
            os.set_blocking(stream.fd, False)

    def _spawner(self) -> Callable[..., int]:
        """``os.posix_spawn``, or the prepared group's launcher (born inside the group).

        A launcher needs the group's final shape first: the limits are written
        and the controllers it joins are decided here, before the spawn.
        """
        group = self._prestaged
        limits = self.plan.cgroup
        if group is None or limits is None:
            return os.posix_spawn
        if self._layout is not None and not group.adopt(self._layout):
            group.remove()  # made for another layout: create the run's own group later
            self._prestaged = None
            return os.posix_spawn
        if group.spawner is None:
            return os.posix_spawn
        # With a pid namespace, killing its pid 1 stops everything: no freezer needed.
        freezer = self.plan.fd("info") is None
        pids = limits.pids
        if pids is not None and not freezer:
            # Born inside, bubblewrap's outer process (which never forks again) is in
            # the group too; moved in later, only the sandbox's pid 1 would be. One
            # more keeps the command's own budget the same.
            pids += 1
        try:
            group.set_limits(memory=limits.memory, pids=pids, cpus=limits.cpus, freezer=freezer)
        except OSError as exc:
            raise LaunchFailed(f"Failed to apply resource limits: {exc}") from exc
        self._born_inside = True
        self._cgroup, self._prestaged = group, None
        return group.spawner

    def _on_one_terminal(self) -> bool:
        """Whether the plan's ``terminal_argv`` applies: stdin, stdout and stderr are one terminal.

        Only then is what the user sees the same with the engine's single pty
        (stdout and stderr merged); a pipe anywhere keeps the pipes.
        """
        if not (self._may_use_terminal and self.plan.terminal_argv):
            return False
        devices = set()
        for fd in (self._streams_in, *self._sinks):
            try:
                if not os.isatty(fd):
                    return False
                devices.add(os.fstat(fd).st_rdev)
            except OSError:
                return False
        return len(devices) == 1

    def _prepare_stdio(self, close_later: list[int]) -> list[int]:
        if self._stdio is not None:
            return list(self._stdio)  # e.g. a pty for an interactive shell
        if self._stdin_mode == "inherit":
            stdin = self._streams_in
            if self._terminal:
                import termios

                try:  # the engine sets the terminal raw: restored in _release, however it ends
                    self._saved_mode = (stdin, termios.tcgetattr(stdin))
                except termios.error:
                    pass
            if self._console is not None:
                return self._console_stdio(close_later)
        elif self._stdin_mode == "data":
            r, w = os.pipe2(os.O_CLOEXEC)
            self._stdin_fd = w
            close_later.append(r)
            stdin = r
        else:
            stdin = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
            close_later.append(stdin)
        outs = []
        for index, sink in enumerate(self._sinks):
            if not self._capture and self.plan.output_limit is None and os.isatty(sink):
                outs.append(sink)  # a terminal: hand it over as is (no cap asked)
                continue
            # the engine CLI at a terminal writes the command's pty's output to its stdout
            as_terminal = self._output_tty or (self._terminal and index == 0)
            if as_terminal and not self._capture and os.isatty(sink):
                r, w = _output_pty(sink)
                self._ptys.append((r, sink))
            else:
                r, w = os.pipe2(os.O_CLOEXEC)
            close_later.append(w)
            stream = _Stream(r, None if self._capture else sink)
            self._streams.append(stream)
            if index == 0:
                self._out = stream
            else:
                self._err = stream
            outs.append(w)
        return [stdin, *outs]

    def _console_stdio(self, close_later: list[int]) -> list[int]:
        """The runtime's own stdio when the command's comes over the console socket.

        Nothing of the user's terminal: stdin ``/dev/null``; stdout and stderr
        one pipe for the runtime's own messages, relayed as stderr. The
        command's output becomes stdout once its pty master arrives
        (:meth:`_attach_console`).
        """
        stdin = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        r, w = os.pipe2(os.O_CLOEXEC)
        close_later += [stdin, w]
        self._err = _Stream(r, self._sinks[1])
        self._streams.append(self._err)
        return [stdin, w, w]

    def _attach_console(self, deadline: float) -> None:
        """Receive the command's pty master, relay it as stdout, set the terminal raw."""
        from ._console import ConsoleRelay

        assert self._console is not None
        try:
            master = self._console.receive(lambda fd: self._wait_readable(fd, deadline))
        except LaunchFailed as exc:
            raise LaunchFailed(
                f"{exc.message} (while waiting for the command's terminal on the console socket)",
                hint=exc.hint or "run with --no-tty to use pipes instead",
            ) from exc
        os.set_blocking(master, False)
        self._out = _Stream(master, self._sinks[0])
        self._streams.insert(0, self._out)
        self._ptys.append((master, self._sinks[0]))
        self._sync_window_sizes()
        self._relay = ConsoleRelay(master, self._streams_in)

    def _setup_phase(self) -> None:
        """Place the sandbox into its cgroup, release it, and attach the broker."""
        plan = self.plan
        deadline = self._started + _SETUP_TIMEOUT
        if plan.cgroup is not None:
            from ._cgroups import Cgroup

            # with a pid namespace, killing its pid 1 stops everything: no freezer needed
            freezer = plan.fd("info") is None
            limits = plan.cgroup
            if self._born_inside:
                pass  # self._cgroup is the group it was born in; limits written already
            elif self._prestaged is not None:
                self._cgroup, self._prestaged = self._prestaged, None
                self._cgroup.set_limits(
                    memory=limits.memory, pids=limits.pids, cpus=limits.cpus, freezer=freezer
                )
            else:
                if self._layout is None:
                    raise LaunchFailed(
                        "Failed to apply resource limits: no cgroup layout was probed"
                    )
                from ._cgroups import sweep

                sweep(self._layout)
                self._cgroup = Cgroup.create(
                    # several commands of one session may run at once: one group each
                    self._layout,
                    f"corral-{os.getpid()}-{plan.sandbox_id}-{self.pid}",
                    memory=limits.memory,
                    pids=limits.pids,
                    cpus=limits.cpus,
                    freezer=freezer,
                )
        elif self._prestaged is not None:
            self._prestaged.remove()
            self._prestaged = None
        if plan.broker is not None:
            # start the broker's thread now: it loads ctypes while bwrap sets up
            from ..backends._broker import Broker

            self._broker = Broker(plan.broker)
            self._broker.start()
        pids = [self.pid]
        if "info" in self._parent_fds:
            info = self._read_until(self._parent_fds["info"], b"}", deadline)
            self.sandbox_pid = _child_pid(info)
            # bubblewrap's outer process never forks again: only the sandbox's
            # pid 1 (and so everything below it) goes into the cgroup.
            pids = [self.sandbox_pid]
        if plan.egress is not None and plan.egress.netns == "sandbox":
            # the proxy must listen inside the sandbox's network before the command starts
            from ..egress import start_for_sandbox

            self._egress = start_for_sandbox(plan.egress, sandbox_pid=pids[-1])
        if self._cgroup is not None and not self._born_inside:
            for pid in pids:
                try:
                    self._cgroup.attach(pid)
                except OSError as exc:
                    raise LaunchFailed(
                        f"Failed to move the sandbox into its cgroup: {exc}"
                    ) from exc
        if "block" in self._parent_fds:
            try:
                os.write(self._parent_fds["block"], b"g")
            except OSError as exc:
                raise self._setup_failure(
                    f"the sandbox exited during set-up ({exc.strerror})"
                ) from exc
            os.close(self._parent_fds.pop("block"))
        if self._broker is not None:
            self._broker.attach(self._receive_listener(deadline), launcher_pid=self.pid)
        if self._console is not None:
            self._attach_console(deadline)

    def _read_until(self, fd: int, marker: bytes, deadline: float) -> bytes:
        data = bytearray()
        while marker not in data:
            self._wait_readable(fd, deadline)
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                raise self._setup_failure("the sandbox exited during set-up")
            data += chunk
        return bytes(data)

    def _receive_listener(self, deadline: float) -> int:
        import _socket

        fd = self._parent_fds.pop("notify")
        sock = _socket.socket(fileno=fd)
        try:
            while True:
                self._wait_readable(fd, deadline)
                try:
                    msg, ancdata, _flags, _addr = sock.recvmsg(1, _socket.CMSG_SPACE(4))
                except BlockingIOError:
                    continue
                for level, kind, data in ancdata:
                    if (
                        level == _socket.SOL_SOCKET
                        and kind == _socket.SCM_RIGHTS
                        and len(data) >= 4
                    ):
                        fds = [
                            int.from_bytes(data[i : i + 4], sys.byteorder, signed=True)
                            for i in range(0, len(data) - len(data) % 4, 4)
                        ]
                        for extra in fds[1:]:
                            os.close(extra)
                        os.set_inheritable(fds[0], False)
                        return fds[0]
                if not msg:
                    raise self._setup_failure(
                        "the sandbox exited before its write broker was attached"
                    )
        finally:
            sock.close()

    def _wait_readable(self, fd: int, deadline: float) -> None:
        """Poll *fd*, also watching the status pipe and the process; fail fast on errors."""
        import select

        poller = select.poll()
        poller.register(fd, _POLLIN)
        status = self._parent_fds.get("status", -1)
        if status >= 0:
            poller.register(status, _POLLIN)
        poller.register(self._pidfd, _POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchFailed("Failed to start the sandbox: set-up did not finish in time")
            events = dict(poller.poll(remaining * 1000))
            if status >= 0 and status in events:
                self._read_status()
                if b"\nE" in b"\n" + self._status:  # X (exec failed) is the command's result
                    raise self._setup_failure("")
            if fd in events:
                return
            if self._pidfd in events:
                raise self._setup_failure("the sandbox exited during set-up")

    def _read_status(self) -> None:
        fd = self._parent_fds.get("status", -1)
        if fd < 0:
            return
        while True:
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._status += chunk
            if self._status.startswith(b"R"):
                self._reached = True

    def _setup_failure(self, default: str) -> LaunchFailed:
        self._read_status()
        for line in bytes(self._status).decode("utf-8", "replace").splitlines():
            if line.startswith("E"):
                step, _, rest = line[1:].partition("\t")
                _err, _, text = rest.partition("\t")
                return LaunchFailed(f"Failed to {step.replace('-', ' ')} in the sandbox: {text}")
        detail = self._collect_stderr_now()
        message = f"Failed to start the sandbox: {default or 'set-up failed'}"
        if detail:
            message += f": {detail}"
        return LaunchFailed(message, hint="run 'corral doctor' to see what works on this machine")

    def _collect_stderr_now(self) -> str:
        """Whatever the backend tool (bwrap) printed before the command started."""
        text = bytes(self._held_stderr)
        if self._err is not None and self._err.fd >= 0:
            try:
                text += os.read(self._err.fd, _CHUNK)
            except OSError:
                pass
        return text.decode("utf-8", "replace").strip().splitlines()[-1] if text.strip() else ""

    def take_fd(self, kind: str) -> int:
        """Take over the parent end of the plan's *kind* fd (the caller closes it), or -1."""
        return self._parent_fds.pop(kind, -1)

    @property
    def broker(self) -> Broker | None:
        """The write broker serving this sandbox, once started."""
        return self._broker

    @property
    def cgroup(self) -> Cgroup | None:
        """The cgroup the sandbox runs in, once placed."""
        return self._cgroup

    # ------------------------------------------------------------ control
    def send_signal(self, signum: int) -> None:
        """Deliver *signum* to the command's process group, as a terminal would (Ctrl-C).

        The command's first process and what it started without job control
        share a process group (``sh -c 'sleep 100; echo after'``: the shell and
        the ``sleep``); a terminal signals that whole group, while a shell
        signalled alone would wait for its child first. Every member in the
        sandbox gets the signal, never the sandbox's init (with bubblewrap the
        group is the init's). A no-op once the command was reaped.
        """
        if self._reaped:
            return  # its pids may belong to other processes by now
        if signum in (18, 20):  # SIGCONT, SIGTSTP: the terminal's job control, for the sandbox
            self._suspend(signum == 20)
            if self._relay is not None and self._saved_mode is not None:
                # the user's shell gets its terminal back as it was; continued, raw again
                from ._console import set_raw

                if signum == 20:
                    _restore_terminal(*self._saved_mode)
                else:
                    set_raw(self._saved_mode[0])
                self._relay.pause(signum == 20)
                self._wake()
            return
        if signum == 28:  # SIGWINCH: the terminal was resized; so are corral's ptys first
            self._sync_window_sizes()
            if self._relay is not None:  # the pty's new size signals the command inside
                return
            if self._terminal:  # the engine CLI resizes the command's pty from its stdin's size
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    pass
                return
        init = self.sandbox_pid if self.sandbox_pid > 0 else self._unreported_init()
        tops = _children_of(init) if init > 0 else self._command_pids(top_only=True)
        if not tops and init > 0 and self.plan.backend == "bubblewrap":
            # corral's init has not forked the command yet: it takes the signal
            # (it handles the forwarded ones) and passes it on once it has
            try:
                os.kill(init, signum)
            except ProcessLookupError:
                pass
            return
        for top in tops:
            try:
                group = os.getpgid(top)
                if group == top:  # it leads its group (a session of its own): all in it
                    os.killpg(top, signum)
                    continue
            except ProcessLookupError:
                continue
            # a group led by the sandbox's init (bubblewrap's --new-session): its members
            members = {top}
            for pid in _pids_in_pidns_of(init) if init > 0 else ():
                try:
                    if pid != init and os.getpgid(pid) == group:
                        members.add(pid)
                except ProcessLookupError:
                    pass
            for pid in sorted(members):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    def _suspend(self, stop: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) every process of the command (Ctrl-Z, ``fg``).

        SIGSTOP, not the terminal's SIGTSTP: a program that catches or ignores
        SIGTSTP stops all the same, and so do processes in other groups
        (background jobs of the sandboxed shell). Processes forked while the
        tree is being stopped are caught by a second pass. The timeout keeps
        counting while the command is stopped.
        """
        signum = 19 if stop else 18
        seen: set[int] = set()
        for _ in range(3 if stop else 1):
            pids = [p for p in self._command_pids(top_only=False) if p not in seen]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
            seen.update(pids)
        if self.sandbox_pid <= 0 and self.pid > 0:  # no pid namespace: the command's group
            try:
                os.killpg(self.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _sync_window_sizes(self) -> None:
        """Give each output pty the window size of the terminal it is relayed to."""
        import fcntl
        import termios

        for master, terminal in self._ptys:
            try:
                size = fcntl.ioctl(terminal, termios.TIOCGWINSZ, b"\0" * 8)
                fcntl.ioctl(master, termios.TIOCSWINSZ, size)
            except OSError:
                pass  # closed meanwhile, or no terminal any more

    def _unreported_init(self) -> int:
        """The sandbox's pid-namespace init when bubblewrap did not report it (no info fd), or -1.

        That is the spawned process's only child living in another pid
        namespace. The init must never get the signal: sent from outside its
        namespace, a SIGINT it has no handler for kills it, and the sandbox with it.
        """
        if self.pid <= 0 or self.plan.backend != "bubblewrap":
            return -1
        try:
            own = os.readlink(f"/proc/{self.pid}/ns/pid")
        except OSError:
            return -1
        children = _children_of(self.pid)
        if len(children) != 1:
            return -1
        try:
            inner = os.readlink(f"/proc/{children[0]}/ns/pid")
        except OSError:
            return -1
        return children[0] if inner != own else -1

    def cancel(self) -> None:
        """Stop the command now: SIGTERM, then SIGKILL after the grace period."""
        self._cancelled = True
        if self._kill_at is None and not self._reaped:
            self._terminate()
        self._wake()

    def kill(self) -> None:
        """Stop the whole sandbox at once (SIGKILL), as if corral itself had died.

        The corral server calls this when its client goes away; :meth:`wait`
        then returns soon after.
        """
        self._cancelled = True
        if self._relay is not None:  # no more keys for the command: the terminal is the shell's
            self._relay.pause(True)
            if self._saved_mode is not None:
                _restore_terminal(*self._saved_mode)
        if self._reaped:
            return
        self._kill_at = time.monotonic()
        self._kill_everything()
        self._wake()

    def _wake(self) -> None:
        """Make :meth:`wait` recompute its poll timeout (it may wait on an older deadline)."""
        # Never blocks (a signal handler may interrupt the holder in this thread):
        # when the lock is taken, _release() is closing the fd or another wake writes.
        if not self._wake_lock.acquire(False):
            return
        try:
            if self._wake_fd >= 0:
                os.eventfd_write(self._wake_fd, 1)
        finally:
            self._wake_lock.release()

    def _command_pids(self, *, top_only: bool) -> list[int]:
        """Host pids of the command: bwrap's pid 2 (and below), or our child."""
        if self.sandbox_pid <= 0:
            return [self.pid] if self.pid > 0 else []
        if top_only:
            return _children_of(self.sandbox_pid)
        return [p for p in _pids_in_pidns_of(self.sandbox_pid) if p != self.sandbox_pid]

    def _terminate(self) -> None:
        for pid in self._command_pids(top_only=False):
            try:
                os.kill(pid, _sigterm())
            except ProcessLookupError:
                pass
        if self.sandbox_pid <= 0 and self.pid > 0:
            try:
                os.killpg(self.pid, _sigterm())
            except (ProcessLookupError, PermissionError):
                pass
        self._kill_at = time.monotonic() + self.plan.kill_grace

    def _kill_everything(self) -> None:
        if self.sandbox_pid <= 0 and self.pid > 0 and self.plan.fd("info") is not None:
            # Set-up not finished: bubblewrap may have cloned the sandbox's first process
            # without telling us yet, and that process waits for bubblewrap's go-ahead
            # with no parent-death signal: killing bubblewrap alone would leave it
            # waiting forever. Stop bubblewrap (so it cannot clone meanwhile), kill
            # its children, then it.
            try:
                os.kill(self.pid, 19)  # SIGSTOP
                for child in _children_of(self.pid):
                    os.kill(child, 9)
            except ProcessLookupError:
                pass
        if self.sandbox_pid > 0:
            try:
                os.kill(self.sandbox_pid, 9)  # pid 1 of the namespace: the kernel kills the rest
            except ProcessLookupError:
                pass
        if self.pid > 0:
            try:
                os.killpg(self.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass
        if self._cgroup is not None:
            self._cgroup.kill_all()

    # ------------------------------------------------------------ supervise
    def wait(self) -> Outcome:
        """Supervise until the command exits; return its Outcome (cleans up always)."""
        import select

        plan = self.plan
        deadline = self._started + plan.timeout if plan.timeout is not None else None
        limit = plan.output_limit
        kept = 0
        poller = select.poll()
        by_fd = {s.fd: s for s in self._streams}
        for fd in by_fd:
            poller.register(fd, _POLLIN)
        status_fd = self._parent_fds.get("status", -1)
        if status_fd >= 0:
            poller.register(status_fd, _POLLIN)
        if self._stdin_fd >= 0:
            poller.register(self._stdin_fd, _POLLOUT)
        poller.register(self._pidfd, _POLLIN)
        # cancel()/kill() may come from another thread or a signal handler while poll()
        # sleeps towards a deadline computed before them: they write here to wake it.
        # (_kill_at is read after this exists, so a cancel before it is seen too.)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        poller.register(self._wake_fd, _POLLIN)
        if self._relay is not None:
            self._relay.register(poller)
        exited_at: float | None = None
        wait_status: int | None = None
        try:
            while True:
                now = time.monotonic()
                timeouts = [t for t in (deadline, self._kill_at) if t is not None]
                if exited_at is not None:
                    timeouts.append(exited_at + _DRAIN_AFTER_EXIT)
                timeout_ms = None if not timeouts else max(0.0, min(timeouts) - now) * 1000
                if exited_at is not None and not by_fd:
                    break
                if self._relay is not None:
                    self._relay.sync()  # stopped (Ctrl-Z) or continued meanwhile
                events = poller.poll(timeout_ms)
                for fd, mask in events:
                    if fd == self._wake_fd:
                        try:
                            os.eventfd_read(fd)
                        except BlockingIOError:
                            pass
                    elif fd == self._pidfd:
                        if wait_status is None:
                            _, wait_status = os.waitpid(self.pid, 0)
                            self._reaped = True
                            exited_at = time.monotonic()
                            self._after_main_exit()
                        poller.unregister(fd)
                    elif fd == status_fd:
                        self._read_status()
                        if mask & (_POLLHUP | _POLLERR) and not mask & _POLLIN:
                            poller.unregister(fd)
                            status_fd = -1
                    elif fd == self._stdin_fd:
                        self._feed_stdin(poller)
                    elif self._relay is not None and self._relay.owns(fd):
                        self._relay.on_event(fd)
                    elif fd in by_fd:
                        stream = by_fd[fd]
                        try:
                            chunk = os.read(fd, _CHUNK)
                        except BlockingIOError:
                            continue
                        except OSError as exc:
                            if exc.errno != errno.EIO:
                                raise
                            chunk = b""  # a pty whose every slave fd is closed: its end
                        if not chunk:
                            poller.unregister(fd)
                            del by_fd[fd]
                            continue
                        kept = self._take(stream, chunk, limit, kept)
                now = time.monotonic()
                if (
                    deadline is not None
                    and now >= deadline
                    and not self._timed_out
                    and wait_status is None
                ):
                    self._timed_out = True
                    self._terminate()
                if self._kill_at is not None and now >= self._kill_at and wait_status is None:
                    self._kill_everything()
                    self._kill_at = None
                if exited_at is not None and now >= exited_at + _DRAIN_AFTER_EXIT:
                    break  # something still holds the pipes: stop waiting for it
        finally:
            if wait_status is None:
                self._kill_everything()
                try:
                    _, wait_status = os.waitpid(self.pid, 0)
                except ChildProcessError:
                    wait_status = 0
                self._reaped = True
            outcome = self._finish(wait_status)
        return outcome

    def _after_main_exit(self) -> None:
        """The spawned process exited: nothing of the sandbox may outlive it."""
        if self._relay is not None:
            self._relay.pause(True)  # the command is gone: typed keys are the shell's again
        if self.sandbox_pid <= 0:
            # no pid namespace (none/landlock): stop what the command left behind
            try:
                os.killpg(self.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        if self._cgroup is not None:
            self._cgroup.kill_all()

    def _feed_stdin(self, poller: object) -> None:
        data = self._stdin_data
        try:
            n = os.write(self._stdin_fd, data[:_CHUNK])
        except BlockingIOError:
            return
        except BrokenPipeError:
            n = len(data)
        self._stdin_data = data[n:]
        if not self._stdin_data:
            poller.unregister(self._stdin_fd)  # type: ignore[attr-defined]
            os.close(self._stdin_fd)
            self._stdin_fd = -1

    def _take(self, stream: _Stream, chunk: bytes, limit: int | None, kept: int) -> int:
        keep = stream.count(chunk, limit, kept)
        if keep:
            if stream.sink is None:
                stream.buf += keep
            elif stream is self._err and not self._reached and self.plan.fd("status") is not None:
                self._held_stderr += keep  # bwrap's own errors: shown only if set-up failed
            else:
                self._flush_held()
                _write_all(stream.sink, keep)
        return kept + len(keep)

    def _flush_held(self) -> None:
        if self._held_stderr and self._reached and self._err is not None:
            _write_all(self._err.sink, bytes(self._held_stderr))
            self._held_stderr.clear()

    # ------------------------------------------------------------ finish
    def _finish(self, wait_status: int) -> Outcome:
        plan = self.plan
        duration = time.monotonic() - self._started
        self._read_status()
        self._reached = self._reached or self._status.startswith(b"R")
        self._flush_held()
        violations: list[Violation] = []
        broker_error: BaseException | None = None
        if self._broker is not None:
            self._broker.stop()
            violations.extend(self._broker.violations)
            broker_error = self._broker.error
        oom = bool(self._cgroup is not None and self._cgroup.oom_killed())
        network: tuple[NetworkAttempt, ...] = ()
        egress_error: BaseException | None = None
        if self._egress is not None:
            network = tuple(self._egress.close())
            egress_error = self._egress.error
            violations.extend(
                Violation(kind="network", target=a.target, rule=a.rule, operation=a.method)
                for a in network
                if a.decision == "deny"
            )
            self._egress = None
        self._release()

        exit_code: int | None = None
        signal: int | None = None
        if os.WIFSIGNALED(wait_status):
            signal = os.WTERMSIG(wait_status)
        else:
            exit_code = os.waitstatus_to_exitcode(wait_status)
        status_text = bytes(self._status).decode("utf-8", "replace")
        for line in status_text.splitlines():
            if line.startswith("S") and line[1:].isdigit():
                # the sandbox's init reports how the command died (it cannot die of it itself)
                signal, exit_code = int(line[1:]), None
            if line.startswith("E"):
                step, _, rest = line[1:].partition("\t")
                _err, _, text = rest.partition("\t")
                raise LaunchFailed(f"Failed to {step.replace('-', ' ')} in the sandbox: {text}")
        if (
            not self._reached
            and plan.fd("status") is not None
            and not self._timed_out
            and not self._cancelled
        ):
            detail = bytes(self._held_stderr).decode("utf-8", "replace").strip()
            raise LaunchFailed(
                f"Failed to start the sandbox: {detail or 'the backend exited before the command ran'}",
                hint="run 'corral doctor' to see what works on this machine",
            )
        if broker_error is not None:
            raise BrokerFailed(
                f"Failed to supervise workspace writes: {broker_error}"
            ) from broker_error
        if egress_error is not None:
            raise ProxyStartFailed(
                f"Failed to run the egress proxy: {egress_error}"
            ) from egress_error
        stdout = self._out or _Stream(-1, None)
        stderr = self._err or _Stream(-1, None)
        dropped = sum(s.dropped for s in self._streams)
        exit_code, signal = command_status(exit_code, signal)
        if oom and signal is None and exit_code is not None and exit_code >= 128:
            signal, exit_code = 9, None
        failure = self.exec_failure()
        exec_error = f"{failure[1]}: {os.strerror(failure[0])}" if failure is not None else None
        return Outcome(
            sandbox_id=plan.sandbox_id,
            backend=plan.backend,
            argv=plan.display_argv or plan.argv,
            exit_code=exit_code,
            signal=signal,
            timed_out=self._timed_out,
            oom_killed=oom,
            stdout=bytes(stdout.buf),
            stderr=bytes(stderr.buf),
            stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated,
            output_dropped=dropped,
            duration=duration,
            started_at=self._wall_start,
            violations=tuple(violations),
            network=network,
            degraded=plan.degraded,
            unsandboxed=plan.unsandboxed,
            exec_error=exec_error,
            credentials=plan.credentials,
            stdout_sha256=stdout.digest.hexdigest() if self._out is not None else "",
            stderr_sha256=stderr.digest.hexdigest() if self._err is not None else "",
            stdout_size=stdout.size,
            stderr_size=stderr.size,
        )

    def exec_failure(self) -> tuple[int, str] | None:
        """``(errno, program)`` when the command could not be executed, else ``None``."""
        for line in bytes(self._status).decode("utf-8", "replace").splitlines():
            if line.startswith("X"):
                code, _, program = line[1:].partition("\t")
                try:
                    return int(code), program
                except ValueError:
                    return errno.ENOENT, program
        return None

    def _abort(self) -> None:
        if self.pid > 0:
            self._kill_everything()
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        if self._broker is not None:
            self._broker.stop()
        if self._egress is not None:
            self._egress.close()
            self._egress = None
        self._release()

    def _release(self) -> None:
        self._ptys = []  # before their masters close: a late SIGWINCH must not resize a reused fd
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if self._console is not None:
            self._console.close()
            self._console = None
        if self._saved_mode is not None:
            _restore_terminal(*self._saved_mode)
            self._saved_mode = None
        if self._prestaged is not None:
            self._prestaged.remove()
            self._prestaged = None
        if self._cgroup is not None:
            self._cgroup.kill_all()
            self._cgroup.remove()
            self._cgroup = None
        for fd in [
            *self._parent_fds.values(),
            self._pidfd,
            self._stdin_fd,
            *(s.fd for s in self._streams),
        ]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._parent_fds.clear()
        self._pidfd = self._stdin_fd = -1
        with self._wake_lock:
            if self._wake_fd >= 0:
                os.close(self._wake_fd)
                self._wake_fd = -1
        for stream in self._streams:
            stream.fd = -1


def run_plan(
    plan: LaunchPlan,
    *,
    stdin_mode: str = "null",
    stdin_data: bytes = b"",
    capture: bool = True,
    cgroup_layout: CgroupLayout | None = None,
) -> Outcome:
    """Launch *plan*, wait for it, and return the Outcome.

    Raises:
        LaunchFailed: the sandbox could not be set up; nothing ran.
        BrokerFailed: the write broker failed while the command ran.
    """
    running = Running(
        plan,
        stdin_mode=stdin_mode,
        stdin_data=stdin_data,
        capture=capture,
        cgroup_layout=cgroup_layout,
    )
    running.start()
    return running.wait()


# ---------------------------------------------------------------- helpers
def _output_pty(terminal: int) -> tuple[int, int]:
    """A pseudo-terminal for output bound for *terminal*: ``(master, slave)``, both close-on-exec.

    The slave gets *terminal*'s window size, and no output processing (no
    ``\n`` -> ``\r\n``): the bytes read from the master - relayed, capped and
    digested like a pipe's - are the bytes the command wrote; the user's own
    terminal does the translation. Nothing is typed into it: the command's
    stdin stays what it was, so the slave is nobody's controlling terminal.
    """
    import fcntl
    import termios

    master, slave = os.openpty()  # non-inheritable: posix_spawn's dup2 places the slave
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        try:
            size = fcntl.ioctl(terminal, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
        except OSError:
            pass  # no size known: the pty's default
    except BaseException:
        os.close(master)
        os.close(slave)
        raise
    return master, slave


def _restore_terminal(fd: int, attrs: list[Any]) -> None:
    """Put *fd*'s terminal back in mode *attrs* if it changed (an engine CLI left it raw).

    SIGTTOU is blocked meanwhile: corral in a background job may still restore it.
    """
    import signal
    import termios

    try:
        if termios.tcgetattr(fd) == attrs:
            return
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            termios.tcsetattr(fd, termios.TCSANOW, attrs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    except (termios.error, OSError):
        pass  # no terminal any more (closed, hung up): nothing to restore


#: Backends whose first process is a container engine's CLI (their stdio is relayed by it).
_ENGINE_CLI_BACKENDS = frozenset({"podman", "docker", "gvisor"})


def _starts_a_session(argv: Sequence[str]) -> bool:
    """Whether the spawned program makes itself a session leader (the exec helper's ``--setsid``).

    Every other first process (bubblewrap, runsc, podman) gets a process group
    of its own: Ctrl-C at corral's terminal then signals corral's group only,
    and corral hands it to the command's group (:meth:`Running.send_signal`);
    bubblewrap left in the terminal's group would die of it and take the
    sandbox along, before the command's own handler could run. A process that
    leads a group can no longer ``setsid``, so the helper is left as it is.
    """
    options = argv[: argv.index("--")] if "--" in argv else argv
    return "--setsid" in options


def _dup_actions(pairs: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """posix_spawn file actions placing each parent fd at its child number.

    Two stages (first to scratch numbers above every fd involved, then to the
    targets) so that a parent fd whose number is another's target cannot be
    clobbered, and every target ends up without FD_CLOEXEC.
    """
    top = max([fd for pair in pairs for fd in pair] + [2]) + 1
    actions: list[tuple[int, ...]] = []
    for i, (parent_fd, _child) in enumerate(pairs):
        actions.append((os.POSIX_SPAWN_DUP2, parent_fd, top + i))
    for i, (_parent_fd, child) in enumerate(pairs):
        actions.append((os.POSIX_SPAWN_DUP2, top + i, child))
    for i in range(len(pairs)):
        actions.append((os.POSIX_SPAWN_CLOSE, top + i))
    return actions


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


def _child_pid(info: bytes) -> int:
    from .._jsonfast import loads

    text = info.decode("utf-8", "replace")
    end = text.rfind("}")
    try:
        data = loads(text[: end + 1])
        return int(data["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise LaunchFailed(f"Failed to read bubblewrap's info: {text!r}") from exc


def _children_of(ppid: int) -> list[int]:
    """Pids whose parent is *ppid* (scans /proc; used only to deliver signals)."""
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == ppid:
            found.append(int(name))
    return found


def _pids_in_pidns_of(pid: int) -> list[int]:
    """Every host pid in the same pid namespace as *pid*."""
    try:
        target = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") == target:
                found.append(int(name))
        except OSError:
            continue
    return found
