"""Memory, process and CPU limits for a whole command tree, through cgroups.

corral creates one cgroup per run, puts the sandbox's first processes into it
*before* the command starts (bubblewrap's ``--block-fd``, or the exec
helper's ``--wait-fd``), and removes it afterwards. Two layouts are handled:

* **cgroup v2** (unified): a ``corral-<id>`` group beside or below our own
  group, wherever we may write and the ``memory``/``pids``/``cpu``
  controllers are available (root, or a systemd-delegated user subtree).
* **cgroup v1** (legacy/hybrid, e.g. this project's CI): one group per
  controller hierarchy (``memory``, ``pids``, ``cpu``, ``freezer``), created
  under our own group in each.

:func:`probe` says which layout is usable and, when none is, why; corral
then refuses runs that ask for these limits unless the caller opted into a
degraded run (``allowDegraded``).

Costs about a dozen small file writes per run; no processes are spawned.
"""

from __future__ import annotations

import errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Cgroup", "CgroupLayout", "Prestage", "probe", "sweep"]

_V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")


class CgroupLayout:
    """Where cgroups can be created on this machine.

    Attributes:
        version: 1 or 2.
        parents: for v2 ``{"": parent_dir}``; for v1 ``{controller: parent_dir}``.
        controllers: the controllers usable under ``parents``.
    """

    __slots__ = ("controllers", "parents", "version")

    def __init__(self, version: int, parents: dict[str, str], controllers: frozenset[str]) -> None:
        self.version = version
        self.parents = parents
        self.controllers = controllers

    def __repr__(self) -> str:
        return f"CgroupLayout(v{self.version}, {sorted(self.controllers)})"


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _own_paths() -> tuple[dict[str, str], str | None]:
    """Our cgroup path per v1 controller, and our v2 path (or None)."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in _read("/proc/self/cgroup").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        else:
            for name in controllers.split(","):
                v1[name] = path
    return v1, v2


def _mounts() -> tuple[dict[str, str], str | None]:
    """Mount points of v1 controller hierarchies and of the v2 hierarchy."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        fstype, _source, options = ([*right.split(), "", "", ""])[:3]
        mount_point = fields[4] if len(fields) > 4 else ""
        if fstype == "cgroup2":
            v2 = mount_point
        elif fstype == "cgroup":
            for opt in options.split(","):
                if opt in _V1_CONTROLLERS:
                    v1[opt] = mount_point
    return v1, v2


def probe(needed: frozenset[str]) -> tuple[CgroupLayout | None, str | None]:
    """Find a layout offering every controller in *needed* (``memory``, ``pids``, ``cpu``).

    Returns ``(layout, None)`` or ``(None, reason)``; the reason says what is
    missing and how to fix it.
    """
    try:
        own_v1, own_v2 = _own_paths()
        mounts_v1, mount_v2 = _mounts()
    except OSError as exc:
        return None, f"cannot read the cgroup layout: {exc}"
    want = set(needed) | {"freezer"} if needed else set()
    # v2 first: where its controllers are available.
    if mount_v2 is not None and own_v2 is not None:
        layout = _probe_v2(mount_v2, own_v2, needed)
        if layout is not None:
            return layout, None
    # v1: each needed controller mounted and writable under our own group.
    parents: dict[str, str] = {}
    missing: list[str] = []
    for controller in sorted(want):
        mount = mounts_v1.get(controller)
        if mount is None:
            if controller != "freezer":
                missing.append(controller)
            continue
        parent = os.path.join(mount, own_v1.get(controller, "/").lstrip("/"))
        if not os.access(parent, os.W_OK):
            if controller != "freezer":
                missing.append(controller)
            continue
        parents[controller] = parent
    if not missing:
        return CgroupLayout(1, parents, frozenset(parents)), None
    hint = (
        "run corral as root, or on cgroup v2 from a systemd user session with delegation "
        "(systemd-run --user --scope -p Delegate=yes ...)"
    )
    return None, f"no writable cgroup with the {', '.join(missing)} controller(s); {hint}"


def _probe_v2(mount: str, own: str, needed: frozenset[str]) -> CgroupLayout | None:
    """A writable v2 parent where *needed* controllers can be enabled for children."""
    candidates: list[str] = []
    path = own
    while True:
        parent = os.path.dirname(path.rstrip("/")) or "/"
        candidates.append(parent)
        if parent == "/":
            break
        path = parent
    for rel in candidates:
        directory = os.path.join(mount, rel.lstrip("/"))
        try:
            available = set(_read(os.path.join(directory, "cgroup.controllers")).split())
        except OSError:
            continue
        if not needed <= available:
            continue
        if not (
            os.access(directory, os.W_OK)
            and os.access(os.path.join(directory, "cgroup.procs"), os.W_OK)
        ):
            continue
        return CgroupLayout(2, {"": os.path.join(directory, "corral")}, frozenset(available))
    return None


class Cgroup:
    """One run's cgroup(s). Create with :meth:`create`, always :meth:`remove`.

    Example::

        cg = Cgroup.create(layout, "sbx-1a2b", memory=512 << 20, pids=256)
        cg.attach(pid)            # before the command starts
        ...
        cg.oom_killed()           # True if the memory limit killed something
        cg.kill_all()             # SIGKILL everything still inside
        cg.remove()

    A group handed out by :class:`corral.pipeline._launchers.LauncherPool` has a
    ``spawner``: a ``posix_spawn`` stand-in that starts the process from a
    thread already inside the group, so the process is born there and no
    ``cgroup.procs`` write (with its RCU grace period on v1) is needed.
    ``on_remove`` is called when :meth:`remove` starts (the pool lets the
    launcher thread go: the run's processes have been reaped by then);
    ``remove_later``, when set, is handed the removal to run on another
    thread (the server answers its client first).
    """

    __slots__ = ("dirs", "layout", "name", "on_remove", "remove_later", "spawner")

    def __init__(self, layout: CgroupLayout, dirs: dict[str, str], name: str = "") -> None:
        self.layout = layout
        self.dirs = dirs
        self.name = name
        self.spawner: Callable[..., int] | None = None
        self.on_remove: Callable[[], None] | None = None
        self.remove_later: Callable[[Callable[[], None]], None] | None = None

    @classmethod
    def create(
        cls,
        layout: CgroupLayout,
        name: str,
        *,
        memory: int | None = None,
        pids: int | None = None,
        cpus: float | None = None,
        freezer: bool = True,
    ) -> Cgroup:
        """Create the group(s) named *name* and write the limits.

        ``freezer`` (v1): also create a freezer group so :meth:`kill_all`
        can stop a tree that has no pid namespace of its own.

        Raises:
            OSError: a directory or limit file could not be written.
        """
        group = cls(layout, {})
        group.name = name
        try:
            group.set_limits(memory=memory, pids=pids, cpus=cpus, freezer=freezer)
        except BaseException:
            group.remove()
            raise
        return group

    def set_limits(
        self, *, memory: int | None, pids: int | None, cpus: float | None, freezer: bool = True
    ) -> None:
        """Create whatever group directories are still missing and write the limits."""
        layout, dirs, name = self.layout, self.dirs, self.name
        if layout.version == 2:
            parent = layout.parents[""]
            if not os.path.isdir(parent):
                try:
                    os.mkdir(parent)
                except FileExistsError:
                    pass
            enable = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in layout.controllers)
            _write_ignore_busy(
                os.path.join(os.path.dirname(parent), "cgroup.subtree_control"), enable
            )
            _write_ignore_busy(os.path.join(parent, "cgroup.subtree_control"), enable)
            path = os.path.join(parent, name)
            if "" not in dirs:
                os.mkdir(path)
                dirs[""] = path
            if memory is not None:
                _write(os.path.join(path, "memory.max"), str(memory))
                _write_optional(os.path.join(path, "memory.swap.max"), "0")
            if pids is not None:
                _write(os.path.join(path, "pids.max"), str(pids))
            if cpus is not None:
                _write(os.path.join(path, "cpu.max"), f"{int(cpus * 100_000)} 100000")
        else:
            wanted = {"freezer"} if freezer else set()
            if memory is not None:
                wanted.add("memory")
            if pids is not None:
                wanted.add("pids")
            if cpus is not None:
                wanted.add("cpu")
            self.ensure_dirs(wanted)
            if memory is not None:
                _write(os.path.join(dirs["memory"], "memory.limit_in_bytes"), str(memory))
                _write_optional(
                    os.path.join(dirs["memory"], "memory.memsw.limit_in_bytes"), str(memory)
                )
            if pids is not None:
                _write(os.path.join(dirs["pids"], "pids.max"), str(pids))
            if cpus is not None:
                _write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), "100000")
                _write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(int(cpus * 100_000)))

    def adopt(self, layout: CgroupLayout) -> bool:
        """Take *layout* (a run's probe) for the controllers this group adds from now on.

        A group prepared ahead (:class:`Prestage`, a launcher pool) was made
        from a probe for ``memory`` and ``pids``; a run that also limits
        ``cpu`` probed a layout that has it (one that needs no ``memory``
        limit, a layout without it: the group keeps its directory, unlimited).
        Returns False (the group cannot serve the run) when *layout* is
        another cgroup version or places a controller the group uses elsewhere.
        """
        if layout.version != self.layout.version:
            return False
        parents = dict(layout.parents)
        for controller in self.dirs:
            mine = self.layout.parents.get(controller)
            if parents.setdefault(controller, mine or "") != mine:
                return False
        self.layout = CgroupLayout(
            layout.version, parents, layout.controllers | self.layout.controllers
        )
        return True

    def ensure_dirs(self, controllers: set[str]) -> None:
        """v1: create the group directory in each of *controllers* (that exists)."""
        for controller in sorted(controllers & set(self.layout.parents)):
            if controller not in self.dirs:
                path = os.path.join(self.layout.parents[controller], self.name)
                os.mkdir(path)
                self.dirs[controller] = path

    def attach(self, pid: int) -> None:
        """Move *pid* into every group of this run."""
        for path in self.dirs.values():
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def procs(self) -> list[int]:
        """Pids currently inside (from the first group)."""
        for path in self.dirs.values():
            try:
                return [int(x) for x in _read(os.path.join(path, "cgroup.procs")).split()]
            except OSError:
                return []
        return []

    def oom_killed(self) -> bool:
        """Whether the memory limit killed a process in this group."""
        try:
            if self.layout.version == 2:
                text = _read(os.path.join(self.dirs[""], "memory.events"))
            elif "memory" in self.dirs:
                text = _read(os.path.join(self.dirs["memory"], "memory.oom_control"))
            else:
                return False
        except OSError:
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip() not in ("", "0"):
                return True
        return False

    def kill_all(self) -> None:
        """SIGKILL every process inside; freeze first where possible so none can fork."""
        if self.layout.version == 2:
            kill_file = os.path.join(self.dirs[""], "cgroup.kill")
            try:
                _write(kill_file, "1")
                return
            except OSError:
                pass
        freezer = self.dirs.get("freezer")
        if freezer is not None:
            try:
                _write(os.path.join(freezer, "freezer.state"), "FROZEN")
            except OSError:
                freezer = None
        me = os.getpid()
        for _ in range(100):
            # Never ourselves: on v1 a thread of ours inside the group (a launcher,
            # see corral.pipeline._launchers) lists our pid in cgroup.procs.
            pids = [pid for pid in self.procs() if pid != me]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            if freezer is not None:
                break
        if freezer is not None:
            try:
                _write(os.path.join(freezer, "freezer.state"), "THAWED")
            except OSError:
                pass

    def remove(self) -> None:
        """Remove the group(s) once every process has left them.

        Killed processes take a moment to exit (longer on a loaded machine),
        and a group with tasks cannot be removed: wait for ``cgroup.procs`` to
        empty (up to 10 s), then remove. A group that still cannot be removed
        is left for :func:`sweep` (its name carries corral's pid).

        With ``remove_later`` set, this object lets go of the directories at
        once (further calls are no-ops) and the removal runs wherever
        ``remove_later`` puts it.
        """
        import time

        if self.remove_later is not None:
            later, self.remove_later = self.remove_later, None
            detached = Cgroup(self.layout, self.dirs, self.name)
            detached.on_remove, self.on_remove = self.on_remove, None
            self.dirs = {}
            later(detached.remove)
            return
        hook, self.on_remove = self.on_remove, None
        if hook is not None:
            hook()  # e.g. an unused launcher thread leaves the group now
        deadline = time.monotonic() + 10.0
        delay = 0.0005
        while self.procs() and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        for path in list(self.dirs.values()):
            for attempt in range(100):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == 99:
                        break
                    time.sleep(0.01)
        self.dirs = {}


def sweep(layout: CgroupLayout) -> None:
    """Remove groups left behind by corral processes that no longer exist.

    Group names are ``corral-<pid>-<sandbox id>``; a group whose pid is gone
    and that has no processes is removed. Cheap (one ``listdir`` per parent).
    """
    for directory in set(layout.parents.values()):
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if not name.startswith("corral-"):
                continue
            pid = name.split("-", 2)[1]
            if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
                continue
            try:
                os.rmdir(os.path.join(directory, name))
            except OSError:
                pass


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _write_optional(path: str, value: str) -> None:
    try:
        _write(path, value)
    except FileNotFoundError:
        pass  # e.g. no swap accounting: nothing to limit


def _write_ignore_busy(path: str, value: str) -> None:
    if not value:
        return
    try:
        _write(path, value)
    except OSError as exc:
        if exc.errno not in (errno.EBUSY, errno.EINVAL, errno.ENOENT):
            raise


class Prestage:
    """A run's cgroup, created before corral knows it needs it.

    On cgroup v1 the first ``cgroup.procs`` write after a quiet period waits
    for an RCU grace period (``cgroup_threadgroup_rwsem`` entering writer
    mode: 7-22 ms on the CI machine) while holding ``cgroup_mutex``, and every
    other cgroup operation queues behind it. So at the very start of an
    in-process ``corral run`` this creates the run's groups (fast) and, on v1,
    parks one launcher thread inside them (:mod:`corral.pipeline._launchers`:
    a ``tasks`` write of one thread takes no such lock). The group handed out
    by :meth:`take` then has a ``spawner``: bubblewrap is born inside the
    group, with the run's limits already written, and no move is needed.

    On v2 (a thread cannot sit in another group than its process) it starts
    the wait instead, in a thread, with a no-op move of our own pid into our
    own group; corral meanwhile loads its settings, plans, and starts
    bubblewrap, and the sandbox's move waits for what is left.

    Example::

        stage = Prestage("corral-1234-sbx-1a2b")   # returns at once
        ...
        group = stage.take()     # the Cgroup (the caller owns it), or None
        # or: stage.discard()    # not needed after all
        ...
        stage.finish()           # before exiting: lets a discarded group go
    """

    __slots__ = ("_discarded", "_done", "_group", "_launcher", "_lock")

    def __init__(self, name: str) -> None:
        import _thread

        from ._launchers import PARKED_CONTROLLERS, Launcher

        self._group: Cgroup | None = None
        self._launcher: Launcher | None = None
        self._discarded: Cgroup | None = None
        self._lock = _thread.allocate_lock()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        target = None
        try:
            layout, _why = probe(frozenset({"memory", "pids"}))
            if layout is not None:
                sweep(layout)
                group = Cgroup(layout, {}, name)
                try:
                    if layout.version == 1:
                        group.ensure_dirs(set(PARKED_CONTROLLERS))
                    else:
                        group.set_limits(memory=None, pids=None, cpus=None, freezer=False)
                    self._group = group
                except OSError:
                    group.remove()
                if self._group is not None and set(PARKED_CONTROLLERS) <= set(group.dirs):
                    self._launcher = Launcher(group)  # v1: born inside, no move at all
                else:
                    target = _own_procs_file()
        except OSError:
            pass
        if target is None:
            self._done.release()
        else:
            _thread.start_new_thread(self._poke, (target,))

    def _poke(self, target: str) -> None:
        try:
            _write(target, str(os.getpid()))
        except OSError:
            pass
        finally:
            with self._lock:
                leftover, self._discarded = self._discarded, None
                self._done.release()
            if leftover is not None:
                leftover.remove()

    def take(self) -> Cgroup | None:
        """The prepared group (the caller owns it from now on).

        With a launcher parked inside (v1) the group's ``spawner`` starts a
        process from that thread and its ``on_remove`` lets the thread go;
        this waits for the thread to be parked (two ``tasks`` writes, started
        at construction). A launcher that could not park is dropped: the
        group is then moved into as usual.
        """
        group, self._group = self._group, None
        launcher, self._launcher = self._launcher, None
        if group is not None and launcher is not None:
            group.on_remove = launcher.release
            if launcher.wait_parked():
                group.spawner = launcher.spawn
        return group

    def discard(self) -> None:
        """The run needs no cgroup: remove the group now or when the thread is done."""
        group = self.take()
        if group is None:
            return
        with self._lock:
            if self._done.locked():
                self._discarded = group  # removing it now would queue behind the poke
                return
        group.remove()

    def finish(self, timeout: float = 1.0) -> None:
        """Wait (briefly) for the background thread so no group is left behind."""
        if self._done.acquire(True, timeout):
            self._done.release()


def _own_procs_file() -> str | None:
    """Our own group's ``cgroup.procs`` (pids hierarchy on v1), if writable."""
    own_v1, own_v2 = _own_paths()
    mounts_v1, mount_v2 = _mounts()
    if "pids" in mounts_v1:
        target = os.path.join(
            mounts_v1["pids"], own_v1.get("pids", "/").lstrip("/"), "cgroup.procs"
        )
    elif mount_v2 is not None and own_v2 is not None:
        target = os.path.join(mount_v2, own_v2.lstrip("/"), "cgroup.procs")
    else:
        return None
    return target if os.access(target, os.W_OK) else None
