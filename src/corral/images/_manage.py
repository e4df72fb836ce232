"""``corral image rm`` and ``corral image prune``: remove builds from the cache and the engines.

The cache (:func:`~corral.images.cache_root`) holds one directory per build,
``NAME-KEY/`` (its ``image.json`` records the engine images it was imported
as), and one pointer per name, ``NAME.json``, naming the build that
``corral:NAME`` means. :func:`remove_image` removes a name entirely: the
pointer, every build of that name and their engine images
(``localhost/corral-NAME:KEY`` and ``:latest``). :func:`prune_images` removes
what no pointer names any more: builds superseded by a later build of the
same name (other inputs), and scratch directories a killed build left.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from .._exceptions import UsageError
from ._build import cache_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["prune_images", "remove_image"]

#: ``(engine name, argv prefix, environment)``, as for ``build_image``.
Engine = tuple[str, "Sequence[str]", dict[str, str]]


def remove_image(
    name: str, engines: Sequence[Engine], environ: dict[str, str] | None = None
) -> list[str]:
    """Remove every build of *name* and its engine images; return what was removed.

    Raises:
        UsageError: nothing named *name* is in the cache; an engine refused to
            remove an image (e.g. a container still uses it) - what could be
            removed was.
    """
    root = cache_root(environ)
    pointer = os.path.join(root, f"{name}.json")
    builds = [d for d in _builds(root) if _name_of(d) == name]
    if not os.path.exists(pointer) and not builds:
        raise UsageError(
            f"Failed to remove image {name!r}: it is not in the cache {root}",
            hint="'corral image list' shows the images",
        )
    removed: list[str] = []
    problems: list[str] = []
    refs = {f"localhost/corral-{name}:latest"}
    for directory in builds:
        refs |= {ref for _engine, ref in _recorded_engines(directory)}
    removed += _remove_refs(sorted(refs), engines, problems)
    for directory in builds:
        shutil.rmtree(directory)
        removed.append(directory)
    if os.path.exists(pointer):
        os.unlink(pointer)
        removed.append(pointer)
    if problems:
        raise UsageError(
            f"Failed to remove all of image {name!r}: " + "; ".join(problems),
            hint="stop the containers or sessions that use it, then run this again",
        )
    return removed


def prune_images(engines: Sequence[Engine], environ: dict[str, str] | None = None) -> list[str]:
    """Remove builds no ``NAME.json`` points to (and their engine images); return what was removed.

    Raises:
        UsageError: an engine refused to remove an image (what could be removed was).
    """
    root = cache_root(environ)
    current = set()
    for entry in _listdir(root):
        if entry.endswith(".json"):
            try:
                with open(os.path.join(root, entry), encoding="utf-8") as f:
                    current.add(os.path.realpath(str(json.load(f)["dir"])))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a broken pointer protects nothing
    removed: list[str] = []
    problems: list[str] = []
    for directory in _builds(root):
        if os.path.realpath(directory) in current:
            continue
        refs = sorted(ref for _engine, ref in _recorded_engines(directory))
        removed += _remove_refs(refs, engines, problems)
        shutil.rmtree(directory)
        removed.append(directory)
    for entry in _listdir(root):
        if ".tmp-" in entry:  # a build's scratch directory: its builder is gone or failed
            pid = entry.rpartition(".tmp-")[2]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
                removed.append(os.path.join(root, entry))
    if problems:
        raise UsageError(
            "Failed to prune every image: " + "; ".join(problems),
            hint="stop the containers or sessions that use them, then run this again",
        )
    return removed


def _listdir(root: str) -> list[str]:
    try:
        return sorted(os.listdir(root))
    except FileNotFoundError:
        return []


def _builds(root: str) -> list[str]:
    """Build directories (``NAME-KEY`` holding an ``image.json``, or a half-written one)."""
    found = []
    for entry in _listdir(root):
        path = os.path.join(root, entry)
        if ".tmp-" in entry or not os.path.isdir(path) or os.path.islink(path):
            continue
        if "-" in entry and len(entry.rpartition("-")[2]) == 16:
            found.append(path)
    return found


def _name_of(directory: str) -> str:
    return os.path.basename(directory).rpartition("-")[0]


def _recorded_engines(directory: str) -> list[tuple[str, str]]:
    try:
        with open(os.path.join(directory, "image.json"), encoding="utf-8") as f:
            record = json.load(f)
        return [(str(engine), str(ref)) for engine, ref in record.get("engines", ())]
    except (OSError, ValueError, TypeError):
        return []


def _remove_refs(refs: Sequence[str], engines: Sequence[Engine], problems: list[str]) -> list[str]:
    """``rmi`` each reference from each engine that has it; refusals go to *problems*."""
    removed = []
    for engine, prefix, env in engines:
        for ref in refs:
            known = subprocess.run(
                [*prefix, "image", "inspect", ref], capture_output=True, env=env, check=False
            )
            if known.returncode != 0:
                continue  # this engine never had it
            result = subprocess.run(
                [*prefix, "rmi", ref], capture_output=True, text=True, env=env, check=False
            )
            if result.returncode == 0:
                removed.append(f"{engine}: {ref}")
            else:
                problems.append(f"{engine} could not remove {ref}: {result.stderr.strip()[-300:]}")
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
