"""Kept sandboxes for agent sessions: ``corral run --keep --agent-session ID`` in the server.

The Claude Code hook rewrites every Bash call to ``corral-client run --keep
--agent-session ID ...``. The corral server keeps one resident sandbox
(:mod:`corral.pipeline._resident`) per **key** - the agent session id, the
digest of the run's policy and its workspace - and runs each further command
of that key in it: one fork of the sandbox's init instead of a new
bubblewrap (docs/design.md, "Kept sandboxes for agent sessions"). Another
policy (a changed setting, a ``rules`` entry, a flag) or another workspace is
another key: a new sandbox. The server serves one user (its peers are
checked), so a kept sandbox is never shared across users; never across
sessions either (the session id is part of the key).

Each kept sandbox has a private host directory mounted as its ``/tmp``
(``<state dir>/sessions/<server pid>-kept-<n>``, mode 0700, removed when the
sandbox is released; a dead server's are swept by the next first open).

The shell state the hook's rewritten command carries (its exports, then its
tagged cwd report) travels on a *state channel*: each kept call gets a new
``memfd`` as its descriptor :data:`STATE_FD` (named in :data:`STATE_VARIABLE`),
holding what the previous call of the key left, with its offset at the end.
The script sources ``/dev/fd/63`` (a new open file description, from the
start) and writes its new state with ``>&63`` (at the shared offset: after
the old state). After the call the server keeps what was written past the old
state (at most :data:`MAX_STATE` bytes) for the next call, and reads the
report from its tail. No open for writing in the sandbox (each is a round trip
to the write broker) and no file on the user's disk; nothing the sandbox can
link, replace or leave as a FIFO; and the state is only ever sourced inside
this key's sandbox (see
:func:`corral.integrations.claude_code_hook.rewrite_command`).

Bounds: a kept sandbox unused for :data:`DEFAULT_IDLE` seconds
(``CORRAL_KEPT_IDLE`` in the server's environment) is released; at most
:data:`DEFAULT_LIMIT` are kept (``CORRAL_KEPT_MAX``); beyond that the one
unused longest is released, and when every one is busy the command runs in a
fresh sandbox. A key whose kept sandbox is busy (a background call of the same
session) also runs fresh.

Fail closed: whatever cannot run in the kept sandbox (it died, a plan of
another shape, a terminal, a policy it cannot enforce) returns ``None`` and
the caller runs the command in a fresh sandbox - never without one.
"""

from __future__ import annotations

import _thread
import os
import time

from ._cwd_report import tagged_report

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from ..pipeline._outcome import Outcome
    from ..pipeline._request import ExecRequest
    from ..pipeline._resident import Resident
    from ..pipeline._runner import SignalRelay
    from ..policy import Policy

__all__ = [
    "DEFAULT_IDLE",
    "DEFAULT_LIMIT",
    "MAX_STATE",
    "STATE_FD",
    "STATE_VARIABLE",
    "KeptSessions",
]

#: seconds a kept sandbox may stay unused before it is released (the server's own idle exit)
DEFAULT_IDLE = 300.0
#: how many kept sandboxes one server holds at most
DEFAULT_LIMIT = 8
#: the kept command's descriptor of its state channel (``corral-exec --serve``'s CX_STATE_FD)
STATE_FD = 63
#: the variable that names :data:`STATE_FD` to a kept run ("" in every fresh run)
STATE_VARIABLE = "CORRAL_SESSION_STATE"
#: the most shell state one call may leave for the next (more: nothing carries)
MAX_STATE = 1 << 20


class _Kept:
    __slots__ = (
        "busy",
        "next_channel",
        "next_id",
        "next_lock",
        "resident",
        "state",
        "tmp_dir",
        "used",
    )

    def __init__(self, resident: Resident, tmp_dir: str) -> None:
        self.resident = resident
        self.tmp_dir = tmp_dir
        self.busy = False
        self.used = time.monotonic()
        #: what the last call left on the state channel (the sandbox's own, untrusted claim)
        self.state = b""
        #: the state channel and sandbox id of the next call's shell started ahead (-1: none)
        self.next_channel = -1
        self.next_id = ""
        #: held while that shell is being started: the next call waits for it
        self.next_lock = _thread.allocate_lock()


class KeptSessions:
    """The server's kept sandboxes, by ``(agent session, policy digest, workspace)``.

    Example::

        kept = KeptSessions(state_dir)
        done = kept.run(key, request, policy, environ=env, relay=relay, streams=(0, 1, 2))
        if done is None:
            ...                        # run it in a fresh sandbox
        outcome, cwd_report = done
        kept.close()                   # at the server's exit
    """

    def __init__(
        self, state_dir: str, *, idle: float = DEFAULT_IDLE, limit: int = DEFAULT_LIMIT
    ) -> None:
        self._state_dir = state_dir
        self.idle = idle
        self.limit = limit
        self._lock = _thread.allocate_lock()
        self._kept: dict[tuple[str, str, str], _Kept] = {}
        self._counter = 0
        self._reaper = False
        self._closed = False
        self._swept: set[str] = set()  # the sessions directories swept once
        #: keys whose policy a kept sandbox cannot serve (each of their calls runs fresh)
        self._unsuitable: set[tuple[str, str, str]] = set()

    @classmethod
    def from_environ(cls, state_dir: str, environ: Mapping[str, str]) -> KeptSessions:
        """With ``CORRAL_KEPT_IDLE`` (seconds) and ``CORRAL_KEPT_MAX`` from *environ*, when valid."""
        idle, limit = DEFAULT_IDLE, DEFAULT_LIMIT
        try:
            idle = float(environ.get("CORRAL_KEPT_IDLE") or idle)
        except ValueError:
            pass
        try:
            limit = int(environ.get("CORRAL_KEPT_MAX") or limit)
        except ValueError:
            pass
        return cls(state_dir, idle=idle if idle > 0 else DEFAULT_IDLE, limit=max(0, limit))

    def __len__(self) -> int:
        return len(self._kept)

    # ------------------------------------------------------------ run
    def run(
        self,
        key: tuple[str, str, str],
        request: ExecRequest,
        policy: Policy,
        *,
        environ: Mapping[str, str],
        relay: SignalRelay,
        streams: tuple[int, int, int],
    ) -> tuple[Outcome, bytes | None] | None:
        """Run *request* in the kept sandbox of *key* (opened on first use).

        Returns ``(outcome, the working directory the command reported or None)``,
        or ``None``: run it in a fresh sandbox instead.

        Raises:
            CorralError: the request cannot be planned, or the broker failed
                (as a fresh run would raise).
        """
        kept = self._take(key, request, policy, environ)
        if kept is None:
            return None
        with kept.next_lock:  # a shell being started ahead for this call: wait for it
            channel, kept.next_channel = kept.next_channel, -1
        if channel >= 0:
            # the call the shell started ahead waits for has the id chosen for it (its
            # environment names it); it runs there if it fits (Resident.run), else as before
            request = request.replace(sandbox_id=kept.next_id)
        try:
            if channel < 0:
                try:
                    channel = _state_channel(kept.state)
                except OSError:
                    return None  # no memfd to be had (out of descriptors): a fresh sandbox
            outcome = kept.resident.run(
                _as_kept(request, kept.tmp_dir),
                policy,
                on_start=relay.started,  # type: ignore[arg-type]  # the relay's duck type
                streams=streams,
                state_fd=channel,
            )
            report = None
            if outcome is not None:
                report = self._take_state(kept, channel, request.sandbox_id)
        finally:
            if channel >= 0:
                os.close(channel)
            with self._lock:
                kept.busy = False
                kept.used = time.monotonic()
        return None if outcome is None else (outcome, report)

    def _take(
        self,
        key: tuple[str, str, str],
        request: ExecRequest,
        policy: Policy,
        environ: Mapping[str, str],
    ) -> _Kept | None:
        """The idle kept sandbox of *key*, marked busy (opened if there is none), or None."""
        released: list[_Kept] = []
        try:
            with self._lock:
                if self._closed or self.limit <= 0 or key in self._unsuitable:
                    return None
                kept = self._kept.get(key)
                if kept is not None and kept.resident.broken and not kept.busy:
                    released.append(self._kept.pop(key))  # it died: a new one below
                    kept = None
                if kept is not None:
                    if kept.busy or kept.resident.broken:
                        return None  # in use by another call of the session: a fresh sandbox
                    kept.busy = True
                    return kept
                while len(self._kept) >= self.limit:
                    idle = [(k, v) for k, v in self._kept.items() if not v.busy]
                    if not idle:
                        return None
                    oldest = min(idle, key=lambda item: item[1].used)[0]
                    released.append(self._kept.pop(oldest))
                self._counter += 1
                number = self._counter
            opened, suitable = self._open(number, request, policy, environ)
            if opened is None:
                if not suitable:
                    with self._lock:
                        if len(self._unsuitable) >= 256:
                            self._unsuitable.clear()
                        self._unsuitable.add(key)
                return None
            with self._lock:
                if self._closed or key in self._kept:
                    released.append(opened)  # closed meanwhile, or a twin call opened one
                    return None
                opened.busy = True
                self._kept[key] = opened
                self._start_reaper()
            return opened
        finally:
            for item in released:
                _release(item)

    def _open(
        self, number: int, request: ExecRequest, policy: Policy, environ: Mapping[str, str]
    ) -> tuple[_Kept | None, bool]:
        """A new kept sandbox, or ``(None, whether another attempt may succeed)``."""
        from .._exceptions import CorralError
        from .._state import ensure_dir
        from ..pipeline._resident import Resident

        if policy.credentials:
            # credentials are injected per command line: a kept /tmp and shell state would
            # carry one command's credential into the next
            return None, False
        tmp_dir = ""
        try:
            # in the caller's state directory, as its own process would (a server serves
            # every state directory of its configuration: corral.server._hub)
            sessions = ensure_dir(os.path.join(_state_dir(environ, self._state_dir), "sessions"))
            if sessions not in self._swept:  # kept /tmps (and SDK TMPDIRs) of dead processes
                from .._session_dirs import sweep_sessions as _sweep_sessions

                self._swept.add(sessions)
                _sweep_sessions(sessions)
            tmp_dir = os.path.join(sessions, f"{os.getpid()}-kept-{number}")
            os.mkdir(tmp_dir, 0o700)
        except (CorralError, OSError):
            if tmp_dir:
                _remove_tree(tmp_dir)
            return None, True  # the fresh run reports what is wrong, if anything
        base = _as_kept(
            request, tmp_dir, argv=("/bin/true",), shell_command=None, stdin_mode="null", stdin=b""
        )
        resident = None
        try:
            resident = Resident.open(base, policy, environ=environ)
        except CorralError:
            return None, True  # the fresh run reports why
        finally:
            if resident is None:
                _remove_tree(tmp_dir)
        if resident is None:
            return None, False  # another backend, the egress proxy, ...: never here
        return _Kept(resident, tmp_dir), True

    @staticmethod
    def _take_state(kept: _Kept, channel: int, sandbox_id: str) -> bytes | None:
        """Keep what the call wrote on its state *channel* for the next call; the working
        directory it reported at its end, or None.

        Untrusted bytes from the sandbox: what was written past the state the call was
        given, at most :data:`MAX_STATE` bytes (more: the next call gets no state), and
        the report only what follows the marker that names this run's *sandbox_id*
        (:func:`corral.server._cwd_report.tagged_report`); ``corral run`` checks the
        path (:func:`~corral.server._cwd_report.checked_directory`). A call that wrote
        nothing (it was killed, or closed the channel) leaves the state it was given,
        as a failed write of the state file did. No process of the sandbox runs now
        (the init swept them all before it reported the end), though one may have
        passed the descriptor on to nothing that outlives it.
        """
        start = len(kept.state)
        try:
            size = os.fstat(channel).st_size
            written = b"" if size - start > MAX_STATE else os.pread(channel, MAX_STATE, start)
        except OSError:
            written, size = b"", start
        if written:
            kept.state = written
        elif size - start > MAX_STATE:
            kept.state = b""
        return tagged_report(written, sandbox_id) if written else None

    # ------------------------------------------------------------ release
    def _start_reaper(self) -> None:
        """(Under the lock.) Start the thread that releases idle sandboxes, once."""
        if not self._reaper:
            self._reaper = True
            start_sweeper(self.idle, self._reap)

    def _reap(self) -> bool:
        """Release the kept sandboxes idle too long (or dead); False once closed."""
        released = []
        with self._lock:
            if self._closed:
                return False
            now = time.monotonic()
            for key, kept in list(self._kept.items()):
                if not kept.busy and (now - kept.used >= self.idle or kept.resident.broken):
                    released.append(self._kept.pop(key))
        for kept in released:
            _release(kept)
        return True

    def start_next(self, key: tuple[str, str, str], request: ExecRequest) -> bool:
        """Start the shell of the next call of *key* ahead, after a call *request* of the
        shape ``[bash, "-c", SCRIPT]`` (:mod:`corral.pipeline._resident_next`): whether
        it now waits. Run once the call's client has its answer; a call that comes
        meanwhile waits for it."""
        from ..pipeline._request import new_sandbox_id
        from ..pipeline._resident_next import LOADER

        argv = request.argv
        if len(argv) != 3 or argv[1] != "-c" or os.path.basename(argv[0]) != "bash":
            return False  # the loader is bash's (read -d, -n): the hook's --shell bash
        with self._lock:
            kept = self._kept.get(key)
            if (
                kept is None
                or self._closed
                or kept.busy
                or kept.resident.broken
                or kept.next_channel >= 0
                or not kept.next_lock.acquire(False)
            ):
                return False
        try:
            try:
                channel = _state_channel(kept.state)
            except OSError:
                return False
            sandbox_id = new_sandbox_id()
            ahead = _as_kept(
                request,
                kept.tmp_dir,
                argv=(argv[0], "-c", LOADER),
                shell_command=None,
                sandbox_id=sandbox_id,
                stdin_mode="null",
                stdin=b"",
                capture=True,
            )
            try:
                waiting = kept.resident.start_next(ahead, state_fd=channel)
            except Exception:
                waiting = False  # e.g. a plan that fails now: the call plans (and says) it
            if not waiting:
                os.close(channel)
                return False
            kept.next_channel, kept.next_id = channel, sandbox_id
            return True
        finally:
            kept.next_lock.release()

    def close(self) -> None:
        """Release every kept sandbox that is not running a command (the server exits)."""
        with self._lock:
            self._closed = True
            released = [kept for kept in self._kept.values() if not kept.busy]
            self._kept.clear()
        for kept in released:
            _release(kept)


def _as_kept(request: ExecRequest, tmp_dir: str, **changes: Any) -> ExecRequest:
    """*request* as it runs in a kept sandbox: its ``/tmp`` the sandbox's, the state
    channel named to it (:data:`STATE_VARIABLE`), and *changes*."""
    return request.replace(
        tmp_dir=tmp_dir, env=(*request.env, (STATE_VARIABLE, str(STATE_FD))), **changes
    )


def _state_channel(state: bytes) -> int:
    """A new memfd holding *state*, its offset at the end (the call writes after it)."""
    fd = os.memfd_create("corral-shell-state", os.MFD_CLOEXEC)
    try:
        view = memoryview(state)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        raise
    return fd


def _state_dir(environ: Mapping[str, str], default: str) -> str:
    """The state directory of a caller whose environment is *environ* (else *default*)."""
    from .._state import state_dir

    return state_dir(environ) if environ else default


def start_sweeper(idle: float, sweep: Callable[[], bool]) -> None:
    """Start a thread that calls *sweep* every quarter of *idle* seconds (0.2 to 5 s) until
    it returns False (its owner closed): how kept and warm sandboxes are ended when unused."""

    def loop() -> None:
        while True:
            time.sleep(min(max(idle / 4, 0.2), 5.0))
            if not sweep():
                return

    _thread.start_new_thread(loop, ())


def _release(kept: _Kept) -> None:
    with kept.next_lock:  # a shell being started ahead: let it finish first
        channel, kept.next_channel = kept.next_channel, -1
    if channel >= 0:
        os.close(channel)
    kept.resident.close()
    _remove_tree(kept.tmp_dir)


def _remove_tree(path: str) -> None:
    from ..preview._mechanism import remove_tree

    try:
        remove_tree(path)
    except OSError:
        pass
