"""``corral image build NAME``: a reproducible Debian image from apt, without a registry.

Also ``corral image list`` (the builds in the cache), ``corral image rm NAME``
(a name's builds and engine images) and ``corral image prune`` (builds no name
points to any more). See :mod:`corral.images`.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..._exceptions import CorralError
from .. import EXIT_USAGE, print_error

__all__ = ["main"]


def _engines(environ: dict[str, str]) -> list[tuple[str, list[str], dict[str, str]]]:
    """Container engines that work here, to import the image into."""
    from ...backends._container import find_program
    from ...backends.docker import DockerBackend
    from ...backends.podman import podman_config

    engines: list[tuple[str, list[str], dict[str, str]]] = []
    base = {
        k: v for k, v in environ.items() if k in ("PATH", "HOME", "XDG_RUNTIME_DIR", "DOCKER_HOST")
    }
    podman = find_program("podman", environ)
    if podman:
        engines.append(("podman", [podman], {**base, "CONTAINERS_CONF": podman_config(environ)}))
    docker = find_program("docker", environ)
    if docker and DockerBackend().engine_problem(environ) is None:
        engines.append(("docker", [docker], base))
    return engines


def main(args: list[str]) -> int:
    """Entry point."""
    from ...images import PRESETS

    parser = argparse.ArgumentParser(prog="corral image", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    build = sub.add_parser("build", help="build (or reuse) an image")
    build.add_argument("name", help=f"a preset ({', '.join(PRESETS)}) or a name of your own")
    build.add_argument(
        "-p", "--package", action="append", default=[], help="extra apt package (repeatable)"
    )
    build.add_argument("--suite", help="Debian suite (default: the host's)")
    build.add_argument("--mirror", help="Debian mirror (default: the host's apt source)")
    build.add_argument("--no-import", action="store_true", help="do not import into podman/docker")
    build.add_argument(
        "--vm",
        action="store_true",
        help="also build what the microvm backend boots: a Debian kernel from apt "
        "(unpacked, not installed), an initramfs with corral's guest agent, a read-only root disk",
    )
    build.add_argument(
        "--rebuild", action="store_true", help="ignore a cached build with the same inputs"
    )
    build.add_argument(
        "--settings",
        action="append",
        default=[],
        metavar="FILE",
        help="an extra settings file (e.g. with integrations.image.packages)",
    )
    sub.add_parser("list", help="list the builds in the cache")
    rm = sub.add_parser("rm", help="remove images: every build and the podman/docker images")
    rm.add_argument("names", nargs="+", metavar="NAME", help="an image name ('corral image list')")
    sub.add_parser("prune", help="remove builds that no image name points to any more")
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    environ = dict(os.environ)
    if ns.action in ("rm", "prune"):
        return _remove(ns, environ)
    if ns.action == "list":
        from ...images import cache_root, find_built

        root = cache_root(environ)
        names = (
            sorted(n[:-5] for n in os.listdir(root) if n.endswith(".json"))
            if os.path.isdir(root)
            else []
        )
        for name in names:
            image = find_built(name, environ)
            if image is not None:
                engines = ", ".join(ref for _e, ref in image.engines) or "not imported"
                sys.stdout.write(f"{name}\t{image.key}\t{image.directory}\t{engines}\n")
        return 0
    from ...images import build_image
    from ...policy import load_settings

    try:
        settings = load_settings(environ=environ, settings_files=ns.settings)
        extra = [*settings.integrations.get("image.packages", ()), *ns.package]
        tty = sys.stderr.isatty()

        def progress(line: str) -> None:
            sys.stderr.write(
                ("\r\x1b[K" if tty else "")
                + f"corral: image {ns.name}: {line}"
                + ("" if tty else "\n")
            )
            sys.stderr.flush()

        image = build_image(
            ns.name,
            packages=extra,
            suite=ns.suite,
            mirror=ns.mirror,
            engines=[] if ns.no_import else _engines(environ),
            progress=progress,
            environ=environ,
            rebuild=ns.rebuild,
        )
        vm = None
        if ns.vm:
            from ...images._vm import build_vm_image

            vm = build_vm_image(image, progress=progress, rebuild=ns.rebuild)
        if tty:
            sys.stderr.write("\n")
    except CorralError as exc:
        print_error(exc.message, exc.hint)
        return EXIT_USAGE
    sys.stdout.write(
        f"image:   corral:{image.name}\nrootfs:  {image.rootfs}\noci:     {image.oci_layout}\n"
    )
    if vm is not None:
        sys.stdout.write(f"vm:      {vm.directory} (kernel {vm.release})\n")
    for engine, ref in image.engines:
        sys.stdout.write(f"{engine}:  {ref}\n")
    return 0


def _remove(ns: argparse.Namespace, environ: dict[str, str]) -> int:
    """``rm`` / ``prune``: one line per removed item on stdout; 125 if anything could not go."""
    from ...images import prune_images, remove_image

    engines = _engines(environ)
    status = 0
    targets = ns.names if ns.action == "rm" else [None]
    for name in targets:
        try:
            removed = (
                prune_images(engines, environ)
                if name is None
                else remove_image(name, engines, environ)
            )
        except CorralError as exc:
            print_error(exc.message, exc.hint)
            status = EXIT_USAGE
            continue
        for item in removed:
            sys.stdout.write(f"removed {item}\n")
    return status
