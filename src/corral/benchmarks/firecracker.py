"""What the Firecracker engine does on the host besides the boot: the workspace image.

Firecracker has no virtiofs, so every run writes the run's view into an ext4
image (``mkfs.ext4 -d`` in a private mount namespace) and every writable
run reads the image back into the preview (``debugfs rdump`` in bubblewrap,
then a sync into the view). These rows time both for two workspaces (100
files of 10 KB, and 1,000 files of 10 KB in 10 directories), each round
running every variant once (interleaved) next to raw bwrap ``true``. They
run wherever root and e2fsprogs are (no VM boots, so also on machines
without KVM); the boot itself is Firecracker's (≤125 ms by its published
figures, not measured here).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time

from . import Context, Row, ratio

__all__ = ["run"]

SIZES = {"100 files": (1, 100), "1,000 files": (10, 100)}  # (directories, files each)


def _workspace(root: str, dirs: int, files: int) -> str:
    ws = os.path.join(root, f"ws-{dirs}x{files}")
    for d in range(dirs):
        os.makedirs(os.path.join(ws, f"d{d}"))
        for f in range(files):
            with open(os.path.join(ws, f"d{d}", f"f{f}"), "wb") as out:
                out.write(os.urandom(10_000))
    return ws


def run(ctx: Context) -> list[Row]:
    """Measure and return the rows."""
    from ..backends import _find_bwrap
    from ..backends._firecracker_disk import build_image, image_size_mb, read_back
    from ..backends.microvm import view_setup
    from ..preview import Preview

    bwrap = _find_bwrap(dict(os.environ))
    if (
        os.geteuid() != 0
        or bwrap is None
        or shutil.which("debugfs", path="/usr/sbin:/sbin") is None
    ):
        return [Row("firecracker rows", float("nan"), note="needs root, bubblewrap and e2fsprogs")]
    times: dict[str, list[float]] = {"raw": []}
    with tempfile.TemporaryDirectory(prefix="corral-bench-fc-") as root:
        spaces = {label: _workspace(root, *shape) for label, shape in SIZES.items()}
        for round_ in range(ctx.runs + 1):  # the first round warms up
            start = time.perf_counter()
            subprocess.run([bwrap, "--ro-bind", "/", "/", "true"], check=True)
            if round_:
                times["raw"].append((time.perf_counter() - start) * 1000)
            for label, ws in spaces.items():
                scratch = tempfile.mkdtemp(dir=root)
                preview = Preview.create(ws, state_dir=os.path.join(scratch, "state"))
                try:
                    setup = view_setup(
                        workspace=ws,
                        preview=preview.spec(),
                        read_only=False,
                        masks=[],
                        read_only_paths=[],
                        chain=True,
                    )
                    image = os.path.join(scratch, "ws.ext4")
                    start = time.perf_counter()
                    used = sum(
                        os.lstat(os.path.join(d, n)).st_size
                        for d, _s, names in os.walk(ws)
                        for n in names
                    )
                    build_image(setup, image, size_mb=image_size_mb(used // 1024), owner=(0, 0))
                    built = time.perf_counter()
                    read_back(image, setup, masks=(), bwrap=bwrap)
                    done = time.perf_counter()
                    if round_:
                        times.setdefault(f"build {label}", []).append((built - start) * 1000)
                        times.setdefault(f"back {label}", []).append((done - built) * 1000)
                finally:
                    preview.discard()
                    shutil.rmtree(scratch, ignore_errors=True)
    raw = statistics.median(times["raw"])
    rows = [Row("raw bwrap true (interleaved)", raw, samples=ctx.runs)]
    for label in SIZES:
        for kind, what in (
            ("build", "workspace image build"),
            ("back", "read-back into a preview"),
        ):
            value = statistics.median(times[f"{kind} {label}"])
            rows.append(
                Row(
                    f"firecracker {what} ({label} x 10 KB)",
                    value,
                    samples=ctx.runs,
                    baseline="raw bwrap true",
                    note=f"{ratio(value, raw)} of raw bwrap",
                )
            )
    return rows
