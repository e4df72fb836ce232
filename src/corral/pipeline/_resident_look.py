"""The host a resident sandbox's mounts were decided from: the look before each command.

A kept sandbox's masks and binds were planned from the host paths its policy names
and what the ``denyRead`` globs matched when it started; the host changes under it.
Before each command those paths are looked at again (:func:`_looked_at`), and any
difference retires the sandbox (docs/threat-model.md, "Resident sessions", point 5).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy import Policy
    from ._request import ExecRequest

__all__: list[str] = []

_Looked = tuple[tuple[str, int, int, int, int], ...]


def _looked_at(request: ExecRequest, policy: Policy) -> _Looked | None:
    """``(path, file type, device, inode, change or birth time)`` of every host path a plan of
    *request* under *policy* looks at (also the ``network.allowUnixSockets`` sockets, and
    where their links lead), the ``denyRead`` globs expanded now (a missing path:
    zeros); ``None`` when a glob cannot be expanded (a fresh run then refuses, with the reason).

    The change time (ns) of a non-directory is there because device and inode name a file,
    not the name's link to it: a mount in another namespace hangs on the *name* (the
    dentry), and the kernel detaches it when that name is unlinked or renamed over. A host
    that unlinks a hidden file and links the same inode back (``ln f f.bak; rm f; ln f.bak
    f``), or removes it and writes a new one that gets the freed inode number (ext4 hands
    it out again at once), leaves device and inode as they were - but every link, unlink
    and new inode sets the change time. A directory's change time moves with every entry
    made in it (corral's own hidden state directory gets one per run: it would retire
    every kept sandbox), and a directory has no other links: its birth time is taken
    instead, which a directory removed and made anew under the freed inode number does
    not share (0 where the filesystem keeps none: there that case is not seen).
    """
    from .._exceptions import CorralError
    from ..backends.base import paths_of_policy
    from ..policy._expand import expand_deny_read
    from ..policy._hostview import HostView

    view = HostView()  # this look's own: each path asked of the kernel once, now
    try:
        expanded = expand_deny_read(policy, view)
    except CorralError:
        return None
    paths = paths_of_policy(request, expanded)
    named = policy.network.allow_unix_sockets
    if isinstance(named, tuple):  # bound in by their real paths; the broker allows those
        paths.update(named)
        paths.update(view.realpath(p) for p in named)
    found = []
    for path in sorted(paths):
        st = view.lstat(path)
        if st is None:
            found.append((path, 0, 0, 0, 0))
            continue
        kind = st.st_mode & 0o170000
        changed = _birth(path) if kind == 0o040000 else st.st_ctime_ns
        found.append((path, kind, st.st_dev, st.st_ino, changed))
    return tuple(found)


_STATX_BTIME = 0x800
_AT_FDCWD, _AT_SYMLINK_NOFOLLOW = -100, 0x100


def _birth(path: str) -> int:
    """The birth time (ns) of *path*, not following a symlink (``statx``); 0 where the
    filesystem or libc has none. A directory made anew has a new one, even with the
    inode number of the one removed."""
    import ctypes

    libc = getattr(_birth, "libc", None)
    if libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        _birth.libc = libc  # type: ignore[attr-defined]
    statx = getattr(libc, "statx", None)
    if statx is None:
        return 0
    buffer = ctypes.create_string_buffer(256)  # struct statx
    if statx(_AT_FDCWD, os.fsencode(path), _AT_SYMLINK_NOFOLLOW, _STATX_BTIME, buffer) != 0:
        return 0
    if not ctypes.c_uint32.from_buffer(buffer, 0).value & _STATX_BTIME:  # stx_mask
        return 0
    seconds = ctypes.c_int64.from_buffer(buffer, 80).value  # stx_btime.tv_sec
    return seconds * 1_000_000_000 + ctypes.c_uint32.from_buffer(buffer, 88).value
