"""``corral hook claude-code``: the Claude Code PreToolUse hook (a hot path).

Reads the hook JSON from stdin, writes the decision JSON to stdout and exits
0; on any problem it writes ``corral: <reason>`` to stderr and exits 2, which
Claude Code treats as "block this tool call" - a broken hook never lets a
command through unsandboxed. See :mod:`corral.integrations.claude_code_hook`.
"""

from __future__ import annotations

import os
import sys

__all__ = ["main"]

EXIT_BLOCK = 2
_MAX_INPUT = 16 << 20  # a PreToolUse payload carries one tool call; Write content can be large
USAGE = """usage: corral hook claude-code < PRE_TOOL_USE_JSON

The Claude Code PreToolUse hook: Bash commands are rewritten to run under
'corral run'; Write/Edit/MultiEdit/NotebookEdit outside what the sandbox may
write, and Read/Grep/Glob of secret paths, are denied. Install it with
'corral install claude-code'. Any error exits 2 (Claude Code blocks the call).
"""


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


def _block(reason: str) -> int:
    sys.stderr.write(f"corral: {reason}\n")
    sys.stderr.flush()
    return EXIT_BLOCK


def main(args: list[str]) -> int:
    """Entry point; returns 0 with a decision on stdout, or 2 with the reason on stderr."""
    if args[:1] in (["-h"], ["--help"]):
        sys.stdout.write(USAGE)
        return 0
    if args != ["claude-code"]:
        return _block(
            f"unknown hook {' '.join(args) or '(none)'}: only 'corral hook claude-code' exists"
        )
    try:
        from ..._exceptions import CorralError
        from ..._jsonfast import dumps
        from ...integrations.claude_code_hook import (
            HookError,
            corral_command,
            decide,
            parse_payload,
        )
        from ...policy import load_settings

        try:
            payload = parse_payload(_read_stdin())
            resolved = load_settings(cwd=payload["cwd"], environ=os.environ)
            answer = decide(payload, resolved, corral=corral_command(sys.argv[0], sys.executable))
        except HookError as exc:
            return _block(str(exc))
        except CorralError as exc:
            return _block(exc.message + (f" ({exc.hint})" if exc.hint else ""))
        if answer is not None:
            sys.stdout.write(dumps(answer) + "\n")
            sys.stdout.flush()
        return 0
    except BaseException as exc:  # fail closed: whatever broke, block the call
        return _block(f"the hook failed ({type(exc).__name__}: {exc}); the tool call is blocked")
