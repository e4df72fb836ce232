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

import errno
import os
import time

from .._exceptions import BrokerFailed, LaunchFailed, ProxyStartFailed
from ._engine_control import _Control
from ._engine_setup import _Setup
from ._engine_state import (
    _CHUNK,
    _DRAIN_AFTER_EXIT,
    _POLLERR,
    _POLLHUP,
    _POLLIN,
    _POLLOUT,
    _Stream,
    _write_all,
)
from ._outcome import NetworkAttempt, Outcome, Violation, command_status
from ._terminal import restore_terminal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..backends._broker import Broker
    from ..backends._plan import LaunchPlan
    from ._cgroups import Cgroup, CgroupLayout

__all__ = ["Running", "run_plan"]


class Running(_Setup, _Control):
    """A launched plan. Use :func:`run_plan` unless you need :meth:`send_signal`.

    ``start()`` raises :class:`~corral.LaunchFailed` if the sandbox cannot be
    set up; ``wait()`` returns the :class:`~corral.Outcome`. Thread-safe
    methods: :meth:`send_signal`, :meth:`cancel` and :meth:`kill` (e.g. from a
    signal handler or another thread).

    *streams* are the fds the command's stdin is inherited from
    (``stdin_mode="inherit"``) and its output is relayed to (default: this
    process's 0, 1, 2; the corral server passes its client's); with
    *output_tty* an output stream whose destination is a terminal is relayed
    from a pseudo-terminal instead of a pipe (:func:`~corral.pipeline._terminal.output_pty`; not for the
    container engines' CLIs, :data:`~corral.pipeline._terminal.ENGINE_CLI_BACKENDS`: pipes as with ``--no-tty``,
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
            restore_terminal(*self._saved_mode)
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
