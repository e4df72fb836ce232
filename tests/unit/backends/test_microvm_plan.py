"""The microvm backend's plans, refusals and qemu/virtiofsd command lines (pure: no VM boots).

These are what runs unchanged on a host with working KVM: the accelerator
follows the probed fact, everything else is the same plan.
"""

from __future__ import annotations

import json

import pytest

from corral._exceptions import BackendUnavailable, EnforcementUnavailable, UsageError
from corral.backends import HostFacts, PreviewSpec, get_backend
from corral.backends._microvm_vm import ShareSpec, VmConfig, qemu_argv, virtiofsd_argv
from corral.backends.microvm import FD_AGENT, FD_CONFIG, FD_DONE, view_setup, vm_config_of
from corral.pipeline._request import ExecRequest
from corral.policy import Policy

WS = "/work/proj"
SECRET_FILE = "/work/proj/.env"
SECRET_DIR = "/work/proj/keys"


def _facts(uid: int = 0, **details: object) -> HostFacts:
    base: dict[str, object] = {
        "qemu": "/usr/bin/qemu-system-x86_64",
        "virtiofsd": "/usr/lib/qemu/virtiofsd",
        "image_name": "python",
        "image_problem": None,
        "vm_kernel": "/cache/vm/vmlinuz",
        "vm_initrd": "/cache/vm/initramfs.cpio",
        "vm_disk": "/cache/vm/rootfs.ext4",
        "kvm_problem": "a trial KVM boot hung",
        "tsc_khz": 2596000,
        "relay": "/corral/_bin/corral-vm-relay",
    }
    base.update(details)
    return HostFacts(
        uid=uid,
        gid=uid,
        home="/root",
        arch="x86_64",
        helper="/opt/corral-exec",
        path_kinds=((WS, "dir"), (SECRET_FILE, "file"), (SECRET_DIR, "dir")),
        environ=(("PATH", "/usr/bin:/bin"), ("SECRET_TOKEN", "x"), ("LANG", "C.UTF-8")),
        details=tuple(sorted(base.items())),
    )


def _policy(**fs: object) -> Policy:
    policy = Policy.for_workspace(WS, home="/root").replace(backend="microvm", isolation="vm")
    return policy.replace(filesystem=policy.filesystem.replace(**fs))


def _request() -> ExecRequest:
    return ExecRequest.from_argv(["python3", "-V"], cwd=WS, sandbox_id="sbx-1")


PREVIEW = PreviewSpec(
    id="pv-1",
    mechanism="overlay",
    workspace=WS,
    upper="/state/previews/pv-1/upper",
    work="/state/previews/pv-1/work",
)


def _config(plan: object) -> dict[str, object]:
    spec = next(f for f in plan.fds if f.number == FD_CONFIG)  # type: ignore[attr-defined]
    return json.loads(spec.data)  # type: ignore[no-any-return]


def test_read_only_plan_boots_a_vm_without_network_and_masks_secrets() -> None:
    backend = get_backend("microvm")
    policy = _policy(read_only=True, deny_read=(SECRET_FILE, SECRET_DIR, "/root/.ssh"))
    plan = backend.plan(_request(), policy, _facts())
    assert plan.argv[0] == "/opt/corral-exec"
    assert plan.argv[-5] == "--"  # the exec helper runs the relay, nothing else
    assert plan.argv[-4] == "/corral/_bin/corral-vm-relay"
    assert plan.argv[-3:] == (str(FD_CONFIG), str(FD_AGENT), str(FD_DONE))
    config = _config(plan)
    vm, share = vm_config_of(config)
    assert vm.accel == "tcg"
    assert share.read_only and share.guest_path == WS
    script = share.setup[2]
    assert 'mount -o remount,bind,ro "$v"' in script
    assert share.setup[4:] == (WS, ".env", "keys")  # masks, relative to the view
    assert 'mount -t tmpfs -o ro,nosuid,nodev,mode=700 corral-mask "$v"/"${3}"' in script
    assert not any("/root/.ssh" in word for word in share.setup)  # never shared at all
    env = dict(config["exec"]["env"])  # type: ignore[index]
    assert "SECRET_TOKEN" not in env and env["TMPDIR"] == "/tmp"
    argv = qemu_argv(vm, "/run/a.sock", "/run/f.sock")
    assert "-nodefaults" in argv
    assert not any(a.startswith(("-net", "-nic")) for a in argv)
    assert any("readonly=on" in a for a in argv)
    assert "tsc_early_khz=2596000" in argv[argv.index("-append") + 1]
    # TCG's translated code is kept by virtual address: the guest's processes are not
    # randomised under TCG (docs/threat-model.md), never under KVM (below)
    assert "norandmaps" in argv[argv.index("-append") + 1].split()


def test_allowlist_gives_the_vm_one_restricted_nic_to_the_proxy() -> None:
    """The plan: the run's proxy on a unix socket (bound at launch at the VM's path), the
    guest's proxy variables at the forwarded address, and qemu's NIC with restrict=on."""
    policy = _policy(read_only=True)
    policy = policy.replace(
        network=policy.network.replace(mode="allowlist", allow=("pypi.org", "localhost:8000"))
    )
    facts = _facts(socat="/usr/bin/socat").replace(egress_token="tok")
    policy = policy.replace(env=policy.env.replace(set=(("HTTPS_PROXY", "http://mine:1"),)))
    plan = get_backend("microvm").plan(_request(), policy, facts)
    assert plan.egress is not None
    assert plan.egress.netns == "unix" and plan.egress.allow == ("pypi.org", "localhost:8000")
    assert plan.egress.forwards == ()  # the guest's loopback is its own
    config = _config(plan)
    env = dict(config["exec"]["env"])  # type: ignore[index]
    assert env["HTTPS_PROXY"] == "http://corral:tok@10.0.2.100:3128"  # corral's, not env.set's
    assert [k for k, _v in config["exec"]["env"]].count("HTTPS_PROXY") == 1  # type: ignore[index]
    vm, _share = vm_config_of(config)
    assert vm.net == "/usr/bin/socat"
    argv = qemu_argv(vm, "/run/a.sock", "/run/f.sock", "/run/e.sock")
    netdev = argv[argv.index("-netdev") + 1]
    assert netdev == (
        "user,id=net,restrict=on,ipv6=off,"
        "guestfwd=tcp:10.0.2.100:3128-cmd:/usr/bin/socat - UNIX-CONNECT:/run/e.sock"
    )
    assert argv[argv.index("-device", argv.index("-netdev")) + 1] == "virtio-net-device,netdev=net"
    assert vm != vm.replace(net="")  # a networked VM is another pool key
    rules = policy.replace(network=policy.network.replace(deny_requests=("pypi.org/evil",)))
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("microvm").plan(_request(), rules, facts)
    assert info.value.rule == "network.denyRequests"


def test_kvm_is_used_where_it_boots_guests() -> None:
    plan = get_backend("microvm").plan(
        _request(), _policy(read_only=True), _facts(kvm_problem=None)
    )
    vm, _share = vm_config_of(_config(plan))
    assert vm.accel == "kvm"
    argv = qemu_argv(vm, "/run/a.sock", None)
    assert argv[argv.index("-accel") + 1] == "kvm"
    assert argv[argv.index("-cpu") + 1] == "host"
    assert "norandmaps" not in argv[argv.index("-append") + 1]
    assert "vhost-user-fs-device" not in " ".join(argv)


def test_preview_plan_serves_the_previews_overlay() -> None:
    plan = get_backend("microvm").plan(_request(), _policy(), _facts(), preview=PREVIEW)
    vm, share = vm_config_of(_config(plan))
    assert not share.read_only
    script = share.setup[2]
    assert 'mount -t overlay -o "${1}" corral-preview "$v"' in script
    assert 'remount,bind,ro "$v"' not in script
    assert share.setup[4] == f"lowerdir={WS},upperdir={PREVIEW.upper},workdir={PREVIEW.work}"
    fsd = virtiofsd_argv(vm, "/run/f.sock")
    assert fsd[0] == "/usr/bin/unshare" and "/usr/lib/qemu/virtiofsd" in fsd
    assert "source=/mnt" in fsd
    assert "modcaps=-mknod" in fsd  # no device nodes made on the host by the guest's root


def test_copy_preview_binds_the_copy() -> None:
    copy = PreviewSpec(id="pv-2", mechanism="copy", workspace=WS, tree="/state/pv-2/tree")
    setup = view_setup(
        workspace=WS, preview=copy, read_only=False, masks=[], read_only_paths=[WS + "/.git"]
    )
    assert 'mount --bind -- "${1}" "$v"' in setup[2]
    assert setup[4:] == ("/state/pv-2/tree", ".git")


def test_writable_workspace_without_a_preview_is_refused() -> None:
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("microvm").plan(_request(), _policy(), _facts())
    assert info.value.rule == "filesystem.workspace"


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"network": "open"}, "network.mode"),
        ({"network": "allowlist"}, "network.mode"),  # these facts have no socat
        ({"allow_write": ("/srv/out",)}, "filesystem.allowWrite"),
        ({"cpu_time": 5.0}, "resources.cpuTime"),
        ({"disk": 1 << 20}, "resources.disk"),
        ({"cpus": 1.5}, "resources.cpus"),
    ],
)
def test_what_a_vm_cannot_enforce_is_refused(change: dict[str, object], rule: str) -> None:
    policy = _policy(read_only=True)
    if "network" in change:
        policy = policy.replace(network=policy.network.replace(mode=change["network"]))
    if "allow_write" in change:
        policy = policy.replace(
            filesystem=policy.filesystem.replace(allow_write=change["allow_write"])
        )
    if "cpu_time" in change:
        policy = policy.replace(resources=policy.resources.replace(cpu_time=change["cpu_time"]))
    if "cpus" in change:
        policy = policy.replace(resources=policy.resources.replace(cpus=change["cpus"]))
    if "disk" in change:
        policy = policy.replace(resources=policy.resources.replace(disk=change["disk"]))
    with pytest.raises(EnforcementUnavailable) as info:
        get_backend("microvm").plan(_request(), policy, _facts())
    assert info.value.rule == rule


def test_limits_become_the_vm_size_and_the_guest_cgroup() -> None:
    policy = _policy(read_only=True)
    policy = policy.replace(resources=policy.resources.replace(memory=256 << 20, pids=64, cpus=2.0))
    config = _config(get_backend("microvm").plan(_request(), policy, _facts()))
    assert config["vm"]["memory_mb"] == 256 + 160  # type: ignore[index]
    assert config["vm"]["cpus"] == 2  # type: ignore[index]
    assert config["exec"]["pids"] == 64 and config["exec"]["memory"] == 256 << 20  # type: ignore[index]


@pytest.mark.parametrize(
    ("facts", "words"),
    [
        (_facts(qemu=None), "apt-get install qemu-system-x86"),
        (_facts(uid=1000), "root only"),
        (_facts(vm_kernel=None), "corral image build python --vm"),
    ],
)
def test_problems_name_the_fix(facts: HostFacts, words: str) -> None:
    backend = get_backend("microvm")
    assert words in (backend.problem(facts) or "")
    with pytest.raises(BackendUnavailable):
        backend.plan(_request(), _policy(read_only=True), facts)


def test_cwd_outside_the_workspace_is_a_usage_error() -> None:
    request = ExecRequest.from_argv(["true"], cwd="/etc", sandbox_id="sbx-1")
    with pytest.raises(UsageError):
        get_backend("microvm").plan(request, _policy(read_only=True), _facts())


def test_vm_configs_are_pool_keys() -> None:
    one = VmConfig(qemu="q", virtiofsd="v", kernel="k", initrd="i", disk="d")
    assert {one: 1}[VmConfig(qemu="q", virtiofsd="v", kernel="k", initrd="i", disk="d")] == 1
    assert ShareSpec(setup=("a",), guest_path=WS, read_only=True).read_only


def test_the_host_side_refuses_a_frame_longer_than_the_agent_sends() -> None:
    """Both host-side readers bound a frame by the agent's own MAX_FRAME (a forged one
    from the guest's root is refused, not buffered): corral's Channel, and the relay
    (the real program, on a socket pair standing for the agent)."""
    import os
    import re
    import socket
    import subprocess

    from corral.backends._microvm_vm import MAX_FRAME, BootFailed, Channel
    from corral.backends.microvm import relay_path

    native = os.path.join(os.path.dirname(__file__), "../../../src/corral/native")
    for program in ("corral-vm-agent.c", "corral-vm-relay.c"):
        with open(os.path.join(native, program), encoding="utf-8") as f:
            (shift,) = re.findall(r"#define MAX_FRAME \(1u << (\d+)\)", f.read())
        assert 1 << int(shift) == MAX_FRAME, program
    ours, guest = socket.socketpair()
    with ours, guest:
        guest.sendall(b"1\0\0\0\2ok" + b"1" + (MAX_FRAME + 1).to_bytes(4, "big"))
        channel = Channel(ours)
        assert channel.read_frame() == (b"1", b"ok")
        with pytest.raises(BootFailed, match="a frame of"):
            channel.read_frame()
    relay = relay_path()
    if relay is None:
        pytest.skip("corral-vm-relay is not built (make native)")
    ours, guest = socket.socketpair()
    command_r, command_w = os.pipe()
    done_r, done_w = os.pipe()
    os.write(command_w, b"0" + b"payload")
    os.close(command_w)
    with ours, guest:
        guest.sendall(b"2\0\0\0\2ok" + b"1" + (MAX_FRAME + 1).to_bytes(4, "big"))
        result = subprocess.run(
            [relay, str(command_r), str(ours.fileno()), str(done_w)],
            pass_fds=(command_r, ours.fileno(), done_w),
            capture_output=True,
            timeout=30,
            check=False,
        )
        os.close(command_r)
        os.close(done_w)
        assert result.returncode == 125
        assert result.stderr.startswith(b"ok")  # the frame before, relayed
        assert b"a frame of 1048577 bytes (at most 1048576)" in result.stderr
        assert guest.recv(64) == b"E\0\0\0\7payloadi\0\0\0\0"  # the command, no stdin
        assert os.read(done_r, 8) == b"s"  # taken; never reported ended
        os.close(done_r)


def test_the_relay_reports_the_command_before_it_sends_it() -> None:
    """'s' goes on the done fd before the first byte of 'E' goes to the agent: a relay
    killed right after sending must not look, to its session, as if the agent never got
    the command (the session would run the next one into a busy agent)."""
    import os
    import socket
    import subprocess

    from corral.backends.microvm import relay_path

    relay = relay_path()
    if relay is None:
        pytest.skip("corral-vm-relay is not built (make native)")
    ours, guest = socket.socketpair()
    guest.close()  # the send of 'E' fails: the VM went away
    command_r, command_w = os.pipe()
    done_r, done_w = os.pipe()
    os.write(command_w, b"0payload")
    os.close(command_w)
    with ours:
        result = subprocess.run(
            [relay, str(command_r), str(ours.fileno()), str(done_w)],
            pass_fds=(command_r, ours.fileno(), done_w),
            capture_output=True,
            timeout=30,
            check=False,
        )
    os.close(command_r)
    os.close(done_w)
    assert (result.returncode, result.stderr) == (125, b"corral: the micro-VM went away\n")
    assert os.read(done_r, 8) == b"s"
    os.close(done_r)
