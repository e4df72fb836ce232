"""The host side of one ``microvm`` run: ``python -I -m corral.backends._microvm_run FD``.

The microvm backend's plan launches this program (through corral's exec
helper, in its own session) instead of the command: it reads the run's
configuration (JSON, written by :meth:`MicrovmBackend.plan
<corral.backends.microvm.MicrovmBackend.plan>`) from fd *FD*, boots the VM,
mounts the workspace share in the guest, runs the command through the guest
agent and relays:

* its stdin (when the run has one) to the guest, its stdout and stderr back;
* signals corral's engine sends it: SIGINT, SIGQUIT, SIGHUP, SIGUSR1,
  SIGUSR2 and SIGWINCH go to the command's process group in the guest;
  SIGTERM (a timeout or a stop) stops the whole guest tree (SIGTERM there,
  SIGKILL after the grace period);
* the command's end: it exits with the command's status, or kills itself
  with the command's signal, after powering the VM off.

If this process is killed (SIGKILL included), qemu and virtiofsd die with it
(``PR_SET_PDEATHSIG``) and no file is left (see :mod:`._microvm_vm`).
Errors before the command starts are printed on stderr and exit 125.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading

from ._microvm_vm import BootFailed, ExecSpec, GuestVM, ShareSpec, VmConfig

RELAYED = (
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)


def load_config(fd: int) -> tuple[VmConfig, ExecSpec, bool]:
    """The VM, the command and whether stdin is relayed, from the JSON on *fd*."""
    with os.fdopen(fd, "rb") as f:
        config = json.load(f)
    vm = dict(config["vm"])
    share = vm.pop("share", None)
    vm_config = VmConfig(
        **vm,
        share=ShareSpec(
            wrapper=tuple(share["wrapper"]),
            source=share["source"],
            guest_path=share["guest_path"],
            read_only=share["read_only"],
        )
        if share
        else None,
    )
    ex = dict(config["exec"])
    spec = ExecSpec(
        **{**ex, "argv": tuple(ex["argv"]), "env": tuple(tuple(kv) for kv in ex["env"])}
    )
    return vm_config, spec, bool(config.get("stdin"))


def _pump_stdin(vm: GuestVM) -> None:
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
    """Boot, run, relay; see the module docstring."""
    if len(argv) != 1 or not argv[0].isdigit():
        sys.stderr.write("usage: python -m corral.backends._microvm_run FD\n")
        return 125
    config, spec, relay_stdin = load_config(int(argv[0]))
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    pending: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        pending.append(signum)

    signal.set_wakeup_fd(wake_w)
    for sig in (*RELAYED, signal.SIGTERM):
        signal.signal(sig, on_signal)
    vm = GuestVM(config)
    try:
        vm.boot()
        vm.mount_share()
    except BootFailed as exc:
        sys.stderr.write(f"corral: Failed to start the micro-VM: {exc}\n")
        vm.close()
        return 125
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
                vm.close()
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
    finally:
        vm.close()


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:
            return
        data = data[n:]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
