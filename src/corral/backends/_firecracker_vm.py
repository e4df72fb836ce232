"""One Firecracker micro-VM: the ``firecracker`` process on the host, corral's agent in the guest.

:class:`FirecrackerVM` boots the image's uncompressed kernel (``vmlinux``)
and initramfs with ``firecracker --no-api --config-file F``
(:func:`firecracker_config`, pure): the root disk read-only, the run's
workspace image (read-only, or writable for a preview) as the second disk,
one virtio-vsock device and no network interface. The guest's init sees
``corral.agent=vsock`` on its command line, mounts the workspace disk and
starts the agent on ``vsock:2:PORT``: the agent connects to the host, which
Firecracker relays to the unix socket ``<uds_path>_PORT`` this class
listens on. From then on the agent speaks the same frames as under qemu
(:class:`~corral.backends._microvm_vm.Channel`), so the relay, timeouts,
output caps and audit are the qemu engine's.

Host-side hygiene, as for qemu: firecracker gets ``PR_SET_PDEATHSIG(SIGKILL)``
and is born in the VM's own cgroup (``pids.max``), killed with it;
everything of the VM on disk (the config file, the sockets, the workspace
image) lives in a private ``corral-vm-PID-*`` directory removed by
:meth:`FirecrackerVM.close` (or, when corral was killed, by the next boot's
sweep). The jailer is not used: see docs/backends/microvm.md, "Firecracker".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time

from .._frozen import Record
from ._microvm_vm import ConsoleTail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..pipeline._cgroups import Cgroup
    from ._microvm_vm import Channel

__all__ = ["FirecrackerConfig", "FirecrackerVM", "boot_args", "firecracker_config"]

#: The guest's vsock context id (any value above 2; each VM has its own device).
GUEST_CID = 3


class FirecrackerConfig(Record):
    """What one Firecracker VM is.

    Attributes:
        firecracker: absolute path of the ``firecracker`` binary.
        kernel: the uncompressed ELF kernel (``VmImage.vmlinux``).
        initrd, disk: the image's initramfs and read-only root disk.
        memory_mb: guest RAM in MiB.
        cpus: vCPUs.
        boot_timeout: seconds until the agent must be ready.
    """

    firecracker: str
    kernel: str
    initrd: str
    disk: str
    memory_mb: int = 512
    cpus: int = 1
    boot_timeout: float = 30.0


def boot_args(*, workspace_read_only: bool) -> str:
    """The guest kernel's command line (pure): the vsock agent and the workspace disk's mode."""
    return (
        "console=ttyS0 reboot=k panic=-1 pci=off quiet corral.agent=vsock "
        f"corral.ws={'ro' if workspace_read_only else 'rw'}"
    )


def firecracker_config(
    config: FirecrackerConfig, *, workspace_image: str, read_only: bool, vsock_uds: str
) -> dict[str, object]:
    """Firecracker's ``--config-file`` document for *config* (pure).

    No ``network-interfaces``: the guest has no network device at all. The
    root disk is always read-only (the guest puts a tmpfs overlay on it);
    the workspace image is read-only unless the run writes through a preview.
    """
    return {
        "boot-source": {
            "kernel_image_path": config.kernel,
            "initrd_path": config.initrd,
            "boot_args": boot_args(workspace_read_only=read_only),
        },
        "drives": [
            {
                "drive_id": "root",
                "path_on_host": config.disk,
                "is_root_device": False,
                "is_read_only": True,
            },
            {
                "drive_id": "workspace",
                "path_on_host": workspace_image,
                "is_root_device": False,
                "is_read_only": read_only,
            },
        ],
        "machine-config": {
            "vcpu_count": config.cpus,
            "mem_size_mib": config.memory_mb,
            "smt": False,
        },
        "vsock": {"guest_cid": GUEST_CID, "uds_path": vsock_uds},
        "network-interfaces": [],
    }


class FirecrackerVM:
    """A booted (or booting) Firecracker VM for one run; see the module docstring."""

    def __init__(self, config: FirecrackerConfig, run_dir: str) -> None:
        self.config = config
        #: the private directory of this VM (made by the caller, 0700): the workspace
        #: image, the config file and the sockets; removed by :meth:`close`
        self.run_dir = run_dir
        self.release = ""
        self.egress_socket = ""  # no network device: never an egress proxy
        self.channel: Channel | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._cgroup: Cgroup | None = None
        self._console = ConsoleTail()

    def boot(self, *, workspace_image: str, read_only: bool) -> None:
        """Start firecracker and wait for the agent's ready frame (raises BootFailed)."""
        from ..images._vm import AGENT_VSOCK_PORT
        from ._microvm_vm import BootFailed, Channel, _born_in, _vm_cgroup

        uds = os.path.join(self.run_dir, "v.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            # the guest's connection to CID 2 port P arrives here (<uds_path>_P)
            listener.bind(f"{uds}_{AGENT_VSOCK_PORT}")
            listener.listen(1)
            document = firecracker_config(
                self.config, workspace_image=workspace_image, read_only=read_only, vsock_uds=uds
            )
            path = os.path.join(self.run_dir, "config.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(document, f)
            self._cgroup = _vm_cgroup()
            self.process = subprocess.Popen(
                [self.config.firecracker, "--no-api", "--config-file", path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
                cwd=self.run_dir,
                preexec_fn=_born_in(self._cgroup),
            )
            assert self.process.stdout is not None
            self._console.start(self.process.stdout)
            deadline = time.monotonic() + self.config.boot_timeout
            while True:
                if self.process.poll() is not None:
                    self._console.join()  # what it printed before it died, to the end
                    raise BootFailed(
                        f"firecracker exited {self.process.returncode}: {self.console()[-600:]}"
                    )
                listener.settimeout(min(0.2, max(0.01, deadline - time.monotonic())))
                try:
                    conn, _ = listener.accept()
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise BootFailed(
                            f"the guest agent did not connect within {self.config.boot_timeout:.0f}"
                            f" s: {self.console()[-600:]}"
                        ) from None
            conn.settimeout(None)
            self.channel = Channel(conn, self.console)
            kind, payload = self.channel.read_frame(deadline=deadline)
            if kind != b"R":
                raise BootFailed(f"the agent answered {kind!r} instead of ready")
            self.release = payload.decode("utf-8", "replace")
        except OSError as exc:
            console = self.console()
            self.close()
            raise BootFailed(f"{exc}; console: {console[-600:]}") from None
        except BaseException:
            self.close()
            raise
        finally:
            listener.close()

    def console(self) -> str:
        """The last lines firecracker and the guest kernel printed (for error messages)."""
        return self._console.text()

    def stop(self) -> None:
        """SIGKILL firecracker (and whatever is in its cgroup); the run directory stays
        (the workspace image is read back from it)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        group, self._cgroup = self._cgroup, None
        if group is not None:
            group.kill_all()
            group.remove()
        self._console.join()
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self) -> None:
        """Destroy the VM: :meth:`stop`, then remove the run directory."""
        import shutil

        self.stop()
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = ""
