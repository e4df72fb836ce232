"""The requests a client sends the corral server: ``run`` and ``hook`` frames, validated."""

from __future__ import annotations

import _socket
import os
import sys

from ._wire import FrameReader, WireError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["MAX_HOOK_INPUT", "HookRequest", "RunRequest", "report_member"]

#: the largest hook input a hook request may carry (``corral hook``'s own limit)
MAX_HOOK_INPUT = 16 << 20
_MSG_CMSG_CLOEXEC = 0x40000000


class RunRequest:
    """One ``corral run`` from a client: what the handler needs to run it like the client would.

    Attributes:
        argv: the words after ``corral run``.
        cwd: the client's working directory.
        environ: the client's whole environment.
        stdio: the client's fds 0, 1, 2 as received (close-on-exec, owned by the server).
        pid: the client's pid.
        reports: what the run hands the client's ``--report-fd`` (descriptor, line); the
            server sends it with the exit status (:mod:`corral.server._wire`).
        afterwards: work the run left for after the client has its exit status (the
            next warm sandbox: :mod:`corral.server._warm`); the server does it then.
    """

    __slots__ = ("afterwards", "argv", "cwd", "environ", "pid", "reports", "stdio")

    def __init__(
        self,
        *,
        argv: list[str],
        cwd: str,
        environ: dict[str, str],
        stdio: tuple[int, int, int],
        pid: int,
    ) -> None:
        self.argv = argv
        self.cwd = cwd
        self.environ = environ
        self.stdio = stdio
        self.pid = pid
        self.reports: list[tuple[int, str]] = []
        self.afterwards: list[Callable[[], None]] = []


class HookRequest:
    """One ``corral hook INTEGRATION`` from a client: its input and context.

    Attributes:
        integration: the hook's name (``"claude-code"``).
        stdin: the bytes the hook read on its stdin.
        cwd: the client's working directory.
        environ: the client's whole environment.
        pid: the client's pid.
    """

    __slots__ = ("cwd", "environ", "integration", "pid", "stdin")

    def __init__(
        self, *, integration: str, stdin: bytes, cwd: str, environ: dict[str, str], pid: int
    ) -> None:
        self.integration = integration
        self.stdin = stdin
        self.cwd = cwd
        self.environ = environ
        self.pid = pid


def report_member(request: RunRequest) -> dict[str, Any]:
    """The exit frame's ``"report"`` member: the last line the run handed ``--report-fd``.

    ``{"report": {"fd": FD, "text": LINE}}``, or ``{}`` when it handed none.
    """
    if not request.reports:
        return {}
    fd, line = request.reports[-1]
    return {"report": {"fd": fd, "text": line}}


def _tell(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode("utf-8", "backslashreplace"))
    except OSError:
        pass


def _fds_of(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The file descriptors an ``SCM_RIGHTS`` message brought."""
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += [
                int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True)
                for i in range(0, usable, 4)
            ]
    return fds


def _receive_request(conn: _socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The first frame, with the fds that came with it (close-on-exec)."""
    reader = FrameReader()
    fds: list[int] = []
    try:
        while True:
            data, ancdata, _flags, _addr = conn.recvmsg(
                65536, _socket.CMSG_SPACE(4 * 3), _MSG_CMSG_CLOEXEC
            )
            fds += _fds_of(ancdata)
            if not data:
                raise WireError("the client closed the connection before its request")
            messages = reader.feed(data)
            if messages:
                if len(messages) > 1 or reader.pending:
                    raise WireError("data after the request")
                return messages[0], fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _context(message: dict[str, Any], pid: int) -> tuple[str, dict[str, str]] | str:
    """A request's ``(cwd, env)`` checked with its pid (shared by every operation),
    or what is wrong with them."""
    cwd = message.get("cwd")
    env = message.get("env")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        return "cwd must be an absolute path"
    if "\0" in cwd:
        return "cwd must not contain a NUL byte"  # no system call could take it
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        return "env must map strings to strings"
    if any("\0" in k or "\0" in v for k, v in env.items()):
        return "env must not contain a NUL byte"
    if message.get("pid") != pid:
        return "the request's pid is not the connecting process's"
    return cwd, env


def _run_request(message: dict[str, Any], fds: list[int], pid: int) -> RunRequest | str:
    """Validate a run message; a RunRequest, or what is wrong with it."""
    argv = message.get("argv")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        return "argv must be a list of strings"
    if any("\0" in a for a in argv):
        return "argv must not contain a NUL byte"
    context = _context(message, pid)
    if isinstance(context, str):
        return context
    cwd, env = context
    if len(fds) != 3:
        return f"expected 3 file descriptors (stdin, stdout, stderr), got {len(fds)}"
    return RunRequest(argv=argv, cwd=cwd, environ=env, stdio=(fds[0], fds[1], fds[2]), pid=pid)


def _hook_request(message: dict[str, Any], fds: list[int], pid: int) -> HookRequest | str:
    """Validate a hook message; a HookRequest, or what is wrong with it."""
    integration = message.get("integration")
    stdin = message.get("stdin")
    if fds:
        return "a hook request carries no file descriptors"
    if integration != "claude-code":
        return f"unknown hook {integration!r}"
    if not isinstance(stdin, str):
        return "stdin must be a string"
    try:
        data = stdin.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return "stdin must decode to bytes (UTF-8 with surrogate escapes)"
    if len(data) > MAX_HOOK_INPUT:
        return f"stdin is larger than {MAX_HOOK_INPUT} bytes"
    context = _context(message, pid)
    if isinstance(context, str):
        return context
    cwd, env = context
    return HookRequest(integration=integration, stdin=data, cwd=cwd, environ=env, pid=pid)
