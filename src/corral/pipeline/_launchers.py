"""Ready per-run cgroups with a launcher thread inside (cgroup v1).

The corral server keeps a pool of them (:class:`LauncherPool`); an in-process
``corral run`` parks one :class:`Launcher` in its own group at its start
(:class:`corral.pipeline._cgroups.Prestage`).

On cgroup v1 the first ``cgroup.procs`` write of a process waits for an RCU
grace period (7-22 ms measured; see :class:`corral.pipeline._cgroups.Prestage`):
moving a whole thread group takes ``cgroup_threadgroup_rwsem`` for writing.
Moving *one thread* - the caller itself, by writing ``0`` to a v1 ``tasks``
file - does not take that lock (0.07 ms measured), and a process forked by a
thread is born in that thread's groups. So a long-lived process (the corral
server) keeps a few of these ready::

    pool = LauncherPool(layout, size=2)       # background: groups + parked threads
    group = pool.take()                       # a Cgroup with .spawner, or None
    engine: group.set_limits(...)             # the run's limits
            pid = group.spawner(path, argv, env, file_actions=..., setsigdef=...)
            ...                               # no attach: the sandbox was born inside
            group.remove()                    # after the process was reaped
    pool.close()

What the launcher thread does for one run, in order:

1. (when parked) joins the group's ``memory`` and ``pids`` directories;
2. joins whatever other directory the run's limits added (``cpu``, ``freezer``);
3. ``posix_spawn``: the child is born in every directory of the group;
4. leaves every directory again (back to the server's own groups), *before*
   handing the pid back: the engine releases the command only after that, so
   the thread never counts against ``pids.max``, is never frozen by the
   group's freezer and never lists the server's pid in ``cgroup.procs``
   while the command runs;
5. waits until the group is removed (the child has been reaped), then exits.
   The removal itself runs on the pool's thread after the engine let go of
   the group (``Cgroup.remove_later``), so the server answers its client
   without waiting for ``rmdir``.

Step 5 matters: ``PR_SET_PDEATHSIG`` (the exec helper's ``--die-with-parent``)
fires when the *thread* that created the child exits, not the process. A
launcher that exited right after the spawn would kill the sandbox.

If step 4 fails the child is killed, the thread exits (which removes it from
the group) and the spawn fails: the engine raises ``LaunchFailed`` (fail
closed). On cgroup v2 a thread cannot sit in another group than its process
(outside threaded subtrees, which have no memory controller): no pool there;
the engine moves the sandbox as before.
"""

from __future__ import annotations

import _thread
import os

from ._cgroups import Cgroup, CgroupLayout, _write

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["PARKED_CONTROLLERS", "Launcher", "LauncherPool"]

#: the default limits' controllers, joined when a launcher parks; others are joined on demand
PARKED_CONTROLLERS = ("memory", "pids")


class Launcher:
    """One thread, parked in one group, that starts one run's first process."""

    def __init__(self, group: Cgroup) -> None:
        self.group = group
        self.error: BaseException | None = None
        self._job: tuple[Any, ...] | None = None
        self._result: int | BaseException | None = None
        self._parked = _thread.allocate_lock()  # released when the thread is parked (or failed)
        self._go = _thread.allocate_lock()  # released by spawn(): a job is waiting
        self._done = _thread.allocate_lock()  # released by the thread: the result is ready
        self._leave = _thread.allocate_lock()  # released by release(): the thread may exit
        for lock in (self._parked, self._go, self._done, self._leave):
            lock.acquire()
        self._joined: list[str] = []  # controllers whose group directory this thread is in
        _thread.start_new_thread(self._main, ())

    # ----------------------------------------------------------- the thread
    def _main(self) -> None:
        try:
            for controller in PARKED_CONTROLLERS:
                self._join(controller)
        except BaseException as exc:
            self.error = exc
            self._leave_all_quietly()
            self._parked.release()
            return
        self._parked.release()
        self._go.acquire()
        job = self._job
        if job is None:  # the pool closed: leave and exit
            self._leave_all_quietly()
            return
        try:
            self._result = self._spawn(*job)
        except BaseException as exc:
            self._result = exc
            self._leave_all_quietly()
            self._done.release()
            return
        self._done.release()
        self._leave.acquire()  # the child's parent thread must outlive it (PR_SET_PDEATHSIG)

    def _join(self, controller: str) -> None:
        _write(os.path.join(self.group.dirs[controller], "tasks"), "0")
        self._joined.append(controller)

    def _leave_all(self) -> None:
        parents = self.group.layout.parents
        while self._joined:
            controller = self._joined[-1]
            _write(os.path.join(parents[controller], "tasks"), "0")
            self._joined.pop()

    def _leave_all_quietly(self) -> None:
        try:
            self._leave_all()
        except OSError:
            pass  # the thread exits next, which takes it out of every group

    def _spawn(
        self,
        path: str,
        argv: list[str],
        env: dict[str, str],
        file_actions: list[tuple[int, ...]],
        setsigdef: tuple[int, ...],
        setpgroup: int | None,
    ) -> int:
        for controller in self.group.dirs:  # the run's limits may have added cpu/freezer
            if controller not in self._joined:
                self._join(controller)
        if setpgroup is None:
            pid = os.posix_spawn(path, argv, env, file_actions=file_actions, setsigdef=setsigdef)
        else:
            pid = os.posix_spawn(
                path, argv, env, file_actions=file_actions, setsigdef=setsigdef, setpgroup=setpgroup
            )
        try:
            self._leave_all()
        except OSError:
            # SAFETY: a thread of ours must never stay in the group while the command
            # runs (pids.max, the freezer, kill_all). Stop the child; the thread exits.
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            raise
        return pid

    # ----------------------------------------------------------- other threads
    def wait_parked(self) -> bool:
        """Wait until the thread is in the group; False if it could not get there."""
        self._parked.acquire()
        self._parked.release()
        return self.error is None

    def spawn(
        self,
        path: str,
        argv: list[str],
        env: dict[str, str],
        *,
        file_actions: list[tuple[int, ...]],
        setsigdef: tuple[int, ...] = (),
        setpgroup: int | None = None,
    ) -> int:
        """``os.posix_spawn`` from inside the group; the pid, or the error re-raised here."""
        self._job = (path, argv, env, file_actions, setsigdef, setpgroup)
        self._go.release()
        self._done.acquire()
        result = self._result
        if isinstance(result, BaseException):
            raise result
        assert isinstance(result, int)
        return result

    def release(self) -> None:
        """The run is over (its process reaped), or there was none: let the thread exit.

        Call it once.
        """
        if self._job is None:
            self._go.release()  # never used: it wakes with no job, leaves and exits
        else:
            self._leave.release()


class LauncherPool:
    """A few ready groups, each with a launcher thread parked inside (v1 only).

    Args:
        layout: a v1 layout with the ``memory`` and ``pids`` controllers.
        size: how many to keep ready; a run that finds none falls back to
            moving its sandbox (today's path).

    Group names are ``corral-<pid>-launch-<n>`` so that
    :func:`corral.pipeline._cgroups.sweep` removes them if this process dies.

    Example::

        pool = LauncherPool(layout)
        group = pool.take()        # None when empty (or closed)
        ...
        pool.close()               # idle launchers leave, their groups are removed
    """

    def __init__(self, layout: CgroupLayout, *, size: int = 2) -> None:
        if layout.version != 1 or not set(PARKED_CONTROLLERS) <= set(layout.parents):
            raise ValueError("a launcher pool needs cgroup v1 with the memory and pids controllers")
        self.layout = layout
        self.size = size
        self.errors: list[str] = []  # why refills failed (the server logs them)
        self.served = 0
        self.missed = 0
        self._ready: list[Launcher] = []
        self._lock = _thread.allocate_lock()
        self._wake = _thread.allocate_lock()
        self._wake.acquire()
        self._stopped = _thread.allocate_lock()
        self._stopped.acquire()
        self._closed = False
        self._counter = 0
        self._removals: list[Callable[[], None]] = []
        _thread.start_new_thread(self._refill_loop, ())

    def statistics(self) -> dict[str, int]:
        """``ready``, ``served`` and ``missed`` (runs that found the pool empty)."""
        return {"ready": len(self._ready), "served": self.served, "missed": self.missed}

    def take(self) -> Cgroup | None:
        """A ready group whose ``spawner`` starts a process inside it, or None."""
        with self._lock:
            launcher = self._ready.pop() if self._ready and not self._closed else None
            if launcher is None:
                self.missed += 1
            else:
                self.served += 1
        if launcher is None:
            self._kick()
            return None
        group = launcher.group

        def done() -> None:
            launcher.release()
            # Refill only now: creating a group and parking a thread take the
            # kernel's cgroup_mutex and the GIL, which the run's own spawn needs.
            self._kick()

        group.spawner = launcher.spawn
        group.on_remove = done
        group.remove_later = self._remove_later
        return group

    def _remove_later(self, removal: Callable[[], None]) -> None:
        """Run a used group's removal on the pool's thread (off the run's critical path)."""
        with self._lock:
            closed = self._closed
            if not closed:
                self._removals.append(removal)
        if closed:
            removal()
        else:
            self._kick()

    def close(self) -> None:
        """Stop refilling; pending removals run, idle launchers leave, their groups go."""
        with self._lock:
            self._closed = True
            idle, self._ready = self._ready, []
        self._kick()
        self._stopped.acquire()
        self._stopped.release()
        with self._lock:
            removals, self._removals = self._removals, []
        for removal in removals:
            removal()
        for launcher in idle:
            launcher.release()
            launcher.group.remove()

    def _kick(self) -> None:
        if self._wake.locked():
            try:
                self._wake.release()
            except RuntimeError:
                pass  # another thread released it first

    def _refill_loop(self) -> None:
        failures = 0
        try:
            while True:
                with self._lock:
                    removals, self._removals = self._removals, []
                for removal in removals:  # used groups first: a run has just finished
                    removal()
                with self._lock:
                    if self._closed:
                        return
                    if self._removals:
                        continue
                    wanted = self.size - len(self._ready)
                if wanted <= 0 or failures >= 3:
                    self._wake.acquire()  # until take() or close(); then try again
                    failures = 0
                    continue
                launcher = self._new_launcher()
                if launcher is None:
                    failures += 1
                    continue
                with self._lock:
                    keep = self._open()  # close() may have run meanwhile
                    if keep:
                        self._ready.append(launcher)
                if not keep:
                    launcher.release()
                    launcher.group.remove()
        finally:
            self._stopped.release()

    def _open(self) -> bool:
        return not self._closed

    def _new_launcher(self) -> Launcher | None:
        self._counter += 1
        name = f"corral-{os.getpid()}-launch-{self._counter}"
        group = Cgroup(self.layout, {}, name)
        try:
            group.ensure_dirs(set(PARKED_CONTROLLERS))
        except OSError as exc:
            group.remove()
            self.errors.append(f"Failed to create {name}: {exc}")
            return None
        launcher = Launcher(group)
        if not launcher.wait_parked():
            self.errors.append(f"Failed to park a launcher in {name}: {launcher.error}")
            group.remove()
            return None
        return launcher
