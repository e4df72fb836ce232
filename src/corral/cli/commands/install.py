"""``corral install claude-code [--user|--project] [--uninstall]``: the Claude Code hook.

Writes corral's ``PreToolUse`` hook into ``~/.claude/settings.json``
(``--user``, the default) or ``<project>/.claude/settings.json``
(``--project``; the project is the git top-level above the current
directory - which covers only sessions started *at* that directory, so the
command says so and recommends ``--user``) by merging JSON: every existing key and hook stays; installing
twice changes nothing; ``--uninstall`` removes the hook again. The hook
command is the compiled fast client (``corral-client hook claude-code``) when
it is usable here, else this corral script. See
:mod:`corral.integrations.claude_settings`.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error

__all__ = ["main", "settings_path"]


def settings_path(scope: str, *, home: str, cwd: str) -> str:
    """The Claude Code settings file for *scope* (``"user"`` or ``"project"``)."""
    if scope == "user":
        return os.path.join(home, ".claude", "settings.json")
    from ...policy import find_workspace

    project, _ = find_workspace(cwd, home=home)
    return os.path.join(project, ".claude", "settings.json")


def main(args: list[str]) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="corral install",
        description=(
            "Install corral's hook into an agent's settings "
            "(merging JSON; existing keys and hooks stay)."
        ),
    )
    parser.add_argument("agent", choices=["claude-code"], help="the agent to integrate with")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--user",
        dest="scope",
        action="store_const",
        const="user",
        help="~/.claude/settings.json (the default)",
    )
    scope.add_argument(
        "--project",
        dest="scope",
        action="store_const",
        const="project",
        help=(
            "<project>/.claude/settings.json (the git top-level above the current directory); "
            "covers only sessions started at that directory - prefer --user"
        ),
    )
    parser.add_argument("--uninstall", action="store_true", help="remove corral's hook again")
    try:
        opts = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    from ..._state import state_dir
    from ...integrations.claude_code_hook import corral_command
    from ...integrations.claude_settings import hook_command, install_hook, uninstall_hook
    from ...policy._locations import default_home
    from ...server._fastclient import usable_client

    home = default_home(os.environ)
    path = settings_path(opts.scope or "user", home=home, cwd=os.getcwd())
    records = os.path.join(state_dir(os.environ), "claude-code-install")
    try:
        if opts.uninstall:
            changed = uninstall_hook(path, records=records)
            what = "removed corral's hook from" if changed else "corral's hook is not in"
        else:
            fast = usable_client()
            corral = (fast,) if fast else corral_command(sys.argv[0], sys.executable)
            changed = install_hook(path, hook_command(corral), records=records)
            what = (
                "installed corral's PreToolUse hook in"
                if changed
                else "corral's hook is already in"
            )
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    except OSError as exc:
        print_error(f"{path}: cannot write it: {exc.strerror}")
        return EXIT_USAGE
    sys.stdout.write(f"corral: {what} {path}{'' if changed else '; nothing changed'}\n")
    if opts.scope == "project" and not opts.uninstall:
        sys.stdout.write(PROJECT_SCOPE_NOTE.format(project=os.path.dirname(os.path.dirname(path))))
    return 0


#: What ``--project`` covers, verified with the real Claude Code (2.1.197): a session
#: reads ``.claude/settings.json`` only in the directory it was started in.
PROJECT_SCOPE_NOTE = """\
corral: this protects Claude Code sessions started in {project} itself. Claude Code
  reads a project's .claude/settings.json only in the directory a session starts
  in: a session started in a subdirectory runs its commands WITHOUT corral.
  To cover every session, install for your user: corral install claude-code --user
"""
