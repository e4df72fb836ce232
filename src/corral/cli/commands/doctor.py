"""``corral doctor``: what works on this machine, and how to fix what doesn't.

For every registered backend: whether it can run here, and if not the exact
reason and the fix; for the ones that can, a real smoke run of ``true`` in a
throw-away workspace (a probe that only looks for binaries can be wrong).
Then the host features corral's guarantees rest on: seccomp user
notification (the write broker), cgroups (limits), Landlock, overlayfs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from ..._exceptions import CorralError
from .. import EXIT_USAGE

__all__ = ["check_backends", "main"]


def _check_backend(name: str, workspace: str) -> dict[str, object]:
    from ..._request import ExecRequest
    from ..._runner import launch, prepare
    from ...backends import get_backend, inspect_host
    from ...policy import Policy

    backend = get_backend(name)
    home = os.environ.get("HOME", "/")
    policy = Policy.for_workspace(workspace, home=home).replace(backend=name, isolation="process"
                                                                 if backend.isolation in ("process", "none")
                                                                 else backend.isolation)
    request = ExecRequest.from_argv(["true"], cwd=workspace)
    entry: dict[str, object] = {"backend": name, "isolation": backend.isolation}
    facts, _layout = inspect_host(backend, request, policy, dict(os.environ))
    problem = backend.problem(facts)
    if problem is not None:
        entry.update(works=False, reason=problem)
        return entry
    try:
        prepared = prepare(request, policy.replace(allow_degraded=frozenset({"*"})), environ=os.environ)
        outcome = launch(prepared, request)
    except CorralError as exc:
        entry.update(works=False, reason=exc.message, fix=exc.hint)
        return entry
    if outcome.returncode != 0:
        entry.update(works=False, reason=f"smoke run of 'true' exited {outcome.returncode}: "
                                          f"{outcome.text('stderr').strip()[-200:]}")
        return entry
    entry.update(works=True, degraded=list(prepared.plan.degraded))
    return entry


def check_backends() -> list[dict[str, object]]:
    """Probe and smoke-test every registered backend."""
    from ...backends import BACKENDS

    results = []
    with tempfile.TemporaryDirectory(prefix="corral-doctor-") as workspace:
        for name in sorted(BACKENDS):
            results.append(_check_backend(name, workspace))
    return results


def _features() -> list[tuple[str, bool, str]]:
    from ..._cgroups import probe
    from ...backends import helper_path
    from ...backends._kernel import broker_supported

    rows: list[tuple[str, bool, str]] = []
    helper = helper_path()
    rows.append(("exec helper", helper is not None,
                 helper or "missing: reinstall corral with a C compiler (apt-get install gcc libc6-dev)"))
    broker = broker_supported()
    rows.append(("write broker (protected paths at any depth)", broker is None,
                 "seccomp user notification available" if broker is None else broker))
    layout, why = probe(frozenset({"memory", "pids"}))
    rows.append(("cgroup limits (memory, pids)", layout is not None,
                 f"cgroup v{layout.version}: {', '.join(sorted(layout.controllers))}" if layout else str(why)))
    rows.append(_egress_feature())
    return rows


#: Run inside an allowlist sandbox: ask the proxy for a host the policy does not list.
_EGRESS_PROBE = """
import base64, os, socket
from urllib.parse import urlsplit
proxy = urlsplit(os.environ["HTTPS_PROXY"])
auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
s.sendall(("CONNECT doctor.invalid:443 HTTP/1.1\\r\\nHost: doctor.invalid\\r\\n"
           "Proxy-Authorization: Basic " + auth + "\\r\\n\\r\\n").encode())
print(s.recv(4096).split(b"\\r\\n")[0].decode())
"""


def _egress_feature() -> tuple[str, bool, str]:
    """A real allowlist run: the proxy must answer 403 for an unlisted host (no DNS involved)."""
    from ..._request import ExecRequest
    from ..._runner import execute
    from ...policy import NetworkPolicy, Policy

    name = "egress proxy (network.mode = allowlist)"
    with tempfile.TemporaryDirectory(prefix="corral-doctor-") as workspace:
        policy = Policy.for_workspace(workspace, home=os.environ.get("HOME", "/")).replace(
            network=NetworkPolicy(mode="allowlist"), allow_degraded=frozenset({"*"}))
        request = ExecRequest.from_argv([sys.executable, "-I", "-c", _EGRESS_PROBE], cwd=workspace)
        try:
            outcome = execute(request, policy, environ=os.environ)
        except CorralError as exc:
            return name, False, exc.message + (f" (fix: {exc.hint})" if exc.hint else "")
    answer = outcome.text().strip()
    if outcome.returncode != 0 or not answer.startswith("HTTP/1.1 403"):
        detail = answer or outcome.text("stderr").strip()[-200:]
        return name, False, f"the proxy did not refuse an unlisted host as expected: {detail}"
    return name, True, "the sandbox reaches the proxy on its loopback; unlisted hosts get 403"


def main(args: list[str]) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="corral doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    backends = check_backends()
    features = _features()
    if ns.json:
        from ..._jsonfast import dumps

        sys.stdout.write(dumps({
            "backends": backends,
            "features": [{"name": n, "ok": ok, "detail": d} for n, ok, d in features],
        }) + "\n")
        return 0
    uname = os.uname()
    sys.stdout.write(f"corral doctor: Linux {uname.release} {uname.machine}, uid {os.getuid()}\n\nbackends:\n")
    for entry in backends:
        mark = "ok " if entry["works"] else "no "
        line = f"  [{mark}] {entry['backend']:<11} ({entry['isolation']})"
        if entry["works"]:
            degraded = entry.get("degraded") or []
            line += "  works" + (f" (without: {', '.join(degraded)})" if degraded else "")  # type: ignore[arg-type]
        else:
            line += f"  {entry['reason']}"
            if entry.get("fix"):
                line += f"\n        fix: {entry['fix']}"
        sys.stdout.write(line + "\n")
    sys.stdout.write("\nfeatures:\n")
    for name, ok, detail in features:
        sys.stdout.write(f"  [{'ok ' if ok else 'no '}] {name}: {detail}\n")
    return 0
