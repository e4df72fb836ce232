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
sandboxed process that reached it would escape; the checks and answers are
:mod:`._connections`'s, this module keeps the lifecycle). The socket lives in
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

**Lifecycle**: a state directory is served by one server at a time (an
``flock`` on ``server/lock`` owns the socket path), and one server serves
every state directory of its user and configuration: a server started for
another directory hands that directory over to the running one
(:mod:`._hub`) and exits. It exits after ``idle`` seconds
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
from ._codewatch import POLL_INTERVAL, CodeWatch
from ._connections import Connections, Session
from ._fastclient import client_stamp
from ._hub import (
    DEFAULT_IDLE,
    MAX_DIRECTORIES,
    Front,
    bind_hub,
    hand_over,
    listen_at,
    lock_directory,
    prepare_directory,
    take_lock,
    unlink_ours,
)
from ._peers import _SO_PEERPIDFD, thread_state
from ._slots import MAX_SERVERS, mark_busy, take_slot, write_record
from ._wire import code_stamp, socket_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TextIO

    from ..backends._microvm_pool import VmPool
    from ..pipeline._launchers import LauncherPool
    from ..pipeline._runner import SignalRelay
    from ._requests import HookRequest, RunRequest

__all__ = ["DEFAULT_IDLE", "Server"]

#: seconds without a client after which the launcher pool is released (parked
#: launcher threads and their cgroups); the next client starts it again
DEFAULT_POOL_IDLE = 30.0
_LOG_LIMIT = 1 << 20
#: worker threads kept waiting for the next connection (each further one ends after its own)
_IDLE_WORKERS = 4


class _Worker:
    """An idle worker thread's hand-over: ``ready`` is released with ``conn`` set (or None: end)
    and ``front`` the state directory it came to (None: the hub name)."""

    __slots__ = ("conn", "front", "ready")

    def __init__(self) -> None:
        self.conn: _socket.socket | None = None
        self.front: str | None = None
        self.ready = _thread.allocate_lock()
        self.ready.acquire()


# ---------------------------------------------------------------- the server
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
        config: the server's :func:`~._hub.configuration`: :meth:`start`
            hands the state directory over to a running server of this
            configuration when there is one (:attr:`handed_to`), and a server
            that starts serves further directories handed over to it
            (:meth:`adopt`). None: this server serves its own directory only.

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
        config: str | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.config = config
        #: the pid of the running server :meth:`start` handed the directory to (0: none)
        self.handed_to = 0
        #: further state directories handed over to this server (lock), by directory
        self.adopted: dict[str, Front] = {}
        self._new_fronts: list[Front] = []  # lock: adopted, not yet polled by the serve loop
        self._dead_fronts: list[Front] = []  # lock: given up, for the serve loop to close
        self._hub: _socket.socket | None = None
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
        #: more members of ``--status`` (name -> what computes it), e.g. the warm sandboxes'
        self.extra_statistics: dict[str, Callable[[], object]] = {}
        self._want_pool = launchers
        self.pool_idle = pool_idle
        self._pool_released = False  # released while idle: the next client starts it again
        self.lock = _thread.allocate_lock()
        self._threads = 0  # connections being served
        self._idle_workers: list[_Worker] = []  # lock: threads waiting for a connection
        self._workers_started = 0  # lock
        self._last_activity = time.monotonic()
        self._listener: _socket.socket | None = None
        self.lock_fd = -1
        self.retired = False
        self.stopping = False
        self._signalled = 0
        self._log_lock = _thread.allocate_lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._log: TextIO | None = None
        self.watch: CodeWatch | None = None
        #: serves each accepted connection (._connections); its counts are --status's
        self.connections = Connections(self)
        self._socket_ino = 0
        self._slot: tuple[_socket.socket, int] | None = None

    # ------------------------------------------------------------ start
    def start(self) -> None:
        """Take the socket path and listen.

        Raises:
            ServerError: another server owns the state directory, the
                directory is unsafe, or the socket cannot be created.
        """
        os.chdir("/")  # never hold the workspace (or anything else) open
        prepare_directory(self.state_dir)
        self._open_log()
        self.lock_fd = lock_directory(self.directory)
        if self.lock_fd < 0:
            raise ServerError(f"Failed to start: a corral server already serves {self.state_dir}")
        self._open_log(rotate=True)
        problem = _kernel_problem()
        if problem is not None:
            self._release_lock()
            _mark_unavailable(self.directory, problem)
            raise ServerError(f"Failed to start: {problem}")
        _mark_unavailable(self.directory, None)
        if self.config is not None and self._hand_over():
            return
        try:
            self._slot = take_slot()
        except ServerError as exc:
            self._release_lock()
            mark_busy(self.directory, exc.message)
            raise
        if self.config is not None:
            self._hub = bind_hub(self.config)
            # another server took the name first (two started at once): it serves us too
            if self._hub is None and self._hand_over():
                self._slot[0].close()
                self._slot = None
                return
        try:
            self.watch = CodeWatch(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
        if self.config is not None:
            self.log(
                "other state directories of this configuration are handed over to this server"
                if self._hub is not None
                else "another process holds the hub name: serving this state directory only"
            )
        if self.watch.fallback:
            self.log(self.watch.fallback)
        if self._want_pool:
            self._start_pool()
        self._warm_up()

    def _hand_over(self) -> bool:
        """Hand the state directory (its lock) over to the running server of this
        configuration; True if it took it (then this server is done)."""
        pid, why = hand_over(self.state_dir, self.lock_fd, self.config or "")
        if not pid:
            self.log(f"serving {self.state_dir} here: {why}")
            return False
        self.handed_to = pid
        self._release_lock()
        mark_busy(self.directory, None)
        self.log(f"handed {self.state_dir} over to the corral server pid {pid}; its log says more")
        return True

    def adopt(self, state_dir: object, lock_fd: int, pid: int) -> str | None:
        """Serve *state_dir* too, whose ``server/lock`` the descriptor *lock_fd* holds
        (from :func:`~._hub.hand_over`, by client *pid*); None when done, else why not.

        See :func:`~._hub.take_lock` for what is checked; the server must not be
        shutting down nor serve :data:`~._hub.MAX_DIRECTORIES` directories already.
        """
        taken = take_lock(state_dir, lock_fd)
        if isinstance(taken, str):
            return taken
        directory, fd = taken
        with self.lock:
            removed = [] if self.retired or self.stopping else self._give_up_removed()
            problem = None
            if self.retired or self.stopping:
                problem = "the server is shutting down"
            elif directory == self.state_dir or directory in self.adopted:
                problem = "the server serves this state directory already"
            elif len(self.adopted) + 1 >= MAX_DIRECTORIES:
                problem = f"the server serves {MAX_DIRECTORIES} state directories already"
            else:
                try:
                    front = Front(directory, fd)
                except OSError as exc:
                    problem = f"cannot listen on {socket_path(directory)}: {exc.strerror}"
                else:
                    self.adopted[directory] = front
                    self._new_fronts.append(front)
                    count = len(self.adopted) + 1
        for gone in removed:
            self.log(f"no longer serving {gone}: it was removed (its lock file is gone)")
        self.wake()  # the serve loop polls the new listener and closes the removed ones
        if problem is not None:
            os.close(fd)
            return problem
        self.log(f"serving {directory} too (handed over by pid {pid}): {count} state directories")
        return None

    def _give_up_removed(self) -> list[str]:
        """Stop serving the adopted directories removed since (a test's temporary ones), under
        :attr:`lock`; returns them. They count no more, one made again at the same path is
        adopted anew, and the serve loop closes their listeners and locks."""
        removed = [directory for directory, front in self.adopted.items() if not front.current()]
        for directory in removed:
            self._dead_fronts.append(self.adopted.pop(directory))
        return removed

    def _listen(self) -> None:
        previous = os.umask(0o177)  # single-threaded here; the socket is born 0600
        try:
            self._listener = listen_at(self.path)  # we hold the lock: a socket left is dead
        except OSError as exc:
            self._release_lock()
            raise ServerError(f"Failed to listen on {self.path}: {exc.strerror}") from exc
        finally:
            os.umask(previous)
        self._socket_ino = os.lstat(self.path).st_ino

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

    def pool_for_a_run(self) -> LauncherPool | None:
        """The launcher pool for a run, started again if it was released while idle.

        A status request does not restart it; the serve loop releases it only
        while no connection is active.
        """
        with self.lock:
            if self._pool_released:
                self._pool_released = False
                self._start_pool()
            return self.pool

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
        # the sockets this server accepts on, and the state directory each serves (None: the hub)
        listeners: dict[int, tuple[_socket.socket, str | None]] = {
            self._listener.fileno(): (self._listener, self.state_dir)
        }
        if self._hub is not None:
            listeners[self._hub.fileno()] = (self._hub, None)
        for fd in listeners:
            poller.register(fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        assert self.watch is not None
        watch = self.watch
        if watch.fd is not None:
            poller.register(watch.fd, select.POLLIN)
        next_check = time.monotonic() + POLL_INTERVAL  # stat checks, without inotify
        listening = True
        watched: dict[int, Session] = {}  # the runs' clients (Connections.client_readable)
        try:
            while True:
                if self._signalled and not self.stopping:
                    self.log(f"signal {self._signalled}: stopping")
                    self.stop()
                with self.lock:
                    active = self._threads
                    retired = self.retired
                if retired and listening:
                    # retired by any thread: stop polling the listeners, then close them
                    # (connections still in their backlogs are reset: those clients run
                    # the command themselves)
                    listening = False
                    for fd, (sock, _front) in listeners.items():
                        poller.unregister(fd)
                        sock.close()
                    listeners.clear()
                if self.stopping:
                    break
                if self.retired and active == 0:
                    break
                now = time.monotonic()
                timeout = None
                if not self.retired and active == 0:
                    left = self._last_activity + self.idle - now
                    if left <= 0:
                        self.log(f"idle for {self.idle:g}s: exiting")
                        self.retire()
                        break
                    timeout = left * 1000
                    if self.pool is not None or self._idle_workers:
                        pool_left = self._last_activity + self.pool_idle - now
                        if pool_left <= 0:
                            self._release_pool()
                            self._end_idle_workers()
                        else:
                            timeout = min(timeout, pool_left * 1000)
                if watch.fd is None and not self.retired:
                    if now >= next_check:
                        next_check = now + POLL_INTERVAL
                        changed = watch.poll()
                        if changed:
                            self.log(f"corral's code changed on disk ({changed}): retiring")
                            self.retire()
                            continue
                    wait = (next_check - now) * 1000
                    timeout = wait if timeout is None else min(timeout, wait)
                if listening:
                    for front in self._take_new_fronts():
                        listeners[front.listener.fileno()] = (front.listener, front.state_dir)
                        poller.register(front.listener.fileno(), select.POLLIN)
                for front in self._take_dead_fronts():
                    if listeners.pop(front.listener.fileno(), None) is not None:
                        poller.unregister(front.listener.fileno())
                    front.listener.close()
                    front.release()
                for new in self.connections.new_watches():
                    assert new.watch is not None
                    watched[new.watch.fileno()] = new
                    poller.register(new.watch.fileno(), select.POLLIN)
                for fd, _mask in poller.poll(timeout):
                    client = watched.get(fd)
                    if client is not None:
                        if not self._client_readable(client):
                            poller.unregister(fd)
                            del watched[fd]
                            assert client.watch is not None
                            client.watch.close()
                    elif listening and fd in listeners:
                        self._accept(*listeners[fd])
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
                            self.retire()
        finally:
            for sock, _front in listeners.values():
                sock.close()
            for front in self._take_new_fronts():
                front.listener.close()
            for front in self._take_dead_fronts():
                front.listener.close()
                front.release()
            for session in watched.values():
                assert session.watch is not None
                session.watch.close()  # stopping: every run is being stopped
            for sig, handler in previous.items():
                _signal.signal(sig, handler)
            self._shutdown()

    def _take_new_fronts(self) -> list[Front]:
        """The state directories adopted since the serve loop last looked (their listeners)."""
        with self.lock:
            new, self._new_fronts = self._new_fronts, []
        return new

    def _take_dead_fronts(self) -> list[Front]:
        """The state directories given up since (removed while served): to close and release."""
        with self.lock:
            dead, self._dead_fronts = self._dead_fronts, []
        return dead

    def _client_readable(self, session: Session) -> bool:
        """:meth:`Connections.client_readable`; an error there kills the run, not the loop."""
        try:
            return self.connections.client_readable(session)
        except Exception as exc:
            self.log(f"watching client {session.pid}: {exc!r}: killing its command")
            session.relay.kill()
            return False

    def _on_signal(self, signum: int, _frame: object) -> None:
        # A signal handler runs between any two bytecodes of the main thread, maybe
        # while it holds self.lock: only set a flag and wake the loop.
        self._signalled = signum
        self.wake()

    def stop(self) -> None:
        """Stop: give up the socket, stop running commands (TERM, grace, KILL), exit."""
        self.stopping = True
        with self.lock:
            sessions = list(self.connections.sessions)
        for session in sessions:
            session.relay.stop()
        self.wake()

    def wake(self) -> None:
        """Wake the serve loop (any thread; never blocks)."""
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass

    def retire(self) -> None:
        """Give up the socket path (a new server may take it) and accept nobody else.

        The main loop closes the listener when it notices.
        """
        with self.lock:
            if self.retired:
                return
            self.retired = True
            unlink_ours(self.path, self._socket_ino)  # we still hold the lock
            self._release_lock()
        self.wake()

    def _release_lock(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # releases the flock
            self.lock_fd = -1
        for front in self.adopted.values():
            front.release()

    def _end_idle_workers(self) -> None:
        """End the worker threads that wait for a connection (idle, or shutting down)."""
        with self.lock:
            idle, self._idle_workers = self._idle_workers, []
        for worker in idle:
            worker.ready.release()  # with no connection: the thread ends

    def _shutdown(self) -> None:
        self.retire()
        self._end_idle_workers()
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            with self.lock:
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
        if self.watch is not None:
            self.watch.close()
        if self._slot is not None:
            self._slot[0].close()
        self.log(f"exiting: served {self.connections.served}, refused {self.connections.refused}")
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    # ------------------------------------------------------------ connections
    def _accept(self, listener: _socket.socket, front: str | None) -> None:
        """Hand each connection waiting on *listener* (serving *front*) to a worker thread."""
        while not self.retired:
            try:
                fd, _addr = listener._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.log(f"accept: {exc.strerror}")
                    return
                raise
            conn = _socket.socket(fileno=fd)
            os.set_inheritable(fd, False)
            with self.lock:
                self._threads += 1
                self._last_activity = time.monotonic()
                worker = self._idle_workers.pop() if self._idle_workers else None
                if worker is None:
                    self._workers_started += 1
            if worker is None:
                _thread.start_new_thread(self._work, (conn, front))
            else:
                worker.conn = conn
                worker.front = front
                worker.ready.release()

    def _work(self, conn: _socket.socket | None, front: str | None) -> None:
        """A worker thread: serve *conn* (which came to *front*), then wait (as one of at most
        :data:`_IDLE_WORKERS` idle workers) for the next connection, or end.

        A worker is kept only while its thread's own kernel state
        (:func:`~._peers.thread_state`: credentials, capabilities, seccomp,
        namespaces, cgroups, signal mask, affinity) is what it was when the
        thread started: a new connection then gets what a new thread would
        have. The comparison runs after the client has its exit status.
        """
        worker: _Worker | None = None
        before = _thread_state()
        while conn is not None:
            self._serve_connection(conn, front)
            if worker is None:
                worker = _Worker()
            changed = _state_change(before, _thread_state())
            if changed:  # this thread must not serve another connection
                self.log(f"a worker thread's state changed ({changed}): not kept")
                return
            with self.lock:
                if self.retired or self.stopping or len(self._idle_workers) >= _IDLE_WORKERS:
                    return
                self._idle_workers.append(worker)
            worker.ready.acquire()  # _accept hands a connection, _shutdown None
            conn, worker.conn = worker.conn, None
            front = worker.front

    def _serve_connection(self, conn: _socket.socket, front: str | None) -> None:
        try:
            self.connections.serve(conn, front)
        except BaseException as exc:
            import traceback

            self.log("error serving a client:\n" + "".join(traceback.format_exception(exc)))
        finally:
            conn.close()
            with self.lock:
                self._threads -= 1
                self._last_activity = time.monotonic()
            self.wake()

    def statistics(self, state_dir: str | None = None) -> dict[str, Any]:
        """What ``corral server --status`` prints (asked through *state_dir*'s socket)."""
        with self.lock:
            active = len(self.connections.sessions)
            idle = len(self._idle_workers)
            directories = 1 + len(self.adopted)
        return {
            "pid": os.getpid(),
            "state_dir": state_dir or self.state_dir,
            "state_dirs": directories,
            "started": self.started,
            "code": self.stamp,
            "idle_timeout": self.idle,
            "served": self.connections.served,
            "hooks": self.connections.hooks,
            "refused": self.connections.refused,
            "running": active,
            "workers": {"started": self._workers_started, "idle": idle},
            "retiring": self.retired,
            "launchers": self.pool.statistics() if self.pool is not None else None,
            "vm_pool": self.vm_pool.statistics() if self.vm_pool is not None else None,
            "settings_cache": _settings_cache_statistics(),
            **{name: compute() for name, compute in self.extra_statistics.items()},
        }


def _settings_cache_statistics() -> dict[str, int] | None:
    from ..policy._watched import installed

    cache = installed()
    return cache.statistics() if cache is not None else None


UNAVAILABLE = "unavailable"  # in server/: why no server can run on this kernel


def _thread_state() -> dict[str, str] | None:
    """:func:`~._peers.thread_state`, or None when ``/proc`` cannot tell (the worker is not kept)."""
    try:
        return thread_state()
    except OSError:
        return None


def _state_change(before: dict[str, str] | None, after: dict[str, str] | None) -> str:
    """What differs between two thread states: ``""`` if nothing, ``"unreadable"`` without both."""
    if before is None or after is None:
        return "unreadable"
    return ", ".join(
        sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    )


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
