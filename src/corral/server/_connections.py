"""The corral server's connections: who may talk to it, and what it answers.

One :class:`Connections` belongs to one :class:`~._server.Server`, which
accepts each connection and hands it to :meth:`Connections.serve` on one of
its worker threads (kept for the next connection, so no run starts a
thread): the peer checks (:func:`~._peers.check_peer`; a peer that fails
them is refused and nothing of its request is read), the
request (bounded, with its descriptors), and the answer - ``status``,
``stop``, a Claude Code ``hook`` decision, or a ``run``, whose client is
watched for signals and for going away (which kills its command) by the
server's serve loop (:meth:`Connections.client_readable`), not by a thread
of its own. A request
from a client running other code than the server's retires the server.
On the hub name (:mod:`._hub`) the only request is ``adopt``: serve another
state directory, whose lock comes with it.

The server's own lifecycle (the socket path, the serve loop, idleness,
retiring, the pools) stays in :mod:`._server`; state both sides touch is
guarded by the server's ``lock``.
"""

from __future__ import annotations

import _socket
import os
import time

from ..pipeline._runner import SignalRelay
from ._peers import PeerRefused, check_peer, process_context
from ._requests import (
    _MSG_CMSG_CLOEXEC,
    RunRequest,
    _fds_of,
    _hook_request,
    _receive_request,
    _run_request,
    _tell,
    report_member,
)
from ._wire import MAX_FRAME, PROTOCOL, FrameReader, WireError, encode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ._server import Server

__all__ = ["Connections", "Session"]

_REQUEST_TIMEOUT = 30.0
#: how long a refused peer's connection is drained at most (in all), and how many at once
_DRAIN_SECONDS = 2.0
_MAX_DRAINING = 16
# what corral run forwards: HUP, INT, QUIT, TERM, WINCH, and CONT, TSTP (Ctrl-Z, fg)
_FORWARDED = frozenset({1, 2, 3, 15, 18, 20, 28})


class Session:
    """One run being served: its connection, client pid and signal relay.

    *watch* is the serve loop's own duplicate of the connection: only the loop
    reads and closes it, so the run's thread may close *conn* at any time
    without the loop ever polling a descriptor number that was reused.
    """

    __slots__ = ("conn", "done", "pid", "reader", "relay", "watch")

    def __init__(self, conn: _socket.socket, pid: int) -> None:
        self.conn = conn
        self.pid = pid
        self.relay = SignalRelay()
        self.done = False
        self.reader = FrameReader()
        self.watch: _socket.socket | None = None


class Connections:
    """Serves the connections of one server (see the module docstring).

    Attributes:
        server: the server whose lock, lifecycle and handlers are used.
        sessions: the runs being served (``server.lock``).
        served, hooks, refused: counts for ``corral server --status``.
        own: the server's process context, which every peer must match.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.sessions: set[Session] = set()
        self.served = 0
        self.hooks = 0
        self.refused = 0
        self.own = process_context()
        self._draining = 0  # server.lock: refused connections being drained (refuse)
        self._new_watches: list[Session] = []  # server.lock; taken by the serve loop

    def refuse(self, conn: _socket.socket, reason: str, *, stale: bool = False) -> None:
        """Answer with a refusal, then drain what the peer still sends until it hangs up.

        Closing a unix socket with unread data resets the connection, and the
        client would never read the answer. The drain keeps nothing (fds that
        arrive are closed at once) and ends after 2 s in all (however slowly
        the peer sends) or 16 MiB; at most :data:`_MAX_DRAINING` connections
        drain at once, the others are closed as soon as the refusal is sent.
        So a refused peer - another user or a sandbox on the hub name, which
        anyone in the network namespace can reach - never holds one of the
        server's threads and descriptors for longer than that.
        """
        with self.server.lock:
            self.refused += 1
            drain = self._draining < _MAX_DRAINING
            if drain:
                self._draining += 1
        try:
            conn.sendall(encode({"refused": reason, "stale": stale}))
            conn.shutdown(_socket.SHUT_WR)
            if drain:
                self._drain(conn)
        except OSError:
            pass
        finally:
            if drain:
                with self.server.lock:
                    self._draining -= 1

    @staticmethod
    def _drain(conn: _socket.socket) -> None:
        deadline = time.monotonic() + _DRAIN_SECONDS
        received = 0
        while received < MAX_FRAME:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            conn.settimeout(left)
            data, ancdata, _flags, _addr = conn.recvmsg(
                65536, _socket.CMSG_SPACE(4 * 16), _MSG_CMSG_CLOEXEC
            )
            for fd in _fds_of(ancdata):
                os.close(fd)
            if not data:
                return
            received += len(data)

    def serve(self, conn: _socket.socket, front: str | None) -> None:
        """Check the peer, read its request and answer it; every failure is a refusal.

        *front* is the state directory whose socket *conn* came to (None: the
        hub name, where only ``adopt`` is answered). The caller (the server's
        connection thread) closes *conn*; the descriptors that arrived with
        the request are closed here.
        """
        conn.setblocking(True)
        try:
            pid, pidfd = check_peer(conn, self.own)
        except PeerRefused as exc:
            if exc.security:
                self.server.log(f"refused a peer: {exc.reason}")
            else:
                self.server.log(f"refused a client: {exc.reason}")
            self.refuse(conn, exc.reason)  # nothing of its request is read or kept
            return
        os.close(pidfd)
        conn.settimeout(_REQUEST_TIMEOUT)
        try:
            message, fds = _receive_request(conn)
        except (OSError, WireError, ValueError) as exc:
            self.server.log(f"bad request from pid {pid}: {exc}")
            self.refuse(conn, f"bad request: {exc}")
            return
        try:
            if front is None:
                self._adopt(conn, pid, message, fds)
            else:
                self._dispatch(conn, pid, message, fds, front)
        finally:
            for fd in fds:
                os.close(fd)

    def _adopt(
        self, conn: _socket.socket, pid: int, message: dict[str, Any], fds: list[int]
    ) -> None:
        """Answer ``adopt`` (the only request on the hub name): ``{"adopted": true, "pid"}``."""
        if message.get("op") != "adopt":
            self.refuse(conn, f"only 'adopt' is answered here, not {message.get('op')!r}")
            return
        if message.get("code") != self.server.stamp or message.get("protocol") != PROTOCOL:
            self.refuse(conn, "another corral code stamp")
            return
        if len(fds) != 1:
            self.refuse(conn, "'adopt' takes exactly one descriptor: the state directory's lock")
            return
        problem = self.server.adopt(message.get("state_dir"), fds[0], pid)
        if problem is not None:
            self.server.log(f"not serving {message.get('state_dir')!r} for pid {pid}: {problem}")
            self.refuse(conn, problem)
            return
        conn.sendall(encode({"adopted": True, "pid": os.getpid()}))

    def _dispatch(
        self, conn: _socket.socket, pid: int, message: dict[str, Any], fds: list[int], front: str
    ) -> None:
        op = message.get("op")
        if op == "status":
            conn.sendall(encode({"status": self.server.statistics(front)}))
            return
        if op == "stop":
            self.server.log(f"stop requested by pid {pid}")
            conn.sendall(encode({"stopping": True, "pid": os.getpid()}))
            self.server.stop()
            return
        if op == "hook":
            self._answer_hook(conn, pid, message, fds)
            return
        if op != "run":
            self.refuse(conn, f"unknown request {op!r}")
            return
        request = _run_request(message, fds, pid)
        if self._turned_away(conn, pid, message, request):
            return
        assert not isinstance(request, str)
        with self.server.lock:
            if self.server.retired or self.server.stopping:
                accepting = False
            else:
                accepting = True
                session = Session(conn, pid)
                self.sessions.add(session)
                self.served += 1
        if not accepting:
            self.refuse(conn, "the server is shutting down", stale=True)
            return
        try:
            conn.settimeout(None)
            conn.sendall(encode({"accepted": True}))
            # watched from now, while this thread prepares the run (not once the command
            # runs: then the write broker's thread needs the interpreter lock)
            self._watch(session)
            status = self._run(request, session)
            session.done = True
            try:
                conn.sendall(encode({"exit": status, **report_member(request)}))
            except OSError:
                pass  # the client is gone; the run was stopped and audited
            self._afterwards(request)
        finally:
            session.done = True
            try:
                conn.shutdown(_socket.SHUT_RDWR)  # the serve loop's watch reads the end
            except OSError:
                pass
            with self.server.lock:
                self.sessions.discard(session)

    def _turned_away(
        self, conn: _socket.socket, pid: int, message: dict[str, Any], request: object
    ) -> bool:
        """Refuse a request that failed validation (*request* is then the problem) or
        comes from a client running other code; True if refused."""
        if isinstance(request, str):
            self.server.log(f"bad request from pid {pid}: {request}")
            self.refuse(conn, f"bad request: {request}")
            return True
        return self._refused_as_stale(conn, pid, message)

    def _refused_as_stale(self, conn: _socket.socket, pid: int, message: dict[str, Any]) -> bool:
        """Refuse (and retire) when the client runs other code than this server; True if so.

        A client's code stamp must be this server's own (the Python client)
        or this installation's compiled client (``"c1:"`` + the real path of
        its ``_bin/corral-client``), with this protocol.
        """
        changed = self.server.watch.poll() if self.server.watch is not None else ""
        code = message.get("code")
        current = (
            code in (self.server.stamp, self.server.client_stamp)
            and message.get("protocol") == PROTOCOL
        )
        if current and not changed:
            return False
        why = f"code changed on disk ({changed})" if changed else "another corral code stamp"
        self.server.log(f"refused pid {pid}: {why}; retiring")
        self.refuse(conn, f"the server runs older code ({why})", stale=True)
        self.server.retire()
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
        with self.server.lock:
            shutting_down = self.server.retired or self.server.stopping
            if not shutting_down:
                self.hooks += 1
        if shutting_down:
            self.refuse(conn, "the server is shutting down", stale=True)
            return
        if self.server.hook_handler is None:
            self.refuse(conn, "this server does not answer hooks")
            return
        try:
            out, err, status = self.server.hook_handler(request)
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
            self.refuse(conn, f"the answer does not fit a frame: {exc}")
            return
        except Exception as exc:
            import traceback

            self.server.log(
                "internal error in a hook:\n" + "".join(traceback.format_exception(exc))
            )
            self.refuse(conn, f"internal error in the corral server: {type(exc).__name__}")
            return
        conn.sendall(frame)

    def _run(self, request: RunRequest, session: Session) -> int:
        pool = self.server.pool_for_a_run()
        try:
            status = self.server.handler(request, session.relay, pool)
        except BaseException as exc:
            import traceback

            self.server.log("internal error:\n" + "".join(traceback.format_exception(exc)))
            _tell(
                request.stdio[2],
                f"corral: internal error in the corral server: {type(exc).__name__}: {exc}\n"
                f"corral: hint: see {os.path.join(self.server.directory, 'server.log')}; "
                "CORRAL_SERVER=off runs corral without the server\n",
            )
            return 125
        if self.server.stopping and session.relay.stopped:
            _tell(request.stdio[2], "corral: the corral server was stopped; so was the command\n")
        return status

    def _afterwards(self, request: RunRequest) -> None:
        """Do what the run left for after its answer (never fails the connection)."""
        for work in request.afterwards:
            try:
                work()
            except Exception as exc:
                self.server.log(f"after a run: {exc!r}")

    def _watch(self, session: Session) -> None:
        """Have the serve loop watch *session*'s client (from the run's thread)."""
        session.watch = _socket.socket(fileno=os.dup(session.conn.fileno()))
        with self.server.lock:
            self._new_watches.append(session)
        self.server.wake()

    def new_watches(self) -> list[Session]:
        """The sessions the serve loop has to start watching (their ``watch`` sockets)."""
        with self.server.lock:
            new, self._new_watches = self._new_watches, []
        return new

    def client_readable(self, session: Session) -> bool:
        """Serve loop: take what the client sent; False when the watch is over.

        Signal frames are forwarded into the run; the client going away (or
        sending what is not a frame) kills its command unless the run is done.
        The caller then closes ``session.watch``.
        """
        assert session.watch is not None
        try:
            data = session.watch.recv(4096, _socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            data = b""
        if not data:
            if not session.done:
                self.server.log(f"client {session.pid} went away: killing its command")
                session.relay.kill()
            return False
        try:
            messages = session.reader.feed(data)
        except WireError as exc:
            self.server.log(f"client {session.pid}: {exc}: killing its command")
            session.relay.kill()
            return False
        for message in messages:
            signum = message.get("signal")
            if isinstance(signum, int) and signum in _FORWARDED:
                session.relay.deliver(signum)
        return True
