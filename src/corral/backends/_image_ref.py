"""What the policy's ``image`` value names, for the container and gVisor backends.

=============================  =========  ==============================================
``image``                      kind       used as
=============================  =========  ==============================================
unset                          ``host``   gvisor: the host's ``/``, read-only
``corral:NAME``                ``corral`` built by ``corral image build NAME``: its rootfs
                                          (gvisor), ``localhost/corral-NAME:KEY``
                                          (podman, docker)
``/abs/dir`` with oci-layout   ``oci``    podman ``oci:DIR``
``/abs/dir``                   ``rootfs`` gvisor root, podman ``--rootfs DIR:O``
anything else                  ``ref``    a registry reference for podman/docker
=============================  =========  ==============================================

Resolution reads a few small files (the build record of ``corral:NAME``);
backends call it from ``inspect`` so that ``plan`` stays pure.
"""

from __future__ import annotations

import os

from .._frozen import Record

__all__ = ["DEFAULT_CONTAINER_IMAGE", "ImageRef", "image_cache_dir", "resolve_image"]

#: What podman and docker run when the ``image`` setting is empty: the image
#: ``corral image build python`` makes (docs/design.md, "The container image
#: on first use"). Never built implicitly: a run refuses with that one command.
DEFAULT_CONTAINER_IMAGE = "corral:python"


class ImageRef(Record):
    """A resolved ``image`` value.

    Attributes:
        kind: ``"host"``, ``"corral"``, ``"oci"``, ``"rootfs"`` or ``"ref"``.
        value: the setting as written.
        rootfs: a root filesystem directory, when there is one.
        oci_layout: an OCI image layout directory, when there is one.
        engine_ref: the name podman/docker run it by (``corral`` and ``ref`` kinds).
        problem: why the image cannot be used (e.g. not built yet), or ``None``.
    """

    kind: str
    value: str | None = None
    rootfs: str | None = None
    oci_layout: str | None = None
    engine_ref: str | None = None
    problem: str | None = None


def image_cache_dir(environ: dict[str, str] | None = None) -> str:
    """Where ``corral image build`` keeps its builds (``$XDG_CACHE_HOME/corral/images``)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "corral", "images")


def resolve_image(value: str | None, environ: dict[str, str] | None = None) -> ImageRef:
    """Turn an ``image`` setting into an :class:`ImageRef` (see the module table)."""
    if value is None:
        return ImageRef(kind="host")
    if value.startswith("corral:"):
        name = value.partition(":")[2]
        from .._jsonfast import JSONError, loads

        pointer = os.path.join(image_cache_dir(environ), f"{name}.json")
        try:
            with open(pointer, "rb") as f:
                record = loads(f.read())
        except (OSError, JSONError):
            return ImageRef(
                kind="corral",
                value=value,
                problem=f"the image {name!r} is not built yet: run 'corral image build {name}'",
            )
        directory = str(record.get("dir", ""))
        rootfs = os.path.join(directory, "rootfs")
        if not os.path.isdir(rootfs):
            return ImageRef(
                kind="corral",
                value=value,
                problem=f"the build of {name!r} at {directory} is gone: run 'corral image build {name}'",
            )
        return ImageRef(
            kind="corral",
            value=value,
            rootfs=rootfs,
            oci_layout=os.path.join(directory, "oci"),
            engine_ref=f"localhost/corral-{name}:{record.get('key', 'latest')}",
        )
    if value.startswith("/"):
        if not os.path.isdir(value):
            return ImageRef(kind="rootfs", value=value, problem=f"{value} is not a directory")
        if os.path.isfile(os.path.join(value, "oci-layout")):
            return ImageRef(kind="oci", value=value, oci_layout=value)
        return ImageRef(kind="rootfs", value=value, rootfs=value)
    return ImageRef(kind="ref", value=value, engine_ref=value)
