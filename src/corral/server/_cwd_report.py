"""``corral run --report-fd FD``: the command's final directory, checked, on a descriptor.

The Claude Code hook's rewritten command carries a sandboxed ``cd`` to the
next call (corral.integrations.claude_code_hook, :func:`_cwd_carrying`). The
sandboxed script writes ``pwd -P`` to ``cwd`` in a report directory when the
command exits 0; that claim is untrusted (any process of the sandbox could
have written it). corral itself - not the host shell - makes the directory
(a fresh sandbox), takes the report back, removes the directory, checks the
claim and writes the checked directory as one line to the caller's
descriptor *FD*, which the host shell reads with builtins only
(``$(...)``): the host half of the carry runs no program.

The check (:func:`checked_directory`): at most :data:`MAX_REPORT` bytes of a
regular file reached without following a link, one line, an absolute path
that, with every link resolved on the host, is a directory at or under the
workspace. Anything else reports nothing: the caller's directory stays.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "MAX_REPORT",
    "REPORT_FILE",
    "REPORT_VARIABLE",
    "checked_directory",
    "make_report_dir",
    "read_report",
    "tagged_report",
    "take_report",
]

#: the largest report read back (a path, one line)
MAX_REPORT = 4096
#: the file a report directory's report is in
REPORT_FILE = "cwd"
#: the variable that names a fresh sandbox's report directory to its command
REPORT_VARIABLE = "CORRAL_REPORT_DIR"


def make_report_dir(environ: Mapping[str, str]) -> str:
    """A new private (0700) directory under the caller's ``$TMPDIR`` (else ``/tmp``).

    Raises:
        OSError: it cannot be made.
    """
    base = environ.get("TMPDIR") or "/tmp"
    if not base.startswith("/"):
        base = "/tmp"
    for _ in range(16):
        path = os.path.join(base, f"corral-report-{os.urandom(8).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free name for a report directory in {base}")


def read_report(dir_fd: int) -> bytes | None:
    """The bytes of ``cwd`` in the directory *dir_fd*: a regular file, no link followed.

    At most :data:`MAX_REPORT` + 1 bytes (more is refused by :func:`checked_directory`).
    """
    return _read_regular(dir_fd, REPORT_FILE, MAX_REPORT + 1)


def tagged_report(state: bytes, tag: str) -> bytes | None:
    """The report at the end of a kept call's shell *state*, if it carries *tag*.

    A kept sandbox's shell state (what its call wrote to the state channel,
    corral.server._kept) is the ``export -p`` its command left, then - only when
    the command exited 0, in the same write - the line ``return``, the line *tag*
    (that run's sandbox id) and the report. Sourced by the next command, it stops
    at ``return``, so the report is never run. Here the report is what follows the
    last ``\nreturn\nTAG\n`` of the state's tail (at most :data:`MAX_REPORT` + 1
    bytes after it, as :func:`read_report`). A state without this run's tag (the
    command exited 0 without the script's end, by ``exec``) reports nothing.
    """
    marker = b"\nreturn\n" + os.fsencode(tag) + b"\n"
    size = MAX_REPORT + 1 + len(marker)
    tail = b"\n" + state if len(state) <= size else state[-size:]
    found = tail.rfind(marker)
    return None if found < 0 else tail[found + len(marker) :]


def _read_regular(dir_fd: int, name: str, size: int) -> bytes | None:
    """At most *size* first bytes of the regular file *name* in *dir_fd* (no link
    followed); ``None`` for anything else."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_mode & 0o170000) != 0o100000:
            return None
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def take_report(directory: str) -> bytes | None:
    """The report in *directory* (made by :func:`make_report_dir`), then the directory removed.

    Whatever the sandbox left there (links, directories, many files) is
    removed without following a link.
    """
    from ..preview._mechanism import remove_tree

    data = None
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECTORY)
    except OSError:
        pass
    else:
        try:
            data = read_report(dir_fd)
        finally:
            os.close(dir_fd)
    try:
        remove_tree(directory)
    except OSError:
        pass
    return data


def checked_directory(report: bytes | None, workspace: str) -> str | None:
    """The directory *report* names, if it is the workspace or a directory under it.

    *report* is untrusted: one line (a final newline allowed), at most
    :data:`MAX_REPORT` bytes, no NUL, absolute. The answer is its real path
    (every link resolved on the host, no ``.``/``..``), and only when that is
    a directory at or under the real path of *workspace*; else ``None``.
    """
    if report is None or len(report) > MAX_REPORT:
        return None
    if report.endswith(b"\n"):
        report = report[:-1]
    if not report.startswith(b"/") or b"\n" in report or b"\0" in report:
        return None
    try:
        claim = os.fsdecode(report)
        real = os.path.realpath(claim, strict=True)
        root = os.path.realpath(workspace, strict=True)
    except (OSError, ValueError):
        return None
    if real != root and not real.startswith(root.rstrip("/") + "/"):
        return None
    if not os.path.isdir(real) or "\n" in real:
        return None
    return real
