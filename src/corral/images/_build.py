"""Build a Debian rootfs with mmdebstrap and expose it as rootfs, OCI layout and engine image."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time

from .._exceptions import CorralError, UsageError
from .._frozen import Record
from ..backends._image_ref import image_cache_dir
from ._presets import BASE_PACKAGES, PRESETS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = [
    "BuiltImage",
    "ImageBuildFailed",
    "build_image",
    "cache_root",
    "find_built",
    "host_apt_source",
]

#: Bumped when the build procedure changes what it produces (part of the cache key).
BUILDER_VERSION = 1
#: Timestamps in the image are clamped to this (reproducible layers).
SOURCE_DATE_EPOCH = 1_700_000_000
_LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar"
_CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
_MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageBuildFailed(CorralError):
    """mmdebstrap, tar or an engine import failed."""

    reference = "image-build-failed"


class BuiltImage(Record):
    """A finished build.

    Attributes:
        name: the image name (``python``).
        key: 16 hex digits of the inputs' digest.
        directory: ``<cache>/NAME-KEY``.
        rootfs: the root filesystem directory.
        oci_layout: the OCI image layout directory.
        layer: the layer tarball (inside the layout's blobs).
        packages: the apt packages installed on top of minbase.
        engines: engine images: ``(engine, reference)``.
        reused: the build came from the cache.
    """

    name: str
    key: str
    directory: str
    rootfs: str
    oci_layout: str
    layer: str
    packages: tuple[str, ...]
    engines: tuple[tuple[str, str], ...] = ()
    reused: bool = False


def cache_root(environ: dict[str, str] | None = None) -> str:
    """The directory that holds every build."""
    return image_cache_dir(environ)


def host_apt_source() -> tuple[str, str]:
    """``(mirror URI, suite)`` of the host's first Debian ``main`` source (apt's own config)."""
    suite = ""
    try:
        with open("/etc/os-release", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VERSION_CODENAME="):
                    suite = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    candidates: list[str] = []
    directory = "/etc/apt/sources.list.d"
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        names = []
    for name in names:
        if name.endswith(".sources"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                for line in f:
                    if line.startswith("URIs:"):
                        candidates += line.split()[1:]
    try:
        with open("/etc/apt/sources.list", encoding="utf-8") as f:
            for line in f:
                words = line.split()
                if len(words) >= 3 and words[0] == "deb":
                    candidates.append(next(w for w in words[1:] if "://" in w))
    except (OSError, StopIteration):
        pass
    mirror = next(
        (c for c in candidates if c.rstrip("/").endswith("/debian")), "http://deb.debian.org/debian"
    )
    return mirror, suite or "bookworm"


def _key(inputs: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def find_built(name: str, environ: dict[str, str] | None = None) -> BuiltImage | None:
    """The latest build of *name*, or ``None``."""
    try:
        with open(os.path.join(cache_root(environ), f"{name}.json"), encoding="utf-8") as f:
            pointer = json.load(f)
        with open(os.path.join(pointer["dir"], "image.json"), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError, KeyError):
        return None
    return _record_to_image(record)


def _record_to_image(record: dict[str, object], *, reused: bool = False) -> BuiltImage:
    directory = str(record["dir"])
    return BuiltImage(
        name=str(record["name"]),
        key=str(record["key"]),
        directory=directory,
        rootfs=os.path.join(directory, "rootfs"),
        oci_layout=os.path.join(directory, "oci"),
        layer=str(record["layer"]),
        packages=tuple(record["packages"]),  # type: ignore[arg-type]
        engines=tuple(tuple(e) for e in record.get("engines", ())),  # type: ignore[attr-defined]
        reused=reused,
    )


def build_image(
    name: str,
    *,
    packages: Sequence[str] = (),
    suite: str | None = None,
    mirror: str | None = None,
    engines: Sequence[tuple[str, Sequence[str], dict[str, str]]] = (),
    progress: Callable[[str], None] | None = None,
    environ: dict[str, str] | None = None,
    rebuild: bool = False,
) -> BuiltImage:
    """Build (or reuse) the image *name*: a preset name, or any name with *packages*.

    Args:
        name: ``base``, ``python``, ``node``, ``go`` or a name of your own.
        packages: extra apt packages.
        suite, mirror: Debian suite and mirror (default: the host's apt source).
        engines: ``(engine name, argv prefix, environment)`` of each container
            engine to import the image into (e.g. podman with its config).
        progress: called with one line per build stage.
        rebuild: ignore a cached build with the same inputs.

    Raises:
        UsageError: bad name or package, or mmdebstrap is missing.
        ImageBuildFailed: mmdebstrap, tar or an import failed.
    """
    say = progress or (lambda _line: None)
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name[0] in "-.":
        raise UsageError(
            f"Failed to build image {name!r}: names are letters, digits, '-', '_' and '.'"
        )
    for package in packages:
        if not package or not all(c.isalnum() or c in "+-.:" for c in package) or package[0] == "-":
            raise UsageError(
                f"Failed to build image {name!r}: {package!r} is not an apt package name"
            )
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise UsageError(
            "Failed to build an image: mmdebstrap is not installed",
            hint="apt-get install mmdebstrap",
        )
    host_mirror, host_suite = host_apt_source()
    suite = suite or host_suite
    mirror = mirror or host_mirror
    wanted = sorted(
        {*(p for p, _ in BASE_PACKAGES), *(p for p, _ in PRESETS.get(name, ())), *packages}
    )
    arch = (
        subprocess.run(
            ["dpkg", "--print-architecture"], capture_output=True, text=True, check=False
        ).stdout.strip()
        or "amd64"
    )
    inputs: dict[str, object] = {
        "suite": suite,
        "mirror": mirror,
        "arch": arch,
        "packages": wanted,
        "variant": "minbase",
        "epoch": SOURCE_DATE_EPOCH,
        "builder": BUILDER_VERSION,
    }
    key = _key(inputs)
    root = cache_root(environ)
    os.makedirs(root, exist_ok=True)
    directory = os.path.join(root, f"{name}-{key}")
    record_path = os.path.join(directory, "image.json")
    started = time.monotonic()

    def stage(text: str) -> None:
        say(f"[{time.monotonic() - started:6.1f}s] {text}")

    if os.path.isfile(record_path) and not rebuild:
        with open(record_path, encoding="utf-8") as f:
            record = json.load(f)
        stage(f"reusing the cached build {directory}")
        reused = True
    else:
        record = _build(name, key, inputs, directory, mmdebstrap, stage)
        reused = False
    record["engines"] = [list(e) for e in _import(record, engines, stage)]
    _write_json(record_path, record)
    _write_json(os.path.join(root, f"{name}.json"), {"dir": directory, "key": key})
    stage("done")
    return _record_to_image(record, reused=reused)


def _build(
    name: str,
    key: str,
    inputs: dict[str, object],
    directory: str,
    mmdebstrap: str,
    stage: Callable[[str], None],
) -> dict[str, object]:
    scratch = f"{directory}.tmp-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    rootfs = os.path.join(scratch, "rootfs")
    packages = list(inputs["packages"])  # type: ignore[call-overload]
    argv = [
        mmdebstrap,
        "--variant=minbase",
        f"--include={','.join(packages)}",
        "--format=directory",
        f"--architectures={inputs['arch']}",
        str(inputs["suite"]),
        rootfs,
        str(inputs["mirror"]),
    ]
    stage(f"mmdebstrap {inputs['suite']} ({', '.join(packages)}) from {inputs['mirror']}")
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(SOURCE_DATE_EPOCH), LC_ALL="C.UTF-8")
    try:
        with subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        ) as proc:
            assert proc.stderr is not None
            tail: list[str] = []
            for line in proc.stderr:
                line = line.rstrip()
                tail = [*tail[-20:], line]
                if line.startswith("I: "):
                    stage(line[3:])
            status = proc.wait()
        if status != 0:
            raise ImageBuildFailed(
                f"Failed to build image {name!r}: mmdebstrap exited {status}:\n"
                + "\n".join(tail[-10:]),
                hint="check that apt can reach the Debian mirror and the package names exist",
            )
        stage("writing the OCI layout")
        layer_digest, layer_size = _write_layout(scratch, rootfs)
        record: dict[str, object] = {
            "name": name,
            "key": key,
            "dir": directory,
            "inputs": inputs,
            "packages": packages,
            "layer": os.path.join(directory, "oci", "blobs", "sha256", layer_digest),
            "layer_digest": f"sha256:{layer_digest}",
            "layer_size": layer_size,
        }
        _write_json(os.path.join(scratch, "image.json"), record)
        shutil.rmtree(directory, ignore_errors=True)
        os.rename(scratch, directory)
        return record
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _write_layout(scratch: str, rootfs: str) -> tuple[str, int]:
    """Write ``scratch/oci`` (one uncompressed, reproducible layer); return the layer digest and size."""
    layout = os.path.join(scratch, "oci")
    blobs = os.path.join(layout, "blobs", "sha256")
    os.makedirs(blobs)
    tmp_layer = os.path.join(blobs, "layer.tmp")
    tar = [
        shutil.which("tar") or "/bin/tar",
        "--sort=name",
        f"--mtime=@{SOURCE_DATE_EPOCH}",
        "--clamp-mtime",
        "--numeric-owner",
        "--xattrs",
        "--format=pax",
        "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
        "-C",
        rootfs,
        "-cf",
        tmp_layer,
        ".",
    ]
    result = subprocess.run(tar, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageBuildFailed(f"Failed to write the image layer: {result.stderr.strip()[-500:]}")
    digest = _sha256_file(tmp_layer)
    size = os.path.getsize(tmp_layer)
    os.rename(tmp_layer, os.path.join(blobs, digest))
    config = {
        "architecture": _oci_arch(),
        "os": "linux",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(SOURCE_DATE_EPOCH)),
        "config": {"Env": [f"PATH={_PATH}"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
    }
    config_digest, config_size = _blob(blobs, config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": _MANIFEST_MEDIA,
        "config": {
            "mediaType": _CONFIG_MEDIA,
            "digest": f"sha256:{config_digest}",
            "size": config_size,
        },
        "layers": [{"mediaType": _LAYER_MEDIA, "digest": f"sha256:{digest}", "size": size}],
    }
    manifest_digest, manifest_size = _blob(blobs, manifest)
    _write_json(
        os.path.join(layout, "index.json"),
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": _MANIFEST_MEDIA,
                    "digest": f"sha256:{manifest_digest}",
                    "size": manifest_size,
                    "annotations": {"org.opencontainers.image.ref.name": "latest"},
                }
            ],
        },
    )
    _write_json(os.path.join(layout, "oci-layout"), {"imageLayoutVersion": "1.0.0"})
    return digest, size


def _oci_arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def _blob(blobs: str, document: Mapping[str, object]) -> tuple[str, int]:
    data = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return digest, len(data)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: str, document: object) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _import(
    record: dict[str, object],
    engines: Sequence[tuple[str, Sequence[str], dict[str, str]]],
    stage: Callable[[str], None],
) -> list[tuple[str, str]]:
    """Import the layer into each engine as ``localhost/corral-NAME:KEY`` and ``:latest``."""
    name, key = record["name"], record["key"]
    done: list[tuple[str, str]] = []
    for engine, prefix, env in engines:
        repo = f"localhost/corral-{name}"
        ref = f"{repo}:{key}"
        exists = subprocess.run(
            [*prefix, "image", "inspect", ref], capture_output=True, env=env, check=False
        )
        if exists.returncode != 0:
            stage(f"importing into {engine} as {ref}")
            result = subprocess.run(
                [
                    *prefix,
                    "import",
                    "--change",
                    'CMD ["/bin/sh"]',
                    "--change",
                    f"ENV PATH={_PATH}",
                    str(record["layer"]),
                    ref,
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
            )
            if result.returncode != 0:
                raise ImageBuildFailed(
                    f"Failed to import image {name!r} into {engine}: {result.stderr.strip()[-500:]}"
                )
        subprocess.run(
            [*prefix, "tag", ref, f"{repo}:latest"], capture_output=True, env=env, check=False
        )
        done.append((engine, ref))
    return done
