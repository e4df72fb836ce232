"""Read back what a preview's command changed, as it is stored by each mechanism.

A preview keeps the command's writes apart from the real workspace. How they
are stored depends on the mechanism (see :mod:`corral.preview._mechanism`):

``overlay`` (kernel overlayfs)
    The upper directory holds every file, directory and symlink the command
    created or changed, whole (``metacopy`` is off). A deleted name is a
    *whiteout*: a character device 0/0. A directory whose lower contents
    are hidden (``rm -rf d; mkdir d``) is *opaque*: the extended attribute
    ``trusted.overlay.opaque`` (mounted as root) or ``user.overlay.opaque``
    (mounted in a user namespace, ``userxattr``) is ``y``. The value ``x``
    means "contains xattr whiteouts": zero-size files marked
    ``*.overlay.whiteout``. A redirect (``*.overlay.redirect``) or a
    metacopy (``*.overlay.metacopy``) would mean data lives elsewhere; corral
    mounts with both off, so meeting one is an error, never a guess.

``fuse-overlayfs``
    The same, plus its own spellings when it cannot create device nodes:
    a file ``.wh.NAME`` is a whiteout of ``NAME``, ``.wh..wh..opq`` marks its
    directory opaque and ``.wh..opq`` is internal. These names are read as
    markers only for this mechanism: under kernel overlayfs a file called
    ``.wh.x`` is just a file the command created.

``copy``
    A full copy of the workspace (the *tree*) plus a *manifest* recording
    ``(kind, inode, ctime)`` of every copied entry. An entry whose inode and
    ctime still match was not touched by the command; a manifest entry
    missing from the tree was deleted; an entry not in the manifest is new.

:class:`Layer` presents all three the same way: the children of a directory
as :class:`Node` values, whether the directory hides the real workspace's
other entries (``opaque``), and what the manifest knows.

SAFETY: the layer was written by the sandboxed command and is untrusted
input. Nothing here follows a symlink (``lstat``, ``O_NOFOLLOW``); names are
taken from directory listings, never from file contents. Extended attributes
count as overlay metadata only in the one namespace the mount owns, which the
command cannot write through the mount: ``trusted.overlay.*`` when kernel
overlayfs was mounted by root (the upper directory is root's), else
``user.overlay.*`` (``userxattr``: overlayfs refuses them to the command). A
command's ``user.overlay.opaque`` under a root mount is just its data.
"""

from __future__ import annotations

import os
import stat

from .._exceptions import PreviewError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Layer", "Node", "kind_of"]

_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque", "user.fuseoverlayfs.opaque")
_WHITEOUT_XATTRS = ("trusted.overlay.whiteout", "user.overlay.whiteout")
_REFUSED_XATTRS = (
    "trusted.overlay.redirect",
    "user.overlay.redirect",
    "trusted.overlay.metacopy",
    "user.overlay.metacopy",
)
_FUSE_WHITEOUT_PREFIX = ".wh."
_FUSE_OPAQUE_MARKER = ".wh..wh..opq"
_FUSE_INTERNAL = ".wh..opq"


def kind_of(mode: int) -> str:
    """``"file"``, ``"dir"``, ``"symlink"`` or ``"other"`` for an ``st_mode``."""
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


class Node:
    """One entry of the layer.

    Attributes:
        name: the entry's name in its directory.
        kind: ``"file"``, ``"dir"``, ``"symlink"``, ``"whiteout"`` (deleted)
            or ``"other"`` (a FIFO, socket or device: cannot be applied).
        host: the entry's path in corral's state dir (the new content).
        st: its ``lstat`` result (``None`` for fuse-overlayfs ``.wh.`` whiteouts).
    """

    __slots__ = ("host", "kind", "name", "st")

    def __init__(self, name: str, kind: str, host: str, st: os.stat_result | None) -> None:
        self.name = name
        self.kind = kind
        self.host = host
        self.st = st

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.kind!r})"


class Layer:
    """A preview's stored changes, read directory by directory.

    Example::

        layer = Layer("/state/previews/pv-1/upper", "overlay")
        nodes, opaque = layer.children("src", "/state/previews/pv-1/upper/src")
    """

    def __init__(
        self, root: str, mechanism: str, manifest: Mapping[str, tuple[str, int, int]] | None = None
    ) -> None:
        self.root = root
        self.mechanism = mechanism
        self._manifest = manifest
        self._own = _metadata_prefixes(root, mechanism)

    def children(self, rel: str, host_dir: str) -> tuple[dict[str, Node], bool]:
        """The entries of the layer directory *host_dir* (workspace path *rel*).

        Returns ``(nodes by name, opaque)``; ``opaque`` means the real
        workspace's other entries of this directory are hidden (deleted).

        Raises:
            PreviewError: the layer uses an overlay feature corral does not
                read (redirect, metacopy).
        """
        if self.mechanism == "copy":
            return self._scan(host_dir, fuse=False), True
        opaque_value = self._dir_xattrs(rel, host_dir)
        fuse = self.mechanism == "fuse-overlayfs"
        nodes = self._scan(host_dir, fuse=fuse)
        opaque = opaque_value == b"y"
        if fuse:
            if _FUSE_OPAQUE_MARKER in nodes:
                opaque = True
            for name in [n for n in nodes if n.startswith(_FUSE_WHITEOUT_PREFIX)]:
                node = nodes.pop(name)
                if name in (_FUSE_OPAQUE_MARKER, _FUSE_INTERNAL):
                    continue
                target = name[len(_FUSE_WHITEOUT_PREFIX) :]
                if target and target not in nodes:
                    nodes[target] = Node(target, "whiteout", node.host, None)
        if opaque_value == b"x":
            for node in nodes.values():
                if (
                    node.kind == "file"
                    and node.st is not None
                    and node.st.st_size == 0
                    and _has_any_xattr(node.host, self._ours(_WHITEOUT_XATTRS))
                ):
                    node.kind = "whiteout"
        return nodes, opaque

    def untouched(self, rel: str, node: Node) -> bool:
        """Whether *node* is exactly what the copy started with (copy mechanism only)."""
        if self._manifest is None or node.st is None:
            return False
        known = self._manifest.get(rel)
        return known is not None and known == (node.kind, node.st.st_ino, node.st.st_ctime_ns)

    def existed(self, rel: str) -> bool | None:
        """Whether *rel* existed when the preview began (copy), else ``None``: unknown."""
        if self._manifest is None:
            return None
        return rel in self._manifest

    # ------------------------------------------------------------ internals
    @staticmethod
    def _scan(host_dir: str, *, fuse: bool) -> dict[str, Node]:
        nodes: dict[str, Node] = {}
        try:
            entries = list(os.scandir(host_dir))
        except FileNotFoundError:
            return nodes
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we read (a command still running in the preview)
            kind = kind_of(st.st_mode)
            if kind == "other" and stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                kind = "whiteout"
                if fuse and entry.name == _FUSE_INTERNAL:
                    kind = "other"  # dropped by the caller as a marker
            nodes[entry.name] = Node(entry.name, kind, entry.path, st)
        return nodes

    def _ours(self, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(n for n in names if n.startswith(self._own))

    def _dir_xattrs(self, rel: str, host_dir: str) -> bytes | None:
        """The directory's opaque value (``b"y"``, ``b"x"`` or ``None``); refuse redirects."""
        try:
            names = os.listxattr(host_dir, follow_symlinks=False)
        except OSError:
            return None
        for name in names:
            if name in self._ours(_REFUSED_XATTRS):
                raise PreviewError(
                    f"Failed to read the preview's changes: {rel or '.'} carries the overlay "
                    f"attribute {name}, which corral does not interpret",
                    hint="discard this preview; corral mounts overlays without redirects and "
                    "metacopy",
                )
        for name in self._ours(_OPAQUE_XATTRS):
            if name in names:
                try:
                    return os.getxattr(host_dir, name, follow_symlinks=False)
                except OSError:
                    return None
        return None


def _metadata_prefixes(root: str, mechanism: str) -> tuple[str, ...]:
    """The xattr prefixes the overlay itself writes in this layer (see SAFETY above)."""
    if mechanism != "overlay":
        # fuse-overlayfs keeps its markers in user.fuseoverlayfs.* (or the
        # overlay spellings) and hides them from the command
        return ("trusted.overlay.", "user.overlay.", "user.fuseoverlayfs.")
    try:
        owner = os.stat(root, follow_symlinks=False).st_uid
    except OSError:
        owner = os.geteuid()
    return ("trusted.overlay.",) if owner == 0 else ("user.overlay.",)


def _has_any_xattr(path: str, names: tuple[str, ...]) -> bool:
    try:
        present = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False
    return any(name in present for name in names)
