"""``corral k8s render``: Kubernetes manifests that carry a corral policy (docs/kubernetes.md).

The run options of ``corral run`` (and the settings files, profiles and
layers) give the policy; the output is a JSON ``List`` of a gVisor
RuntimeClass, the settings ConfigMap, a NetworkPolicy and the sandbox Pod
(or, with ``--warm N``, a Deployment of N idle sandbox Pods), ready for
``kubectl apply -f``. ``corral run`` in the Pod enforces the rules a
manifest cannot express (or refuses the run with exit 125).
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
    ("--name X", "name of the objects (default corral-sandbox)"),
    ("--image X", "container image with corral and the agent's tools (default corral:base)"),
    ("--claim X", "PersistentVolumeClaim holding the workspace (default NAME-workspace)"),
    ("--warm N", "render a Deployment of N idle sandbox Pods (a warm pool) instead of one Pod"),
    ("--output X", "write the manifests to this file instead of stdout"),
)


def main(args: list[str]) -> int:
    """Entry point: ``corral k8s render [OPTIONS] [-- COMMAND...]``."""
    if args[:1] in (["-h"], ["--help"]) or not args:
        sys.stdout.write(
            run_options_help("k8s render", SUMMARY, EXTRA_HELP).replace(
                "-- COMMAND [ARG...]", "[-- COMMAND...]"
            )
        )
        return 0 if args else EXIT_USAGE
    if args[0] != "render":
        print_error(
            f"unknown k8s action {args[0]!r}", "corral k8s render [OPTIONS] [-- COMMAND...]"
        )
        return EXIT_USAGE
    try:
        opts = parse_run_options(
            args[1:],
            extra={
                "--name": "value",
                "--image": "value",
                "--claim": "value",
                "--warm": "value",
                "--output": "value",
            },
            command_required=False,
        )
        from ...cluster.k8s import render
        from ...policy import effective_settings_json, load_settings

        resolved = load_settings(
            environ=os.environ,
            flags=opts.flags,
            settings_files=tuple(opts.settings_files),
            profile=opts.profile,
        )
        for warning in resolved.warnings:
            print_error(warning)
        warm_text = str(opts.extra.get("--warm", "0"))
        if not warm_text.isdigit():
            print_error(f"--warm: expected a number of Pods, got {warm_text!r}")
            return EXIT_USAGE
        command = (
            ["sh", "-c", opts.shell]
            if opts.shell is not None
            else (opts.argv or ["sleep", "infinity"])
        )
        manifests = render(
            resolved.policy,
            effective_settings_json(resolved),
            name=str(opts.extra.get("--name", "corral-sandbox")),
            image=str(opts.extra.get("--image", "corral:base")),
            claim=opts.extra.get("--claim"),
            command=command,
            warm=int(warm_text),
        )
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    import json

    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}, indent=2) + "\n"
    output = opts.extra.get("--output")
    if output:
        with open(str(output), "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0
