"""The relay of one ``microvm`` run: ``python -I -m corral.backends._microvm_run CONFIG AGENT``.

:meth:`MicrovmBackend.launch <corral.backends.microvm.MicrovmBackend.launch>`
boots the VM (or takes one from the warm pool) and mounts the workspace in
it, then has corral's engine start this program (through corral's exec
helper, in its own session) in place of the command, with the run's
configuration (JSON) on fd *CONFIG* and the connection to the guest agent
on fd *AGENT*. So the engine's clock (``resources.timeout``), output limit,
signals and stdio apply to the command itself, not to the boot. It runs the
command through the agent and relays:

* its stdin (when the run has one) to the guest, its stdout and stderr back;
* signals corral's engine sends it: SIGINT, SIGQUIT, SIGHUP, SIGUSR1,
  SIGUSR2 and SIGWINCH go to the command's process group in the guest;
  SIGTERM (a timeout or a stop) stops the whole guest tree (SIGTERM there,
  SIGKILL after the grace period);
* the command's end: it exits with the command's status, or kills itself
  with the command's signal. ``launch`` then powers the VM off.

Errors before the command starts are printed on stderr and exit 125.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading

from ._microvm_vm import BootFailed, Channel, ExecSpec

RELAYED = (
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)


def load_config(fd: int) -> tuple[ExecSpec, bool]:
    """The command and whether stdin is relayed, from the JSON on *fd*."""
    with os.fdopen(fd, "rb") as f:
        config = json.load(f)
    ex = dict(config["exec"])
    spec = ExecSpec(
        **{**ex, "argv": tuple(ex["argv"]), "env": tuple(tuple(kv) for kv in ex["env"])}
    )
    return spec, bool(config.get("stdin"))


def _pump_stdin(vm: Channel) -> None:
    try:
        while True:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            vm.send(b"I", chunk)
        vm.send(b"i")
    except OSError:
        pass


def main(argv: list[str]) -> int:
    """Run the command in the guest and relay; see the module docstring."""
    if len(argv) != 2 or not all(a.isdigit() for a in argv):
        sys.stderr.write("usage: python -m corral.backends._microvm_run CONFIG_FD AGENT_FD\n")
        return 125
    import socket

    spec, relay_stdin = load_config(int(argv[0]))
    vm = Channel(socket.socket(fileno=int(argv[1])))
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    pending: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        pending.append(signum)

    signal.set_wakeup_fd(wake_w)
    for sig in (*RELAYED, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        if signal.SIGTERM in pending:
            return 128 + signal.SIGTERM
        vm.start(spec)
        if relay_stdin:
            threading.Thread(target=_pump_stdin, args=(vm,), daemon=True).start()
        else:
            vm.send(b"i")
        while True:
            if not vm.has_buffered():
                ready, _, _ = select.select([vm.fileno(), wake_r], [], [])
                if wake_r in ready:
                    try:
                        os.read(wake_r, 512)
                    except BlockingIOError:
                        pass
            while pending:
                signum = pending.pop(0)
                if signum == signal.SIGTERM:
                    vm.send(b"T")
                else:
                    vm.send(b"S", bytes([signum]))
            if not vm.has_buffered() and not select.select([vm.fileno()], [], [], 0)[0]:
                continue
            kind, payload = vm.next_frame()
            if kind == b"1":
                _write(1, payload)
            elif kind == b"2":
                _write(2, payload)
            elif kind == b"F":
                sys.stderr.write(f"corral: {payload.decode('utf-8', 'replace')}\n")
                return 127 if b"exec" in payload[:5] else 126
            elif kind == b"X":
                how, _, _reason = payload.partition(b"\0")
                word, _, number = how.decode().partition(" ")
                if word == "signal":
                    signum = int(number)
                    signal.signal(signum, signal.SIG_DFL)
                    signal.set_wakeup_fd(-1)
                    os.kill(os.getpid(), signum)
                    return 128 + signum
                return int(number)
    except BootFailed as exc:
        sys.stderr.write(f"corral: the micro-VM failed: {exc}\n")
        return 125


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:
            return
        data = data[n:]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
