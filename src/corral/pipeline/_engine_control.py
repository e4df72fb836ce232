"""The control half of a run: signals, Ctrl-Z, cancel, timeout and the kill of the whole tree.

These methods may be called from another thread or a signal handler while
:meth:`Running.wait <corral.pipeline._engine.Running.wait>` supervises.
"""

from __future__ import annotations

import os
import time

from ._engine_state import _sigterm, _State
from ._terminal import copy_window_size, restore_terminal

TYPE_CHECKING = False


class _Control(_State):
    """Deliver signals to the command's processes and stop them."""

    # ------------------------------------------------------------ control
    def send_signal(self, signum: int) -> None:
        """Deliver *signum* to the command's process group, as a terminal would (Ctrl-C).

        The command's first process and what it started without job control
        share a process group (``sh -c 'sleep 100; echo after'``: the shell and
        the ``sleep``); a terminal signals that whole group, while a shell
        signalled alone would wait for its child first. Every member in the
        sandbox gets the signal, never the sandbox's init (with bubblewrap the
        group is the init's). A no-op once the command was reaped.
        """
        if self._reaped:
            return  # its pids may belong to other processes by now
        if signum in (18, 20):  # SIGCONT, SIGTSTP: the terminal's job control, for the sandbox
            self._suspend(signum == 20)
            if self._relay is not None and self._saved_mode is not None:
                # the user's shell gets its terminal back as it was; continued, raw again
                from ._console import set_raw

                if signum == 20:
                    restore_terminal(*self._saved_mode)
                else:
                    set_raw(self._saved_mode[0])
                self._relay.pause(signum == 20)
                self._wake()
            return
        if signum == 28:  # SIGWINCH: the terminal was resized; so are corral's ptys first
            self._sync_window_sizes()
            if self._relay is not None:  # the pty's new size signals the command inside
                return
            if self._terminal:  # the engine CLI resizes the command's pty from its stdin's size
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    pass
                return
        init = self.sandbox_pid if self.sandbox_pid > 0 else self._unreported_init()
        tops = _children_of(init) if init > 0 else self._command_pids(top_only=True)
        if not tops and init > 0 and self.plan.backend == "bubblewrap":
            # corral's init has not forked the command yet: it takes the signal
            # (it handles the forwarded ones) and passes it on once it has
            try:
                os.kill(init, signum)
            except ProcessLookupError:
                pass
            return
        for top in tops:
            try:
                group = os.getpgid(top)
                if group == top:  # it leads its group (a session of its own): all in it
                    os.killpg(top, signum)
                    continue
            except ProcessLookupError:
                continue
            # a group led by the sandbox's init (bubblewrap's --new-session): its members
            members = {top}
            for pid in _pids_in_pidns_of(init) if init > 0 else ():
                try:
                    if pid != init and os.getpgid(pid) == group:
                        members.add(pid)
                except ProcessLookupError:
                    pass
            for pid in sorted(members):
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    def _suspend(self, stop: bool) -> None:
        """Stop (SIGSTOP) or continue (SIGCONT) every process of the command (Ctrl-Z, ``fg``).

        SIGSTOP, not the terminal's SIGTSTP: a program that catches or ignores
        SIGTSTP stops all the same, and so do processes in other groups
        (background jobs of the sandboxed shell). Processes forked while the
        tree is being stopped are caught by a second pass. The timeout keeps
        counting while the command is stopped.
        """
        signum = 19 if stop else 18
        seen: set[int] = set()
        for _ in range(3 if stop else 1):
            pids = [p for p in self._command_pids(top_only=False) if p not in seen]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass
            seen.update(pids)
        if self.sandbox_pid <= 0 and self.pid > 0:  # no pid namespace: the command's group
            try:
                os.killpg(self.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _sync_window_sizes(self) -> None:
        """Give each output pty the window size of the terminal it is relayed to."""
        for master, terminal in self._ptys:
            copy_window_size(terminal, master)

    def _unreported_init(self) -> int:
        """The sandbox's pid-namespace init when bubblewrap did not report it (no info fd), or -1.

        That is the spawned process's only child living in another pid
        namespace. The init must never get the signal: sent from outside its
        namespace, a SIGINT it has no handler for kills it, and the sandbox with it.
        """
        if self.pid <= 0 or self.plan.backend != "bubblewrap":
            return -1
        try:
            own = os.readlink(f"/proc/{self.pid}/ns/pid")
        except OSError:
            return -1
        children = _children_of(self.pid)
        if len(children) != 1:
            return -1
        try:
            inner = os.readlink(f"/proc/{children[0]}/ns/pid")
        except OSError:
            return -1
        return children[0] if inner != own else -1

    def cancel(self) -> None:
        """Stop the command now: SIGTERM, then SIGKILL after the grace period."""
        self._cancelled = True
        if self._kill_at is None and not self._reaped:
            self._terminate()
        self._wake()

    def kill(self) -> None:
        """Stop the whole sandbox at once (SIGKILL), as if corral itself had died.

        The corral server calls this when its client goes away; :meth:`wait`
        then returns soon after.
        """
        self._cancelled = True
        if self._relay is not None:  # no more keys for the command: the terminal is the shell's
            self._relay.pause(True)
            if self._saved_mode is not None:
                restore_terminal(*self._saved_mode)
        if self._reaped:
            return
        self._kill_at = time.monotonic()
        self._kill_everything()
        self._wake()

    def _wake(self) -> None:
        """Make :meth:`wait` recompute its poll timeout (it may wait on an older deadline)."""
        # Never blocks (a signal handler may interrupt the holder in this thread):
        # when the lock is taken, _release() is closing the fd or another wake writes.
        if not self._wake_lock.acquire(False):
            return
        try:
            if self._wake_fd >= 0:
                os.eventfd_write(self._wake_fd, 1)
        finally:
            self._wake_lock.release()

    def _command_pids(self, *, top_only: bool) -> list[int]:
        """Host pids of the command: bwrap's pid 2 (and below), or our child."""
        if self.sandbox_pid <= 0:
            return [self.pid] if self.pid > 0 else []
        if top_only:
            return _children_of(self.sandbox_pid)
        return [p for p in _pids_in_pidns_of(self.sandbox_pid) if p != self.sandbox_pid]

    def _terminate(self) -> None:
        for pid in self._command_pids(top_only=False):
            try:
                os.kill(pid, _sigterm())
            except ProcessLookupError:
                pass
        if self.sandbox_pid <= 0 and self.pid > 0:
            try:
                os.killpg(self.pid, _sigterm())
            except (ProcessLookupError, PermissionError):
                pass
        self._kill_at = time.monotonic() + self.plan.kill_grace

    def _kill_everything(self) -> None:
        if self.plan.reaper and self.sandbox_pid <= 0 and self.pid > 0:
            # The exec helper is the command's parent and subreaper: it kills every
            # process the command started, also those that left its process group
            # (setsid), and then exits. A SIGKILL would orphan them instead.
            for signum in (self.plan.reaper, 18):  # SIGCONT: it may be stopped (Ctrl-Z)
                try:
                    os.kill(self.pid, signum)
                except ProcessLookupError:
                    pass
            if self._cgroup is not None:
                self._cgroup.kill_all()
            return
        if self.sandbox_pid <= 0 and self.pid > 0 and self.plan.fd("info") is not None:
            # Set-up not finished: bubblewrap may have cloned the sandbox's first process
            # without telling us yet, and that process waits for bubblewrap's go-ahead
            # with no parent-death signal: killing bubblewrap alone would leave it
            # waiting forever. Stop bubblewrap (so it cannot clone meanwhile), kill
            # its children, then it.
            try:
                os.kill(self.pid, 19)  # SIGSTOP
                for child in _children_of(self.pid):
                    os.kill(child, 9)
            except ProcessLookupError:
                pass
        if self.sandbox_pid > 0:
            try:
                os.kill(self.sandbox_pid, 9)  # pid 1 of the namespace: the kernel kills the rest
            except ProcessLookupError:
                pass
        if self.pid > 0:
            try:
                os.killpg(self.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass
        if self._cgroup is not None:
            self._cgroup.kill_all()


def _children_of(ppid: int) -> list[int]:
    """Pids whose parent is *ppid* (scans /proc; used only to deliver signals)."""
    found: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == ppid:
            found.append(int(name))
    return found


def _pids_in_pidns_of(pid: int) -> list[int]:
    """Every host pid in the same pid namespace as *pid*."""
    try:
        target = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return []
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{name}/ns/pid") == target:
                found.append(int(name))
        except OSError:
            continue
    return found
