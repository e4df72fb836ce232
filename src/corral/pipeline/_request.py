"""ExecRequest: what to run, as an argv list from edge to exec.

A request never holds a shell string to be split: ``corral run -c 'STRING'``
becomes ``("/bin/sh", "-c", "STRING")`` and the SDK does the same only when the
caller passes a string on purpose. Secrets never appear in
:meth:`ExecRequest.display`.

Example::

    req = ExecRequest.from_argv(["pytest", "-q"], cwd="/src/app", timeout=60.0)
"""

from __future__ import annotations

import os

from .._exceptions import InvalidRequest
from .._frozen import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["STDIN_DATA", "STDIN_INHERIT", "STDIN_NULL", "ExecRequest", "new_sandbox_id", "redact"]

STDIN_NULL = "null"
STDIN_INHERIT = "inherit"
STDIN_DATA = "data"

#: Substrings that mark an environment variable or flag as secret in displays.
_SECRET_MARKERS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "APIKEY",
    "API_KEY",
    "PRIVATE",
    "AUTH",
    "CREDENTIAL",
    "SESSION",
    "COOKIE",
)


def new_sandbox_id() -> str:
    """Return a fresh sandbox id: ``sbx-`` and 12 random hex digits."""
    return "sbx-" + os.urandom(6).hex()


def _looks_secret(name: str) -> bool:
    upper = name.upper().replace("-", "_")
    return any(marker in upper for marker in _SECRET_MARKERS)


def redact(argv: Iterable[str], secrets: Iterable[str] = ()) -> tuple[str, ...]:
    """Return *argv* with secret values replaced by ``***``.

    Redacted: every occurrence of a known secret value (``secrets``), the value
    of ``NAME=value`` words and ``--flag=value`` options whose name looks secret
    (contains TOKEN, PASSWORD, ...), and the word following such a bare flag.
    """
    known = [s for s in secrets if len(s) >= 4]
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        for secret in known:
            if secret in word:
                word = word.replace(secret, "***")
        name, eq, _value = word.partition("=")
        if eq and _looks_secret(name.lstrip("-")):
            word = f"{name}=***"
        elif word.startswith("-") and not eq and _looks_secret(word.lstrip("-")):
            hide_next = True
        out.append(word)
    return tuple(out)


class ExecRequest(Record):
    """One command to run in a sandbox.

    Attributes:
        argv: program and arguments; never empty. The program is looked up on
            the sandbox's ``PATH`` inside the sandbox.
        cwd: working directory as seen inside the sandbox (default: the
            workspace).
        env: extra ``(name, value)`` pairs for this command only, applied
            after the policy's environment.
        stdin_mode: ``"null"`` (``/dev/null``), ``"inherit"`` (the caller's
            stdin) or ``"data"`` (``stdin`` bytes).
        stdin: the bytes fed to the command when ``stdin_mode == "data"``.
        timeout: wall-clock seconds for this command; ``None`` uses the policy.
        capture: keep stdout/stderr on the Outcome (SDK); ``False`` streams
            them to corral's own stdout/stderr (CLI).
        shell_command: the original string when the request came from ``-c``.
        tty: the command runs on a terminal corral provides (``corral shell``):
            it gets a private pseudo-terminal as controlling terminal.
        output_tty: stdout/stderr streamed to a terminal go through a private
            pseudo-terminal of corral's instead of a pipe (``corral run`` at a
            terminal): the command sees a terminal (colours, line buffering)
            while corral still relays, caps and digests every byte.
        sandbox_id: the id of the sandbox this runs in.
        agent_session: the agent's session id (e.g. Claude Code's), for audit.
        tmp_dir: a host directory mounted as the sandbox's ``/tmp`` (an SDK
            session's private TMPDIR, kept across commands); ``None``: a
            fresh, empty tmpfs for this command.
    """

    argv: tuple[str, ...]
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    stdin_mode: str = STDIN_NULL
    stdin: bytes = b""
    timeout: float | None = None
    capture: bool = True
    shell_command: str | None = None
    tty: bool = False
    output_tty: bool = False
    sandbox_id: str = ""
    agent_session: str | None = None
    tmp_dir: str | None = None

    @classmethod
    def from_argv(
        cls,
        argv: Iterable[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        capture: bool = True,
        sandbox_id: str | None = None,
        agent_session: str | None = None,
    ) -> ExecRequest:
        """Build a validated request from an argv list.

        Raises:
            InvalidRequest: empty argv, NUL bytes, or a non-positive timeout.
        """
        words = tuple(argv)
        return cls._build(words, None, cwd, env, stdin, timeout, capture, sandbox_id, agent_session)

    @classmethod
    def from_shell(
        cls,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        capture: bool = True,
        sandbox_id: str | None = None,
        agent_session: str | None = None,
        shell: str = "/bin/sh",
    ) -> ExecRequest:
        """Build a request that runs *command* with ``shell -c`` (``/bin/sh``) in the sandbox."""
        if not isinstance(command, str) or not command.strip():
            raise InvalidRequest("Failed to build the request: the shell command is empty")
        if not shell:
            raise InvalidRequest("Failed to build the request: the shell program is empty")
        return cls._build(
            (shell, "-c", command),
            command,
            cwd,
            env,
            stdin,
            timeout,
            capture,
            sandbox_id,
            agent_session,
        )

    @classmethod
    def _build(
        cls,
        argv: tuple[str, ...],
        shell_command: str | None,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | str | None,
        timeout: float | None,
        capture: bool,
        sandbox_id: str | None,
        agent_session: str | None,
    ) -> ExecRequest:
        if not argv:
            raise InvalidRequest("Failed to build the request: no command given")
        for word in argv:
            if not isinstance(word, str):
                raise InvalidRequest(
                    f"Failed to build the request: argv item {word!r} is not a string"
                )
            if "\x00" in word:
                raise InvalidRequest("Failed to build the request: argv contains a NUL byte")
        if not argv[0]:
            raise InvalidRequest("Failed to build the request: the program name is empty")
        if timeout is not None and not (timeout > 0):
            raise InvalidRequest(
                f"Failed to build the request: timeout must be positive, got {timeout!r}"
            )
        pairs: list[tuple[str, str]] = []
        for name, value in (env or {}).items():
            if not name or "=" in name or "\x00" in name or "\x00" in str(value):
                raise InvalidRequest(
                    f"Failed to build the request: invalid environment variable {name!r}"
                )
            pairs.append((name, str(value)))
        if stdin is None:
            mode, data = STDIN_NULL, b""
        else:
            mode, data = STDIN_DATA, stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        if cwd is not None and not cwd.startswith("/"):
            raise InvalidRequest(f"Failed to build the request: cwd must be absolute, got {cwd!r}")
        return cls(
            argv=argv,
            cwd=cwd,
            env=tuple(pairs),
            stdin_mode=mode,
            stdin=data,
            timeout=timeout,
            capture=capture,
            shell_command=shell_command,
            sandbox_id=sandbox_id or new_sandbox_id(),
            agent_session=agent_session,
        )

    def display(self, secrets: Iterable[str] = ()) -> tuple[str, ...]:
        """Return argv with secrets redacted (see :func:`redact`), for logs and audit."""
        return redact(self.argv, secrets)

    def command_line(self) -> str:
        """The command as one string, for matching ``rules``/``commands`` globs (not for exec)."""
        if self.shell_command is not None:
            return self.shell_command
        return " ".join(self.argv)
