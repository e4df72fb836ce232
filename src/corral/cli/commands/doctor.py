"""``corral doctor``: what works on this machine, and how to fix what doesn't.

First whether the settings layers of the current directory load and validate
(exit status 1 when they do not: every run would be refused). For every
registered backend: whether it can run here, and if not the exact
reason and the fix; for the ones that can, a real smoke run of ``true`` in a
throw-away workspace (a probe that only looks for binaries can be wrong).
Then the host features corral's guarantees rest on: seccomp user
notification (the write broker), cgroups (limits), Landlock, and the
preview mechanisms (kernel overlayfs, fuse-overlayfs, copy) - each tried
with a real mount - with the one ``corral preview`` uses and a smoke
preview run that checks the real workspace stays untouched.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from ..._exceptions import CorralError
from .. import EXIT_USAGE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["check_backends", "main", "matrix", "render_matrix"]


def _check_backend(name: str, workspace: str) -> dict[str, object]:
    from ...backends import get_backend, inspect_host
    from ...pipeline._request import ExecRequest
    from ...pipeline._runner import launch, prepare
    from ...policy import Policy

    backend = get_backend(name)
    home = os.environ.get("HOME", "/")
    policy = Policy.for_workspace(workspace, home=home).replace(
        backend=name,
        isolation="process" if backend.isolation in ("process", "none") else backend.isolation,
    )
    if name in ("podman", "docker"):
        from ...backends._image_ref import resolve_image

        # smoke-test with a corral-built image when there is one (the image setting may be unset)
        built = [
            ref for ref in ("corral:python", "corral:base") if resolve_image(ref).problem is None
        ]
        policy = policy.replace(image=built[0] if built else None)
    if backend.writes_through_preview:  # the smoke run needs no preview
        policy = policy.replace(filesystem=policy.filesystem.replace(read_only=True))
    request = ExecRequest.from_argv(["true"], cwd=workspace)
    entry: dict[str, object] = {"backend": name, "isolation": backend.isolation}
    if name == "microvm":
        entry["note"] = _microvm_note()
    facts, _layout = inspect_host(backend, request, policy, dict(os.environ))
    problem = backend.problem(facts)
    if problem is not None:
        entry.update(works=False, reason=problem)
        return entry
    try:
        prepared = prepare(
            request, policy.replace(allow_degraded=frozenset({"*"})), environ=os.environ
        )
        outcome = launch(prepared, request)
    except CorralError as exc:
        entry.update(works=False, reason=exc.message, fix=exc.hint)
        return entry
    if outcome.returncode != 0:
        entry.update(
            works=False,
            reason=f"smoke run of 'true' exited {outcome.returncode}: "
            f"{outcome.text('stderr').strip()[-200:]}",
        )
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


def _microvm_note() -> str:
    """TCG or KVM, and what that costs (stated, not hidden)."""
    import json

    from ...backends._image_ref import image_cache_dir

    try:
        with open(
            os.path.join(os.path.dirname(image_cache_dir()), "kvm-probe.json"), encoding="utf-8"
        ) as f:
            problem = json.load(f).get("problem")
    except (OSError, ValueError, AttributeError):
        return "KVM not probed yet"
    if problem:
        return f"TCG (software emulation: seconds per boot; KVM would boot in ~0.1 s): {problem}"
    return "KVM"


def _features() -> list[tuple[str, bool, str]]:
    from ...backends import helper_path
    from ...backends._kernel import broker_supported
    from ...pipeline._cgroups import probe

    rows: list[tuple[str, bool, str]] = [_settings_feature()]
    helper = helper_path()
    rows.append(
        (
            "exec helper",
            helper is not None,
            helper or "missing: reinstall corral with a C compiler (apt-get install gcc libc6-dev)",
        )
    )
    rows.append(_fast_client_feature())
    broker = broker_supported()
    rows.append(
        (
            "write broker (protected paths at any depth)",
            broker is None,
            "seccomp user notification available" if broker is None else broker,
        )
    )
    layout, why = probe(frozenset({"memory", "pids"}))
    rows.append(
        (
            "cgroup limits (memory, pids)",
            layout is not None,
            f"cgroup v{layout.version}: {', '.join(sorted(layout.controllers))}"
            if layout
            else str(why),
        )
    )
    rows += _preview_rows()
    rows.append(_egress_feature())
    return rows


def _settings_feature() -> tuple[str, bool, str]:
    """The settings layers of this directory load and validate (what every run would meet)."""
    from ..._exceptions import SettingsError
    from ...policy import load_settings

    name = "settings"
    try:
        resolved = load_settings(environ=os.environ)
    except SettingsError as exc:
        return name, False, exc.message + (f" (fix: {exc.hint})" if exc.hint else "")
    files = [
        layer.label + ("" if layer.trusted else " (untrusted: tightening only)")
        for layer in resolved.layers
        if layer.path is not None and layer.found
    ]
    detail = "valid: " + ("; ".join(files) if files else "built-in defaults only")
    for warning in resolved.warnings:
        detail += f"; warning: {warning}"
    return name, True, detail


def _fast_client_feature() -> tuple[str, bool, str]:
    """Whether the hook and the commands it rewrites can use corral-client (and record its sidecar)."""
    from ...server._fastclient import SIDECAR_SUFFIX, client_path, usable_client

    name = "fast client (corral-client: hooks and runs without an interpreter's start)"
    fast = usable_client()
    if fast is not None:
        return name, True, fast
    path = client_path()
    if not os.access(path, os.X_OK):
        return name, False, "not built: reinstall corral with a C compiler; the Python CLI is used"
    return (
        name,
        False,
        f"{path}{SIDECAR_SUFFIX} cannot be written (a read-only installation?): run corral once "
        "as the installation's owner; until then the Python CLI is used",
    )


def matrix(
    names: list[str] | None = None, progress: Callable[[str], None] | None = None
) -> list[dict[str, object]]:
    """Run the conformance probes on every backend that works here.

    One row per backend: ``{"backend", "available", "reason", "cells": {guarantee: (status, detail)}}``;
    see :mod:`corral.testing.conformance` for the statuses. *progress* is told
    what is being probed, before each step.
    """
    from ...backends import BACKENDS, get_backend, unregistered
    from ...testing.conformance import GUARANTEES, check

    def tell(text: str) -> None:
        if progress is not None:
            progress(text)

    rows: list[dict[str, object]] = []
    tell("smoke-testing every backend")
    by_name = {e["backend"]: e for e in check_backends()}
    todo = names or sorted(BACKENDS)
    for index, name in enumerate(todo, 1):
        entry = by_name.get(name, {})
        if not entry.get("works"):
            rows.append(
                {
                    "backend": name,
                    "available": False,
                    "reason": entry.get("reason", "not registered"),
                    "isolation": get_backend(name).isolation,
                    "cells": {},
                }
            )
            continue
        cells = {}
        for guarantee in GUARANTEES:
            tell(f"backend {index}/{len(todo)} {name}: {guarantee.name}")
            verdict = check(name, guarantee)
            cells[guarantee.name] = (verdict.status, verdict.detail)
        rows.append(
            {
                "backend": name,
                "available": True,
                "reason": "",
                "isolation": get_backend(name).isolation,
                "cells": cells,
            }
        )
    for name, reason in sorted(unregistered(dict(os.environ)).items()):
        rows.append(
            {"backend": name, "available": False, "reason": reason, "isolation": "vm", "cells": {}}
        )
    return rows


def render_matrix(rows: list[dict[str, object]]) -> str:
    """The matrix as a Markdown table (also readable in a terminal)."""
    from ...testing.conformance import GUARANTEES

    header = ["backend (isolation)", *(g.name for g in GUARANTEES)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    notes: list[str] = []
    for row in rows:
        label = f"{row['backend']} ({row['isolation']})"
        if not row["available"]:
            lines.append(f"| {label} | " + " | ".join(["unavailable"] * len(GUARANTEES)) + " |")
            notes.append(f"{row['backend']}: {row['reason']}")
            continue
        cells = row["cells"]
        assert isinstance(cells, dict)
        lines.append(f"| {label} | " + " | ".join(cells[g.name][0] for g in GUARANTEES) + " |")
    text = "\n".join(lines) + "\n"
    if notes:
        text += "\n" + "\n".join(f"* {n}" for n in notes) + "\n"
    return text


def _preview_rows() -> list[tuple[str, bool, str]]:
    """Each preview mechanism tried for real, then the one in use with a smoke preview run."""
    from ..._state import state_dir
    from ...preview._mechanism import MECHANISMS, choose_mechanism, probe

    previews = os.path.join(state_dir(), "previews")
    rows: list[tuple[str, bool, str]] = []
    for mechanism in MECHANISMS:
        problem = probe(mechanism, previews, use_cache=False)
        detail = {
            "overlay": "kernel overlayfs in a private mount namespace",
            "fuse-overlayfs": "fuse-overlayfs daemon",
            "copy": "a full copy of the workspace (reflink where supported)",
        }[mechanism]
        rows.append(
            (
                f"preview mechanism {mechanism}",
                problem is None,
                detail if problem is None else problem,
            )
        )
    requested = os.environ.get("CORRAL_PREVIEW_MECHANISM", "auto") or "auto"
    try:
        chosen = choose_mechanism(requested, previews)
    except CorralError as exc:
        rows.append(("preview (corral preview)", False, exc.message))
        return rows
    ok, detail = _smoke_preview(chosen)
    rows.append(("preview (corral preview)", ok, f"uses {chosen}: {detail}"))
    return rows


def _smoke_preview(mechanism: str) -> tuple[bool, str]:
    """Run one write in a preview of a scratch workspace; check where it landed."""
    from ...pipeline._request import ExecRequest
    from ...pipeline._runner import execute
    from ...policy import Policy
    from ...preview import Preview

    with tempfile.TemporaryDirectory(prefix="corral-doctor-") as scratch:
        workspace = os.path.join(scratch, "ws")
        os.mkdir(workspace)
        state = os.path.join(scratch, "state")
        try:
            preview = Preview.create(workspace, state_dir=state, mechanism=mechanism)
            policy = Policy.for_workspace(workspace, home=os.environ.get("HOME", "/")).replace(
                allow_degraded=frozenset({"*"})
            )
            request = ExecRequest.from_argv(
                ["/bin/sh", "-c", "echo smoke > written"], cwd=workspace
            )
            outcome = execute(request, policy, environ=os.environ, preview=preview)
            changes = [(c.kind, c.path) for c in preview.changes()]
        except CorralError as exc:
            return False, exc.message
        if outcome.returncode != 0:
            detail = outcome.text("stderr").strip()[-200:]
            return False, f"the smoke run exited {outcome.returncode}: {detail}"
        if os.path.exists(os.path.join(workspace, "written")):
            return False, "the smoke run wrote through to the real workspace"
        if changes != [("added", "written")]:
            return False, f"unexpected change set {changes}"
        preview.discard()
        return True, "smoke run ok (the write landed in the preview only)"


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
    from ...pipeline._request import ExecRequest
    from ...pipeline._runner import execute
    from ...policy import NetworkPolicy, Policy

    name = "egress proxy (network.mode = allowlist)"
    with tempfile.TemporaryDirectory(prefix="corral-doctor-") as workspace:
        policy = Policy.for_workspace(workspace, home=os.environ.get("HOME", "/")).replace(
            network=NetworkPolicy(mode="allowlist"), allow_degraded=frozenset({"*"})
        )
        # a system interpreter: a virtualenv under /tmp would be hidden inside the sandbox
        python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
        request = ExecRequest.from_argv([python, "-I", "-c", _EGRESS_PROBE], cwd=workspace)
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
    parser.add_argument(
        "--matrix",
        action="store_true",
        help="run the conformance probes: backend x guarantee (enforced / refused / not expressible)",
    )
    parser.add_argument(
        "--backend", action="append", help="with --matrix: only this backend (repeatable)"
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="with --matrix: report each probe on stderr (default: only when stderr is a terminal)",
    )
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    if ns.matrix:
        progress = _progress_line() if ns.progress else _progress_tty()
        rows = matrix(ns.backend, progress=progress)
        if progress is not None and not ns.progress:
            sys.stderr.write("\r\x1b[K")  # clear the progress line
        if ns.json:
            from ..._jsonfast import dumps

            sys.stdout.write(dumps(rows) + "\n")
        else:
            sys.stdout.write(render_matrix(rows))
        bad = [
            f"{r['backend']}: {g} {c[0]}"
            for r in rows
            for g, c in r["cells"].items()  # type: ignore[attr-defined]
            if c[0] in ("VIOLATED", "error")
        ]
        for line in bad:
            sys.stderr.write(f"corral: {line}\n")
        return 1 if bad else 0
    backends = check_backends()
    features = _features()
    if ns.json:
        from ..._jsonfast import dumps

        sys.stdout.write(
            dumps(
                {
                    "backends": backends,
                    "features": [{"name": n, "ok": ok, "detail": d} for n, ok, d in features],
                }
            )
            + "\n"
        )
        return _status(features)
    uname = os.uname()
    sys.stdout.write(
        f"corral doctor: Linux {uname.release} {uname.machine}, uid {os.getuid()}\n\nbackends:\n"
    )
    from ...backends import unregistered

    backends += [
        {"backend": n, "isolation": "vm", "works": False, "reason": r}
        for n, r in sorted(unregistered(dict(os.environ)).items())
    ]
    for entry in backends:
        mark = "ok " if entry["works"] else "no "
        line = f"  [{mark}] {entry['backend']:<11} ({entry['isolation']})"
        if entry["works"]:
            degraded = entry.get("degraded") or []
            line += "  works" + (f" (without: {', '.join(degraded)})" if degraded else "")  # type: ignore[arg-type]
            if entry.get("note"):
                line += f"; {entry['note']}"
        else:
            line += f"  {entry['reason']}"
            if entry.get("fix"):
                line += f"\n        fix: {entry['fix']}"
        sys.stdout.write(line + "\n")
    sys.stdout.write("\nfeatures:\n")
    for name, ok, detail in features:
        sys.stdout.write(f"  [{'ok ' if ok else 'no '}] {name}: {detail}\n")
    return _status(features)


def _progress_tty() -> Callable[[str], None] | None:
    """A progress line that rewrites itself on a terminal stderr; None when it is not one."""
    if not sys.stderr.isatty():
        return None

    def show(text: str) -> None:
        sys.stderr.write(f"\r\x1b[Kcorral: doctor --matrix: {text}")
        sys.stderr.flush()

    return show


def _progress_line() -> Callable[[str], None]:
    """``--progress``: one stderr line per step (a log, for pipes and CI)."""

    def show(text: str) -> None:
        sys.stderr.write(f"corral: doctor --matrix: {text}\n")
        sys.stderr.flush()

    return show


def _status(features: list[tuple[str, bool, str]]) -> int:
    """1 when the settings are invalid (every run would be refused), else 0."""
    settings_ok = all(ok for name, ok, _ in features if name == "settings")
    if not settings_ok:
        sys.stderr.write("corral: the settings are invalid: every run would be refused\n")
    return 0 if settings_ok else 1
