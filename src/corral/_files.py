"""The SDK's file operations, done *inside* the sandbox's view.

Each operation is a tiny program (``sh``, ``cat``, ``dd``, ``find``, ``rm``,
``mkdir``, ``tar``) run in the session's sandbox like any command, so every
rule the sandbox enforces (read-only areas, protected persistence points,
hidden secrets, the private ``/tmp``, a preview's copy-on-write view) applies
to it exactly; there is no host-side second implementation of the policy.
This module builds those requests and judges their outcomes; the twins in
:mod:`corral._sandbox` run them.

What comes *out* of a sandbox is untrusted: :func:`extract_download` unpacks a
downloaded directory after checking every member itself (no absolute paths, no
``..``, nothing below a link, no links leaving the destination, no devices;
tarfile's ``data`` filter too where the interpreter has it), into a
destination that must not exist yet or be empty.
"""

from __future__ import annotations

import os

from ._exceptions import CommandFailed, InvalidRequest, PolicyDenied
from ._frozen import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import tarfile
    from collections.abc import Mapping, Sequence

    from .pipeline._outcome import Outcome
    from .pipeline._request import ExecRequest

__all__ = [
    "FileInfo",
    "FileRequests",
    "check_download_target",
    "extract_download",
    "pack_upload",
]

#: ``find -printf`` type letters -> FileInfo.kind
_KINDS = {"f": "file", "d": "dir", "l": "symlink"}


class FileInfo(Record):
    """One entry of :meth:`AsyncSandbox.list_files`.

    Attributes:
        name: the entry's name.
        path: its path as the sandbox sees it.
        kind: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"``.
        size: size in bytes (of the link itself for symlinks).
    """

    name: str
    path: str
    kind: str
    size: int


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


class FileRequests:
    """Requests for the file operations, and the judging of their outcomes (a mixin)."""

    def _request(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        cwd: str | None = None,
    ) -> ExecRequest:
        raise NotImplementedError  # BaseSandbox's

    def _write_request(self, path: str, data: bytes | str, *, parents: bool) -> ExecRequest:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"' if parents else 'cat > "$1"'
        return self._request(
            ["/bin/sh", "-c", script, "corral-write", path], stdin=data, env={"LC_ALL": "C"}
        )

    def _read_request(self, path: str, offset: int, limit: int | None) -> ExecRequest:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidRequest(
                f"Failed to read {path}: offset must be a byte count >= 0, not {offset!r}"
            )
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise InvalidRequest(
                f"Failed to read {path}: limit must be a byte count >= 0 or None, not {limit!r}"
            )
        # Only regular files: a device (/dev/zero) or a FIFO never ends or never answers.
        # nonblock: a FIFO swapped in after the test makes dd fail instead of waiting.
        count = "" if limit is None else f" count={limit}"
        script = (
            'if [ ! -f "$1" ]; then '
            'if [ -e "$1" ]; then echo "$1: not a regular file" >&2; '
            'else echo "$1: No such file or directory" >&2; fi; exit 1; fi; '
            f'exec dd if="$1" iflag=skip_bytes,count_bytes,nonblock bs=65536 skip={offset}'
            f"{count} status=none"
        )
        return self._request(["/bin/sh", "-c", script, "corral-read", path], env={"LC_ALL": "C"})

    def _list_request(self, path: str) -> ExecRequest:
        # find reads a word starting with -, ! or ( as its expression (-delete, -exec):
        # such a name is given as ./NAME, which find can only take for a path
        start = f"./{path}" if path[:1] in ("-", "!", "(") else path
        return self._request(
            ["find", "-H", start, "-mindepth", "1", "-maxdepth", "1", "-printf", "%y\\t%s\\t%p\\0"],
            env={"LC_ALL": "C"},
        )

    @staticmethod
    def _check_file(action: str, outcome: Outcome) -> Outcome:
        """Raise when a file operation was blocked or failed (see AsyncSandbox.write_file)."""
        if outcome.violations:
            raise PolicyDenied(
                f"Failed to {action}: the policy {outcome.violations[0].describe()}",
                outcome=outcome,
            )
        if not outcome.ok:
            why = _last_line(outcome.stderr) or f"exit status {outcome.returncode}"
            raise CommandFailed(f"Failed to {action}: {why}", outcome=outcome)
        if outcome.truncated:
            raise InvalidRequest(
                f"Failed to {action}: the output went over the sandbox's output "
                "limit (resources.output)",
                hint="raise it with max_output=..., or read in parts (offset=, limit=)",
            )
        return outcome

    @staticmethod
    def _parse_listing(outcome: Outcome) -> list[FileInfo]:
        entries = []
        for record in outcome.stdout.split(b"\0"):
            if not record:
                continue
            kind, size, path = record.decode("utf-8", "surrogateescape").split("\t", 2)
            entries.append(
                FileInfo(
                    name=os.path.basename(path),
                    path=path,
                    kind=_KINDS.get(kind, "other"),
                    size=int(size),
                )
            )
        return sorted(entries, key=lambda e: e.name)

    def _remove_request(self, path: str, *, recursive: bool) -> ExecRequest:
        if recursive:
            return self._request(["rm", "-r", "--", path], env={"LC_ALL": "C"})
        # a file or link, or an empty directory
        script = 'if [ -d "$1" ] && [ ! -L "$1" ]; then exec rmdir -- "$1"; fi; exec rm -- "$1"'
        return self._request(["/bin/sh", "-c", script, "corral-remove", path], env={"LC_ALL": "C"})

    def _mkdir_request(self, path: str, *, parents: bool) -> ExecRequest:
        return self._request(
            ["mkdir", *(["-p"] if parents else []), "--", path], env={"LC_ALL": "C"}
        )

    def _upload_request(self, local_dir: str, path: str) -> ExecRequest:
        script = 'mkdir -p -- "$1" && exec tar -x --no-same-owner --no-same-permissions -C "$1"'
        return self._request(
            ["/bin/sh", "-c", script, "corral-upload", path],
            stdin=pack_upload(local_dir),
            env={"LC_ALL": "C"},
        )

    def _download_request(self, path: str) -> ExecRequest:
        return self._request(["tar", "-c", "-C", path, "--", "."], env={"LC_ALL": "C"})


def pack_upload(local_dir: str) -> bytes:
    """A tar of the host directory *local_dir* (the caller's own files) to unpack in the sandbox.

    Raises:
        InvalidRequest: *local_dir* is not a directory.
    """
    import io
    import tarfile

    if not os.path.isdir(local_dir):
        raise InvalidRequest(f"Failed to upload {local_dir}: it is not a directory")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in sorted(os.listdir(local_dir)):
            archive.add(os.path.join(local_dir, name), arcname=name)
    return buffer.getvalue()


def check_download_target(local_dir: str, source: str) -> None:
    """Refuse a *local_dir* that exists and is not an empty directory (before anything runs).

    Raises:
        InvalidRequest: it is.
    """
    if os.path.lexists(local_dir) and (not os.path.isdir(local_dir) or os.listdir(local_dir)):
        raise InvalidRequest(
            f"Failed to download {source}: {local_dir} exists and is not an empty directory",
            hint="give a new directory (nothing of yours is overwritten)",
        )


def extract_download(outcome: Outcome, local_dir: str, source: str) -> None:
    """Unpack the tar a download made in the sandbox (untrusted) into the new or empty *local_dir*.

    :func:`_checked_members` refuses absolute names, ``..``, members below a
    link, links that leave *local_dir*, device nodes and FIFOs, and drops
    set-id bits (tarfile's ``data`` filter is applied too where it exists).

    Raises:
        InvalidRequest: *local_dir* exists and is not an empty directory.
        CommandFailed: the archive is unsafe or damaged (what was unpacked
            before the bad member stays).
    """
    import io
    import tarfile

    check_download_target(local_dir, source)
    os.makedirs(local_dir, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(outcome.stdout), mode="r:") as archive:
            members = _checked_members(archive.getmembers())
            if hasattr(tarfile, "data_filter"):
                archive.extractall(local_dir, members=members, filter="data")
            else:  # Python 3.11 before 3.11.4 (Debian 12's 3.11.2): our checks alone
                archive.extractall(local_dir, members=members)  # noqa: S202 (checked above)
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise CommandFailed(f"Failed to download {source}: {exc}", outcome=outcome) from None


def _checked_members(members: list[tarfile.TarInfo]) -> list[tarfile.TarInfo]:
    """The archive's members if none can reach outside the target, with owner and set-id bits dropped.

    Independent of tarfile's ``data`` filter (absent before Python 3.11.4, and
    bypassed through ``realpath`` in releases before 3.11.13): only
    directories, regular files, and links; relative names without ``..``,
    each at most once; no member below a link; a symbolic link's target,
    walked from its directory, stays inside and passes no link; a hard link
    names a regular file of the archive by a relative name without ``..``
    (tarfile links ``os.path.join(DIR, linkname)``: an absolute name would be
    the host's file, then chmodded and chowned).

    Raises:
        ValueError: a member breaks one of these rules.
    """
    names: dict[str, tarfile.TarInfo] = {}
    for member in members:
        parts = member.name.split("/")
        name = "/".join(p for p in parts if p not in ("", "."))
        kind_ok = member.isfile() or member.isdir() or member.issym() or member.islnk()
        if member.name.startswith("/") or ".." in parts or not kind_ok:
            raise ValueError(f"unsafe member {member.name!r}")
        if name in names:
            raise ValueError(f"member {member.name!r} appears twice")
        names[name] = member
    links = {name for name, member in names.items() if member.issym() or member.islnk()}

    def below_link(path: str) -> bool:
        parts = path.split("/")
        return any("/".join(parts[:i]) in links for i in range(1, len(parts)))

    for name, member in names.items():
        if below_link(name):
            raise ValueError(f"member {member.name!r} lies below a link")
        if member.issym():
            walked = name.split("/")[:-1]
            steps = [p for p in member.linkname.split("/") if p not in ("", ".")]
            if member.linkname.startswith("/"):
                raise ValueError(f"link {member.name!r} leads outside")
            for index, part in enumerate(steps):
                if part == "..":
                    if not walked:
                        raise ValueError(f"link {member.name!r} leads outside")
                    walked.pop()
                    continue
                walked.append(part)
                if index < len(steps) - 1 and "/".join(walked) in links:
                    raise ValueError(f"link {member.name!r} leads through a link")
        elif member.islnk():
            # tarfile links os.path.join(DIR, linkname): an absolute name is the host's file
            steps = member.linkname.split("/")
            target = names.get("/".join(p for p in steps if p not in ("", ".")))
            if member.linkname.startswith("/") or ".." in steps:
                raise ValueError(f"hard link {member.name!r} leads outside")
            if target is None or not target.isfile():
                raise ValueError(f"hard link {member.name!r} names no file of the archive")
        member.mode &= 0o755  # no set-id, sticky or group/other write bits
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
    return members
