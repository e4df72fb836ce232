"""A sandboxed process must never get the corral server to run something for it.

Each test makes the server's socket reachable on purpose (a hard link into
the workspace, ``--allow-unix-sockets``), has a process speak the real
protocol to it asking for an unsandboxed run that writes a host file, and
then checks the refusal, the server's log and the host file.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from corral._wire import code_stamp
from tests.conftest import PROBE_PYTHON, World, needs_bwrap, needs_root
from tests.integration.server.conftest import status

pytestmark = needs_bwrap

ATTACK = r"""
import json, os, socket, sys
path, target = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(path)
except OSError as exc:
    print("connect failed:", exc.strerror)
    sys.exit(0)
request = {
    "op": "run", "protocol": 1, "code": sys.argv[3],
    "argv": ["--backend", "none", "--allow-write", os.path.dirname(target),
             "-c", "echo pwned > " + target],
    "cwd": sys.argv[5], "env": {"PATH": "/usr/bin:/bin", "HOME": sys.argv[4]}, "pid": os.getpid(),
}
body = json.dumps(request).encode()
fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
s.sendmsg([len(body).to_bytes(4, "big") + body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
reply = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    reply += chunk
print("reply:", reply[4:].decode(errors="replace"))
"""


def _link_socket(world: World, directory: str) -> str:
    """A second name for the server's socket, somewhere a sandbox (or another user) can see."""
    link = os.path.join(directory, "server.sock")
    os.link(os.path.join(world.state_dir, "server", "server.sock"), link)
    return link


def _attack_args(world: World, link: str, target: str) -> list[str]:
    script = World.write(world.ws("attack.py"), ATTACK)
    return [PROBE_PYTHON, script, link, target, code_stamp(), world.home, world.workspace]


def _log(world: World) -> str:
    return World.read(os.path.join(world.state_dir, "server", "server.log"))


@pytest.mark.parametrize("reach", ["hard link in the workspace", "allow-read of the state dir"])
@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        (("--backend", "bubblewrap"), "namespace differs"),
        (("--backend", "landlock", "--isolation", "process"), "differs"),
    ],
)
def test_a_sandboxed_process_cannot_use_the_server(
    served: World, backend: tuple[str, ...], reason: str, reach: str
) -> None:
    before_tree = served.tree()
    server_dir = os.path.join(served.state_dir, "server")
    if reach.startswith("hard link"):
        link = _link_socket(served, served.workspace)
        options: tuple[str, ...] = ()
    else:  # the real path, re-exposed under the hidden state directory
        link = os.path.join(server_dir, "server.sock")
        options = ("--allow-read", server_dir)
    before = status(served)
    assert before is not None
    # the sandboxed command runs in-process: the server is the target, not the vehicle
    result = served.corral(
        "run",
        *backend,
        *options,
        "--allow-unix-sockets",
        "--",
        *_attack_args(served, link, served.victim),
        env={"CORRAL_SERVER": "off"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert out.startswith("reply:") and '"refused"' in out and reason in out, out
    assert World.read(served.victim) == "original\n"
    after = status(served)
    assert after is not None
    assert after["served"] == before["served"] and after["refused"] == before["refused"] + 1
    assert "refused a peer:" in _log(served)
    if reach.startswith("hard link"):
        os.unlink(link)
    tree = served.tree()
    del tree[served.ws("attack.py")]
    assert tree == before_tree


def test_the_same_request_from_the_host_is_served(served: World) -> None:
    """Control: the attack script speaks the protocol correctly; only the checks stop it."""
    link = _link_socket(served, served.outside)
    target = os.path.join(served.outside, "control.txt")
    result = subprocess.run(
        _attack_args(served, link, target),
        capture_output=True,
        env=served.environ,
        cwd="/",
        check=False,
        timeout=60,
    )
    assert b'"accepted":true' in result.stdout, result
    assert World.read(target) == "pwned\n"


@needs_root
def test_another_users_process_is_refused(served: World) -> None:
    link = _link_socket(served, served.outside)
    os.chmod(link, 0o777)  # the inode: the real socket too, for this test only
    target = os.path.join(served.outside, "other-user.txt")
    os.chmod(served.outside, 0o777)
    try:
        result = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                *_attack_args(served, link, target),
            ],
            capture_output=True,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            check=False,
            timeout=60,
        )
    finally:
        os.chmod(link, 0o600)
        os.chmod(served.outside, 0o755)
    out = result.stdout.decode()
    assert '"refused"' in out and "is not the server's uid" in out, (out, result.stderr)
    assert not os.path.exists(target)
    assert "refused a peer: uid 65534" in _log(served)


SECCOMP_FIRST = r"""
import ctypes, struct, sys
# one allow-everything seccomp filter, installed without no_new_privs (root may): the
# process is otherwise the host's, so only its seccomp state tells it apart
code = struct.pack("HBBI", 0x06, 0, 0, 0x7FFF0000)  # BPF_RET|BPF_K, SECCOMP_RET_ALLOW
buf = ctypes.create_string_buffer(code)
prog = struct.pack("HxxxxxxP", 1, ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(22, 2, ctypes.c_char_p(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    sys.exit("seccomp: errno %d" % ctypes.get_errno())
sys.argv = sys.argv[1:]
exec(compile(open(sys.argv[0]).read(), sys.argv[0], "exec"))
"""


@needs_root
def test_a_host_process_with_a_seccomp_filter_is_refused(served: World) -> None:
    link = _link_socket(served, served.outside)
    target = os.path.join(served.outside, "filtered.txt")
    wrapper = World.write(served.ws("seccomp_first.py"), SECCOMP_FIRST)
    args = _attack_args(served, link, target)
    result = subprocess.run(
        [args[0], wrapper, *args[1:]],
        capture_output=True,
        env=served.environ,
        cwd="/",
        check=False,
        timeout=60,
    )
    out = result.stdout.decode()
    assert '"refused":"Seccomp differs"' in out, (out, result.stderr)
    assert not os.path.exists(target)
