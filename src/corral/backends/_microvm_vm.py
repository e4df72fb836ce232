"""One micro-VM: qemu (and virtiofsd) on the host, corral's agent as the guest's pid 1.

:class:`GuestVM` boots a VM from a :class:`~corral.images._vm.VmImage`,
speaks the agent's frame protocol over a virtio-serial port (see
``src/corral/native/corral-vm-agent.c``) and tears everything down again::

    vm = GuestVM(VmConfig(...))
    vm.boot()                                   # qemu + virtiofsd started, agent ready
    vm.attach(ShareSpec(...))                   # the run's workspace view at its own path
    for kind, data in vm.channel.run(spec): ... # one command: '1', '2', then 'X'
    vm.close()                                  # destroy it

Host-side hygiene, which the tests check after killing the host side:

* qemu and virtiofsd get ``PR_SET_PDEATHSIG(SIGKILL)``: when the process
  that started them dies, however it dies, they die too;
* their sockets live in a fresh ``corral-vm-*`` directory that is emptied and
  removed as soon as the agent says ready (every end is connected by then),
  so a running VM leaves no file behind (a VM with a NIC keeps the empty
  directory, where the run's egress proxy binds its socket, until it is
  destroyed); a directory left by a
  process killed during boot is swept by the next boot (its pid is in the
  name).

:func:`qemu_argv` and :func:`virtiofsd_argv` are pure, for the unit tests
and ``corral explain``.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
import time

from .._frozen import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import IO, Any

    from ..pipeline._cgroups import Cgroup

__all__ = [
    "BootFailed",
    "Channel",
    "ExecSpec",
    "GuestVM",
    "ShareSpec",
    "VmConfig",
    "exec_payload",
    "qemu_argv",
    "sweep_stale_run_dirs",
    "virtiofsd_argv",
]

#: The largest frame the agent ever sends (its ``MAX_FRAME``; output comes in 64 KiB
#: chunks; ``corral-vm-relay`` has the same bound). The guest's root can take the agent's
#: port (``pidfd_getfd``) and send anything: a longer announced length is refused.
MAX_FRAME = 1 << 20
#: The virtiofs tag of the workspace share.
SHARE_TAG = "corral-ws"
#: Where virtiofsd's private tmpfs is mounted in its own mount namespace (any
#: existing directory: the mount is invisible to the host); views go in ``ws``.
VIEW_ROOT = "/mnt"
#: What the run directories of VMs are called (in the system's temp directory).
RUN_DIR_PREFIX = "corral-vm-"
#: Host tasks (threads count) of one VM's qemu, virtiofsd and what they start - qemu's
#: user network starts a host process per guest connection to the proxy: the cap on
#: what a guest can make the host run (its own cgroup, see GuestVM.boot).
HOST_TASKS = 256
#: Where the guest reaches corral's egress proxy: qemu forwards each connection
#: to this address (``guestfwd``) to the run's proxy socket on the host.
GUEST_PROXY = ("10.0.2.100", 3128)
#: Guest kernel arguments under TCG only (never KVM), each with its reason; the
#: trade-off is argued in docs/threat-model.md ("micro-VM guests under TCG").
TCG_KERNEL_ARGS: tuple[tuple[str, str], ...] = (
    (
        "norandmaps",
        "no address-space randomisation of the guest's processes: qemu's TCG keeps its "
        "translated code by virtual address, so a library mapped at a new address in every "
        "process is translated again for every command (a dynamically linked `true` took "
        "~40 ms in the guest instead of ~10 ms); everything in the guest is the command's own "
        "(KASLR, the guest kernel's, stays on)",
    ),
)


class BootFailed(Exception):
    """qemu exited, or the agent did not say ready in time (with qemu's console tail)."""


class ShareSpec(Record):
    """One run's view of the workspace, mounted in virtiofsd's namespace at attach time.

    Attributes:
        setup: argv run inside virtiofsd's mount namespace (``nsenter``) that
            mounts the view at ``VIEW_ROOT/ws``: a preview's overlay or copy, or
            the workspace read-only; masks over secret paths (see
            :func:`corral.backends.microvm.view_setup`).
        guest_path: where the guest shows it (the workspace's own path).
        read_only: also bound read-only in the guest (the host side already is).
    """

    setup: tuple[str, ...]
    guest_path: str
    read_only: bool


class VmConfig(Record):
    """What one VM is: engine binaries, boot artifacts, size, devices.

    Attributes:
        qemu: absolute path of qemu-system-x86_64.
        virtiofsd: absolute path of virtiofsd ("" for a VM without a share).
        kernel, initrd, disk: the boot artifacts (``VmImage``).
        memory_mb: guest RAM in MiB.
        cpus: vCPUs.
        accel: ``"kvm"`` or ``"tcg"``.
        tsc_khz: the host TSC frequency for ``tsc_early_khz`` (0: unknown).
        boot_timeout: seconds until the agent must be ready.
        net: ``socat``'s absolute path for a VM with a NIC (``network.mode =
            "allowlist"``), or ``""``: no network device at all. The NIC is on
            qemu's user network with ``restrict=on`` (no route to the host or
            anywhere); its only destination is :data:`GUEST_PROXY`, which
            qemu forwards, one ``socat`` per connection, to the unix socket
            :attr:`GuestVM.egress_socket` where the run's proxy listens.

    A VM with a *virtiofsd* gets a share at boot: virtiofsd serves an empty
    tmpfs (:data:`VIEW_ROOT`) in a private mount namespace of its own; a run's
    view of the workspace is mounted there when the VM is handed to the run
    (:meth:`GuestVM.attach`), so a VM can be booted before anyone knows
    which workspace it will serve (the warm pool).
    """

    qemu: str
    virtiofsd: str
    kernel: str
    initrd: str
    disk: str
    memory_mb: int = 512
    cpus: int = 1
    accel: str = "tcg"
    tsc_khz: int = 0
    boot_timeout: float = 60.0
    net: str = ""


class ExecSpec(Record):
    """One command for the agent (see the 'E' frame)."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    uid: int
    gid: int
    timeout_ms: int = 0
    grace_ms: int = 2000
    output_cap: int = 0
    pids: int = 0
    memory: int = 0


def exec_payload(spec: ExecSpec) -> bytes:
    """The agent's 'E' frame payload for *spec* (pure)."""
    fields = [
        spec.cwd,
        str(spec.uid),
        str(spec.gid),
        str(spec.timeout_ms),
        str(spec.grace_ms),
        str(spec.output_cap),
        str(spec.pids),
        str(spec.memory),
        str(len(spec.argv)),
        *spec.argv,
        str(len(spec.env)),
        *(f"{k}={v}" for k, v in spec.env),
    ]
    return b"".join(f.encode("utf-8", "surrogateescape") + b"\0" for f in fields)


def qemu_argv(
    config: VmConfig, agent_socket: str, fs_socket: str | None, egress_socket: str | None = None
) -> list[str]:
    """qemu's argv for *config* (pure).

    No network device (``-nodefaults``: no NIC, no default serial or parallel
    port, no monitor) unless ``config.net``: then one virtio-net NIC on a
    restricted user network whose only destination is :data:`GUEST_PROXY`,
    forwarded to *egress_socket*; the root disk read-only; the agent's port
    a unix socket qemu listens on.
    """
    cmdline = "console=ttyS0 panic=-1 reboot=t" + (
        " quiet" if not os.environ.get("CORRAL_VM_DEBUG") else ""
    )
    if config.accel == "tcg":
        cmdline += "".join(f" {word}" for word, _why in TCG_KERNEL_ARGS)
    if config.tsc_khz:
        cmdline += f" tsc_early_khz={config.tsc_khz} tsc=reliable"
    argv = [
        config.qemu,
        "-M",
        "microvm,x-option-roms=off",
        "-accel",
        config.accel,
        "-cpu",
        "host" if config.accel == "kvm" else "max",
        "-m",
        f"{config.memory_mb}M",
        "-smp",
        str(config.cpus),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-monitor",
        "none",
        "-no-reboot",
        "-serial",
        "stdio",
        "-global",
        "virtio-mmio.force-legacy=false",
        "-kernel",
        config.kernel,
        "-initrd",
        config.initrd,
        "-append",
        cmdline,
        "-drive",
        f"id=root,file={config.disk},format=raw,if=none,readonly=on",
        "-device",
        "virtio-blk-device,drive=root",
    ]
    if fs_socket is not None:
        # before the agent's chardev: qemu creates chardevs in order, so once the agent
        # socket exists, virtiofsd's is connected
        argv += [
            "-object",
            f"memory-backend-memfd,id=mem,size={config.memory_mb}M,share=on",
            "-machine",
            "memory-backend=mem",
            "-chardev",
            f"socket,id=fs,path={fs_socket}",
            "-device",
            f"vhost-user-fs-device,chardev=fs,tag={SHARE_TAG}",
        ]
    if config.net and egress_socket is not None:
        if "," in egress_socket or " " in egress_socket:
            raise ValueError(f"the egress socket path {egress_socket!r} has a comma or a space")
        address, port = GUEST_PROXY
        argv += [
            "-netdev",
            f"user,id=net,restrict=on,ipv6=off,guestfwd=tcp:{address}:{port}-cmd:"
            f"{config.net} - UNIX-CONNECT:{egress_socket}",
            "-device",
            "virtio-net-device,netdev=net",
        ]
    return [
        *argv,
        "-chardev",
        f"socket,id=agent,path={agent_socket},server=on,wait=off",
        "-device",
        "virtio-serial-device",
        "-device",
        "virtserialport,chardev=agent,name=corral.agent",
    ]


def virtiofsd_argv(config: VmConfig, fs_socket: str) -> list[str]:
    """virtiofsd's argv: in a private mount namespace, serving an empty tmpfs (pure)."""
    prepare = (
        f"mount -t tmpfs -o mode=755,size=1m corral-view {VIEW_ROOT} && "
        f'mkdir {VIEW_ROOT}/ws && exec "$@"'
    )
    return [
        "/usr/bin/unshare", "--mount", "--propagation", "private", "--",
        "/bin/sh", "-c", prepare, "corral-share",
        config.virtiofsd, f"--socket-path={fs_socket}", "-o", f"source={VIEW_ROOT}",
        "-o", "cache=none", "-o", "sandbox=chroot", "-o", "no_xattr", "-o", "log_level=err",
        # the guest's root may not make device nodes on the host's disk (the preview's
        # upper layer): a FIFO needs no CAP_MKNOD, so only devices are refused
        "-o", "modcaps=-mknod",
    ]  # fmt: skip


def _die_with_parent() -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    os.setpgid(0, 0)


def _niced(preexec: Callable[[], None]) -> Callable[[], None]:
    """*preexec*, then the lowest CPU priority (nice 19) for the child."""

    def setup() -> None:
        preexec()
        os.nice(19)

    return setup


def _vm_cgroup() -> Cgroup:
    """A new cgroup for one VM's host processes: ``pids.max`` = :data:`HOST_TASKS`.

    Raises:
        BootFailed: no cgroup can be made here (the VM is not booted: its
            host processes would be unbounded).
    """
    from ..pipeline._cgroups import Cgroup, probe, sweep

    layout, problem = probe(frozenset({"pids"}))
    if layout is None:
        raise BootFailed(f"the VM's host processes cannot be bounded: {problem}")
    sweep(layout)  # the empty groups of VMs whose corral was killed
    name = f"corral-{os.getpid()}-vm-{os.urandom(4).hex()}"
    try:
        return Cgroup.create(layout, name, pids=HOST_TASKS, freezer=True)
    except OSError as exc:
        raise BootFailed(f"the VM's host processes cannot be bounded: {exc}") from None


def _born_in(cgroup: Cgroup) -> Callable[[], None]:
    """A ``preexec_fn``: die with corral, then join *cgroup* before exec (born inside it)."""
    procs = [os.path.join(d, "cgroup.procs") for d in cgroup.dirs.values()]

    def enter() -> None:
        _die_with_parent()
        for path in procs:
            with open(path, "w", encoding="ascii") as f:
                f.write("0")

    return enter


def sweep_stale_run_dirs(tmp: str | None = None) -> list[str]:
    """Remove run directories whose creator (pid in the name) is gone; return them."""
    import shutil
    import tempfile

    base = tmp or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(RUN_DIR_PREFIX):
            continue
        pid = name[len(RUN_DIR_PREFIX) :].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            removed.append(name)
    return removed


class ConsoleTail:
    """The last 8 KiB a VMM and its guest kernel printed, read by a daemon thread.

    Shared by qemu's :class:`GuestVM` and firecracker's VM: :meth:`start` reads
    *stream* until its end (or until it is closed under the thread),
    :meth:`text` gives the last 2000 bytes for error messages, :meth:`join`
    waits for the reader once the VMM is dead.
    """

    def __init__(self) -> None:
        self._data = bytearray()
        self._thread: threading.Thread | None = None

    def start(self, stream: IO[bytes]) -> None:
        thread = threading.Thread(target=self._drain, args=(stream,), daemon=True)
        thread.start()
        self._thread = thread  # started: a close() from another thread may join it

    def _drain(self, stream: IO[bytes]) -> None:
        while True:
            try:
                chunk = stream.read1(4096)  # type: ignore[attr-defined]
            except (ValueError, OSError):
                return  # closed by a close() that did not see this thread yet
            if not chunk:
                return
            self._data += chunk
            del self._data[:-8192]

    def text(self) -> str:
        return bytes(self._data[-2000:]).decode("utf-8", "replace").strip()

    def join(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)  # the VMM's output is at its end: it is dead


class GuestVM:
    """A booted (or booting) micro-VM; see the module docstring."""

    def __init__(self, config: VmConfig, *, background: bool = False) -> None:
        self.config = config
        #: booted at the lowest CPU priority (nice 19) until :meth:`foreground` or ready:
        #: a warm pool's boot ahead must not slow the runs being served meanwhile
        self.background = background
        self.release = ""
        self.qemu: subprocess.Popen[bytes] | None = None
        self.virtiofsd: subprocess.Popen[bytes] | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        #: set by :meth:`close`; a boot under way starts no process after it (see _spawn)
        self._closed = False
        self._spawn_lock = threading.Lock()
        self.channel: Channel | None = None
        self._console = ConsoleTail()
        self._run_dir = ""
        self.egress_socket = ""
        self._cgroup: Cgroup | None = None

    # ----------------------------------------------------------- lifecycle
    def boot(self) -> None:
        """Start virtiofsd and qemu and wait for the agent (raises BootFailed)."""
        import tempfile

        sweep_stale_run_dirs()
        self._run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
        agent_socket = os.path.join(self._run_dir, "agent.sock")
        fs_socket = os.path.join(self._run_dir, "fs.sock") if self.config.virtiofsd else None
        if self.config.net:
            # bound by the run's proxy (corral.egress.start_on_unix_socket); the run
            # directory (0700) stays while the VM lives
            self.egress_socket = os.path.join(self._run_dir, "egress.sock")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
        try:
            # qemu, virtiofsd and every process they start (a socat per guest connection to
            # the proxy, double-forked by qemu: its parent is init) are born in the VM's own
            # cgroup: bounded, and killed with the VM. If corral itself is killed, qemu dies
            # of its parent-death signal and each socat ends with its connection's EOF.
            self._cgroup = _vm_cgroup()
            preexec = _born_in(self._cgroup)
            if self.background:  # the pool's boot ahead: lowest CPU priority until ready
                preexec = _niced(preexec)
            if fs_socket is not None:
                fs = self._spawn(
                    virtiofsd_argv(self.config, fs_socket),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    env=env,
                    preexec_fn=preexec,
                )
                self.virtiofsd = fs
                self._wait_for(fs_socket, fs, "virtiofsd")
            qemu = self._spawn(
                qemu_argv(self.config, agent_socket, fs_socket, self.egress_socket or None),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=preexec,
            )
            self.qemu = qemu
            assert qemu.stdout is not None
            self._console.start(qemu.stdout)
            self._wait_for(agent_socket, qemu, "qemu")
            self.channel = Channel(self._connect(agent_socket, qemu), self.console)
            deadline = time.monotonic() + self.config.boot_timeout
            kind, payload = self.channel.read_frame(deadline=deadline)
            if kind != b"R":
                raise BootFailed(f"the agent answered {kind!r} instead of ready")
            # the guest runs: qemu connected every device long ago, nothing needs the paths
            # (but the proxy's socket, which qemu connects to per guest connection)
            if self.egress_socket:
                for path in (agent_socket, fs_socket):
                    if path is not None:
                        os.unlink(path)
            else:
                self._cleanup_run_dir()
            self.release = payload.decode("utf-8", "replace")
            self.foreground()
        except OSError as exc:
            console = self.console()
            self.close()
            raise BootFailed(f"{exc}; console: {console[-600:]}") from None
        except BaseException:
            self.close()
            raise

    def _spawn(self, argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
        """Start one of the VM's host processes, unless :meth:`close` came first (then
        BootFailed): a VM closed while it boots (an SDK session closed early) starts
        nothing more, and whatever it started is killed by that close."""
        with self._spawn_lock:
            if self._closed:
                raise BootFailed("the VM was closed while it booted")
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **options)
            self._procs.append(proc)
            return proc

    def foreground(self) -> None:
        """Back to normal CPU priority (every thread of qemu and virtiofsd), if niced."""
        if not self.background:
            return
        self.background = False
        for proc in self._procs:
            try:
                tasks = os.listdir(f"/proc/{proc.pid}/task")
            except OSError:
                continue
            for tid in tasks:
                try:
                    os.setpriority(os.PRIO_PROCESS, int(tid), 0)
                except OSError:
                    pass  # gone, or not ours to raise (not root): it stays niced

    def attach(self, share: ShareSpec) -> None:
        """Give the booted VM a run's view of the workspace (raises BootFailed).

        The view is mounted in virtiofsd's namespace (``nsenter``), then the
        agent binds it at the workspace's path in the guest.
        """
        if self.virtiofsd is None or self.channel is None:
            raise BootFailed("this VM was booted without a share")
        result = subprocess.run(
            ["/usr/bin/nsenter", f"--mount=/proc/{self.virtiofsd.pid}/ns/mnt", "--", *share.setup],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        if result.returncode != 0:
            raise BootFailed(f"the workspace view could not be mounted: {result.stderr.strip()}")
        self.channel.mount_share(share)

    def _wait_for(self, path: str, proc: subprocess.Popen[bytes], what: str) -> None:
        deadline = time.monotonic() + 20
        while not os.path.exists(path):
            if proc.poll() is not None:
                raise BootFailed(
                    f"{what} exited {proc.returncode} before listening: {self.console()}"
                )
            if time.monotonic() > deadline:
                raise BootFailed(f"{what} did not create {path} within 20 s")
            time.sleep(0.002)

    def _connect(self, path: str, proc: subprocess.Popen[bytes]) -> socket.socket:
        """Connect to qemu's agent socket (it binds before it listens: retry briefly)."""
        deadline = time.monotonic() + 20
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.connect(path)
                return sock
            except OSError:
                sock.close()
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise BootFailed(
                        f"qemu did not accept the agent connection: {self.console()}"
                    ) from None
                time.sleep(0.002)

    def console(self) -> str:
        """The last lines qemu and the guest kernel printed (for error messages)."""
        return self._console.text()

    def _cleanup_run_dir(self) -> None:
        if self._run_dir:
            import shutil

            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = ""

    def close(self) -> None:
        """Destroy the VM: SIGKILL qemu and virtiofsd, reap them, remove the run dir.

        Nothing in a VM outlives its run (the root disk is read-only, the
        overlay a tmpfs, workspace changes are already in the preview), so
        there is nothing to shut down cleanly, and killing takes milliseconds
        where a guest power-off under TCG takes seconds.
        """
        with self._spawn_lock:
            self._closed = True
            procs = list(self._procs)
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        group, self._cgroup = self._cgroup, None  # close() may race close() (pool vs run)
        if group is not None:  # whatever qemu started (a socat per connection)
            group.kill_all()
            group.remove()
        self._console.join()
        for proc in self._procs:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self._procs = []
        self._cleanup_run_dir()


class Channel:
    """The agent's frame protocol over a connected socket (see the agent's header).

    Used by :class:`GuestVM` while booting and by the run's relay process,
    which receives the connection as an inherited fd.
    """

    def __init__(self, sock: socket.socket, console: Callable[[], str] | None = None) -> None:
        self._sock = sock
        self._buf = b""
        self._send_lock = threading.Lock()
        self._console = console or (lambda: "")

    def console(self) -> str:
        """The guest console's tail, when known (for error messages)."""
        return self._console()

    def close(self) -> None:
        """Close the connection."""
        self._sock.close()

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        """Send one frame to the agent (thread-safe)."""
        with self._send_lock:
            self._sock.sendall(kind + struct.pack(">I", len(payload)) + payload)

    def read_frame(self, deadline: float | None = None) -> tuple[bytes, bytes]:
        """The agent's next frame.

        Raises:
            BootFailed: the VM went away, the deadline passed, or a frame
                announces more than the agent ever sends (``MAX_FRAME``).
        """
        while True:
            if len(self._buf) >= 5:
                (length,) = struct.unpack(">I", self._buf[1:5])
                if length > MAX_FRAME:
                    raise BootFailed(
                        f"the guest agent sent a frame of {length} bytes (at most {MAX_FRAME})"
                    )
                if len(self._buf) >= 5 + length:
                    kind, payload = self._buf[:1], self._buf[5 : 5 + length]
                    self._buf = self._buf[5 + length :]
                    return kind, payload
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BootFailed(f"the guest agent was not ready in time: {self._console()}")
                self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                continue
            finally:
                self._sock.settimeout(None)
            if not chunk:
                raise BootFailed(f"the VM went away: {self._console()}")
            self._buf += chunk

    def fileno(self) -> int:
        """The agent connection's fd (for select)."""
        return self._sock.fileno()

    def has_buffered(self) -> bool:
        """Whether a frame may be waiting in the buffer (no need to select)."""
        return len(self._buf) >= 5

    def next_frame(self) -> tuple[bytes, bytes]:
        """The agent's next frame (blocking)."""
        return self.read_frame()

    def mount_share(self, share: ShareSpec) -> None:
        """Mount the workspace share in the guest (raises BootFailed with the agent's error)."""
        mode = b"ro" if share.read_only else b"rw"
        self.send(b"M", b"\0".join((SHARE_TAG.encode(), share.guest_path.encode(), mode)) + b"\0")
        kind, payload = self.read_frame()
        if kind != b"m" or payload:
            raise BootFailed(f"the guest could not mount the workspace: {payload.decode()}")

    def start(self, spec: ExecSpec) -> None:
        """Start one command (its frames follow: '1', '2', then 'X' or 'F')."""
        self.send(b"E", exec_payload(spec))

    def run(self, spec: ExecSpec, stdin: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Run one command to its end; yield its frames (the last is 'X' or 'F')."""
        self.start(spec)
        if stdin:
            self.send(b"I", stdin)
        self.send(b"i")
        while True:
            kind, payload = self.read_frame()
            yield kind, payload
            if kind in (b"X", b"F"):
                return
