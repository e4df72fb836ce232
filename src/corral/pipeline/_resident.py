"""Resident sessions: one sandbox kept alive, whose init spawns each further command.

A fresh sandbox per command costs a bubblewrap start (namespaces, mounts,
the ``--as-user`` stage, the filters): ~10-30 ms. A session (SDK
:class:`~corral.Sandbox`, MCP ``sandbox_create``) instead keeps one sandbox
whose pid 1 is the exec helper in ``--init --serve`` mode
(``native/exec/serve.c``, ``cx_serve_main``): every filter is installed once,
and each command is one fork and exec of that init, in the same namespaces and
under the same filters.

What stays per command, exactly as in a fresh sandbox:

* the plan: each request is planned by the backend as for a fresh run; it runs
  in the resident sandbox only when that plan has the *same shape* (every
  mount, fd, filter, broker, cgroup and proxy setting; only the working
  directory, the command, its environment, timeout and output cap may differ).
  Anything else (another policy from ``rules``, a different cwd mount) runs
  in a fresh sandbox, so a resident run never has other rules than a fresh one;
* its own timeout (TERM to every process of the sandbox, KILL after the
  grace), output cap and digests, stdin (data, ``/dev/null``, or the
  caller's own stdin when it is not a terminal);
* nothing of a command survives into the next: when the command's first
  process ends, the init kills and reaps every other process of the
  namespace before it reports the end;
* the write broker's git check runs after each command (the broker itself
  serves the whole session) and its violations are the command's;
* the host the mounts were decided from: the kept sandbox's masks and binds
  were planned from the host paths the policy names (secrets, carve-outs,
  writable and write-denied paths, the workspace) and what the ``denyRead``
  globs matched when it started. Before each command those paths are looked
  at again (kind, device, inode, birth or change time: :func:`_looked_at`); if
  any differs - a secret the host created since, a masked file the host
  replaced by a rename (which detaches a mount on it in every other mount
  namespace), a new glob match - the sandbox is retired and the command runs
  in a fresh one, planned from the host as it is now. The first command,
  run right after the sandbox was opened (:meth:`Resident.run` called next),
  is not looked at twice: the opening's look precedes it by as little as a
  fresh sandbox's plan precedes its command.

Not resident (a fresh sandbox as before): other backends, previews (the
preview is held and recorded per run), the egress proxy (its log is per
run), terminals (also a caller's stdin or output on one), background
processes (the SDK's ``spawn`` asks for a fresh sandbox), and a second
command while one runs (the async twin may run several at once). A resident
sandbox whose memory limit killed something is retired: the next command
gets a new one.
"""

from __future__ import annotations

import _socket
import _thread
import os
import sys
import time

from .._exceptions import BrokerFailed, LaunchFailed
from ._engine import Running
from ._engine_state import _Stream, _write_all
from ._outcome import Outcome, command_status
from ._resident_look import _Looked, _looked_at

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ..backends._plan import LaunchPlan
    from ..policy import Policy
    from ._launchers import LauncherPool
    from ._request import ExecRequest
    from ._resident_next import NextShell
    from ._runner import Prepared

__all__ = ["Resident", "ResidentCommand"]

_POLLIN, _POLLOUT = 0x001, 0x004
_CHUNK = 65536
_CONTROL_FD = 9  # bubblewrap's plan uses 3..8
_MAX_REQUEST = 200 * 1024  # the init's buffer is 256 KiB
_MAX_WORDS = 4000  # arguments, and environment entries: the init takes 4096 of each


def _with_id(env: tuple[tuple[str, str], ...], sandbox_id: str) -> tuple[tuple[str, str], ...]:
    """*env* with ``CORRAL_SANDBOX_ID`` set to *sandbox_id* (where it is set)."""
    return tuple((n, sandbox_id if n == "CORRAL_SANDBOX_ID" else v) for n, v in env)


def _id_only_as_variable(plan: LaunchPlan, cwd: str) -> bool:
    """Whether the plan's sandbox id is nowhere in its environment but ``CORRAL_SANDBOX_ID``
    (nor in *cwd*): then a plan for another id is this one with that variable replaced."""
    sid = plan.sandbox_id
    if not sid:
        return True
    found = [n for n, v in plan.env if sid in n or sid in v]
    return found == ["CORRAL_SANDBOX_ID"] and dict(plan.env)[found[0]] == sid and sid not in cwd


def _encoded(env: tuple[tuple[str, str], ...], cwd: str) -> bytes:
    """*env* as the init takes it: ``NAME=value`` entries, each ended by a NUL, with ``PWD``
    set to *cwd* as bubblewrap sets it for a fresh sandbox's command (after ``--chdir``)."""
    entries = [os.fsencode(f"{name}={value}") for name, value in env if not cwd or name != "PWD"]
    if cwd:
        entries.append(os.fsencode(f"PWD={cwd}"))
    return b"\0".join(entries) + b"\0"


def _helper_index(argv: tuple[str, ...]) -> int:
    """Index of the exec helper's ``--init`` in a bubblewrap plan's argv, or -1."""
    for index in range(len(argv) - 1, 0, -1):
        if argv[index] == "--init" and argv[index - 1].endswith("corral-exec"):
            return index
    return -1


def _split(plan: LaunchPlan) -> tuple[tuple[object, ...], str, tuple[str, ...]] | None:
    """``(shape, cwd, command argv)`` of a bubblewrap plan, or ``None`` if it has no init.

    The shape is everything but the working directory and the command.
    """
    argv = plan.argv
    init = _helper_index(argv)
    if init < 0:
        return None
    end = argv.index("--", init)
    command = argv[end + 1 :]
    sandbox = list(argv[:init])
    cwd = ""
    for index in range(len(sandbox) - 1):
        if sandbox[index] == "--chdir":
            cwd = sandbox[index + 1]
            sandbox[index + 1] = ""
    shape = (
        tuple(sandbox),
        argv[init:end],
        plan.fds,
        plan.broker,
        plan.cgroup,
        plan.egress,
        plan.unsandboxed,
        plan.degraded,
        plan.files,
        plan.credentials,
        plan.kill_grace,
    )
    return shape, cwd, command


class _InitChanged(Exception):
    """The init refused to spawn: a command had changed what every command inherits from it
    (``native/exec/serve.c``, ``init_state``). Nothing ran; the sandbox is retired."""


class _Launched:
    """A command the init was asked to start: its output streams, our descriptors (closed
    when it is supervised) and the write end of its stdin pipe (-1: none)."""

    __slots__ = ("ours", "outs", "stdin_fd")

    def __init__(self, outs: list[_Stream], ours: list[int], stdin_fd: int) -> None:
        self.outs = outs
        self.ours = ours
        self.stdin_fd = stdin_fd


class ResidentCommand:
    """The handle of one command of a resident sandbox (``on_start``: cancel, kill, signal)."""

    def __init__(self, resident: Resident, grace: float, *, wakeable: bool) -> None:
        self._resident = resident
        self._grace = grace
        self.cancelled = False
        self.kill_at: float | None = None
        # another thread's cancel() wakes the supervising poll (only when one can call it)
        self._wake_r, self._wake_w = (
            os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK) if wakeable else (-1, -1)
        )

    def send_signal(self, signum: int) -> None:
        """Deliver *signum* to the command's process group (as a fresh sandbox does)."""
        self._resident.control(f"S{signum}".encode())

    def terminate(self) -> None:
        """SIGTERM to every process of the command; SIGKILL after the grace period."""
        if self.kill_at is None:
            self._resident.control(b"K15")
            self.kill_at = time.monotonic() + self._grace
            self._wake()

    def cancel(self) -> None:
        """Stop the command now: SIGTERM, then SIGKILL after the grace period."""
        self.cancelled = True
        self.terminate()

    def kill(self) -> None:
        """SIGKILL every process of the command at once."""
        self.cancelled = True
        self._resident.control(b"K")
        self.kill_at = time.monotonic()
        self._wake()

    def _wake(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def close(self) -> None:
        if self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)


class Resident:
    """A kept sandbox whose init spawns each command (see the module's docstring).

    Use :meth:`open`, then :meth:`run` for each request (``None``: run that one
    in a fresh sandbox), then :meth:`close`. Thread-safe: one command at a
    time; :meth:`run` returns ``None`` at once while another runs.
    """

    def __init__(
        self, policy: Policy, prepared: Prepared, running: Running, control: int, shape: object
    ) -> None:
        self._policy = policy  # as given: a command with another policy runs fresh
        self._prepared = prepared
        self._running = running
        self._control = control
        self._shape = shape
        self._lock = _thread.allocate_lock()
        self._send_lock = _thread.allocate_lock()
        self._reported = 0  # broker violations handed out so far
        self.broken = False  # the sandbox is gone (or retired): open a new one
        self._keeper: _Keeper | None = None
        self.commands = 0  # commands run here so far
        # planned requests by everything but their command (see _plan)
        self._plans: dict[ExecRequest, tuple[LaunchPlan, str]] = {}
        self._socket: _socket.socket | None = None
        # the request it was opened with and what its plan looked at (see _looked_at)
        self._looked: tuple[ExecRequest, _Looked | None] | None = None
        self._unchecked = False  # set by open(): no command ran since that look
        self._null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)  # the commands' stdin
        self._next: NextShell | None = None  # a shell started ahead (start_next)

    @classmethod
    def open(
        cls,
        request: ExecRequest,
        policy: Policy,
        *,
        environ: Mapping[str, str],
        look_again: bool = False,
        launchers: LauncherPool | None = None,
    ) -> Resident | None:
        """Start a resident sandbox for the session of *request*, or ``None`` when not suitable.

        With *look_again* its first command is not spared the look at the host
        (a warm sandbox, :mod:`corral.server._warm`: that command comes later).
        With *launchers* (the corral server's, cgroup v1) a sandbox with limits
        is born in a ready group instead of being moved into a new one.

        Raises:
            CorralError: the sandbox could not be set up (as a fresh run would).
        """
        from ..backends._plan import FdSpec
        from ._runner import prepare

        if request.tty or request.stdin_mode == "inherit":
            return None
        looked = _looked_at(request, policy)  # before planning: a change after it retires
        prepared = prepare(request, policy, environ=environ)
        plan = prepared.plan
        if prepared.backend.name != "bubblewrap" or plan.egress is not None:
            return None
        split = _split(plan)
        if split is None or any(spec.number == _CONTROL_FD for spec in plan.fds):
            return None
        init = _helper_index(plan.argv)
        serving = plan.replace(
            argv=(*plan.argv[: init + 1], "--serve", str(_CONTROL_FD), *plan.argv[init + 1 :]),
            fds=(*plan.fds, FdSpec(number=_CONTROL_FD, kind="control")),
            timeout=None,
        )
        cgroup = launchers.take() if launchers is not None and plan.cgroup is not None else None
        running = Running(serving, cgroup_layout=prepared.layout, cgroup=cgroup)
        keeper = _Keeper(running)
        control = running.take_fd("control")
        os.set_blocking(control, True)
        resident = cls(policy, prepared, running, control, split[0])
        resident._keeper = keeper
        resident._looked = (request, looked)
        resident._unchecked = looked is not None and not look_again
        return resident

    # ------------------------------------------------------------ control
    def control(self, message: bytes, fds: tuple[int, ...] = ()) -> None:
        """Send one request to the init (ignored once the sandbox is gone)."""
        with self._send_lock:
            if self._control < 0:
                return
            if self._socket is None:
                self._socket = _socket.socket(fileno=os.dup(self._control))
            try:
                if fds:
                    rights = b"".join(fd.to_bytes(4, sys.byteorder, signed=True) for fd in fds)
                    self._socket.sendmsg(
                        [message], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)]
                    )
                else:
                    self._socket.send(message)
            except OSError:
                self.broken = True

    # ------------------------------------------------------------ run
    def run(
        self,
        request: ExecRequest,
        policy: Policy,
        *,
        on_start: Callable[[ResidentCommand], None] | None = None,
        streams: tuple[int, int, int] = (0, 1, 2),
        state_fd: int | None = None,
    ) -> Outcome | None:
        """Run *request* under *policy* here; ``None`` if it must run in a fresh sandbox instead.

        *state_fd*, when given, reaches the command as its descriptor 63 (the same open
        file description: a kept session's shell state channel, :mod:`corral.server._kept`).

        Raises:
            CorralError: the request cannot be planned (as a fresh run would
                raise), or the broker failed.
        """
        # only the first call after open() may skip the look at the host: it follows the
        # opening's own look right away, as a fresh sandbox's command follows its plan
        unchecked, self._unchecked = self._unchecked, False
        if self.broken or request.tty:
            return None
        if request.stdin_mode == "inherit" and any(_isatty(fd) for fd in streams):
            return None  # a terminal: a fresh sandbox gives it the pty handling it needs
        if policy is not self._policy and policy != self._policy:
            return None  # e.g. a ``rules`` entry matched: its own sandbox
        if unchecked:
            pass
        elif (
            self._looked is None
            or self._looked[1] is None  # a glob it could not expand: a fresh run says why
            or self._looked[1] != _looked_at(self._looked[0], policy)
        ):
            # its mounts were decided from another host: retired once no command of it runs
            # (retiring ends the sandbox, and the async twin may run one now), fresh until then
            if self._lock.acquire(False):
                self.broken = True
                self._lock.release()
            return None
        found = self._plan(request)
        if found is None:
            return None
        plan, cwd, argv, environ = found
        body = self._body(cwd, argv, environ)
        if body is None or not self._lock.acquire(False):
            return None
        try:
            shell, self._next = self._next, None
            if shell is not None:
                from ._resident_next import discard, run_next, waiting

                if not waiting(self):
                    shell.close()  # it ended on its own (its end was read): start one here
                elif shell.fits(request, cwd, argv, environ, state_fd, streams):
                    return run_next(self, shell, request, argv[2], plan, on_start, streams)
                elif not discard(self, shell):
                    return None  # its init did not answer: the sandbox is retired
            return self._run(plan, request, body, on_start, streams, state_fd)
        except _InitChanged:
            return None  # retired; the command runs in a new sandbox
        finally:
            self._lock.release()

    def start_next(self, request: ExecRequest, *, state_fd: int) -> bool:
        """Start the shell of the next call ahead (:mod:`._resident_next`): *request* is that
        call as expected, its command ``[shell, "-c", LOADER]``; *state_fd* becomes the
        shell's descriptor 63. Whether it now waits; never while a command runs here."""
        from ._resident_next import start_next

        if not self._lock.acquire(False):
            return False
        try:
            if self.broken or self._next is not None:
                return False
            self._next = start_next(self, request, state_fd=state_fd)
            return self._next is not None
        finally:
            self._lock.release()

    def _body(self, cwd: str, argv: tuple[str, ...], environ: bytes) -> bytes | None:
        """The init's ``C`` request for *argv* in *cwd* with *environ*; ``None`` when too big."""
        body = b"\0".join(
            [
                b"C" + os.fsencode(cwd),
                str(len(argv)).encode(),
                *(os.fsencode(word) for word in argv),
                environ,
            ]
        )
        if len(body) > _MAX_REQUEST or len(argv) > _MAX_WORDS or environ.count(b"\0") > _MAX_WORDS:
            return None
        return body

    def _plan(self, request: ExecRequest) -> tuple[LaunchPlan, str, tuple[str, ...], bytes] | None:
        """``(plan, cwd, command, encoded environment)`` of *request*, or ``None`` (not here).

        The backend plans each request as for a fresh sandbox. Without
        credentials in the policy nothing of a plan but the command, its
        display and the sandbox id depends on the command and the id
        (credentials are chosen by command line; the id is the plan's
        ``sandbox_id`` and the command's ``CORRAL_SANDBOX_ID``, which
        :func:`corral.backends.bubblewrap.sandbox_env` sets last), so the plan of
        a request that differs from an earlier one only in its command and its
        id (each kept run of an agent session has a new id) is that plan with
        those replaced. Everything else a plan is made of - the host's paths -
        was looked at before (:meth:`run`).
        """
        key = None
        if not self._policy.credentials:
            key = request.replace(argv=("",), shell_command=None, stdin=b"", sandbox_id="")
            cached = self._plans.get(key)
            if cached is not None:
                from ._request import redact

                plan, cwd = cached
                if plan.sandbox_id != request.sandbox_id:
                    plan = plan.replace(
                        sandbox_id=request.sandbox_id, env=_with_id(plan.env, request.sandbox_id)
                    )
                return (
                    plan.replace(display_argv=redact(request.argv, [])),
                    cwd,
                    request.argv,
                    _encoded(plan.env, cwd),
                )
        prepared = self._prepared
        plan = prepared.backend.plan(request, prepared.policy, prepared.facts)
        split = _split(plan)
        if split is None or split[0] != self._shape:
            return None
        _shape, cwd, argv = split
        if key is not None and argv == request.argv and _id_only_as_variable(plan, cwd):
            if len(self._plans) >= 64:
                self._plans.clear()
            self._plans[key] = (plan, cwd)
        return plan, cwd, argv, _encoded(plan.env, cwd)

    def _run(
        self,
        plan: LaunchPlan,
        request: ExecRequest,
        body: bytes,
        on_start: Callable[[ResidentCommand], None] | None,
        streams: tuple[int, int, int],
        state_fd: int | None = None,
    ) -> Outcome | None:
        handle = ResidentCommand(self, plan.kill_grace, wakeable=on_start is not None)
        try:
            started, wall = time.monotonic(), time.time()
            launched = self._launch(request, body, streams, () if state_fd is None else (state_fd,))
        except BaseException:
            handle.close()
            raise
        if launched is None:
            handle.close()
            return None  # the sandbox is gone (its init failed?): nothing ran
        self.commands += 1
        if on_start is not None:
            on_start(handle)
        return self._supervise(plan, request, launched, handle, started, wall)

    def _launch(
        self,
        request: ExecRequest,
        body: bytes,
        streams: tuple[int, int, int],
        extra: tuple[int, ...],
    ) -> _Launched | None:
        """Send the init the ``C`` request *body* with the command's stdin, output pipes and
        the *extra* descriptors (its 63, 61, 62); ``None`` when the sandbox is gone."""
        ours: list[int] = []  # our ends: closed by _supervise (or here on failure)
        theirs: list[int] = []  # the command's: closed once sent
        try:
            stdin_fd = -1
            if request.stdin_mode == "data":
                r, stdin_fd = os.pipe2(os.O_CLOEXEC)
                theirs.append(r)
                ours.append(stdin_fd)
            elif request.stdin_mode == "inherit":
                theirs.append(os.dup(streams[0]))  # the caller's stdin, as a fresh run hands it
            else:
                theirs.append(os.dup(self._null))
            outs: list[_Stream] = []
            for index in (1, 2):
                r, w = os.pipe2(os.O_CLOEXEC)
                theirs.append(w)
                ours.append(r)
                outs.append(_Stream(r, None if request.capture else streams[index]))
            theirs.extend(os.dup(fd) for fd in extra)
            self.control(body, tuple(theirs))
        except BaseException:
            self.broken = True  # the init's replies may be out of step now: retire it
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        if self.broken:
            for fd in ours:
                os.close(fd)
            return None
        return _Launched(outs, ours, stdin_fd)

    def _supervise(
        self,
        plan: LaunchPlan,
        request: ExecRequest,
        launched: _Launched,
        handle: ResidentCommand,
        started: float,
        wall: float,
        replies: list[bytes] | None = None,
    ) -> Outcome:
        """Relay the launched command's output and stdin, enforce its timeout, and wait for
        the init's end (``D``); its Outcome. Closes our ends and *handle* in every case."""
        import select

        ours, outs, stdin_fd = launched.ours, launched.outs, launched.stdin_fd
        replies = [] if replies is None else replies  # P, and E or X before their D
        try:
            poller = select.poll()
            poller.register(self._control, _POLLIN)
            if handle._wake_r >= 0:
                poller.register(handle._wake_r, _POLLIN)
            by_fd = {s.fd: s for s in outs}
            for fd in by_fd:
                os.set_blocking(fd, False)
                poller.register(fd, _POLLIN)
            data = memoryview(request.stdin)
            if stdin_fd >= 0:
                os.set_blocking(stdin_fd, False)
                poller.register(stdin_fd, _POLLOUT)
            deadline = started + plan.timeout if plan.timeout is not None else None
            limit, kept = plan.output_limit, 0
            wait_status: int | None = None
            timed_out = False
            while wait_status is None or by_fd:
                timeouts = [t for t in (deadline, handle.kill_at) if t is not None]
                now = time.monotonic()
                wait_ms = None if not timeouts else max(0.0, min(timeouts) - now) * 1000
                for fd, _mask in poller.poll(wait_ms):
                    if fd == self._control:
                        reply = os.read(fd, 4096)
                        if not reply:  # the init is gone: so is everything in the sandbox
                            self.broken = True
                            poller.unregister(fd)
                            wait_status = 9 if wait_status is None else wait_status
                        elif reply.startswith(b"D"):
                            wait_status = int(reply[1:])
                            poller.unregister(fd)
                        else:
                            replies.append(reply)  # P, and E or X before their D
                    elif fd == handle._wake_r:
                        while True:
                            try:
                                if not os.read(fd, 64):
                                    break
                            except BlockingIOError:
                                break
                    elif fd == stdin_fd:
                        try:
                            n = os.write(stdin_fd, data[:_CHUNK])
                        except BlockingIOError:
                            continue
                        except BrokenPipeError:
                            n = len(data)
                        data = data[n:]
                        if not data:
                            poller.unregister(stdin_fd)
                            os.close(stdin_fd)
                            ours.remove(stdin_fd)
                            stdin_fd = -1
                    elif fd in by_fd:
                        stream = by_fd[fd]
                        try:
                            chunk = os.read(fd, _CHUNK)
                        except BlockingIOError:
                            continue
                        if not chunk:
                            poller.unregister(fd)
                            del by_fd[fd]
                            continue
                        kept = _take(stream, chunk, limit, kept)
                now = time.monotonic()
                if wait_status is None:
                    if deadline is not None and now >= deadline and not timed_out:
                        timed_out = True
                        handle.terminate()
                    if handle.kill_at is not None and now >= handle.kill_at:
                        handle.kill()
                        handle.kill_at = now + 1.0  # again if the first did not arrive
        except BaseException:
            self.broken = True  # the init's replies may be out of step now: retire it
            raise
        finally:
            for fd in ours:
                try:
                    os.close(fd)
                except OSError:
                    pass
            handle.close()
        return self._outcome(plan, wait_status, replies, outs, timed_out, started, wall)

    def _outcome(
        self,
        plan: LaunchPlan,
        wait_status: int,
        replies: list[bytes],
        outs: list[_Stream],
        timed_out: bool,
        started: float,
        wall: float,
    ) -> Outcome:
        exec_error = None
        for reply in replies:
            text = reply.decode("utf-8", "replace")
            if text.startswith("Einit-changed\t"):
                self.broken = True  # nothing ran; the command gets a new sandbox
                raise _InitChanged(text)
            if text.startswith("E"):
                step, _, rest = text[1:].partition("\t")
                _err, _, detail = rest.partition("\t")
                raise LaunchFailed(f"Failed to {step.replace('-', ' ')} in the sandbox: {detail}")
            if text.startswith("X"):
                code, _, program = text[1:].partition("\t")
                exec_error = f"{program}: {os.strerror(int(code))}"
        violations = []
        broker = self._running.broker
        if broker is not None:
            broker.checkpoint()  # every process of the command is gone: check git now
            violations = broker.violations[self._reported :]
            self._reported = len(broker.violations)
            if broker.error is not None:
                self.broken = True
                raise BrokerFailed(
                    f"Failed to supervise workspace writes: {broker.error}"
                ) from broker.error
        cgroup = self._running.cgroup
        oom = bool(cgroup is not None and cgroup.oom_killed())
        if oom:
            self.broken = True  # its OOM record stays: the next command gets a new sandbox
        if os.WIFSIGNALED(wait_status):
            exit_code, signal = None, os.WTERMSIG(wait_status)
        else:
            exit_code, signal = os.waitstatus_to_exitcode(wait_status), None
        exit_code, signal = command_status(exit_code, signal)
        if oom and signal is None and exit_code is not None and exit_code >= 128:
            signal, exit_code = 9, None
        stdout, stderr = outs
        return Outcome(
            sandbox_id=plan.sandbox_id,
            backend=plan.backend,
            argv=plan.display_argv or plan.argv,
            exit_code=exit_code,
            signal=signal,
            timed_out=timed_out,
            oom_killed=oom,
            stdout=bytes(stdout.buf),
            stderr=bytes(stderr.buf),
            stdout_truncated=stdout.truncated,
            stderr_truncated=stderr.truncated,
            output_dropped=stdout.dropped + stderr.dropped,
            duration=time.monotonic() - started,
            started_at=wall,
            violations=tuple(violations),
            degraded=plan.degraded,
            unsandboxed=plan.unsandboxed,
            exec_error=exec_error,
            credentials=plan.credentials,
            stdout_sha256=stdout.digest.hexdigest(),
            stderr_sha256=stderr.digest.hexdigest(),
            stdout_size=stdout.size,
            stderr_size=stderr.size,
        )

    # ------------------------------------------------------------ close
    def close(self) -> None:
        """End the sandbox (its init exits on end of file) and release everything."""
        with self._send_lock:
            control, self._control = self._control, -1
            sock, self._socket = self._socket, None
        self.broken = True
        shell, self._next = self._next, None
        if shell is not None:
            shell.close()  # the shell itself ends with the sandbox
        if sock is not None:
            sock.close()
        if self._null >= 0:
            os.close(self._null)
            self._null = -1
        if control >= 0:
            os.close(control)
        if self._keeper is not None:
            self._keeper.release()


class _Keeper:
    """The thread a resident sandbox is spawned from, alive until the sandbox ends.

    bubblewrap dies with the *thread* that spawned it (``--die-with-parent`` is
    a parent-death signal, which follows the spawning thread): a session's
    commands come from short-lived worker threads (the async twin, the MCP
    server), so the sandbox is spawned from a thread of its own, which then
    supervises it (``Running.wait``) until :meth:`release`.
    """

    def __init__(self, running: Running) -> None:
        self._running = running
        self._started = _thread.allocate_lock()
        self._started.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._error: BaseException | None = None
        _thread.start_new_thread(self._main, ())
        self._started.acquire()  # released once the sandbox runs (or failed to start)
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        try:
            try:
                self._running.start()
            except BaseException as exc:
                self._error = exc
                return
            finally:
                self._started.release()
            try:
                self._running.wait()  # until the init exits (end of file on its control socket)
            except (LaunchFailed, BrokerFailed):
                pass  # every command's result was reported already
        finally:
            self._done.release()

    def release(self) -> None:
        """Wait until the sandbox ended and its resources were released."""
        self._done.acquire()
        self._done.release()


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _take(stream: _Stream, chunk: bytes, limit: int | None, kept: int) -> int:
    """Digest *chunk*, keep (or relay) it within the output cap; the new kept total."""
    keep = stream.count(chunk, limit, kept)
    if keep:
        if stream.sink is None:
            stream.buf += keep
        else:
            _write_all(stream.sink, keep)
    return kept + len(keep)
