"""The relay of one ``microvm`` run: ``python -I -S _microvm_run.py EXEC_FD AGENT_FD DONE_FD``.

:meth:`MicrovmBackend.launch <corral.backends.microvm.MicrovmBackend.launch>`
boots the VM (or takes one from the warm pool) and mounts the workspace in
it, then has corral's engine start this program (through corral's exec
helper, in its own session) in place of the command, with the command (one
byte, ``1`` when stdin is relayed, then the agent's 'E' frame payload) on fd
*EXEC_FD* and the connection to the guest agent on fd *AGENT_FD*. So the
engine's clock (``resources.timeout``), output limit, signals and stdio apply
to the command itself, not to the boot. It relays:

* its stdin (when the run has one) to the guest, its stdout and stderr back;
* signals corral's engine sends it: SIGINT, SIGQUIT, SIGHUP, SIGUSR1,
  SIGUSR2 and SIGWINCH go to the command's process group in the guest;
  SIGTERM (a timeout or a stop) stops the whole guest tree (SIGTERM there,
  SIGKILL after the grace period);
* the command's end: it exits with the command's status, or kills itself
  with the command's signal. ``launch`` then destroys the VM (a session's
  kept VM runs the next command instead).

On *DONE_FD* it writes ``s`` once the agent has the command and ``x`` once
the agent said the command ended ('X' or 'F'): a kept VM whose relay ended
between the two (killed after a timeout's grace) still has a command to stop
and frames to drain before the next one
(:mod:`corral.pipeline._vm_session`).

It is a script of the standard library alone, started without ``site``
(``-S``): its start-up is on every run's path. The frame format is the
agent's (``src/corral/native/corral-vm-agent.c``), as in
:class:`corral.backends._microvm_vm.Channel`. Errors before the command
starts are printed on stderr and exit 125.
"""

import os
import select
import signal
import socket
import struct
import sys
import threading

#: The largest frame the agent ever sends (its ``MAX_FRAME``; output comes in 64 KiB
#: chunks). The guest's root can take the agent's port (``pidfd_getfd``) and send
#: anything: a longer announced length is refused, not buffered.
MAX_FRAME = 1 << 20

RELAYED = (
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)


class Agent:
    """The agent connection: frames out (thread-safe), frames in (buffered)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.lock = threading.Lock()

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        with self.lock:
            self.sock.sendall(kind + struct.pack(">I", len(payload)) + payload)

    def frame(self) -> "tuple[bytes, bytes] | None":
        """A complete buffered frame, or None.

        Raises:
            ValueError: the frame announces more than :data:`MAX_FRAME` bytes.
        """
        if len(self.buf) < 5:
            return None
        (length,) = struct.unpack(">I", self.buf[1:5])
        if length > MAX_FRAME:
            raise ValueError(f"a frame of {length} bytes (at most {MAX_FRAME})")
        if len(self.buf) < 5 + length:
            return None
        kind, payload = self.buf[:1], self.buf[5 : 5 + length]
        self.buf = self.buf[5 + length :]
        return kind, payload

    def fill(self) -> bool:
        """Read what arrived; False when the VM went away."""
        chunk = self.sock.recv(1 << 16)
        self.buf += chunk
        return bool(chunk)


def _pump_stdin(agent: Agent) -> None:
    try:
        while True:
            chunk = os.read(0, 65536)
            if not chunk:
                break
            agent.send(b"I", chunk)
        agent.send(b"i")
    except OSError:
        pass


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except BrokenPipeError:
            return
        data = data[n:]


def main(argv: "list[str]") -> int:
    """Run the command in the guest and relay; see the module docstring."""
    if len(argv) != 3 or not all(a.isdigit() for a in argv):
        sys.stderr.write("usage: python -I -S _microvm_run.py EXEC_FD AGENT_FD DONE_FD\n")
        return 125
    done = int(argv[2])
    with os.fdopen(int(argv[0]), "rb") as f:
        exec_frame = f.read()
    agent = Agent(socket.socket(fileno=int(argv[1])))
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    pending: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        pending.append(signum)

    signal.set_wakeup_fd(wake_w)
    for sig in (*RELAYED, signal.SIGTERM):
        signal.signal(sig, on_signal)
    if signal.SIGTERM in pending:
        return 128 + signal.SIGTERM
    agent.send(b"E", exec_frame[1:])
    _write(done, b"s")
    if exec_frame[:1] == b"1":
        threading.Thread(target=_pump_stdin, args=(agent,), daemon=True).start()
    else:
        agent.send(b"i")
    while True:
        try:
            got = agent.frame()
        except ValueError as exc:
            sys.stderr.write(f"corral: the micro-VM broke the agent protocol: {exc}\n")
            return 125
        if got is None:
            ready, _, _ = select.select([agent.sock.fileno(), wake_r], [], [])
            if wake_r in ready:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
            while pending:
                signum = pending.pop(0)
                agent.send(
                    b"T" if signum == signal.SIGTERM else b"S",
                    b"" if signum == signal.SIGTERM else bytes([signum]),
                )
            if agent.sock.fileno() in ready and not agent.fill():
                sys.stderr.write("corral: the micro-VM went away\n")
                return 125
            continue
        kind, payload = got
        if kind in (b"X", b"F"):
            # the command is over in the guest; no frame of ours may be cut in half by
            # our exit (the stdin pump's), or the agent would misread the next command
            agent.lock.acquire()
            _write(done, b"x")
        if kind == b"1":
            _write(1, payload)
        elif kind == b"2":
            _write(2, payload)
        elif kind == b"F":
            sys.stderr.write(f"corral: {payload.decode('utf-8', 'replace')}\n")
            return 127 if payload.startswith(b"exec") else 126
        elif kind == b"X":
            end = _ending(payload)
            if end is None:
                how = payload.partition(b"\0")[0][:64].decode("ascii", "replace")
                sys.stderr.write(
                    f"corral: the micro-VM broke the agent protocol: an end of {how!r}\n"
                )
                return 125
            word, number = end
            if word == "signal":
                signal.set_wakeup_fd(-1)
                if number != signal.SIGKILL:
                    signal.signal(number, signal.SIG_DFL)
                os.kill(os.getpid(), number)
                return 128 + number
            return number


#: signals that end a process by default (Term or Core): the only ones a command can
#: have died of; a stop signal (19-22) sent to the relay itself would hang the host's run
_ENDING_SIGNALS = frozenset(range(1, 65)) - {17, 18, 19, 20, 21, 22, 23, 28}


def _ending(payload: bytes) -> "tuple[str, int] | None":
    """``("exit", 0-255)`` or ``("signal", N)`` from an 'X' payload; None for anything else.

    The guest is not trusted: an end no command can have is a protocol error.
    """
    word, _, number = payload.partition(b"\0")[0].partition(b" ")
    if not number.isdigit() or len(number) > 3:
        return None
    value = int(number)
    if word == b"exit" and value <= 255:
        return "exit", value
    if word == b"signal" and value in _ENDING_SIGNALS:
        return "signal", value
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
