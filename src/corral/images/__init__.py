"""Images without a registry: small, reproducible Debian root filesystems.

``corral image build NAME`` (:func:`build_image`) builds a Debian rootfs with
``mmdebstrap`` from apt alone (no image registry is needed), for a preset
(``base``, ``python``, ``node``, ``go``: :data:`PRESETS`) plus extra apt
packages, and exposes it three ways:

* a **rootfs directory** (``rootfs/``), which the ``gvisor`` backend uses as
  its read-only root;
* an **OCI image layout** (``oci/``: one uncompressed layer), for VM
  backends and tools that read OCI layouts;
* a **podman/docker image** ``localhost/corral-NAME:latest`` (imported into
  each engine that works here).

Builds are cached under ``$XDG_CACHE_HOME/corral/images/NAME-KEY/``, keyed by
their inputs (suite, mirror, architecture, packages, builder version); the
same inputs reuse the cached build. Timestamps are clamped to
``SOURCE_DATE_EPOCH`` so the layer is byte-for-byte reproducible for the
same package versions.

``corral image rm NAME`` and ``corral image prune`` (:func:`remove_image`,
:func:`prune_images`) remove builds from the cache and the engines.

Settings refer to a built image as ``"image": "corral:NAME"``
(:func:`resolve_image` turns any ``image`` value into a :class:`ImageRef`).
"""

from __future__ import annotations

from ..backends._image_ref import ImageRef, resolve_image
from ._build import BuiltImage, ImageBuildFailed, build_image, cache_root, find_built
from ._manage import prune_images, remove_image
from ._presets import PRESETS

__all__ = [
    "PRESETS",
    "BuiltImage",
    "ImageBuildFailed",
    "ImageRef",
    "build_image",
    "cache_root",
    "find_built",
    "prune_images",
    "remove_image",
    "resolve_image",
]
