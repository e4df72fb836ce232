"""The set-up half of a run: fds, the spawn, the cgroup, the release and the broker.

Everything here happens before the command may start; any failure is a
:class:`~corral.LaunchFailed` (exit 125) and :meth:`Running.start
<corral.pipeline._engine.Running.start>` releases what was acquired.
"""

from __future__ import annotations

import errno
import os
import sys
import time

from .._exceptions import LaunchFailed
from ._engine_state import _CHUNK, _POLLIN, _SETUP_TIMEOUT, _State, _Stream
from ._terminal import (
    ENGINE_CLI_BACKENDS,
    copy_window_size,
    in_directory,
    output_pty,
    starts_a_session,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


class _Setup(_State):
    """Spawn the plan's first process and bring the sandbox to the point where the command runs."""

    def _spawn(self) -> None:
        plan = self.plan
        self._terminal = self._on_one_terminal()
        argv = plan.terminal_argv if self._terminal else plan.argv
        if plan.backend in ENGINE_CLI_BACKENDS:
            argv = in_directory(argv, plan.cwd)
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
                if starts_a_session(argv):
                    group = {}
                elif plan.backend in ENGINE_CLI_BACKENDS and spawn is os.posix_spawn:
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
        (stdout and stderr merged); a pipe anywhere keeps the pipes. So does a
        corral in a background job of that terminal (``corral run ... &``): the
        engine's relay would set the shell's terminal raw and read its
        keystrokes, and the read would stop corral (SIGTTIN). Only a terminal
        that is this process's own can be asked; the corral server's client's is not.
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
        try:
            if os.tcgetpgrp(self._streams_in) != os.getpgrp():
                return False
        except OSError:
            pass  # not this process's controlling terminal (a corral server's client's)
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
                r, w = output_pty(sink)
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
        self._ptys.append((master, self._sinks[0]))  # resized on SIGWINCH (send_signal)
        copy_window_size(self._sinks[0], master)
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
                    if exc.errno == errno.ESRCH:  # it died in its set-up: say why
                        raise self._setup_failure(
                            "the sandbox exited before it could join its cgroup"
                        ) from exc
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


def _child_pid(info: bytes) -> int:
    from .._jsonfast import loads

    text = info.decode("utf-8", "replace")
    end = text.rfind("}")
    try:
        data = loads(text[: end + 1])
        return int(data["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise LaunchFailed(f"Failed to read bubblewrap's info: {text!r}") from exc
