"""``corral policy``: the effective policy, and where each value comes from.

``--explain`` lists every setting with its source layer (defaults, user,
project, local, environment, flags, profile, rule); ``--json`` prints the
effective settings as a settings file; ``--plan`` prints the launch plan the
chosen backend would use for a command (``corral policy --plan -- CMD``).
The run options of ``corral run`` are accepted, so you can see what a given
command line would get.
"""

from __future__ import annotations

import os
import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error
from .._options import parse_run_options, run_options_help

__all__ = ["main"]

SUMMARY = __doc__.split("\n\n")[1].replace("\n", " ")
EXTRA_HELP = (
    ("--explain", "show the layer each value came from (a built-in one with its reason)"),
    ("--json", "print the effective settings as JSON"),
    ("--plan", "print the launch plan for COMMAND"),
)


def main(args: list[str]) -> int:
    """Entry point."""
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(
            run_options_help("policy", SUMMARY, EXTRA_HELP).replace(
                "-- COMMAND [ARG...]", "[--explain|--json|--plan] [-- COMMAND...]"
            )
        )
        return 0
    try:
        opts = parse_run_options(
            args,
            extra={"--explain": "flag", "--json": "flag", "--plan": "flag"},
            command_required=False,
        )
        from ...policy import effective_settings_json, explain, load_settings

        command = opts.shell if opts.shell is not None else (opts.argv or None)
        resolved = load_settings(
            environ=os.environ,
            flags=opts.flags,
            settings_files=tuple(opts.settings_files),
            profile=opts.profile,
            command=command,
        )
        for warning in resolved.warnings:
            print_error(warning)
        if opts.extra.get("--plan"):
            return _print_plan(opts, resolved)
        if opts.extra.get("--json"):
            import json

            sys.stdout.write(
                json.dumps(effective_settings_json(resolved), indent=2, sort_keys=True) + "\n"
            )
            return 0
        if opts.extra.get("--explain"):
            sys.stdout.write(explain(resolved) + "\n")
            return 0
        sys.stdout.write(_summary(resolved) + "\n")
        return 0
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE


def _summary(resolved: object) -> str:
    from ...policy import format_duration, format_size, policy_digest

    policy = resolved.policy  # type: ignore[attr-defined]
    fs, net, res = policy.filesystem, policy.network, policy.resources

    def size(v: int | None) -> str:
        return "none" if v is None else format_size(v)

    def duration(v: float | None) -> str:
        return "none" if v is None else format_duration(v)

    writable = [fs.workspace] * (not fs.read_only) + list(fs.allow_write)
    lines = [
        f"workspace   {fs.workspace} ({'read-only' if fs.read_only else 'writable'})",
        f"backend     {policy.backend} (minimum isolation: {policy.isolation})",
        f"network     {net.mode}"
        + (f" allow={list(net.allow)}" if net.allow else "")
        + (f" deny={list(net.deny)}" if net.deny else ""),
        f"limits      memory={size(res.memory)} pids={res.pids if res.pids is not None else 'none'} "
        f"cpus={res.cpus if res.cpus is not None else 'none'} timeout={duration(res.timeout)} "
        f"output={size(res.output)}",
        f"writable    {', '.join(writable) or '(nothing)'} + private /tmp",
        f"protected   {len(fs.protect)} patterns at any depth (corral policy --explain lists them)",
        f"hidden      {len(fs.deny_read)} secret paths",
        f"env         passes {', '.join(policy.env.pass_through)}",
        f"digest      {policy_digest(policy)}",
    ]
    return "\n".join(lines)


def _print_plan(opts: object, resolved: object) -> int:
    from ...pipeline._runner import prepare
    from .run import build_request

    if not opts.argv and opts.shell is None:  # type: ignore[attr-defined]
        print_error("--plan needs a command", "corral policy --plan -- COMMAND [ARG...]")
        return EXIT_USAGE
    request = build_request(opts, resolved.workspace, stdin_inherit=False)  # type: ignore[arg-type, attr-defined]
    prepared = prepare(request, resolved.policy, environ=os.environ)  # type: ignore[attr-defined]
    plan = prepared.plan
    out = [f"backend: {plan.backend}", "argv:"]
    out += [f"  {word}" for word in plan.argv]
    out.append("env:")
    out += [
        f"  {name}={'***' if name.upper().endswith(('TOKEN', 'KEY', 'SECRET', 'PASSWORD')) else value}"
        for name, value in plan.env
    ]
    out.append("fds:")
    out += [
        f"  {fd.number}: {fd.kind}" + (f" ({len(fd.data)} bytes)" if fd.data else "")
        for fd in plan.fds
    ]
    if plan.broker:
        out.append("write broker roots: " + ", ".join(sandbox for sandbox, _ in plan.broker.roots))
        out.append(f"write broker patterns: {len(plan.broker.patterns)}")
    if plan.cgroup:
        out.append(f"cgroup: {plan.cgroup!r}")
    out.append(
        f"timeout: {plan.timeout}  output limit: {plan.output_limit}  degraded: {list(plan.degraded)}"
    )
    sys.stdout.write("\n".join(out) + "\n")
    return 0
