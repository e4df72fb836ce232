"""The ``corral`` command line: dispatch to one module per subcommand.

Exit statuses (DESIGN §5): the command's own status; 124 timed out; 125
corral failed or refused (nothing ran); 126 not executable; 127 not found;
128+N killed by signal N (137 when the memory limit killed it).
Diagnostics go to stderr, prefixed ``corral:``; stdout belongs to the command.

Subcommand modules are imported only when used: ``corral run`` loads the run
path and nothing else (see docs/design.md, "Start-up budget").
"""

from __future__ import annotations

import sys

__all__ = ["EXIT_USAGE", "main", "print_error"]

EXIT_USAGE = 125

#: subcommand -> (module, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("corral.cli.commands.run", "run a command in the sandbox"),
    "shell": ("corral.cli.commands.shell", "interactive shell in the sandbox"),
    "preview": ("corral.cli.commands.preview", "run a command against a copy-on-write workspace"),
    "diff": ("corral.cli.commands.diff", "review a preview's changes"),
    "apply": ("corral.cli.commands.apply", "land a preview's changes in the workspace"),
    "discard": ("corral.cli.commands.discard", "drop a preview"),
    "previews": ("corral.cli.commands.previews", "list the previews"),
    "policy": (
        "corral.cli.commands.policy",
        "show the effective policy (--explain: where each value comes from)",
    ),
    "trust": ("corral.cli.commands.trust", "trust this project's settings files"),
    "doctor": (
        "corral.cli.commands.doctor",
        "what works on this machine, and how to fix what doesn't",
    ),
    "audit": ("corral.cli.commands.audit", "show, follow or verify the audit log"),
    "ui": ("corral.cli.commands.ui", "local web page to review runs, previews and sessions"),
    "bench": ("corral.cli.commands.bench", "overhead benchmarks"),
    "k8s": ("corral.cli.commands.k8s", "render Kubernetes manifests that carry the policy"),
    "image": (
        "corral.cli.commands.image",
        "build a Debian image from apt (no registry) for container backends",
    ),
    "hook": ("corral.cli.commands.hook", "Claude Code hook entry (PreToolUse JSON on stdin)"),
    "install": ("corral.cli.commands.install", "install the Claude Code hook into settings.json"),
    "wrap-plugin": (
        "corral.cli.commands.wrap_plugin",
        "run another plugin's hooks, servers and monitors in corral",
    ),
    "mcp": ("corral.cli.commands.mcp", "MCP server on stdio"),
    "server": (
        "corral.cli.commands.server",
        "the warm per-user process that serves 'corral run' (--status, --stop)",
    ),
    "completion": ("corral.cli._reference", "print the shell completion script (bash, zsh, fish)"),
}

USAGE = """usage: corral COMMAND [OPTIONS] ...

Run an AI agent's commands in a sandbox under one policy.

commands:
{commands}

Run 'corral COMMAND --help' for a command's options.
"""


def print_error(message: str, hint: str | None = None) -> None:
    """Write ``corral: message`` (and ``corral: hint: ...``) to stderr."""
    sys.stderr.write(f"corral: {message}\n")
    if hint:
        sys.stderr.write(f"corral: hint: {hint}\n")
    sys.stderr.flush()


#: commands whose stdout/stderr is a protocol, or a daemon's: they do not report recoveries
_NO_RECOVERY = frozenset({"hook", "mcp", "server"})


def _finish_interrupted_applies() -> None:
    """Complete an apply that was killed midway (docs/preview.md); cheap when there is none."""
    import os

    from .._state import state_dir

    state = state_dir()
    try:
        if not os.listdir(os.path.join(state, "apply-journals")):
            return
    except OSError:
        return
    from .._exceptions import CorralError
    from ..preview import recover_interrupted

    try:
        for message in recover_interrupted(state):
            print_error(message)
    except (CorralError, OSError) as exc:
        print_error(f"could not complete an interrupted apply: {exc}")


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = "\n".join(
        f"  {name.ljust(width)}  {summary}" for name, (_, summary) in COMMANDS.items()
    )
    return USAGE.format(commands=lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``corral`` console script; returns the exit status.

    With *argv* ``None`` (the console script, ``python -m corral``) a ``corral
    run`` served by the corral server ends the process itself once the status
    is known (see :func:`corral.cli._client.main`); called with an argument
    list, it always returns.
    """
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(_usage())
        return 0 if args else EXIT_USAGE
    if args[0] in ("-V", "--version"):
        from .._version import __version__

        sys.stdout.write(f"corral {__version__}\n")
        return 0
    command = args[0]
    if command not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(command, list(COMMANDS), n=1)
        print_error(
            f"unknown command {command!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
            "run 'corral --help' for the list of commands",
        )
        return EXIT_USAGE
    if command not in _NO_RECOVERY:
        _finish_interrupted_applies()
    # corral's helper threads (cgroup set-up, write broker, proxy) mostly wait
    # in syscalls; hand the GIL back to the main thread quickly when they wake.
    sys.setswitchinterval(0.0005)
    try:
        if command == "run":
            from ._client import main as run_main  # the corral server, else in-process

            return run_main(args[1:], console=argv is None)
        import importlib

        module = importlib.import_module(COMMANDS[command][0])
        status: int = module.main(args[1:])
    except KeyboardInterrupt:
        return 130
    return status
