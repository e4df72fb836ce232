"""``corral server``: the warm per-user process that serves ``corral run``.

::

    corral server              run it in the foreground (logs go to its log file)
    corral server --detach     start it in the background; return once it listens
    corral server --status     is one running? (exit 0: yes, 1: no)
    corral server --stop       stop it (running commands are stopped) and wait

``corral run`` starts one by itself when none runs (``CORRAL_SERVER=off``
turns the server off). It also answers ``corral-client hook claude-code``
(:func:`handle_hook`). See :mod:`corral.server._server` and docs/design.md, "The
corral server".
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .. import EXIT_USAGE, print_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...pipeline._launchers import LauncherPool
    from ...pipeline._runner import SignalRelay
    from ...server._kept import KeptSessions
    from ...server._requests import HookRequest, RunRequest
    from ...server._server import Server
    from ...server._warm import WarmSandboxes

__all__ = ["handle_hook", "handle_run", "main"]


def handle_run(
    request: RunRequest,
    relay: SignalRelay,
    launchers: LauncherPool | None,
    *,
    kept: KeptSessions | None = None,
    warm: WarmSandboxes | None = None,
) -> int:
    """Run one client's ``corral run`` exactly as it would run in the client's process.

    With *kept*, ``corral run --keep --agent-session ID`` runs in that session's
    kept sandbox (:mod:`corral.server._kept`).
    """
    from .run import Caller, run

    caller = Caller(
        cwd=request.cwd,
        environ=request.environ,
        stdio=request.stdio,
        reports=request.reports,
        afterwards=request.afterwards,
    )
    return run(
        request.argv, caller, relay, launchers=launchers, prestage=False, kept=kept, warm=warm
    )


def handle_hook(request: HookRequest) -> tuple[bytes, bytes, int]:
    """Answer one client's ``corral hook INTEGRATION`` exactly as its own process would.

    Returns ``(stdout, stderr, exit status)``. The Python CLI it names in a
    rewritten command (when the fast client is not usable) is this server's
    interpreter with ``-m corral``.
    """
    from .hook import answer

    result = answer(
        request.integration,
        request.stdin,
        environ=request.environ,
        python_cli=(sys.executable, "-m", "corral"),
        pid=request.pid,
    )
    return result.stdout, result.stderr, result.status


def _pool_idle(value: str | None) -> float:
    """``CORRAL_SERVER_POOL_IDLE``: seconds before an idle server releases its launcher pool."""
    from ...server._server import DEFAULT_POOL_IDLE

    try:
        seconds = float(value) if value else DEFAULT_POOL_IDLE
    except ValueError:
        return DEFAULT_POOL_IDLE
    return seconds if seconds > 0 else DEFAULT_POOL_IDLE


def main(args: list[str]) -> int:
    """Entry point."""
    from ..._exceptions import ServerError
    from ..._state import state_dir
    from ...server._hub import server_idle

    parser = argparse.ArgumentParser(
        prog="corral server",
        description="The warm per-user process that serves 'corral run' (see docs/design.md).",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--detach", action="store_true", help="start in the background")
    group.add_argument("--status", action="store_true", help="is a server running?")
    group.add_argument("--stop", action="store_true", help="stop the running server")
    parser.add_argument(
        "--state-dir", help="corral's state directory (default: $XDG_STATE_HOME/corral)"
    )
    parser.add_argument(
        "--idle",
        help="exit after this many seconds without a client (default: $CORRAL_SERVER_IDLE or 300)",
    )
    parser.add_argument("--json", action="store_true", help="--status as JSON")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    state = os.path.abspath(ns.state_dir) if ns.state_dir else state_dir()
    try:
        idle = server_idle(ns.idle if ns.idle is not None else os.environ.get("CORRAL_SERVER_IDLE"))
    except ValueError as exc:
        print_error(f"--idle / CORRAL_SERVER_IDLE: {exc}")
        return EXIT_USAGE
    try:
        if ns.status:
            return _status(state, as_json=ns.json)
        if ns.stop:
            return _stop(state)
        if ns.detach:
            return _detach(state, ns.idle)
        return _serve(state, idle)
    except ServerError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE


def _serve(state: str, idle: float) -> int:
    from ..._exceptions import ServerError
    from ...server._hub import configuration
    from ...server._kept import KeptSessions
    from ...server._server import Server
    from ...server._warm import WarmSandboxes

    kept = KeptSessions.from_environ(state, os.environ)
    warm = WarmSandboxes.from_environ(os.environ)

    def run_kept(request: RunRequest, relay: SignalRelay, launchers: LauncherPool | None) -> int:
        return handle_run(request, relay, launchers, kept=kept, warm=warm)

    server = Server(
        state,
        handler=run_kept,
        hook_handler=handle_hook,
        idle=idle,
        launchers=os.geteuid() == 0,
        pool_idle=_pool_idle(os.environ.get("CORRAL_SERVER_POOL_IDLE")),
        config=configuration(os.environ, idle),
    )
    server.extra_statistics["warm"] = warm.statistics
    try:
        server.start()
    except ServerError as exc:
        server.log(f"not started: {exc.message}")  # a detached server has no terminal
        raise
    if server.handed_to:  # the running server of this configuration serves the directory now
        sys.stdout.write(
            f"the corral server pid {server.handed_to} serves {state} now (one server serves "
            "every state directory of a configuration); this process is done\n"
        )
        return 0
    _prepare_hooks(server)
    try:
        server.serve()
    finally:
        warm.close()
        kept.close()
    return 0


def _prepare_hooks(server: Server) -> None:
    """Import what the first hook answer needs, and record this interpreter for the fast client.

    With inotify, the settings cache (:mod:`corral.policy._watched`) is set up on the
    code watch's instance: the hook's settings and Claude Code rules are then parsed
    again only after a change to a file they read.
    """
    from ...integrations import _access, claude_code_hook  # noqa: F401
    from ...policy._watched import install
    from ...server._fastclient import usable_client
    from . import hook  # noqa: F401

    if server.watch is not None and server.watch.inotify is not None:
        install(server.watch.inotify)
        server.log("settings cache: on (inotify)")
    else:
        server.log("settings cache: off (no inotify)")
    fast = usable_client()
    server.log(
        f"fast client: {fast}" if fast else "fast client: not built or its sidecar not writable"
    )


def _status(state: str, *, as_json: bool) -> int:
    from ...server._control import request_status

    status = request_status(state)
    if as_json:
        import json

        sys.stdout.write(json.dumps(status) + "\n")
        return 0 if status else 1
    if status is None:
        sys.stdout.write(f"no corral server for {state}\n")
        return 1
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["started"]))
    pool = status.get("launchers")
    also = int(status.get("state_dirs", 1)) - 1
    lines = [
        f"corral server pid {status['pid']} for {status['state_dir']}"
        + (f" (and {also} other state directories)" if also > 0 else "")
        + f", since {since}",
        f"  served {status['served']}, refused {status['refused']}, running {status['running']}"
        + (" (retiring)" if status.get("retiring") else ""),
        f"  idle timeout {status['idle_timeout']:g}s; code {status['code']}",
        "  launcher pool: "
        + (
            f"{pool['ready']} ready, {pool['served']} served, {pool['missed']} missed"
            if pool
            else "none (cgroup v2, not root, or no v1 memory/pids controllers)"
        ),
    ]
    vms = status.get("vm_pool")
    if vms:
        lines.append(
            f"  micro-VM pool: {vms['idle']} idle (size {vms['size']}), {vms['booted']} booted, "
            f"{vms['served']} served, {vms['missed']} missed"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _stop(state: str) -> int:
    from ...server._control import request_stop

    pid = request_stop(state)
    if pid is None:
        sys.stdout.write(f"no corral server for {state}\n")
    else:
        sys.stdout.write(f"stopped the corral server (pid {pid})\n")
    return 0


def _detach(state: str, idle: str | None) -> int:
    """Start a server in its own session and wait until it answers."""
    from ..._exceptions import ServerError
    from ...server._control import request_status
    from .._client import spawn_server

    status = request_status(state)
    if status is not None:
        sys.stdout.write(f"a corral server already runs (pid {status['pid']})\n")
        return 0
    pid = spawn_server(state, os.environ, idle=idle)
    deadline = time.monotonic() + 30.0
    exited = False  # with status 0: it handed the directory over to a running server
    while time.monotonic() < deadline:
        status = request_status(state)
        if status is not None:
            sys.stdout.write(f"started the corral server (pid {status['pid']})\n")
            return 0
        if not exited:
            finished, wait_status = os.waitpid(pid, os.WNOHANG)
            code = os.waitstatus_to_exitcode(wait_status) if finished else 0
            if code != 0:
                log = os.path.join(state, "server", "server.log")
                raise ServerError(
                    f"Failed to start the corral server (exit status {code})",
                    hint=f"see {log}, or run 'corral server' in the foreground",
                )
            exited = bool(finished)
        time.sleep(0.02)
    raise ServerError("Failed to start the corral server: it did not answer within 30s")
