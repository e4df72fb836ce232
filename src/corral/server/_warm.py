"""Warm sandboxes: a fresh sandbox started before the ``corral run`` that takes it (the server).

Most of a fresh run's time is bubblewrap building the sandbox (namespaces,
mounts, the ``--as-user`` stage, the filters): work that depends on the
policy, the workspace and the host, not on the command. So after serving a
run, the corral server starts one more sandbox for the same **key** - the
digest of the run's policy and its workspace - in the background: a resident
sandbox (:mod:`corral.pipeline._resident`) whose init has run nothing. The
next plain ``corral run`` of that key takes it and runs its command there; the
sandbox then ends with that command, exactly as a fresh one would, and the
next one is started behind it. A warm sandbox serves **one** command, ever.

What makes it the same as a fresh sandbox (docs/design.md, "Warm sandboxes"):

* **the plan**: the run is planned as any fresh run is; its command goes to
  the warm sandbox only if that plan has the same shape (every mount, fd,
  filter, broker, cgroup and proxy setting; :meth:`Resident.run`) and the
  same policy. Anything else runs in a new sandbox as before;
* **the host**: the warm sandbox's masks and binds were decided when it
  started. Before its command, every host path its plan looked at is looked
  at again (kind, device, inode, birth or change time; each ``denyRead`` glob anew), and
  any difference retires it: the command then runs in a new sandbox planned
  from the host as it is (the resident host-change rule; never skipped here,
  unlike a kept session's first command);
* **nothing ran before**: its init has spawned nothing, its ``/tmp`` is its
  own tmpfs, and after the command every process of it is killed and its
  mounts, cgroup and broker go with it (:meth:`Resident.close`);
* per-command timeout, output cap, signals, stdin and audit record as in a
  kept sandbox (:mod:`corral.pipeline._resident`).

Bounds: at most :data:`DEFAULT_LIMIT` warm sandboxes (``CORRAL_WARM_MAX`` in
the server's environment; 0 turns them off), one per key; one unused for
:data:`DEFAULT_IDLE` seconds (``CORRAL_WARM_IDLE``) is ended. A key whose
policy a resident sandbox cannot serve (another backend, the egress proxy,
credentials) is remembered and never warmed.

Fail closed: whatever cannot run in a warm sandbox returns ``None`` and the
caller runs the command in a new sandbox - never without one.
"""

from __future__ import annotations

import _thread
import time

from ._kept import start_sweeper

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..pipeline._launchers import LauncherPool
    from ..pipeline._outcome import Outcome
    from ..pipeline._request import ExecRequest
    from ..pipeline._resident import Resident
    from ..pipeline._runner import SignalRelay
    from ..policy import Policy

__all__ = ["DEFAULT_DEPTH", "DEFAULT_IDLE", "DEFAULT_LIMIT", "WarmSandboxes"]

#: seconds a warm sandbox may wait for its command before it is ended
DEFAULT_IDLE = 60.0
#: how many warm sandboxes one server holds at most
DEFAULT_LIMIT = 2
#: how many of them one key may have: with two, a run that follows another at once finds one
#: ready while the one behind it starts
DEFAULT_DEPTH = 2
#: how long a run waits for the warm sandbox of its key that is still starting
_WAIT_STARTING = 2.0

Key = tuple[str, str, str]


class _Slot:
    """One key's warm sandbox: starting (``resident`` None, ``ready`` held) or ready."""

    __slots__ = ("abandoned", "made", "ready", "resident")

    def __init__(self) -> None:
        self.resident: Resident | None = None
        self.abandoned = False  # a run gave up waiting for it: end it once started
        self.made = time.monotonic()
        self.ready = _thread.allocate_lock()
        self.ready.acquire()  # released once the start ended (with a sandbox or without)


class WarmSandboxes:
    """The server's warm sandboxes, one per ``(policy digest, workspace)``.

    Example::

        warm = WarmSandboxes.from_environ(os.environ)
        outcome = warm.run(key, request, policy, relay=relay, streams=(0, 1, 2))
        if outcome is None:
            ...                               # run it in a new sandbox
        warm.refill(key, request, policy, environ=env)   # after the run, either way
        warm.close()                          # at the server's exit
    """

    def __init__(
        self, *, limit: int = DEFAULT_LIMIT, idle: float = DEFAULT_IDLE, depth: int = DEFAULT_DEPTH
    ) -> None:
        self.limit = limit
        self.idle = idle
        self.depth = depth
        self._lock = _thread.allocate_lock()
        self._slots: dict[Key, list[_Slot]] = {}
        self._unsuitable: set[Key] = set()
        self._closed = False
        self._reaper = False
        self._starting = 0  # threads starting a sandbox now (close() waits for them)
        self._ending = 0  # threads ending a used or unused one now (close() waits for them)
        self.served = 0  # runs that took a warm sandbox
        self.started = 0  # warm sandboxes started

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WarmSandboxes:
        """With ``CORRAL_WARM_MAX`` and ``CORRAL_WARM_IDLE`` (seconds) from *environ*, when valid."""
        limit, idle = DEFAULT_LIMIT, DEFAULT_IDLE
        try:
            limit = int(environ.get("CORRAL_WARM_MAX") or limit)
        except ValueError:
            pass
        try:
            idle = float(environ.get("CORRAL_WARM_IDLE") or idle)
        except ValueError:
            pass
        return cls(limit=max(0, limit), idle=idle if idle > 0 else DEFAULT_IDLE)

    def statistics(self) -> dict[str, int]:
        """``ready`` and ``starting`` now; ``served`` (runs that took one) and ``started`` so far."""
        with self._lock:
            ready = sum(1 for ss in self._slots.values() for s in ss if s.resident is not None)
            return {
                "ready": ready,
                "starting": self._count() - ready,
                "served": self.served,
                "started": self.started,
            }

    def _count(self) -> int:
        """(Under the lock.) Warm sandboxes, ready or starting."""
        return sum(len(slots) for slots in self._slots.values())

    # ------------------------------------------------------------ run
    def run(
        self,
        key: Key,
        request: ExecRequest,
        policy: Policy,
        *,
        relay: SignalRelay,
        streams: tuple[int, int, int],
    ) -> Outcome | None:
        """Run *request* in the warm sandbox of *key*, which then ends; ``None``: run it anew.

        A sandbox of *key* that is still starting is waited for (briefly): it
        started before this run arrived, so it is ready sooner than a new one.

        Raises:
            CorralError: the request cannot be planned, or the broker failed
                (as a fresh run would raise).
        """
        with self._lock:
            slots = self._slots.get(key)
            if not slots:
                return None
            ready = [s for s in slots if s.resident is not None]
            slot = ready[0] if ready else slots[0]
            slots.remove(slot)  # taken: no other run may have it
            if not slots:
                del self._slots[key]
        if not slot.ready.acquire(True, _WAIT_STARTING):
            with self._lock:  # still starting: its starter ends it when it is up
                slot.abandoned = True
            return None
        slot.ready.release()
        resident, slot.resident = slot.resident, None
        if resident is None:
            return None
        try:
            outcome = resident.run(request, policy, on_start=relay.started, streams=streams)  # type: ignore[arg-type]
        finally:
            self._end(resident)  # one command, ever
        with self._lock:
            if outcome is not None:
                self.served += 1
                return outcome
            # planned from a host that changed since (or for another shape): so were the
            # other ready ones of this key; the ones starting now are planned after the change
            stale = [slot for slot in self._slots.get(key, []) if slot.resident is not None]
            for slot in stale:
                self._slots[key].remove(slot)
            if key in self._slots and not self._slots[key]:
                del self._slots[key]
        for slot in stale:
            self._end_slot(slot)
        return None

    # ------------------------------------------------------------ refill
    def refill(
        self,
        key: Key,
        request: ExecRequest,
        policy: Policy,
        *,
        environ: Mapping[str, str],
        launchers: LauncherPool | None = None,
    ) -> None:
        """Start a warm sandbox for *key* in the background, unless one is there or may not be.

        *request* is the run just served (its command is not used: the sandbox
        is planned for ``/bin/true`` and runs nothing until a run takes it).
        With *launchers* its cgroup comes ready from the server's pool.
        """
        if policy.credentials:
            return  # chosen per command line: a sandbox planned ahead would have others
        released: list[_Slot] = []
        started: list[_Slot] = []
        with self._lock:
            if self._closed or self.limit <= 0 or key in self._unsuitable:
                return
            slots = self._slots.setdefault(key, [])
            while len(slots) < min(self.depth, self.limit):
                if self._count() >= self.limit:
                    others = [
                        (k, s)
                        for k, ss in self._slots.items()
                        if k != key
                        for s in ss
                        if s.resident is not None
                    ]
                    if not others:
                        break  # the rest are starting: no room now
                    oldest_key, oldest = min(others, key=lambda item: item[1].made)
                    self._slots[oldest_key].remove(oldest)
                    if not self._slots[oldest_key]:
                        del self._slots[oldest_key]
                    released.append(oldest)
                    continue
                slot = _Slot()
                slots.append(slot)
                started.append(slot)
            if not slots:
                del self._slots[key]
            self._starting += len(started)
            self.started += len(started)
            if started:
                self._start_reaper()
        for item in released:
            self._end_slot(item)
        base = request.replace(
            argv=("/bin/true",), shell_command=None, stdin_mode="null", stdin=b"", sandbox_id=""
        )
        environ = dict(environ)  # the caller's may change once it has its answer
        for slot in started:
            args = (key, slot, base, policy, environ, launchers)
            _thread.start_new_thread(self._start, args)

    def _start(
        self,
        key: Key,
        slot: _Slot,
        base: ExecRequest,
        policy: Policy,
        environ: dict[str, str],
        launchers: LauncherPool | None,
    ) -> None:
        from .._exceptions import CorralError
        from ..pipeline._resident import Resident

        resident = None
        suitable = True
        try:
            resident = Resident.open(
                base, policy, environ=environ, look_again=True, launchers=launchers
            )
            suitable = resident is not None
        except CorralError:
            pass  # the next fresh run reports why, if it still applies
        finally:
            with self._lock:
                self._starting -= 1
                if not suitable:
                    if len(self._unsuitable) >= 256:
                        self._unsuitable.clear()
                    self._unsuitable.add(key)
                keep = resident is not None and not self._closed and not slot.abandoned
                slots = self._slots.get(key, [])
                if not keep and slot in slots:
                    slots.remove(slot)
                    if not slots:
                        del self._slots[key]
                slot.resident = resident if keep else None
                slot.made = time.monotonic()
            slot.ready.release()
            if resident is not None and not keep:
                self._end(resident)  # the server is closing, or the run that waited gave up

    # ------------------------------------------------------------ release
    def _end_slot(self, slot: _Slot) -> None:
        """(The slot out of the table.) End its sandbox, if it has one (one starting ends
        itself: its starter sees it abandoned)."""
        resident, slot.resident = slot.resident, None
        if resident is not None:
            self._end(resident)
        else:
            slot.abandoned = True

    def _end(self, resident: Resident) -> None:
        """End *resident* (every process, mount, cgroup, broker) off the caller's path;
        :meth:`close` waits for it."""
        with self._lock:
            self._ending += 1
        _thread.start_new_thread(self._ending_thread, (resident,))

    def _ending_thread(self, resident: Resident) -> None:
        try:
            resident.close()
        finally:
            with self._lock:
                self._ending -= 1

    def _start_reaper(self) -> None:
        """(Under the lock.) Start the thread that ends idle warm sandboxes, once."""
        if not self._reaper:
            self._reaper = True
            start_sweeper(self.idle, self._reap)

    def _reap(self) -> bool:
        """End the warm sandboxes unused too long (or dead); False once closed."""
        released = []
        with self._lock:
            if self._closed:
                return False
            now = time.monotonic()
            for key, slots in list(self._slots.items()):
                for slot in list(slots):
                    resident = slot.resident
                    if resident is not None and (now - slot.made >= self.idle or resident.broken):
                        slots.remove(slot)
                        released.append(slot)
                if not slots:
                    del self._slots[key]
        for slot in released:
            self._end_slot(slot)
        return True

    def close(self) -> None:
        """End every warm sandbox, and any that is starting once it started (the server exits)."""
        with self._lock:
            self._closed = True
            slots = [slot for ss in self._slots.values() for slot in ss]
            self._slots.clear()
        for slot in slots:
            resident, slot.resident = slot.resident, None
            if resident is not None:
                resident.close()  # here: every process, mount and cgroup before the exit
            else:
                slot.abandoned = True
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with self._lock:
                if self._starting == 0 and self._ending == 0:
                    return
            time.sleep(0.01)
