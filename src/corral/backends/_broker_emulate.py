"""The write broker's emulation of each supervised syscall family (see :mod:`._broker`).

Each operation is checked (:class:`~._broker_policy._Policy`), then performed
on the host's writable view of the same directory, with the target's umask
and the broker thread's dropped capabilities, and journaled.
"""

from __future__ import annotations

import errno
import os
import stat
import struct

from ._broker_abi import (
    _AT_EMPTY_PATH,
    _AT_FDCWD,
    _AT_REMOVEDIR,
    _AT_SYMLINK_FOLLOW,
    _AT_SYMLINK_NOFOLLOW,
    _MAX_XATTR,
    _O_TMPFILE,
    _RENAME_EXCHANGE,
    _RENAME_NOREPLACE,
    _RENAME_WHITEOUT,
    _RESOLVE_BENEATH,
    _RESOLVE_NO_MAGICLINKS,
    _RESOLVE_NO_SYMLINKS,
    _Continue,
    _Denied,
    _FdResult,
    _own_fd_number,
    _refuse_existing,
    _Resolved,
    _signed64,
    _signed_fd,
)
from ._broker_connect import _Connector
from ._broker_policy import _land_copy
from ._broker_pty import _PtyPeer
from ._gitlayout import read_regular_file

__all__: list[str] = []


class _Emulator(_Connector, _PtyPeer):
    """open/creat, mkdir, mknod, symlink, link, rename, unlink, chmod, chown, truncate,
    utimes and xattrs, by path and through file descriptors."""

    # ------------------------------------------------------------ fd-based metadata
    def _on_open_file(self, pid: int, fd_arg: int, act: object) -> int:
        """Run *act(fd)* on the target's open file *fd_arg* if it lies in a supervised root.

        Used for fchmod/fchown/fsetxattr/fremovexattr/futimens and the
        ``AT_EMPTY_PATH`` forms, only with ``confine_metadata`` (otherwise the
        kernel decides: the read-only mount holds).

        SAFETY: the broker takes a duplicate of the target's *open file*
        (``pidfd_getfd``), checks where that file lives (its path, verified by
        device and inode against the supervised root) and acts on the
        duplicate, so the target cannot swap the file between check and use.
        """
        import ctypes

        if not self._spec.confine_metadata and self._spec.idmapped_id is None:
            raise _Continue
        pidfd = os.pidfd_open(pid)
        try:
            ours = self._as_tracer(
                lambda: self._syscall(
                    "pidfd_getfd",
                    ctypes.c_int(pidfd),
                    ctypes.c_int(_signed_fd(fd_arg)),
                    ctypes.c_uint(0),
                )
            )
        finally:
            os.close(pidfd)
        outside = "filesystem: outside the writable areas"
        try:
            path = os.readlink(f"/proc/self/fd/{ours}")
            root = self._root_for(path) if path.startswith("/") else None
            if root is None and not self._spec.confine_metadata:
                raise _Continue  # idmapped sandbox, not a supervised root: the kernel decides
            if root is None:
                raise _Denied(path, outside)
            rel = path[len(root.sandbox_path) :].strip("/")
            try:
                check_fd = self._openat2(
                    root.host_fd,
                    rel or ".",
                    os.O_PATH,
                    _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
                )
            except OSError:
                raise _Denied(path, outside) from None
            try:
                mine, theirs = os.fstat(ours), os.fstat(check_fd)
            finally:
                os.close(check_fd)
            if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
                raise _Denied(path, outside)
            label = (
                None if root.sandbox_path in self._spec.open_roots else self._denied_by(rel, path)
            )
            if label is not None:
                raise _Denied(path, label)
            act(ours)  # type: ignore[operator]
            return 0
        finally:
            os.close(ours)

    # ------------------------------------------------------------ emulation
    def _dispatch(self, name: str, pid: int, nid: int, a: tuple[int, ...]) -> int | _FdResult:
        def s(addr: int) -> str:
            return self._read_string(pid, nid, addr)

        sfd = _signed_fd
        if name == "connect":
            return self._connect(pid, nid, a)
        if name == "ioctl":  # only TIOCGPTPEER is handed over (PTY_PEER_BROKER_RULES)
            return self._pty_peer(pid, a)
        if name == "open":
            return self._open(pid, nid, _AT_FDCWD, s(a[0]), a[1], a[2])
        if name == "openat":
            return self._open(pid, nid, sfd(a[0]), s(a[1]), a[2], a[3])
        if name == "creat":
            return self._open(
                pid, nid, _AT_FDCWD, s(a[0]), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, a[1]
            )
        if name in ("mkdir", "mkdirat"):
            dirfd, path, mode = (
                (_AT_FDCWD, s(a[0]), a[1]) if name == "mkdir" else (sfd(a[0]), s(a[1]), a[2])
            )
            r = self._resolve(pid, nid, dirfd, path, follow=False)
            return self._with(
                r,
                lambda: self._as_target(
                    pid, lambda: os.mkdir(r.name, mode & 0o7777, dir_fd=r.parent_fd)
                ),
                creates=True,
            )
        if name in ("mknod", "mknodat"):
            dirfd, path, mode, dev = (
                (_AT_FDCWD, s(a[0]), a[1], a[2])
                if name == "mknod"
                else (sfd(a[0]), s(a[1]), a[2], a[3])
            )
            kind = stat.S_IFMT(mode) or stat.S_IFREG
            if kind not in (stat.S_IFREG, stat.S_IFIFO, stat.S_IFSOCK):
                raise OSError(errno.EPERM, "device nodes are not allowed")
            r = self._resolve(pid, nid, dirfd, path, follow=False)
            return self._with(
                r,
                lambda: self._as_target(
                    pid, lambda: os.mknod(r.name, kind | (mode & 0o7777), dev, dir_fd=r.parent_fd)
                ),
                creates=True,
            )
        if name in ("symlink", "symlinkat"):
            target = s(a[0])
            dirfd, path = (_AT_FDCWD, s(a[1])) if name == "symlink" else (sfd(a[1]), s(a[2]))
            r = self._resolve(pid, nid, dirfd, path, follow=False)
            return self._with(
                r,
                lambda: os.symlink(target, r.name, dir_fd=r.parent_fd),
                creates=True,
                symlink=True,
            )
        if name in ("link", "linkat"):
            return self._link(pid, nid, name, a)
        if name in ("rename", "renameat", "renameat2"):
            return self._rename(pid, nid, name, a)
        if name in ("unlink", "unlinkat", "rmdir"):
            if name == "unlinkat":
                dirfd, path, flags = sfd(a[0]), s(a[1]), a[2]
            else:
                dirfd, path, flags = _AT_FDCWD, s(a[0]), (_AT_REMOVEDIR if name == "rmdir" else 0)
            r = self._resolve(pid, nid, dirfd, path, follow=False)
            if flags & _AT_REMOVEDIR:
                return self._with(r, lambda: os.rmdir(r.name, dir_fd=r.parent_fd))
            return self._with(r, lambda: os.unlink(r.name, dir_fd=r.parent_fd))
        if name in ("chmod", "fchmodat", "fchmodat2"):
            if name == "chmod":
                dirfd, path, mode, flags = _AT_FDCWD, s(a[0]), a[1], 0
            else:
                dirfd, path, mode = sfd(a[0]), s(a[1]), a[2]
                flags = a[3] if name == "fchmodat2" else 0
            if flags & _AT_EMPTY_PATH:
                return self._on_open_file(pid, a[0], lambda fd: os.chmod(fd, mode & 0o7777))
            r = self._resolve(pid, nid, dirfd, path, follow=not flags & _AT_SYMLINK_NOFOLLOW)
            return self._with(
                r,
                lambda: os.chmod(r.name, mode & 0o7777, dir_fd=r.parent_fd, follow_symlinks=False),
                changes_inode=True,
            )
        if name in ("chown", "lchown", "fchownat"):
            if name == "fchownat":
                dirfd, path, uid, gid, flags = sfd(a[0]), s(a[1]), a[2], a[3], a[4]
            else:
                dirfd, path, uid, gid = _AT_FDCWD, s(a[0]), a[1], a[2]
                flags = _AT_SYMLINK_NOFOLLOW if name == "lchown" else 0
            host_uid = self._map_id(pid, "uid_map", uid)
            host_gid = self._map_id(pid, "gid_map", gid)
            if flags & _AT_EMPTY_PATH:
                return self._on_open_file(pid, a[0], lambda fd: os.chown(fd, host_uid, host_gid))
            r = self._resolve(pid, nid, dirfd, path, follow=not flags & _AT_SYMLINK_NOFOLLOW)
            return self._with(
                r,
                lambda: os.chown(
                    r.name, host_uid, host_gid, dir_fd=r.parent_fd, follow_symlinks=False
                ),
                changes_inode=True,
            )
        if name == "truncate":
            path, length = s(a[0]), _signed64(a[1])
            r = self._resolve(pid, nid, _AT_FDCWD, path, follow=True)

            def truncate() -> None:
                fd = os.open(
                    r.name,
                    os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    dir_fd=r.parent_fd,
                )
                try:
                    os.ftruncate(fd, length)
                finally:
                    os.close(fd)

            return self._with(r, truncate, changes_inode=True, content=True)
        if name in ("utime", "utimes", "futimesat", "utimensat"):
            return self._utimes(pid, nid, name, a)
        if name in ("fchmod", "fchown", "fsetxattr", "fremovexattr"):
            return self._fd_call(pid, nid, name, a)
        if name in ("setxattr", "lsetxattr", "removexattr", "lremovexattr"):
            path, attr = s(a[0]), s(a[1])
            if attr.startswith(("security.", "trusted.")):
                raise OSError(errno.EPERM, "privileged extended attribute")
            follow = not name.startswith("l")
            r = self._resolve(pid, nid, _AT_FDCWD, path, follow=follow)
            target = f"/proc/self/fd/{r.parent_fd}/{r.name}"
            if name.endswith("setxattr"):
                size = a[3]
                if size > _MAX_XATTR:
                    raise OSError(errno.E2BIG, "attribute value too large")
                value = self._read_bytes(pid, nid, a[2], size)
                flags = a[4]
                return self._with(
                    r,
                    lambda: os.setxattr(target, attr, value, flags, follow_symlinks=False),
                    changes_inode=True,
                )
            return self._with(
                r, lambda: os.removexattr(target, attr, follow_symlinks=False), changes_inode=True
            )
        raise _Continue

    def _fd_call(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> int:
        """The plain fd-based metadata calls (trapped only with ``confine_metadata``)."""
        if name == "fchmod":
            return self._on_open_file(pid, a[0], lambda fd: os.chmod(fd, a[1] & 0o7777))
        if name == "fchown":
            uid, gid = self._map_id(pid, "uid_map", a[1]), self._map_id(pid, "gid_map", a[2])
            return self._on_open_file(pid, a[0], lambda fd: os.chown(fd, uid, gid))
        attr = self._read_string(pid, nid, a[1])
        if attr.startswith(("security.", "trusted.")):
            raise OSError(errno.EPERM, "privileged extended attribute")
        if name == "fsetxattr":
            if a[3] > _MAX_XATTR:
                raise OSError(errno.E2BIG, "attribute value too large")
            value, flags = self._read_bytes(pid, nid, a[2], a[3]), a[4]
            return self._on_open_file(pid, a[0], lambda fd: os.setxattr(fd, attr, value, flags))
        return self._on_open_file(pid, a[0], lambda fd: os.removexattr(fd, attr))

    def _with(
        self,
        r: _Resolved,
        action: object,
        *,
        changes_inode: bool = False,
        creates: bool = False,
        content: bool = False,
        symlink: bool = False,
    ) -> int:
        """Check *r* against the policy, then run *action* (a callable); return 0.

        ``changes_inode``: the operation changes the file itself (mode, owner,
        times, size, attributes), not just a name - refused for hard-linked files.
        ``creates``: the operation makes the name (journaled as created).
        ``content``/``symlink``: see :meth:`~._broker_policy._Policy._check`.
        """
        try:
            if creates:
                _refuse_existing(r)
            self._check(r, content=content, symlink=symlink)
            self._check_git_shape(r, creates=creates, content=content, symlink=symlink)
            if changes_inode:
                self._check_single_link(r)
            action()  # type: ignore[operator]
        finally:
            os.close(r.parent_fd)
        if creates:
            self.journal.create(r.root.sandbox_path, r.rel)
        elif changes_inode:
            self.journal.change(r.root.sandbox_path, r.rel)
        return 0

    def _as_target(self, pid: int, action: object) -> None:
        """Run *action* with the target's umask (this thread has its own fs_struct)."""
        mask = self._umask_of(pid)
        previous = os.umask(mask)
        try:
            action()  # type: ignore[operator]
        finally:
            os.umask(previous)

    @staticmethod
    def _umask_of(pid: int) -> int:
        """The ``Umask:`` of ``/proc/PID/status``, else 022."""
        from .._procfs import read_text, status_fields

        try:
            return int(status_fields(read_text(f"/proc/{pid}/status"), ("Umask",))["Umask"], 8)
        except (OSError, ValueError):
            return 0o022

    def _map_id(self, pid: int, map_name: str, value: int) -> int:
        """Map a uid/gid from the target's user namespace to the owner stored on disk
        (-1 stays -1): through the namespace's map, then back through the idmapped
        mounts of a root caller's sandbox (``BrokerSpec.idmapped_id`` is root's there)."""
        value &= 0xFFFFFFFF
        if value == 0xFFFFFFFF:
            return -1
        with open(f"/proc/{pid}/{map_name}", "rb") as f:
            for line in f:
                inside, outside, count = (int(x) for x in line.split())
                if inside <= value < inside + count:
                    host = outside + (value - inside)
                    if self._spec.through_idmap:
                        return host  # the idmapped layers store it as root's
                    return 0 if host == self._spec.idmapped_id else host
        raise OSError(errno.EINVAL, "id not mapped in the sandbox")

    def _open(
        self, pid: int, nid: int, dirfd: int, path: str, flags: int, mode: int
    ) -> int | _FdResult:
        flags &= 0xFFFFFFFF
        if flags & _O_TMPFILE == _O_TMPFILE:
            r = self._resolve_dir(pid, nid, dirfd, path)
            fd = self._open_checked(pid, r, ".", flags, mode, check=False)
            return _FdResult(fd, bool(flags & os.O_CLOEXEC))
        follow = not flags & os.O_NOFOLLOW
        r = self._resolve(pid, nid, dirfd, path, follow=follow)
        fd = self._open_checked(pid, r, r.name, flags, mode, check=True)
        return _FdResult(fd, bool(flags & os.O_CLOEXEC))

    def _resolve_dir(self, pid: int, nid: int, dirfd: int, path: str) -> _Resolved:
        """Resolve a directory itself (for O_TMPFILE): returns its fd with name '.'."""
        r = self._resolve(pid, nid, dirfd, path, follow=True)
        try:
            fd = self._openat2(
                r.parent_fd,
                r.name,
                os.O_PATH | os.O_DIRECTORY,
                _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
            )
        except OSError as exc:
            raise _Continue from exc
        finally:
            os.close(r.parent_fd)
        return _Resolved(r.root, fd, ".", r.rel)

    def _open_checked(
        self, pid: int, r: _Resolved, name: str, flags: int, mode: int, *, check: bool
    ) -> int:
        try:
            if check:
                self._check(
                    r, content=bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
                )
            try:
                existing = os.stat(name, dir_fd=r.parent_fd, follow_symlinks=False)
            except FileNotFoundError:
                existing = None
            if existing is not None and not (
                stat.S_ISREG(existing.st_mode) or stat.S_ISDIR(existing.st_mode)
            ):
                if stat.S_ISLNK(existing.st_mode) and flags & os.O_NOFOLLOW:
                    raise OSError(errno.ELOOP, "symbolic link with O_NOFOLLOW")
                raise _Continue  # FIFOs, devices, sockets: the kernel decides on the sandbox's mount
            if existing is not None:
                self._check_single_link(r, existing)
            if check and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
                self._check_git_shape(
                    r, creates=existing is None and bool(flags & os.O_CREAT), content=True
                )
            open_flags = (flags | os.O_NOFOLLOW | os.O_CLOEXEC) & ~os.O_NOCTTY
            holder: list[int] = []
            self._as_target(
                pid,
                lambda: holder.append(os.open(name, open_flags, mode & 0o7777, dir_fd=r.parent_fd)),
            )
            if existing is None and flags & os.O_CREAT:
                self.journal.create(r.root.sandbox_path, r.rel)
            elif flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC) and name != ".":
                self.journal.change(r.root.sandbox_path, r.rel)
            return holder[0]
        finally:
            os.close(r.parent_fd)

    def _link(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> int:
        def s(addr: int) -> str:
            return self._read_string(pid, nid, addr)

        if name == "link":
            olddir, old, newdir, new, flags = _AT_FDCWD, s(a[0]), _AT_FDCWD, s(a[1]), 0
        else:
            olddir, newdir, flags = _signed_fd(a[0]), _signed_fd(a[2]), a[4]
            old = s(a[1]) if a[1] else ""
            new = s(a[3])
        fd_path = _own_fd_number(old) if flags & _AT_SYMLINK_FOLLOW else None
        if fd_path is not None:
            # linkat("/proc/self/fd/N", ..., AT_SYMLINK_FOLLOW): the documented way to
            # give an O_TMPFILE file a name; "self" is the target, so this is its fd N.
            olddir, old, flags = fd_path, "", flags | _AT_EMPTY_PATH
        dst = self._resolve(pid, nid, newdir, new, follow=False)
        try:
            _refuse_existing(dst)
            self._check(dst, content=True)
            self._check_git_shape(dst, creates=True, content=True)
            if flags & _AT_EMPTY_PATH and not old:
                # Linking an open file (O_TMPFILE): the classic /proc/self/fd route.
                src_fd = self._as_tracer(
                    lambda: os.open(f"/proc/{pid}/fd/{olddir}", os.O_PATH | os.O_CLOEXEC)
                )
                try:
                    os.link(
                        f"/proc/self/fd/{src_fd}",
                        dst.name,
                        dst_dir_fd=dst.parent_fd,
                        follow_symlinks=True,
                    )
                finally:
                    os.close(src_fd)
                self.journal.create(dst.root.sandbox_path, dst.rel)
                return 0
            src = self._resolve(pid, nid, olddir, old, follow=bool(flags & _AT_SYMLINK_FOLLOW))
            try:
                self._check(src)
                if src.root is not dst.root:
                    raise OSError(errno.EXDEV, "cross-device link")
                os.link(
                    src.name,
                    dst.name,
                    src_dir_fd=src.parent_fd,
                    dst_dir_fd=dst.parent_fd,
                    follow_symlinks=False,
                )
                self.journal.create(dst.root.sandbox_path, dst.rel)
            finally:
                os.close(src.parent_fd)
        finally:
            os.close(dst.parent_fd)
        return 0

    def _rename(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> int:
        import ctypes

        def s(addr: int) -> str:
            return self._read_string(pid, nid, addr)

        if name == "rename":
            olddir, old, newdir, new, flags = _AT_FDCWD, s(a[0]), _AT_FDCWD, s(a[1]), 0
        else:
            olddir, old, newdir, new = _signed_fd(a[0]), s(a[1]), _signed_fd(a[2]), s(a[3])
            flags = a[4] if name == "renameat2" else 0
        if flags & _RENAME_WHITEOUT:
            raise OSError(errno.EPERM, "RENAME_WHITEOUT needs privileges")
        src = self._resolve(pid, nid, olddir, old, follow=False)
        try:
            try:
                dst = self._resolve(pid, nid, newdir, new, follow=False)
            except _Continue:
                raise OSError(errno.EXDEV, "rename across mounts") from None
            try:
                if src.root is not dst.root:
                    raise OSError(errno.EXDEV, "rename across mounts")
                self._check(src)
                config_row = self._git_config_row(dst) or (
                    self._git_config_row(src) if flags & _RENAME_EXCHANGE else None
                )
                if config_row is not None:
                    if flags & _RENAME_EXCHANGE:
                        raise _Denied(dst.sandbox_path, config_row)
                    if flags & _RENAME_NOREPLACE and _exists(dst.parent_fd, dst.name):
                        raise OSError(errno.EEXIST, "file exists")
                    self._land_git_config(src, dst, config_row)
                    return 0
                self._check(dst)
                self._check_git_shape(dst, creates=not _exists(dst.parent_fd, dst.name), moved=True)
                if flags & _RENAME_EXCHANGE:
                    self._check_git_shape(src, moved=True)
                self._check_subtree_move(src, dst)
                if flags & _RENAME_EXCHANGE:
                    self._check_subtree_move(dst, src)
                self._syscall(
                    "renameat2",
                    ctypes.c_int(src.parent_fd),
                    os.fsencode(src.name),
                    ctypes.c_int(dst.parent_fd),
                    os.fsencode(dst.name),
                    ctypes.c_uint(flags),
                )
                self.journal.move(dst.root.sandbox_path, dst.rel)
                if flags & _RENAME_EXCHANGE:
                    self.journal.move(src.root.sandbox_path, src.rel)
            finally:
                os.close(dst.parent_fd)
        finally:
            os.close(src.parent_fd)
        return 0

    def _land_git_config(self, src: _Resolved, dst: _Resolved, row: str) -> None:
        """``rename(config.lock, config)``: how git writes a repository's config.

        The new content is validated first - every entry in a repository the
        run created, the entries it adds to one that existed before - against
        the keys git writes itself (:func:`~._gitcheck.config_problem`); then
        the broker lands *its own copy* (a file the sandbox holds no
        descriptor to, so the content cannot change after the check) and
        removes the lock file. Anything else is refused with *row*.
        """
        from ._gitcheck import config_problem

        data = read_regular_file(src.parent_fd, src.name)
        if data is None:
            raise _Denied(dst.sandbox_path, f"{row} (the new config is no regular file)")
        parts = dst.rel.split("/")
        if ".git" in parts[:-1]:
            own = self._own_repository(dst)
        else:  # a directory shaped like a gitdir: the run's own if it made it
            own = self.journal.is_new(dst.root.sandbox_path, "/".join(parts[:-1]))
        before: bytes | None = None
        if not own and _exists(dst.parent_fd, dst.name):
            before = read_regular_file(dst.parent_fd, dst.name)
            if before is None:  # a symlink or special file stands there: not git's
                raise _Denied(dst.sandbox_path, row)
        problem = config_problem(data, before=before)
        if problem is not None:
            raise _Denied(dst.sandbox_path, f"{row} ({problem})")
        mode = os.stat(src.name, dir_fd=src.parent_fd, follow_symlinks=False).st_mode & 0o777
        _land_copy(dst.parent_fd, dst.name, data, mode)
        os.unlink(src.name, dir_fd=src.parent_fd)
        if own:  # checked whole again after the run, with the rest of the repository
            self.journal.change(dst.root.sandbox_path, dst.rel)
        # a repository that existed before: what was added is checked; the entries the
        # user had (a core.hooksPath of their own) are theirs, so it is not journaled

    def _utimes(self, pid: int, nid: int, name: str, a: tuple[int, ...]) -> int:
        import ctypes

        def s(addr: int) -> str:
            return self._read_string(pid, nid, addr)

        flags = 0
        path: str | None
        if name == "utimensat":
            dirfd, path, times_addr, flags = (
                _signed_fd(a[0]),
                (s(a[1]) if a[1] else None),
                a[2],
                a[3],
            )
            times = self._read_bytes(pid, nid, times_addr, 32) if times_addr else None
        else:
            if name == "futimesat":
                dirfd, path, times_addr = _signed_fd(a[0]), s(a[1]), a[2]
            else:
                dirfd, path, times_addr = _AT_FDCWD, s(a[0]), a[1]
            times = None
            if times_addr:
                if name == "utime":  # struct utimbuf: two time_t seconds
                    at, mt = struct.unpack("<qq", self._read_bytes(pid, nid, times_addr, 16))
                    times = struct.pack("<qqqq", at, 0, mt, 0)
                else:  # two struct timeval
                    a_s, a_us, m_s, m_us = struct.unpack(
                        "<qqqq", self._read_bytes(pid, nid, times_addr, 32)
                    )
                    times = struct.pack("<qqqq", a_s, a_us * 1000, m_s, m_us * 1000)
        buf = ctypes.create_string_buffer(times, 32) if times is not None else None
        if flags & _AT_EMPTY_PATH or path is None:

            def touch_fd(fd: int) -> None:
                self._syscall("utimensat", ctypes.c_int(fd), None, buf, ctypes.c_int(0))

            return self._on_open_file(pid, dirfd, touch_fd)
        r = self._resolve(pid, nid, dirfd, path, follow=not flags & _AT_SYMLINK_NOFOLLOW)

        def touch() -> None:
            self._syscall(
                "utimensat",
                ctypes.c_int(r.parent_fd),
                os.fsencode(r.name),
                buf,
                ctypes.c_int(_AT_SYMLINK_NOFOLLOW),
            )

        return self._with(r, touch, changes_inode=True)


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
