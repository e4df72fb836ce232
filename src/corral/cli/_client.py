"""``corral run`` as a thin client of the corral server (the hot path).

The client connects to the per-user server's socket, sends its argv, cwd,
whole environment, pid and code stamp with its fds 0, 1, 2 attached
(``SCM_RIGHTS``), forwards SIGHUP/SIGINT/SIGQUIT/SIGTERM/SIGWINCH as messages and exits with
the status the server sends back. The command's output goes straight to the
client's own fds; the server writes every ``corral:`` line there too.

Without a usable server the command runs in this process, exactly as
before:

* ``CORRAL_SERVER=off`` (or ``0``): always;
* no server listening (or one exiting just now): run here, then start a
  server in the background for next time (own session, stdio on
  ``/dev/null``, working directory ``/``) - unless this process is itself
  inside a corral sandbox;
* the server runs other corral code (stale): it refuses and retires; run
  here, then start a new one;
* the server refuses this client (its process context differs, see
  :mod:`corral.server._server`): run here;
* the last server start for this state directory failed (``server/busy``,
  e.g. the user's :data:`~corral.server._slots.MAX_SERVERS` servers already
  run, see :mod:`corral.server._slots`): run here with one warning on
  stderr, and start no server until the record expires.

Once the server has accepted, a broken connection means corral failed
(exit 125); the command is never run twice.

The compiled client (``corral-client``, see :mod:`corral.server._fastclient`) does
the same without an interpreter; when it cannot be served it execs this
command line with ``CORRAL_HANDOFF`` saying what it already learned
(``no-server``, ``stale`` or ``refused``, then ``:`` and the signals that
arrived meanwhile, e.g. ``no-server:2``). :func:`take_handoff` removes it from
the environment, so the run and a server started afterwards never see it.

Start-up budget: beyond what ``python -c pass`` loads, this path imports
only :mod:`os`, :mod:`sys`, ``_socket``, ``_signal`` and corral's
:mod:`~corral._jsonfast` (plus :mod:`corral.server._wire` and :mod:`corral._state`,
which import nothing else); ``tests/repo/test_hygiene.py`` checks it.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping

__all__ = [
    "FORWARDED_SIGNALS",
    "HANDOFF",
    "SIGTSTP",
    "main",
    "spawn_server",
    "start_server_later",
    "stop_like_a_job",
    "take_handoff",
]

SIGTSTP = 20
#: The terminal's signals ``corral run`` passes on to its command: SIGHUP, SIGINT, SIGQUIT,
#: SIGTERM, SIGCONT, SIGTSTP, SIGWINCH. The command runs in a session of its own, so corral
#: (the terminal's foreground job) gets them. Ctrl-Z (SIGTSTP) stops the whole sandbox
#: (every process in it gets SIGSTOP: ``Running.send_signal``), then corral stops itself
#: (:func:`stop_like_a_job`) so the shell's job control sees a stopped job; ``fg``/``bg``
#: send SIGCONT, which corral passes on to continue the sandbox.
FORWARDED_SIGNALS = (1, 2, 3, 15, 18, SIGTSTP, 28)

_NO_SERVER = "no-server"  # nothing listens: run here, start one afterwards
_STALE = "stale"  # it runs other code and retires: run here, start a new one
_REFUSED = "refused"  # it will not serve us: run here
#: what corral-client learned before it handed a call to this command line
HANDOFF = "CORRAL_HANDOFF"


def take_handoff(environ: MutableMapping[str, str]) -> tuple[str, list[int]] | None:
    """Remove ``CORRAL_HANDOFF`` from *environ*; what it said, or None (absent or malformed).

    Returns ``(result, signals)``: why the server did not serve the call
    (``"no-server"``, ``"stale"`` or ``"refused"``) and the signals
    (SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGCONT, SIGTSTP, SIGWINCH) that arrived before,
    in order.
    """
    value = environ.pop(HANDOFF, None)
    if value is None:
        return None
    result, colon, rest = value.partition(":")
    if result not in (_NO_SERVER, _STALE, _REFUSED) or (colon and not rest):
        return None
    signals = []
    for word in rest.split(",") if rest else ():
        if not word.isdigit() or int(word) not in FORWARDED_SIGNALS:
            return None
        signals.append(int(word))
    return result, signals


def main(args: list[str], *, console: bool = False) -> int:
    """``corral run ARGS``: through the server when possible, else in this process.

    With *console* (the ``corral`` command itself, not an embedding caller)
    the run ends this process right away with its status (``os._exit`` after
    flushing stdout and stderr; an in-process run after it started the
    server for next time): the interpreter's teardown would cost ~2 ms of the
    start-up budget. Nothing is left to finalise by then: the run's sandbox
    was reaped and its cgroup removed, its audit record and ``--json`` file
    were written with ``os.write`` or closed files, and the threads it
    started (launcher, broker, proxy) are done or daemons.
    """
    environ = os.environ
    handoff = take_handoff(environ)
    if environ.get("CORRAL_SERVER", "") in ("off", "0") or args[:1] in (["-h"], ["--help"]):
        status = _in_process(args, [])
        if console:
            _exit_now(status)
        return status
    import _signal  # type: ignore[import-not-found]  # not signal: it imports enum

    from .._state import state_dir

    state = state_dir(environ)
    pending: list[int] = []
    link: list[object] = []  # the socket, once the server accepted

    def forward(signum: int, _frame: object) -> None:
        if link:
            _send_signal(link[0], signum)
        else:
            pending.append(signum)
        if signum == SIGTSTP:  # Ctrl-Z: the sandbox stops (server side), then this process
            stop_like_a_job(forward)

    previous = {sig: _signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        if handoff is not None:  # corral-client asked the server already
            result: int | str = handoff[0]
            pending[:0] = handoff[1]
        else:
            result = _through_server(args, state, environ, pending, link)
        if result == _NO_SERVER and _joined(state, environ):
            result = _through_server(args, state, environ, pending, link)
        if isinstance(result, int):
            if console:
                _exit_now(result)
            return result
        busy = _busy(state) if result in (_NO_SERVER, _STALE) else None
        if busy is not None:
            os.write(
                2,
                f"corral: warning: no corral server could start ({busy}); "
                "running the command in this process\n".encode(errors="replace"),
            )
        status = _in_process(args, pending)
    finally:
        for sig, handler in previous.items():
            _signal.signal(sig, handler)
    if result in (_NO_SERVER, _STALE) and busy is None:
        start_server_later(state, environ)
    if console:
        _exit_now(status)
    return status


def _busy(state: str) -> str | None:
    """Why the last server start for *state* failed, while it is too soon to try again."""
    from ..server._slots import busy_reason

    return busy_reason(os.path.join(state, "server"))


def start_server_later(state: str, environ: Mapping[str, str]) -> None:
    """Start a server for the next client (best effort), unless :func:`_may_start_server` says no.

    A server that cannot be started at all (e.g. ``EAGAIN``: no process left
    for this user) is recorded like one that failed to start
    (:func:`corral.server._slots.mark_busy`): the next clients warn and do
    not try again for a while.
    """
    if _may_start_server(state, environ):
        try:
            spawn_server(state, environ)
        except OSError as exc:
            from ..server._slots import mark_busy

            mark_busy(os.path.join(state, "server"), f"cannot start a process: {exc}")


def _joined(state: str, environ: Mapping[str, str]) -> bool:
    """Whether the running server of this client's configuration serves *state* now
    (:func:`corral.server._hub.join`), when this client may start a server at all."""
    if not _may_start_server(state, environ):
        return False
    from ..server._hub import join, server_idle

    try:
        idle = server_idle(environ.get("CORRAL_SERVER_IDLE"))
    except ValueError:
        return False  # a server would not start either
    return join(state, environ, idle)


def _may_start_server(state: str, environ: Mapping[str, str]) -> bool:
    """Not inside a corral sandbox, no server found this kernel unfit (``server/unavailable``),
    and no server failed to start just now (``server/busy``)."""
    if environ.get("CORRAL_SANDBOX_ID") or _busy(state) is not None:
        return False
    try:
        with open(os.path.join(state, "server", "unavailable"), "rb") as f:
            release = f.readline().strip()
    except OSError:
        return True
    return release != os.uname().release.encode()


def _exit_now(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status & 0xFF if status >= 0 else 1)


def _in_process(args: list[str], pending: list[int]) -> int:
    """The run in this process; *pending* (still filled by our handlers) is read at its start."""
    from .commands.run import main as run_main  # first: signals during the import are kept

    return run_main(args, pending=tuple(pending))


def _through_server(
    args: list[str],
    state: str,
    environ: Mapping[str, str],
    pending: list[int],
    link: list[object],
) -> int | str:
    """The exit status from the server, or why the command must run here."""
    import _socket

    from ..server._wire import (
        PROTOCOL,
        FrameReader,
        WireError,
        code_stamp,
        connect_unix,
        encode,
        socket_path,
    )

    path = socket_path(state)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        try:
            connect_unix(sock, path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
            return _NO_SERVER
        except OSError:
            return _REFUSED  # e.g. EACCES: not ours to use
        cred = sock.getsockopt(_socket.SOL_SOCKET, 17, 12)  # SO_PEERCRED: pid, uid, gid
        uid = int.from_bytes(cred[4:8], sys.byteorder)
        if uid != os.getuid():
            # never hand our environment to another user's socket
            os.write(2, f"corral: warning: ignoring {path}: it belongs to uid {uid}\n".encode())
            return _REFUSED
        request = encode(
            {
                "op": "run",
                "protocol": PROTOCOL,
                "code": code_stamp(),
                "argv": args,
                "cwd": os.getcwd(),
                "env": dict(environ),
                "pid": os.getpid(),
            }
        )
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        try:
            sent = sock.sendmsg([request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            if sent < len(request):
                sock.sendall(request[sent:])
        except BrokenPipeError:
            return _NO_SERVER  # it is going away
        except OSError:
            return _REFUSED  # e.g. EBADF: a closed stdin/stdout/stderr
        reader = FrameReader()
        accepted = False
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            try:
                messages = reader.feed(data) if data else []
            except WireError:
                messages, data = [], b""
            if not data:
                if not accepted:
                    return _NO_SERVER  # it exited (idle) before taking the request
                os.write(
                    2,
                    b"corral: the corral server stopped during the run; the command was stopped "
                    b"with it\ncorral: hint: see " + os.fsencode(os.path.dirname(path)) + b"/"
                    b"server.log; CORRAL_SERVER=off runs corral without the server\n",
                )
                return 125
            for message in messages:
                if not accepted:
                    if message.get("accepted") is True:
                        accepted = True
                        link.append(sock)
                        while pending:
                            _send_signal(sock, pending.pop(0))
                        continue
                    return _STALE if message.get("stale") else _REFUSED
                status = message.get("exit")
                if isinstance(status, int):
                    _write_report(message.get("report"), sock.fileno())
                    return status
    finally:
        link.clear()
        sock.close()


def _write_report(report: object, own: int) -> None:
    """Write what the server's exit frame says the run hands ``--report-fd`` to that fd.

    Only a descriptor of 3 or more that is not this client's socket *own*;
    best effort (a closed descriptor reports nothing).
    """
    if not isinstance(report, dict):
        return
    fd, text = report.get("fd"), report.get("text")
    if not isinstance(fd, int) or isinstance(fd, bool) or fd < 3 or fd == own:
        return
    if not isinstance(text, str):
        return
    try:
        os.write(fd, os.fsencode(text))
    except OSError:
        pass


def _send_signal(sock: object, signum: int) -> None:
    from ..server._wire import encode

    try:
        sock.sendall(encode({"signal": signum}))  # type: ignore[attr-defined]
    except OSError:
        pass  # the server is gone; the loop reports it


def spawn_server(state: str, environ: Mapping[str, str], *, idle: str | None = None) -> int:
    """Start ``corral server`` detached: own session, stdio on ``/dev/null``, no inherited fds.

    It runs with this interpreter and *environ* (``-P``: the current
    directory is not on its import path) and moves to ``/`` itself. Returns
    its pid (a child of this process until this process exits).

    Raises:
        OSError: it could not be started.
    """
    if not sys.executable:
        raise OSError("no Python interpreter to start the server with")
    argv = [sys.executable, "-P", "-m", "corral", "server", "--state-dir", state]
    if idle is not None:
        argv += ["--idle", idle]
    actions: list[tuple[int, int, str, int, int] | tuple[int, int, int] | tuple[int, int]] = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDWR, 0),
        (os.POSIX_SPAWN_DUP2, 0, 1),
        (os.POSIX_SPAWN_DUP2, 0, 2),
    ]
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                actions.append((os.POSIX_SPAWN_CLOSE, fd))  # e.g. a pipe our caller waits on
        except OSError:
            pass  # the directory listing's own fd, closed by now
    return os.posix_spawn(sys.executable, argv, dict(environ), file_actions=actions, setsid=True)


def stop_like_a_job(handler: Callable[[int, object], None]) -> None:
    """Stop this process as SIGTSTP's default action would; return once it is continued.

    *handler* is put back afterwards. The signal is sent to the calling
    thread, so it is delivered before this returns (a process-directed one
    could reach the re-installed handler first and never stop the process).
    """
    import _signal  # not signal: it imports enum
    import _thread

    _signal.signal(SIGTSTP, _signal.SIG_DFL)
    try:
        _signal.pthread_kill(_thread.get_ident(), SIGTSTP)
    finally:
        _signal.signal(SIGTSTP, handler)
