"""The corral server: ``corral run`` served from a warm, per-user process.

Why (docs/design.md, "The corral server"): a cold ``corral run`` pays for
Python's imports, settings and - with limits on cgroup v1 - an RCU grace
period for moving the sandbox into its cgroup; a warm process pays none of
that. The client (:mod:`corral.cli._client`, or the compiled
``corral-client``) passes its argv, cwd, whole environment and
stdin/stdout/stderr over a unix socket; the server runs the command exactly
as ``corral run`` would in the client's own process and sends back the exit
status. For ``corral-client hook claude-code`` it answers the Claude Code hook
the same way (a :class:`HookRequest`: the hook's input, cwd, environment;
the answer's stdout, stderr and exit status).

**Who may use it** (the server runs commands with caller-chosen options: a
sandboxed process that reached it would escape). The socket lives in
corral's state directory (``server/``: mode 0700, socket 0600), a default
secret path hidden in every sandbox. On top of that, every connection is
checked (:func:`check_peer`), all of these must hold or the connection is
refused, closed and logged:

* ``SO_PEERCRED`` uid is the server's uid;
* the peer's pid, mount and user namespaces (and every other namespace) are
  the server's: a bubblewrap, container or gVisor sandbox never matches;
* every thread of the peer has exactly the server's seccomp filter count,
  no_new_privs flag and capability sets: corral's exec helper installs at
  least one filter in every process-level sandbox (``landlock``), which a
  process can never remove;
* the peer is still the process that connected (``SO_PEERPIDFD``: a pid
  that was reused after the peer exited is not accepted);
* and, so that a run through the server is the same as one in the client's
  own process, the rest of its process context matches too: root directory,
  cgroups, rlimits, umask, supplementary groups, nice value, CPU/memory
  affinity, OOM score adjustment, LSM label. A client that differs is told
  so and runs the command itself.

**Lifecycle**: one server per state directory (an ``flock`` on
``server/lock`` owns the socket path). It exits after ``idle`` seconds
without a client (``CORRAL_SERVER_IDLE``, default 300), on SIGTERM or
``corral server --stop`` (running commands are stopped as on a timeout),
and retires - gives up the socket path, finishes what runs, exits - as soon
as the corral code it was started from changes on disk (:mod:`._codewatch`:
inotify on its package directories, else a stat check before every request)
or a client with another code stamp connects. It holds one of its user's
:data:`~._slots.MAX_SERVERS` slots (:mod:`._slots`); with none free it does not
start and records why in ``server/busy``. It logs to ``server/server.log`` and
keeps ``/`` as its working directory.
"""

from __future__ import annotations

import _socket
import _thread
import errno
import os
import time

from .._exceptions import ServerError
from ..pipeline._runner import SignalRelay
from ._codewatch import POLL_INTERVAL, CodeWatch
from ._fastclient import client_stamp
from ._peers import _SO_PEERPIDFD, PeerRefused, check_peer, process_context
from ._requests import (
    _MSG_CMSG_CLOEXEC,
    HookRequest,
    RunRequest,
    _fds_of,
    _hook_request,
    _receive_request,
    _run_request,
    _tell,
)
from ._slots import MAX_SERVERS, mark_busy, take_slot, write_record
from ._wire import (
    MAX_FRAME,
    PROTOCOL,
    FrameReader,
    WireError,
    bind_unix,
    code_stamp,
    encode,
    socket_path,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TextIO

    from ..backends._microvm_pool import VmPool
    from ..pipeline._launchers import LauncherPool

__all__ = ["DEFAULT_IDLE", "Server"]

DEFAULT_IDLE = 300.0
#: seconds without a client after which the launcher pool is released (parked
#: launcher threads and their cgroups); the next client starts it again
DEFAULT_POOL_IDLE = 30.0
_REQUEST_TIMEOUT = 30.0
# what corral run forwards: HUP, INT, QUIT, TERM, WINCH, and CONT, TSTP (Ctrl-Z, fg)
_FORWARDED = frozenset({1, 2, 3, 15, 18, 20, 28})
_LOG_LIMIT = 1 << 20


# ---------------------------------------------------------------- the server
class _Session:
    __slots__ = ("conn", "done", "pid", "relay")

    def __init__(self, conn: _socket.socket, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self.relay = SignalRelay()
        self.done = False


class Server:
    """One user's corral server, bound to one state directory.

    Args:
        state_dir: corral's state directory (the socket is ``server/server.sock`` in it).
        handler: runs one :class:`RunRequest` for its client (with the
            session's :class:`~corral.pipeline._runner.SignalRelay` and the launcher
            pool, if any) and returns the exit status. Everything the user
            sees must go to the request's fds.
        hook_handler: answers one :class:`HookRequest`: ``(stdout, stderr,
            exit status)``, touching no process-wide state; None: hook
            requests are refused (the client decides in its own process).
        idle: seconds without a client before the server exits.
        launchers: build the cgroup launcher pool (cgroup v1 as root).
        pool_idle: seconds without a client before the launcher pool is
            released (started again by the next client): an idle server
            holds no parked launcher and no prepared cgroup.

    Example::

        server = Server(state_dir, handler=handle_run)
        server.start()           # raises ServerError if it cannot listen
        server.serve()           # until idle, SIGTERM, --stop, or the code changes
    """

    def __init__(
        self,
        state_dir: str,
        *,
        handler: Callable[[RunRequest, SignalRelay, LauncherPool | None], int],
        hook_handler: Callable[[HookRequest], tuple[bytes, bytes, int]] | None = None,
        idle: float = DEFAULT_IDLE,
        launchers: bool = True,
        pool_idle: float = DEFAULT_POOL_IDLE,
    ) -> None:
        self.state_dir = state_dir
        self.directory = os.path.join(state_dir, "server")
        self.path = socket_path(state_dir)
        self.handler = handler
        self.hook_handler = hook_handler
        self.idle = idle
        self.stamp = code_stamp()
        #: what this installation's compiled client sends (corral.server._fastclient)
        self.client_stamp = client_stamp()
        self.started = time.time()
        self.pool: LauncherPool | None = None
        #: the microvm backend's warm pool (``CORRAL_VM_POOL=N``), owned here
        self.vm_pool: VmPool | None = None
        self._want_pool = launchers
        self.pool_idle = pool_idle
        self._pool_released = False  # released while idle: the next client starts it again
        self._lock = _thread.allocate_lock()
        self._sessions: set[_Session] = set()
        self._threads = 0
        self._served = 0
        self._hooks = 0
        self._refused = 0
        self._last_activity = time.monotonic()
        self._listener: _socket.socket | None = None
        self._lock_fd = -1
        self._retired = False
        self._stopping = False
        self._signalled = 0
        self._log_lock = _thread.allocate_lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._log: TextIO | None = None
        self._watch: CodeWatch | None = None
        self._own = process_context()
        self._socket_ino = 0
        self._slot: tuple[_socket.socket, int] | None = None

    # ------------------------------------------------------------ start
    def start(self) -> None:
        """Take the socket path and listen.

        Raises:
            ServerError: another server owns the state directory, the
                directory is unsafe, or the socket cannot be created.
        """
        from .._state import ensure_dir

        os.chdir("/")  # never hold the workspace (or anything else) open
        ensure_dir(self.state_dir)
        try:
            os.mkdir(self.directory, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ServerError(f"Failed to create {self.directory}: {exc.strerror}") from exc
        st = os.lstat(self.directory)
        import stat

        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ServerError(
                f"Failed to use {self.directory}: it must be a directory owned by uid "
                f"{os.getuid()} with mode 0700",
                hint=f"remove it (rm -rf {self.directory}) and start again",
            )
        self._open_log()
        import fcntl

        self._lock_fd = os.open(
            os.path.join(self.directory, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise ServerError(
                f"Failed to start: a corral server already serves {self.state_dir}"
            ) from None
        self._open_log(rotate=True)
        problem = _kernel_problem()
        if problem is not None:
            self._release_lock()
            _mark_unavailable(self.directory, problem)
            raise ServerError(f"Failed to start: {problem}")
        _mark_unavailable(self.directory, None)
        try:
            self._slot = take_slot()
        except ServerError as exc:
            self._release_lock()
            mark_busy(self.directory, exc.message)
            raise
        try:
            self._watch = CodeWatch(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        except OSError as exc:
            self._release_lock()
            mark_busy(self.directory, f"cannot watch corral's code: {exc}")
            raise ServerError(f"Failed to watch corral's code for changes: {exc}") from exc
        mark_busy(self.directory, None)
        self._listen()
        self.log(
            f"listening on {self.path} (pid {os.getpid()}, idle {self.idle:g}s, code {self.stamp}, "
            f"server slot {self._slot[1]} of {MAX_SERVERS})"
        )
        if self._watch.fallback:
            self.log(self._watch.fallback)
        if self._want_pool:
            self._start_pool()
        self._warm_up()

    def _listen(self) -> None:
        try:
            os.unlink(self.path)  # we hold the lock: a socket left here is a dead server's
        except FileNotFoundError:
            pass
        listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        previous = os.umask(0o177)  # single-threaded here; the socket is born 0600
        try:
            bind_unix(listener, self.path)
        except OSError as exc:
            listener.close()
            self._release_lock()
            raise ServerError(f"Failed to listen on {self.path}: {exc.strerror}") from exc
        finally:
            os.umask(previous)
        os.chmod(self.path, 0o600)
        self._socket_ino = os.lstat(self.path).st_ino
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener

    def _start_pool(self) -> None:
        from ..pipeline._cgroups import probe

        layout, why = probe(frozenset({"memory", "pids"}))
        if layout is None or layout.version != 1:
            self.log(
                "no launcher pool: "
                + (why or "cgroup v2 (a thread cannot sit in another group than its process)")
            )
            return
        from ..pipeline._launchers import LauncherPool

        try:
            self.pool = LauncherPool(layout)
        except (OSError, ValueError) as exc:
            self.log(f"no launcher pool: {exc}")

    def _release_pool(self) -> None:
        """Idle: give back the launcher pool's threads and cgroups (serve loop, no client)."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        pool.close()
        for problem in pool.errors:
            self.log(f"launcher pool: {problem}")
        self._pool_released = True
        self.log(f"idle for {self.pool_idle:g}s: launcher pool released")

    def _warm_up(self) -> None:
        """Import what the first run would, so that it is as fast as the next."""
        import select  # noqa: F401

        from .. import _audit  # noqa: F401
        from ..backends import bubblewrap, get_backend, landlock  # noqa: F401
        from ..pipeline import _cgroups, _engine, _outcome, _request, _runner  # noqa: F401
        from ..policy import _settings, load_settings, policy_digest  # noqa: F401

        for name in ("bubblewrap", "landlock", "none"):
            try:
                get_backend(name)
            except Exception as exc:
                self.log(f"warming up the {name} backend: {exc}")

    # ------------------------------------------------------------ logging
    def _open_log(self, *, rotate: bool = False) -> None:
        """Open ``server.log`` for appending; *rotate* (only the lock holder): keep it small."""
        path = os.path.join(self.directory, "server.log")
        if rotate:
            try:
                if os.path.getsize(path) > _LOG_LIMIT:
                    os.replace(path, path + ".1")
            except OSError:
                pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        log = open(fd, "a", encoding="utf-8", errors="backslashreplace", buffering=1)  # noqa: SIM115
        with self._log_lock:
            if self._log is not None:
                self._log.close()
            self._log = log

    def log(self, message: str) -> None:
        """One line in ``server/server.log``."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        with self._log_lock:
            if self._log is None:
                return
            try:
                self._log.write(f"{stamp} [{os.getpid()}] {message}\n")
            except (OSError, ValueError):
                pass

    # ------------------------------------------------------------ main loop
    def serve(self) -> None:
        """Accept clients until idle, stopped, or retired with nothing left running."""
        import _signal  # type: ignore[import-not-found]
        import select

        assert self._listener is not None
        if os.environ.get("CORRAL_VM_POOL", "0") != "0":  # the microvm backend's warm pool
            from ..pipeline._vm_session import pool_from_environ

            # boots ahead in the background: the first answers are not held up
            self.vm_pool = pool_from_environ(dict(os.environ), self.log)
        previous = {
            sig: _signal.signal(sig, self._on_signal) for sig in (1, 2, 15)
        }  # SIGHUP, SIGINT, SIGTERM
        poller = select.poll()
        poller.register(self._listener.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        assert self._watch is not None
        watch = self._watch
        if watch.fd is not None:
            poller.register(watch.fd, select.POLLIN)
        next_check = time.monotonic() + POLL_INTERVAL  # stat checks, without inotify
        listening = True
        try:
            while True:
                if self._signalled and not self._stopping:
                    self.log(f"signal {self._signalled}: stopping")
                    self.stop()
                with self._lock:
                    active = self._threads
                    retired = self._retired
                if retired and listening:
                    # retired by any thread: stop polling the listener, then close it
                    # (connections still in its backlog are reset: those clients run
                    # the command themselves)
                    listening = False
                    poller.unregister(self._listener.fileno())
                    self._listener.close()
                if self._stopping:
                    break
                if self._retired and active == 0:
                    break
                now = time.monotonic()
                timeout = None
                if not self._retired and active == 0:
                    left = self._last_activity + self.idle - now
                    if left <= 0:
                        self.log(f"idle for {self.idle:g}s: exiting")
                        self._retire()
                        break
                    timeout = left * 1000
                    if self.pool is not None:
                        pool_left = self._last_activity + self.pool_idle - now
                        if pool_left <= 0:
                            self._release_pool()
                        else:
                            timeout = min(timeout, pool_left * 1000)
                if watch.fd is None and not self._retired:
                    if now >= next_check:
                        next_check = now + POLL_INTERVAL
                        changed = watch.poll()
                        if changed:
                            self.log(f"corral's code changed on disk ({changed}): retiring")
                            self._retire()
                            continue
                    wait = (next_check - now) * 1000
                    timeout = wait if timeout is None else min(timeout, wait)
                for fd, _mask in poller.poll(timeout):
                    if listening and fd == self._listener.fileno():
                        self._accept()
                    elif fd == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except BlockingIOError:
                            pass
                    elif fd == watch.fd:
                        changed = watch.poll()
                        if changed:
                            poller.unregister(watch.fd)
                            self.log(f"corral's code changed on disk ({changed}): retiring")
                            self._retire()
        finally:
            if listening:
                self._listener.close()
            for sig, handler in previous.items():
                _signal.signal(sig, handler)
            self._shutdown()

    def _on_signal(self, signum: int, _frame: object) -> None:
        # A signal handler runs between any two bytecodes of the main thread, maybe
        # while it holds self._lock: only set a flag and wake the loop.
        self._signalled = signum
        self._wake()

    def stop(self) -> None:
        """Stop: give up the socket, stop running commands (TERM, grace, KILL), exit."""
        self._stopping = True
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.relay.stop()
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def _retire(self) -> None:
        """Give up the socket path (a new server may take it) and accept nobody else.

        The main loop closes the listener when it notices.
        """
        with self._lock:
            if self._retired:
                return
            self._retired = True
            try:
                if os.lstat(self.path).st_ino == self._socket_ino:
                    os.unlink(self.path)  # ours: we still hold the lock
            except OSError:
                pass
            self._release_lock()
        self._wake()

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def _shutdown(self) -> None:
        self._retire()
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            with self._lock:
                if self._threads == 0:
                    break
            time.sleep(0.02)
        if self.pool is not None:
            self.pool.close()
            for problem in self.pool.errors:
                self.log(f"launcher pool: {problem}")
        if self.vm_pool is not None:
            from ..backends.microvm import set_pool

            set_pool(None)
            self.vm_pool.close()
        if self._watch is not None:
            self._watch.close()
        if self._slot is not None:
            self._slot[0].close()
        self.log(f"exiting: served {self._served}, refused {self._refused}")
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    # ------------------------------------------------------------ connections
    def _accept(self) -> None:
        assert self._listener is not None
        while not self._retired:
            try:
                fd, _addr = self._listener._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log(f"accept: {exc.strerror}")
                    return
                raise
            conn = _socket.socket(fileno=fd)
            os.set_inheritable(fd, False)
            with self._lock:
                self._threads += 1
                self._last_activity = time.monotonic()
            _thread.start_new_thread(self._serve_connection, (conn,))

    def _serve_connection(self, conn: _socket.socket) -> None:
        try:
            self._serve_checked(conn)
        except BaseException as exc:
            import traceback

            self.log("error serving a client:\n" + "".join(traceback.format_exception(exc)))
        finally:
            conn.close()
            with self._lock:
                self._threads -= 1
                self._last_activity = time.monotonic()
            self._wake()

    def _refuse(self, conn: _socket.socket, reason: str, *, stale: bool = False) -> None:
        """Answer with a refusal, then drain what the peer still sends until it hangs up.

        Closing a unix socket with unread data resets the connection, and the
        client would never read the answer. The drain keeps nothing (fds that
        arrive are closed at once) and ends after 2 s or 16 MiB.
        """
        with self._lock:
            self._refused += 1
        try:
            conn.sendall(encode({"refused": reason, "stale": stale}))
            conn.shutdown(_socket.SHUT_WR)
            conn.settimeout(2.0)
            received = 0
            while received < MAX_FRAME:
                data, ancdata, _flags, _addr = conn.recvmsg(
                    65536, _socket.CMSG_SPACE(4 * 16), _MSG_CMSG_CLOEXEC
                )
                for fd in _fds_of(ancdata):
                    os.close(fd)
                if not data:
                    break
                received += len(data)
        except OSError:
            pass

    def _serve_checked(self, conn: _socket.socket) -> None:
        conn.setblocking(True)
        try:
            pid, pidfd = check_peer(conn, self._own)
        except PeerRefused as exc:
            if exc.security:
                self.log(f"refused a peer: {exc.reason}")
            else:
                self.log(f"refused a client: {exc.reason}")
            self._refuse(conn, exc.reason)  # nothing of its request is read or kept
            return
        os.close(pidfd)
        conn.settimeout(_REQUEST_TIMEOUT)
        try:
            message, fds = _receive_request(conn)
        except (OSError, WireError, ValueError) as exc:
            self.log(f"bad request from pid {pid}: {exc}")
            self._refuse(conn, f"bad request: {exc}")
            return
        try:
            self._dispatch(conn, pid, message, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _dispatch(
        self, conn: _socket.socket, pid: int, message: dict[str, Any], fds: list[int]
    ) -> None:
        op = message.get("op")
        if op == "status":
            conn.sendall(encode({"status": self.statistics()}))
            return
        if op == "stop":
            self.log(f"stop requested by pid {pid}")
            conn.sendall(encode({"stopping": True, "pid": os.getpid()}))
            self.stop()
            return
        if op == "hook":
            self._answer_hook(conn, pid, message, fds)
            return
        if op != "run":
            self._refuse(conn, f"unknown request {op!r}")
            return
        request = _run_request(message, fds, pid)
        if self._turned_away(conn, pid, message, request):
            return
        assert not isinstance(request, str)
        with self._lock:
            if self._retired or self._stopping:
                accepting = False
            else:
                accepting = True
                session = _Session(conn, pid)
                self._sessions.add(session)
                self._served += 1
        if not accepting:
            self._refuse(conn, "the server is shutting down", stale=True)
            return
        try:
            conn.settimeout(None)
            conn.sendall(encode({"accepted": True}))
            _thread.start_new_thread(self._watch_client, (session,))
            status = self._run(request, session)
            session.done = True
            try:
                conn.sendall(encode({"exit": status}))
            except OSError:
                pass  # the client is gone; the run was stopped and audited
        finally:
            session.done = True
            try:
                conn.shutdown(_socket.SHUT_RDWR)  # wakes the watcher thread
            except OSError:
                pass
            with self._lock:
                self._sessions.discard(session)

    def _turned_away(
        self, conn: _socket.socket, pid: int, message: dict[str, Any], request: object
    ) -> bool:
        """Refuse a request that failed validation (*request* is then the problem) or
        comes from a client running other code; True if refused."""
        if isinstance(request, str):
            self.log(f"bad request from pid {pid}: {request}")
            self._refuse(conn, f"bad request: {request}")
            return True
        return self._refused_as_stale(conn, pid, message)

    def _refused_as_stale(self, conn: _socket.socket, pid: int, message: dict[str, Any]) -> bool:
        """Refuse (and retire) when the client runs other code than this server; True if so.

        A client's code stamp must be this server's own (the Python client)
        or this installation's compiled client (``"c1:"`` + the real path of
        its ``_bin/corral-client``), with this protocol.
        """
        changed = self._watch.poll() if self._watch is not None else ""
        code = message.get("code")
        current = code in (self.stamp, self.client_stamp) and message.get("protocol") == PROTOCOL
        if current and not changed:
            return False
        why = f"code changed on disk ({changed})" if changed else "another corral code stamp"
        self.log(f"refused pid {pid}: {why}; retiring")
        self._refuse(conn, f"the server runs older code ({why})", stale=True)
        self._retire()
        return True

    def _answer_hook(
        self, conn: _socket.socket, pid: int, message: dict[str, Any], fds: list[int]
    ) -> None:
        """Answer a hook request: ``{"hook": {"stdout", "stderr", "exit"}}``.

        The hook has no side effects, so every problem - a bad request, an
        answer too large for a frame, an error in the handler - is a refusal:
        the client then decides in its own process.
        """
        request = _hook_request(message, fds, pid)
        if self._turned_away(conn, pid, message, request):
            return
        assert not isinstance(request, str)
        with self._lock:
            shutting_down = self._retired or self._stopping
            if not shutting_down:
                self._hooks += 1
        if shutting_down:
            self._refuse(conn, "the server is shutting down", stale=True)
            return
        if self.hook_handler is None:
            self._refuse(conn, "this server does not answer hooks")
            return
        try:
            out, err, status = self.hook_handler(request)
            frame = encode(
                {
                    "hook": {
                        "stdout": out.decode("utf-8", "surrogateescape"),
                        "stderr": err.decode("utf-8", "surrogateescape"),
                        "exit": status,
                    }
                }
            )
        except WireError as exc:
            self._refuse(conn, f"the answer does not fit a frame: {exc}")
            return
        except Exception as exc:
            import traceback

            self.log("internal error in a hook:\n" + "".join(traceback.format_exception(exc)))
            self._refuse(conn, f"internal error in the corral server: {type(exc).__name__}")
            return
        conn.sendall(frame)

    def _run(self, request: RunRequest, session: _Session) -> int:
        with self._lock:
            # released while idle: a run starts it again (a status request does not);
            # the serve loop releases it only while no connection is active
            if self._pool_released:
                self._pool_released = False
                self._start_pool()
        try:
            status = self.handler(request, session.relay, self.pool)
        except BaseException as exc:
            import traceback

            self.log("internal error:\n" + "".join(traceback.format_exception(exc)))
            _tell(
                request.stdio[2],
                f"corral: internal error in the corral server: {type(exc).__name__}: {exc}\n"
                f"corral: hint: see {os.path.join(self.directory, 'server.log')}; "
                "CORRAL_SERVER=off runs corral without the server\n",
            )
            return 125
        if self._stopping and session.relay.stopped:
            _tell(request.stdio[2], "corral: the corral server was stopped; so was the command\n")
        return status

    def _watch_client(self, session: _Session) -> None:
        """Forward the client's signals; its disconnect kills the sandbox."""
        reader = FrameReader()
        try:
            while True:
                try:
                    data = session.conn.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    if not session.done:
                        self.log(f"client {session.pid} went away: killing its command")
                        session.relay.kill()
                    return
                try:
                    messages = reader.feed(data)
                except WireError as exc:
                    self.log(f"client {session.pid}: {exc}: killing its command")
                    session.relay.kill()
                    return
                for message in messages:
                    signum = message.get("signal")
                    if isinstance(signum, int) and signum in _FORWARDED:
                        session.relay.deliver(signum)
        except BaseException as exc:
            self.log(f"watching client {session.pid}: {exc!r}")
            session.relay.kill()

    def statistics(self) -> dict[str, Any]:
        """What ``corral server --status`` prints."""
        with self._lock:
            active = len(self._sessions)
        return {
            "pid": os.getpid(),
            "state_dir": self.state_dir,
            "started": self.started,
            "code": self.stamp,
            "idle_timeout": self.idle,
            "served": self._served,
            "hooks": self._hooks,
            "refused": self._refused,
            "running": active,
            "retiring": self._retired,
            "launchers": self.pool.statistics() if self.pool is not None else None,
            "vm_pool": self.vm_pool.statistics() if self.vm_pool is not None else None,
        }


UNAVAILABLE = "unavailable"  # in server/: why no server can run on this kernel


def _kernel_problem() -> str | None:
    """Why this kernel cannot host a server safely, or None.

    ``SO_PEERPIDFD`` (Linux 6.5) pins the peer: without it a peer that
    exits between ``connect`` and the checks could have its pid reused by
    another process, whose ``/proc`` entries would then be checked instead.
    """
    a, b = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        os.close(a.getsockopt(_socket.SOL_SOCKET, _SO_PEERPIDFD))
    except OSError as exc:
        return (
            f"this kernel ({os.uname().release}) has no SO_PEERPIDFD ({exc.strerror}); "
            "the corral server needs Linux 6.5 or later to check who connects"
        )
    finally:
        a.close()
        b.close()
    return None


def _mark_unavailable(directory: str, problem: str | None) -> None:
    """Record (or clear) why no server can run with this kernel, so clients stop starting one.

    The record names the kernel release: after an upgrade clients try again.
    """
    text = None if problem is None else f"{os.uname().release}\n{problem}\n"
    write_record(os.path.join(directory, UNAVAILABLE), text)
