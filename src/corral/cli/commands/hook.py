"""``corral hook claude-code``: the Claude Code PreToolUse hook (a hot path).

Reads the hook JSON from stdin, writes the decision JSON to stdout and exits
0; on any problem it writes ``corral: <reason>`` to stderr and exits 2, which
Claude Code treats as "block this tool call" - a broken hook never lets a
command through unsandboxed. See :mod:`corral.integrations.claude_code_hook`.

The decision itself is :func:`answer`: input bytes, environment and the
Python CLI to name in, ``stdout``/``stderr`` bytes and a status out, with no
process-wide state read or written (no ``os.environ``, no ``chdir``, no
``sys.stdin``/``sys.stdout``). The command (:func:`main`) runs it for its own
process; the corral server runs it for ``corral-client hook claude-code``
(:func:`corral.cli.commands.server.handle_hook`), so both give the same bytes.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["EXIT_BLOCK", "HookAnswer", "answer", "main"]

EXIT_BLOCK = 2
_MAX_INPUT = 16 << 20  # a PreToolUse payload carries one tool call; Write content can be large
USAGE = """usage: corral hook claude-code < PRE_TOOL_USE_JSON

The Claude Code PreToolUse hook: Bash and Monitor commands are rewritten to
run under 'corral run', after your Claude Code deny/ask rules are applied to
the original command; Write/Edit/NotebookEdit outside what the sandbox may
write, Read/Grep/Glob of secret paths, and tools that would run code outside
the sandbox are denied. Install it with 'corral install claude-code'. Any
error exits 2 (Claude Code blocks the call).

options:
  -h, --help  show this help message and exit
"""


class HookAnswer:
    """What a hook writes and how it exits.

    Attributes:
        stdout: the decision JSON and a newline, or nothing (no decision).
        stderr: ``corral: <reason>`` lines when the call is blocked.
        status: 0, or :data:`EXIT_BLOCK`.
    """

    __slots__ = ("status", "stderr", "stdout")

    def __init__(self, *, stdout: bytes = b"", stderr: bytes = b"", status: int = 0) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.status = status


def _blocked(reason: str) -> HookAnswer:
    return HookAnswer(
        stderr=f"corral: {reason}\n".encode("utf-8", "backslashreplace"), status=EXIT_BLOCK
    )


def _failed(exc: BaseException) -> HookAnswer:
    return _blocked(f"the hook failed ({type(exc).__name__}: {exc}); the tool call is blocked")


def answer(
    integration: str,
    data: bytes,
    *,
    environ: Mapping[str, str],
    python_cli: Sequence[str],
    pid: int | None = None,
) -> HookAnswer:
    """The answer of ``corral hook INTEGRATION`` to the input *data*.

    Args:
        integration: the hook's name; only ``"claude-code"`` exists.
        data: what the hook read on stdin.
        environ: the hook's environment (settings layers, ``~`` in paths).
        python_cli: how a rewritten Bash command starts corral when the
            fast client (:func:`corral.server._fastclient.usable_client`) is not usable.
        pid: the hook's process (this one, or the fast client the server
            answers): the Claude Code above it gives its command line's rules.

    Never raises: any error is an answer that blocks the call.
    """
    if integration != "claude-code":
        return _blocked(
            f"unknown hook {integration or '(none)'}: only 'corral hook claude-code' exists"
        )
    try:
        from ..._exceptions import CorralError
        from ..._jsonfast import dumps
        from ...integrations.claude_code_hook import (
            HookError,
            anchored_cwd,
            decide,
            parse_payload,
        )
        from ...policy import load_settings
        from ...policy._locations import default_home
        from ...policy._watched import cached

        try:
            payload = parse_payload(data)
            # the project's, never from a directory a sandboxed command can re-point
            cwd = anchored_cwd(
                payload["cwd"], environ.get("CLAUDE_PROJECT_DIR"), default_home(environ)
            )
            resolved = cached(
                "settings", cwd, environ, lambda env: load_settings(cwd=cwd, environ=env)
            )
            decision = decide(
                payload,
                resolved,
                corral=_corral_for_commands(python_cli),
                environ=environ,
                pid=pid,
            )
        except HookError as exc:
            return _blocked(str(exc))
        except CorralError as exc:
            return _blocked(exc.message + (f" ({exc.hint})" if exc.hint else ""))
        if decision is None:
            return HookAnswer()
        return HookAnswer(stdout=(dumps(decision) + "\n").encode("ascii"))
    except Exception as exc:  # fail closed: whatever broke, block the call
        return _failed(exc)


def _corral_for_commands(python_cli: Sequence[str]) -> tuple[str, ...]:
    """The fast client when it is usable (~0.05 ms to check; in the server, cached), else *python_cli*."""
    from ...policy._watched import cached
    from ...server._fastclient import usable_client

    fast = cached("fast-client", "", {}, lambda _env: usable_client())
    return (fast,) if fast is not None else tuple(python_cli)


def _read_stdin() -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > _MAX_INPUT:
            raise ValueError(f"the hook input is larger than {_MAX_INPUT >> 20} MiB")
        chunks.append(chunk)


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main(args: list[str]) -> int:
    """Entry point; returns 0 with a decision on stdout, or 2 with the reason on stderr.

    When ``corral-client`` handed the call over (``CORRAL_HANDOFF``) because no
    server was running, a server is started afterwards for the next call.
    """
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    from .._client import start_server_later, take_handoff

    handoff = take_handoff(os.environ)
    python_cli: tuple[str, ...] = ()
    try:
        if args != ["claude-code"]:
            result = answer(" ".join(args), b"", environ=os.environ, python_cli=())
        else:
            from ...integrations.claude_code_hook import corral_command

            python_cli = corral_command(sys.argv[0], sys.executable)
            result = answer(
                "claude-code",
                _read_stdin(),
                environ=os.environ,
                python_cli=python_cli,
                pid=os.getpid(),
            )
    except BaseException as exc:  # fail closed: whatever broke (^C too), block the call
        result = _failed(exc)
    _note_for_plugin(python_cli)
    try:
        _write(1, result.stdout)
        _write(2, result.stderr)
    except BaseException as exc:
        _write_quietly(2, _failed(exc).stderr)
        return EXIT_BLOCK
    if handoff is not None and handoff[0] in ("no-server", "stale"):
        from ..._state import state_dir

        start_server_later(state_dir(os.environ), os.environ)
    return result.status


def _write_quietly(fd: int, data: bytes) -> None:
    try:
        _write(fd, data)
    except OSError:
        pass


def _note_for_plugin(python_cli: Sequence[str]) -> None:
    """Tell the plugin's hook script where the fast client is (when we run as a corral script)."""
    if len(python_cli) != 1:
        return  # python -m corral, or the fast client's fallback: not the corral on PATH
    from ..._state import state_dir
    from ...server._fastclient import note_for_plugin, usable_client

    note_for_plugin(state_dir(os.environ), python_cli[0], usable_client())  # best effort
