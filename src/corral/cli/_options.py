"""Options shared by ``run``, ``shell`` and ``preview``, parsed without argparse.

``argparse`` costs ~9 ms to import on the target machines, more than the rest
of ``corral run``'s own work; this table-driven parser covers the run options
(DESIGN §5) in a few dozen lines. Cold subcommands use argparse.

Every option that changes the policy becomes a value in a *flags* dict shaped
like a settings file, so the settings loader validates it with the same
messages and ``corral policy --explain`` shows it as coming from ``flags``.
"""

from __future__ import annotations

import os

from .._exceptions import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["RUN_OPTIONS", "RunOptions", "option_for_key", "parse_run_options", "run_options_help"]

#: the help line of -h/--help, worded as argparse words it for the other commands
HELP_TEXT = "show this help message and exit"

# (option, kind, target, help). kind: "flag" | "value" | "append"
RUN_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("--backend", "value", "backend", "backend to use (auto, bubblewrap, none, ...)"),
    ("--isolation", "value", "isolation", "minimum isolation: process, namespace, kernel, vm"),
    ("--profile", "value", "@profile", "apply the named settings profile"),
    (
        "--workspace",
        "value",
        "filesystem.workspace",
        "project directory (default: git top-level, else cwd)",
    ),
    ("--read-only", "flag", "filesystem.readOnly", "mount the workspace read-only too"),
    (
        "--allow-home-workspace",
        "flag",
        "filesystem.allowHomeWorkspace",
        "accept the home directory (or a parent) as the workspace",
    ),
    ("--allow-write", "append", "filesystem.allowWrite", "also writable: PATH (repeatable)"),
    ("--deny-write", "append", "filesystem.denyWrite", "never writable: PATH or glob (repeatable)"),
    (
        "--allow-read",
        "append",
        "filesystem.allowRead",
        "re-expose PATH under a hidden one (repeatable)",
    ),
    ("--deny-read", "append", "filesystem.denyRead", "hide PATH (repeatable)"),
    ("--net", "value", "network.mode", "network: none, allowlist or open"),
    (
        "--allow-host",
        "append",
        "network.allow",
        "allow egress to HOST (implies --net allowlist; repeatable)",
    ),
    (
        "--allow-unix-sockets",
        "flag",
        "network.allowUnixSockets",
        "let the command create AF_UNIX sockets",
    ),
    (
        "--memory",
        "value",
        "resources.memory",
        "memory limit for the whole tree, e.g. 512M, 2G ('none': no limit)",
    ),
    ("--pids", "value", "resources.pids", "process/thread limit"),
    ("--cpus", "value", "resources.cpus", "CPU bandwidth in cores, e.g. 1.5"),
    ("--cpu-time", "value", "resources.cpuTime", "CPU time per process, e.g. 60s"),
    ("--timeout", "value", "resources.timeout", "wall-clock timeout, e.g. 30s, 10m"),
    ("--max-output", "value", "resources.output", "cap on stdout+stderr, e.g. 10M"),
    ("--env", "append", "@env", "NAME=VALUE sets, NAME passes the host's value (repeatable)"),
    (
        "--allow-degraded",
        "append",
        "allowDegraded",
        "run even if RULE cannot be enforced here (recorded)",
    ),
    ("--settings", "append", "@settings", "an extra settings FILE (trusted; repeatable)"),
    (
        "--no-tty",
        "flag",
        "@no_tty",
        "no pseudo-terminal for output on a terminal (pipes, as when redirected)",
    ),
    ("--json-out", "value", "@json_out", "write the Outcome as JSON to FILE ('-': stdout)"),
    ("--agent-session", "value", "@agent_session", "agent session id for the audit log"),
    ("-c", "value", "@shell", "run STRING with /bin/sh -c"),
    ("--shell", "value", "@shell_program", "run the -c STRING with this shell instead of /bin/sh"),
    ("--command-file", "value", "@command_file", "like -c, with the STRING read from FILE"),
)
_BY_NAME = {opt: (kind, target) for opt, kind, target, _ in RUN_OPTIONS}
_INT_KEYS = {"resources.pids"}
_FLOAT_KEYS = {"resources.cpus"}


class RunOptions:
    """The parsed command line of ``run``/``shell``/``preview``."""

    __slots__ = (
        "agent_session",
        "argv",
        "extra",
        "flags",
        "json_out",
        "no_tty",
        "profile",
        "settings_files",
        "shell",
        "shell_program",
    )

    def __init__(self) -> None:
        self.flags: dict[str, Any] = {}
        self.argv: list[str] = []
        self.shell: str | None = None
        self.shell_program: str | None = None
        self.profile: str | None = None
        self.settings_files: list[str] = []
        self.json_out: str | None = None
        self.no_tty = False
        self.agent_session: str | None = None
        self.extra: dict[str, Any] = {}


def _set(flags: dict[str, Any], dotted: str, value: Any, *, append: bool) -> None:
    node = flags
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    if append:
        node.setdefault(parts[-1], []).append(value)
    else:
        node[parts[-1]] = value


def parse_run_options(
    args: list[str], *, extra: dict[str, str] | None = None, command_required: bool = True
) -> RunOptions:
    """Parse *args*; ``extra`` adds subcommand-specific options (name -> "flag"/"value"/"append").

    The command starts after ``--`` or at the first word that is not an option.

    Raises:
        UsageError: unknown option, missing value, bad number, or no command.
    """
    opts = RunOptions()
    extra = extra or {}
    from_file = False  # the -c STRING came from --command-file
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            opts.argv = args[i + 1 :]
            break
        if not word.startswith("-") or word == "-":
            opts.argv = args[i:]
            break
        name, eq, inline = word.partition("=")
        if name in extra:
            if extra[name] == "flag":
                opts.extra[name] = True
                i += 1
                continue
            value, i = _value(args, i, name, inline if eq else None)
            if extra[name] == "append":
                opts.extra.setdefault(name, []).append(value)
            else:
                opts.extra[name] = value
            continue
        if name not in _BY_NAME:
            import difflib

            known = [*_BY_NAME, *extra]
            close = difflib.get_close_matches(name, known, n=1)
            raise UsageError(
                f"unknown option {name}" + (f" (did you mean {close[0]}?)" if close else ""),
                hint="run with --help for the options",
            )
        kind, target = _BY_NAME[name]
        if kind == "flag":
            if eq:
                raise UsageError(f"option {name} takes no value")
            if target == "@no_tty":
                opts.no_tty = True
            else:
                _set(opts.flags, target, True, append=False)
            i += 1
            continue
        value, i = _value(args, i, name, inline if eq else None)
        if target == "@profile":
            opts.profile = value
        elif target == "@settings":
            opts.settings_files.append(value)
        elif target == "@json_out":
            opts.json_out = value
        elif target == "@agent_session":
            opts.agent_session = value
        elif target in ("@shell", "@command_file"):
            if opts.shell is not None and (target == "@command_file" or from_file):
                raise UsageError("give either -c STRING or --command-file FILE, not both")
            from_file = target == "@command_file"
            opts.shell = _read_command_file(value) if from_file else value
        elif target == "@shell_program":
            opts.shell_program = value
        elif target == "@env":
            env_name, has_value, env_value = value.partition("=")
            if not env_name:
                raise UsageError(f"--env {value!r}: expected NAME or NAME=VALUE")
            if has_value:
                _set(opts.flags, f"env.set.{env_name}", env_value, append=False)
            else:
                _set(opts.flags, "env.pass", env_name, append=True)
        else:
            if target == "network.allow":
                opts.flags.setdefault("network", {}).setdefault("mode", "allowlist")
            typed: Any = value
            if target.startswith("resources.") and value.lower() in ("none", "null", "unlimited"):
                typed = None  # explicitly no limit (a loosening: only flags and trusted files)
            elif target in _INT_KEYS:
                typed = _number(name, value, int)
            elif target in _FLOAT_KEYS:
                typed = _number(name, value, float)
            _set(opts.flags, target, typed, append=kind == "append")
    network = opts.flags.get("network", {})
    if "allow" in network and network.get("mode") != "allowlist":
        raise UsageError(
            f"--allow-host needs --net allowlist, not --net {network.get('mode')}",
            hint="drop --net (--allow-host implies allowlist) or drop --allow-host",
        )
    if opts.shell is not None and opts.argv:
        raise UsageError("give either -c STRING or a command, not both")
    if opts.shell_program is not None and opts.shell is None:
        raise UsageError("--shell goes with -c STRING")
    if command_required and opts.shell is None and not opts.argv:
        raise UsageError(
            "no command given", hint="corral run [OPTIONS] -- COMMAND [ARG...]  or  -c 'STRING'"
        )
    return opts


def option_for_key(key: str) -> str | None:
    """The command-line option that sets settings *key* (``resources.output`` -> ``--max-output``)."""
    if key.startswith(("env.set", "env.pass")):
        return "--env"
    base = key.split("[", 1)[0]
    for opt, _kind, target, _help in RUN_OPTIONS:
        if target == base:
            return opt
    return None


def _read_command_file(path: str) -> str:
    """The text of *path* for ``--command-file`` (no NUL byte, as for ``-c``)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise UsageError(f"--command-file {path}: {exc.strerror}") from None
    if b"\0" in data:
        raise UsageError(f"--command-file {path}: the command contains a NUL byte")
    return os.fsdecode(data)  # as the words of -c are decoded


def _value(args: list[str], i: int, name: str, inline: str | None) -> tuple[str, int]:
    if inline is not None:
        return inline, i + 1
    if i + 1 >= len(args):
        raise UsageError(f"option {name} needs a value")
    return args[i + 1], i + 2


def _number(name: str, value: str, kind: type) -> Any:
    try:
        number = kind(value)
    except ValueError:
        raise UsageError(f"option {name}: {value!r} is not a number") from None
    return number


def run_options_help(command: str, summary: str, extra: tuple[tuple[str, str], ...] = ()) -> str:
    """Help text for a run-like subcommand."""
    rows = [("-h, --help", HELP_TEXT)]
    rows += [(opt + ("" if kind == "flag" else " X"), text) for opt, kind, _, text in RUN_OPTIONS]
    rows += list(extra)
    width = max(len(r[0]) for r in rows)
    body = "\n".join(f"  {left.ljust(width)}  {text}" for left, text in rows)
    return (
        f"usage: corral {command} [OPTIONS] -- COMMAND [ARG...]\n"
        f"       corral {command} [OPTIONS] -c 'STRING'\n\n{summary}\n\noptions:\n{body}\n"
    )
