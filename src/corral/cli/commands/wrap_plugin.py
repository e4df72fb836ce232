"""``corral wrap-plugin DIR [--check]``: run a plugin's hooks, servers and monitors under corral.

See :mod:`corral.integrations.plugin_wrap`. ``--check`` changes nothing: it
lists every hook and server and exits 1 when any runs unwrapped.
"""

from __future__ import annotations

import argparse
import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error

__all__ = ["main"]


def main(args: list[str]) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(
        prog="corral wrap-plugin",
        description="Rewrite a Claude Code plugin's hooks, MCP and LSP servers and monitors to run under "
        "'corral run' "
        "with no network, the plugin directory and the workspace read-only.",
    )
    parser.add_argument("plugin_dir", metavar="DIR", help="the plugin's directory")
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; list hooks, servers and monitors, exit 1 if any is not wrapped",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="let the plugin reach HOST (repeatable; needs the egress proxy)",
    )
    parser.add_argument(
        "--allow-workspace-write",
        action="store_true",
        help="let the plugin write the workspace (protected paths stay protected)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="show what would be wrapped; write nothing"
    )
    try:
        opts = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    from ...integrations.claude_code_hook import corral_command
    from ...integrations.plugin_wrap import (
        WrapOptions,
        check_plugin,
        trusted_launchers,
        wrap_plugin,
    )

    corral = corral_command(sys.argv[0], sys.executable)
    try:
        if opts.check:
            findings = check_plugin(opts.plugin_dir, launchers=trusted_launchers(corral))
            for finding in findings:
                sys.stdout.write(finding.describe() + "\n")
            unwrapped = [f for f in findings if f.wrapped is False]
            if not findings:
                sys.stdout.write("corral: the plugin has no hooks, servers or monitors\n")
            elif unwrapped:
                sys.stdout.write(
                    f"corral: {len(unwrapped)} of {len(findings)} run without corral; "
                    f"run 'corral wrap-plugin {opts.plugin_dir}'\n"
                )
            return 1 if unwrapped else 0
        options = WrapOptions(
            corral=corral,
            allow_hosts=opts.allow_host,
            workspace_writable=opts.allow_workspace_write,
        )
        changed = wrap_plugin(opts.plugin_dir, options, dry_run=opts.dry_run)
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    verb = "would wrap" if opts.dry_run else "wrapped"
    for finding in changed:
        sys.stdout.write(f"{verb} {finding.kind} {finding.location}\n")
    if not changed:
        sys.stdout.write("corral: nothing to wrap (everything already runs under corral)\n")
    return 0
