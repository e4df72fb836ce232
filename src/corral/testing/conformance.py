"""One policy, every backend: the conformance checks behind the suite and ``doctor --matrix``.

Each :class:`Guarantee` pairs a *harmless* probe (must work: the probe and
the backend are fine) with a *malicious* one (must be stopped), runs both
through corral's real pipeline (``_runner.prepare`` + ``launch``) on one
backend, and checks the host afterwards (no file written outside, no
connection received ...). The verdict is one of:

``enforced``
    the malicious probe was stopped and the host is untouched;
``refused``
    the backend refused the policy (``EnforcementUnavailable``, exit 125):
    it cannot enforce the rule and says so;
``not expressible``
    the backend has no mechanism for it (declared in
    ``Backend.not_expressible`` with the reason) and the probe confirmed the
    escape;
``VIOLATED``
    the probe escaped although the backend claims the guarantee: a bug;
``error``
    the harmless probe failed or the run broke (the detail says how).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

from .._exceptions import CorralError, EnforcementUnavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ..pipeline._outcome import Outcome
    from ..pipeline._request import ExecRequest
    from ..policy._model import Policy

__all__ = [
    "GUARANTEES",
    "Guarantee",
    "Probe",
    "Verdict",
    "check",
    "expected",
    "probe_dir",
    "tcp_server",
]

ENFORCED, REFUSED, NOT_EXPRESSIBLE, VIOLATED, ERROR = (
    "enforced",
    "refused",
    "not expressible",
    "VIOLATED",
    "error",
)

#: Images the container backends run the probes in (they need python3).
PROBE_IMAGE = "corral:python"

#: Rules a backend refuses under the default policy: (backend, guarantee).
EXPECTED_REFUSALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("docker", "protected path"),
        ("gvisor", "protected path"),
        # the harmless half needs network.mode=open, which a VM refuses (its one route,
        # in allowlist mode, is the egress proxy);
        # mode none itself is proven in tests/integration/test_microvm.py
        ("microvm", "network egress"),
    }
)
#: The policy rule behind a guarantee that some backends refuse. The probes
#: of the *other* guarantees run with those rules degraded (recorded), so one
#: refusal does not hide what the backend does enforce.
REFUSABLE_RULES: dict[str, str] = {
    "protected path": "filesystem.protect",
    "unix socket": "network.allowUnixSockets",
}


#: Backends that refuse a root caller, and the rule they name: backend -> rule.
ROOT_REFUSALS: dict[str, str] = {"landlock": "isolation"}


def probe_dir() -> str:
    """Where the probe programs live."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes")


class Verdict:
    """The result of one guarantee on one backend."""

    __slots__ = ("backend", "detail", "guarantee", "status")

    def __init__(self, backend: str, guarantee: str, status: str, detail: str = "") -> None:
        self.backend = backend
        self.guarantee = guarantee
        self.status = status
        self.detail = detail

    def __repr__(self) -> str:
        return f"Verdict({self.backend}, {self.guarantee}: {self.status} {self.detail})"


class Probe:
    """A scratch world for one check: workspace, host-side fixtures, the runner."""

    def __init__(self, backend: str, root: str, guarantee: str = "") -> None:
        self.backend = backend
        self.guarantee = guarantee
        self.root = root
        self.workspace = os.path.join(root, "ws")
        self.home = os.path.join(root, "home")
        self.outside = os.path.join(root, "outside")
        for path in (self.workspace, self.home, self.outside):
            os.makedirs(path)
        os.chmod(root, 0o755)  # noqa: S103 - containers run as the user must reach the workspace
        shutil.copytree(
            probe_dir(),
            os.path.join(self.workspace, ".probes"),
            ignore=shutil.ignore_patterns("__pycache__", "__init__.py"),
        )
        self.environ = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.home,
            "LANG": "C.UTF-8",
            "XDG_STATE_HOME": os.path.join(root, "state"),
            "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME")
            or os.path.join(os.environ.get("HOME", "/root"), ".cache"),
        }
        for name in ("DOCKER_HOST",):
            if name in os.environ:
                self.environ[name] = os.environ[name]

    def policy(self, **changes: object) -> Policy:
        """The default policy for this workspace on this backend, with *changes* applied."""
        from ..backends import get_backend
        from ..policy import Policy

        backend = get_backend(self.backend)
        level = backend.isolation if backend.isolation not in ("none",) else "process"
        policy = Policy.for_workspace(self.workspace, home=self.home).replace(
            backend=self.backend, isolation=level
        )
        if self.backend in ("podman", "docker"):
            policy = policy.replace(image=PROBE_IMAGE)
        degraded = frozenset(
            rule
            for name, rule in REFUSABLE_RULES.items()
            if name != self.guarantee and (self.backend, name) in EXPECTED_REFUSALS
        )
        if os.geteuid() == 0 and self.backend in ROOT_REFUSALS:
            # the backend refuses a root caller outright (tests/integration/
            # test_process_escapes.py checks that); degraded here so that the
            # probes still show what it enforces for one that accepts the risk
            degraded |= {ROOT_REFUSALS[self.backend]}
        return policy.replace(allow_degraded=degraded, **changes)

    def run(self, policy: Policy, script: str, *args: str, timeout: float | None = None) -> Outcome:
        """Run probe *script* with *args* under *policy*; raises CorralError if refused/broken."""
        from ..pipeline._request import ExecRequest
        from ..pipeline._runner import launch, prepare

        request = ExecRequest.from_argv(
            ["python3", f"{self.workspace}/.probes/{script}", *args],
            cwd=self.workspace,
            timeout=timeout,
        )
        from ..backends import get_backend

        if get_backend(self.backend).writes_through_preview and not policy.filesystem.read_only:
            return self._run_in_preview(policy, request)
        prepared = prepare(request, policy, environ=self.environ)
        return launch(prepared, request)

    def _run_in_preview(self, policy: Policy, request: ExecRequest) -> Outcome:
        """Run in a new preview, then apply it as a user would (``corral apply``, which
        refuses protected paths), so the host-side checks see what would land."""
        from .._exceptions import CorralError
        from ..pipeline._runner import launch, prepare
        from ..preview import Preview
        from ..preview._preview import _policy_patterns

        state = self.environ["XDG_STATE_HOME"]
        from ..backends import get_backend

        preview = Preview.create(
            self.workspace,
            state_dir=state,
            mechanism=get_backend(self.backend).preview_mechanism(),
        )
        try:
            outcome = launch(
                prepare(request, policy, environ=self.environ, preview=preview), request
            )
            try:
                preview.apply(protect=_policy_patterns(policy, self.workspace))
            except CorralError:
                pass  # refused (a protected path): nothing lands
            return outcome
        finally:
            try:
                preview.discard()
            except CorralError:
                pass  # apply removed it already


class Guarantee:
    """A named promise with its harmless/malicious probe pair."""

    def __init__(
        self, name: str, run: Callable[[Probe], tuple[bool, bool, str]], description: str
    ) -> None:
        self.name = name
        self.description = description
        self._run = run

    def evaluate(self, probe: Probe) -> tuple[bool, bool, str]:
        """``(harmless worked, malicious stopped, detail)``; raises CorralError on refusal."""
        return self._run(probe)


def _text(outcome: Outcome) -> str:
    return (outcome.stdout + outcome.stderr).decode("utf-8", "replace").strip()


def _fs_write(p: Probe) -> tuple[bool, bool, str]:
    policy = p.policy()
    inside = os.path.join(p.workspace, "inside.txt")
    ok = p.run(policy, "write_file.py", inside)
    owner_ok = os.path.exists(inside) and os.stat(inside).st_uid == os.getuid()
    target = os.path.join(p.outside, "escaped.txt")
    bad = p.run(policy, "write_file.py", target)
    return (
        ok.returncode == 0 and owner_ok,
        not os.path.exists(target),
        f"inside: {_text(ok)}; outside: {_text(bad)}",
    )


def _secret(p: Probe) -> tuple[bool, bool, str]:
    secrets = os.path.join(p.workspace, "secrets")
    os.makedirs(secrets)
    with open(os.path.join(secrets, "key.txt"), "w") as f:
        f.write("TOPSECRET-4f1c\n")
    with open(os.path.join(p.workspace, "readme.txt"), "w") as f:
        f.write("hello\n")
    policy = p.policy()
    policy = policy.replace(
        filesystem=policy.filesystem.replace(deny_read=(*policy.filesystem.deny_read, secrets))
    )
    ok = p.run(policy, "read_file.py", os.path.join(p.workspace, "readme.txt"))
    bad = p.run(policy, "read_file.py", os.path.join(secrets, "key.txt"))
    return ("hello" in _text(ok), "TOPSECRET" not in _text(bad), f"secret read: {_text(bad)[:120]}")


def _secret_glob(p: Probe) -> tuple[bool, bool, str]:
    """``denyRead`` globs hide what they match at start-up, at any depth."""
    deep = os.path.join(p.workspace, "certs", "a", "b")
    os.makedirs(deep)
    os.makedirs(os.path.join(p.workspace, "sub"))
    for path, text in (
        (os.path.join(deep, "server.pem"), "TOPSECRET-pem-71\n"),
        (os.path.join(deep, "server.txt"), "hello\n"),
        (os.path.join(p.workspace, "sub", ".env"), "TOPSECRET-env-72\n"),
    ):
        with open(path, "w") as f:
            f.write(text)
    policy = p.policy()
    globs = (f"{p.workspace}/certs/**/*.pem", f"{p.workspace}/**/.env")
    policy = policy.replace(
        filesystem=policy.filesystem.replace(deny_read=(*policy.filesystem.deny_read, *globs))
    )
    ok = p.run(policy, "read_file.py", os.path.join(deep, "server.txt"))
    bad = [
        p.run(policy, "read_file.py", os.path.join(deep, "server.pem")),
        p.run(policy, "read_file.py", os.path.join(p.workspace, "sub", ".env")),
    ]
    leaked = " ".join(_text(b) for b in bad)
    return "hello" in _text(ok), "TOPSECRET" not in leaked, f"secret read: {leaked[:120]}"


def _protected(p: Probe) -> tuple[bool, bool, str]:
    policy = p.policy()
    ok = p.run(policy, "write_file.py", os.path.join(p.workspace, "a", "b", "src.txt"))
    target = os.path.join(p.workspace, "a", "b", ".git", "hooks", "pre-commit")
    bad = p.run(policy, "write_file.py", target)
    return ok.returncode == 0, not os.path.exists(target), f"hook: {_text(bad)[:120]}"


def _env(p: Probe) -> tuple[bool, bool, str]:
    p.environ["CORRAL_PROBE_TOKEN"] = "leak-9b2e"  # noqa: S105 - a decoy, not a secret
    p.environ["AWS_SECRET_ACCESS_KEY"] = "leak-aws-77"  # noqa: S105 - a decoy
    policy = p.policy()
    policy = policy.replace(env=policy.env.replace(set=(("PROBE_OK", "yes"),)))
    out = _text(p.run(policy, "print_env.py"))
    return "PROBE_OK=yes" in out, "leak-" not in out, ""


@contextlib.contextmanager
def tcp_server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP listener on 127.0.0.1: yields ``(port, what each connection sent)``."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    received.append(conn.recv(64) or b"(connected)")
                except OSError:
                    received.append(b"(connected)")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], received
    finally:
        stop.set()
        thread.join(2)
        # a connection the kernel completed that the thread had not accepted yet (a loaded
        # machine: the probe printed CONNECTED and exited first) is still in the backlog
        server.setblocking(False)
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                break
            conn.close()
            received.append(b"(connected)")
        server.close()


def _network(p: Probe) -> tuple[bool, bool, str]:
    policy = p.policy()
    with tcp_server() as (port, received):
        bad = p.run(policy, "connect_tcp.py", "127.0.0.1", str(port))
    escaped = bool(received)  # read once the listener's backlog was drained (tcp_server)
    with tcp_server() as (port, _received):
        ok = p.run(
            policy.replace(network=policy.network.replace(mode="open")),
            "connect_tcp.py",
            "127.0.0.1",
            str(port),
        )
    return ok.returncode == 0, not escaped, f"none: {_text(bad)[:100]}"


def _processes(p: Probe) -> tuple[bool, bool, str]:
    marker = "corral-probe-marker-" + os.urandom(4).hex()
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", marker])
    try:
        policy = p.policy()
        ok = p.run(policy, "find_process.py", "self")
        bad = p.run(policy, "find_process.py", marker[::-1])
    finally:
        host.kill()
        host.wait()
    return "FOUND" in _text(ok), "FOUND" not in _text(bad), _text(bad)[:80]


def _unix(p: Probe) -> tuple[bool, bool, str]:
    path = os.path.join(p.workspace, "host.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    server.settimeout(0.5)
    try:
        policy = p.policy()
        ok = p.run(policy, "connect_unix.py", "pair")
        bad = p.run(policy, "connect_unix.py", path)
        try:
            conn, _ = server.accept()
            conn.close()
            escaped = True
        except OSError:
            escaped = False
    finally:
        server.close()
    return ok.returncode == 0, not escaped, _text(bad)[:100]


def _limits(p: Probe) -> tuple[bool, bool, str]:
    policy = p.policy()
    policy = policy.replace(resources=policy.resources.replace(memory=192 << 20))
    ok = p.run(policy, "allocate.py", "16")
    bad = p.run(policy, "allocate.py", "768")
    return (
        "ALLOCATED" in _text(ok),
        "ALLOCATED" not in _text(bad),
        f"exit {bad.returncode}, oom {bad.oom_killed}",
    )


def _timeout(p: Probe) -> tuple[bool, bool, str]:
    from ..backends import get_backend

    # in a TCG guest Python's start-up alone takes seconds: a longer timeout there
    timeout = 12.0 if get_backend(p.backend).isolation == "vm" else 2.0
    policy = p.policy()
    policy = policy.replace(resources=policy.resources.replace(timeout=timeout, kill_grace=1.0))
    ok = p.run(policy, "sleep.py", "0.1")
    bad = p.run(policy, "sleep.py", "60")
    return (
        "WOKE" in _text(ok),
        bad.timed_out and bad.returncode == 124 and bad.duration < timeout + 18,
        f"timed out {bad.timed_out} after {bad.duration:.1f}s",
    )


#: The guarantees, in ``doctor --matrix`` column order.
GUARANTEES: tuple[Guarantee, ...] = (
    Guarantee("fs write outside", _fs_write, "nothing outside the workspace is writable"),
    Guarantee("secret read", _secret, "filesystem.denyRead paths are unreadable"),
    Guarantee(
        "secret glob", _secret_glob, "filesystem.denyRead globs hide what they match at start"
    ),
    Guarantee("protected path", _protected, "persistence points are write-protected at any depth"),
    Guarantee("env leak", _env, "only allowlisted environment variables reach the command"),
    Guarantee("network egress", _network, "network.mode none: no connection leaves the sandbox"),
    Guarantee("host processes", _processes, "host processes are invisible"),
    Guarantee("unix socket", _unix, "host unix sockets are unreachable"),
    Guarantee("limits", _limits, "resources.memory bounds the command"),
    Guarantee("timeout", _timeout, "resources.timeout stops the command tree"),
)


def expected(backend: str, guarantee: str) -> str:
    """The verdict a backend claims for *guarantee* (what the suite asserts)."""
    from ..backends import get_backend

    if guarantee in get_backend(backend).not_expressible:
        return NOT_EXPRESSIBLE
    if (backend, guarantee) in EXPECTED_REFUSALS:
        return REFUSED
    return ENFORCED


def check(backend: str, guarantee: Guarantee, *, scratch: str | None = None) -> Verdict:
    """Run *guarantee* on *backend* in a fresh scratch directory; never raises for sandbox failures."""
    from ..backends import get_backend

    root = tempfile.mkdtemp(prefix="corral-conformance-", dir=scratch)
    try:
        probe = Probe(backend, root, guarantee.name)
        try:
            worked, stopped, detail = guarantee.evaluate(probe)
        except EnforcementUnavailable as exc:
            return Verdict(backend, guarantee.name, REFUSED, exc.message)
        except CorralError as exc:
            return Verdict(backend, guarantee.name, ERROR, exc.message)
        if not worked:
            return Verdict(backend, guarantee.name, ERROR, f"the harmless probe failed: {detail}")
        if stopped:
            return Verdict(backend, guarantee.name, ENFORCED, detail)
        reason = get_backend(backend).not_expressible.get(guarantee.name)
        if reason is not None:
            return Verdict(backend, guarantee.name, NOT_EXPRESSIBLE, reason)
        return Verdict(backend, guarantee.name, VIOLATED, detail)
    finally:
        shutil.rmtree(root, ignore_errors=True)
