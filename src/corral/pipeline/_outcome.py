"""Outcome: everything that happened to one sandboxed command.

A policy denial is data here (``violations``), not an exception; callers who
want an exception ask for it with :meth:`Outcome.raise_for_denial`, and
:meth:`Outcome.check` raises when the command itself failed.

Example::

    outcome = sandbox.exec(["pytest", "-q"])
    if outcome.violations:
        print(outcome.violations[0].describe())
    outcome.check()          # raises CommandFailed unless exit status 0
"""

from __future__ import annotations

from .._exceptions import CommandFailed, PolicyDenied
from .._frozen import Record

__all__ = ["NetworkAttempt", "Outcome", "Violation", "command_status", "status_for"]

#: the highest signal number (SIGRTMAX on Linux)
_MAX_SIGNAL = 64


class Violation(Record):
    """One thing the policy blocked.

    Attributes:
        kind: ``"fs-write"``, ``"fs-read"``, ``"network"``, ``"limit"`` ...
        target: what was attempted: a path, ``host:port``, a limit name.
        rule: the policy rule that blocked it, e.g. ``"filesystem.protect: **/.git/hooks/**"``.
        operation: the attempted operation (``"open"``, ``"rename"``, ``"connect"`` ...).
        pid: the process (as seen by corral) that attempted it, when known.
    """

    kind: str
    target: str
    rule: str
    operation: str = ""
    pid: int | None = None

    def describe(self) -> str:
        """One human line, e.g. ``blocked write to /w/.bashrc (filesystem.protect: **/.bashrc)``."""
        verb = {
            "fs-write": "write to",
            "fs-read": "read of",
            "network": "connection to",
            "limit": "limit",
        }.get(self.kind, self.kind)
        return f"blocked {verb} {self.target} ({self.rule})"

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return self.fields()


class NetworkAttempt(Record):
    """One connection attempt through the egress proxy.

    Attributes:
        host: the host as the client named it (canonicalised).
        port: the destination port.
        method: ``CONNECT``, ``GET`` ..., or ``SOCKS5``.
        decision: ``"allow"``, ``"deny"``, or ``"challenge"`` (the client asked
            without the proxy credential and was told to authenticate, the
            first leg of HTTP proxy authentication; not a violation).
        rule: the rule that decided (``"network.allow: *.pypi.org"`` or the reason).
        bytes_up: bytes sent by the sandbox to the destination.
        bytes_down: bytes received from the destination.
        duration: seconds the connection was open.
        started_at: UNIX time of the attempt.
        error: why an allowed connection failed (``"cannot resolve ..."``,
            ``"connection refused"``), empty when it did not.
    """

    host: str
    port: int
    method: str
    decision: str
    rule: str
    bytes_up: int = 0
    bytes_down: int = 0
    duration: float = 0.0
    started_at: float = 0.0
    error: str = ""

    @property
    def target(self) -> str:
        """``host:port``, with brackets around an IPv6 address (``[::1]:443``)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return self.fields()


def command_status(exit_code: int | None, signal: int | None) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` of the command from what its sandbox reported.

    A sandbox's init (bubblewrap, a container runtime) reports a command killed
    by signal N as exit status 128+N, as a shell does; so does a shell that
    ran the command. corral reads every status 129..192 that way, whichever
    backend ran it, so a segfault is ``signal=11`` everywhere (not
    ``exit_code=139`` in one backend and ``signal=11`` in another). A command
    that itself calls ``exit(139)`` cannot be told apart, exactly as in a shell.
    """
    if signal is None and exit_code is not None and 128 < exit_code <= 128 + _MAX_SIGNAL:
        return None, exit_code - 128
    return exit_code, signal


def status_for(exit_code: int | None, signal: int | None, timed_out: bool, oom_killed: bool) -> int:
    """The exit status ``corral run`` reports (DESIGN §5).

    124 timed out; 137 killed by the memory limit; 128+N killed by signal N;
    otherwise the command's own status.
    """
    if timed_out:
        return 124
    if oom_killed:
        return 137
    if signal is not None:
        return 128 + signal
    return 0 if exit_code is None else exit_code


class Outcome(Record):
    """What happened when a command ran in a sandbox.

    Attributes:
        sandbox_id: the sandbox's id.
        backend: the backend that ran it (``"bubblewrap"`` ...).
        argv: the command as run, with secrets redacted.
        exit_code: the exit status when the command exited normally (0-128),
            else ``None``.
        signal: the signal that killed it, else ``None`` (a status of 128+N
            reported by the sandbox or a shell counts as signal N: see
            :func:`command_status`). Exactly one of ``exit_code`` and
            ``signal`` is set.
        timed_out: the wall-clock timeout stopped it (``signal`` says with
            which signal; ``returncode`` is 124).
        oom_killed: the memory limit stopped it.
        stdout, stderr: captured output (empty when streamed).
        stdout_truncated, stderr_truncated: output beyond the limit was dropped.
        output_dropped: how many bytes were dropped.
        duration: wall-clock seconds from launch to exit.
        started_at: UNIX time of the launch.
        violations: what the policy blocked.
        network: egress attempts through the proxy.
        degraded: rules that were *not* enforced because the caller opted in
            with ``allowDegraded`` (empty in a fully enforced run).
        unsandboxed: the ``none`` backend ran it (no isolation at all).
        exec_error: why the command could not be executed (not found: exit
            127; not executable: 126), e.g. ``"foo: No such file or directory"``.
        stopped: why corral stopped the command before it finished, e.g.
            ``"cancelled"`` or ``"the sandbox was closed"``; empty when it was
            not stopped (a timeout is ``timed_out``).
        credentials: names (never values) of the credentials injected.
        policy_digest: sha256 of the effective policy.
        stdout_sha256, stderr_sha256, stdout_size, stderr_size: digests of the
            full output as the command wrote it (for the audit log).
    """

    sandbox_id: str
    backend: str
    argv: tuple[str, ...]
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    oom_killed: bool = False
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    output_dropped: int = 0
    duration: float = 0.0
    started_at: float = 0.0
    violations: tuple[Violation, ...] = ()
    network: tuple[NetworkAttempt, ...] = ()
    degraded: tuple[str, ...] = ()
    unsandboxed: bool = False
    exec_error: str | None = None
    stopped: str = ""
    credentials: tuple[str, ...] = ()
    policy_digest: str = ""
    stdout_sha256: str = ""
    stderr_sha256: str = ""
    stdout_size: int = 0
    stderr_size: int = 0

    def __repr__(self) -> str:
        """One short line: how it ended, how long, how much output, what was blocked."""
        how = [f"returncode={self.returncode}"]
        if self.timed_out:
            how.append("timed out")
        elif self.oom_killed:
            how.append("out of memory")
        elif self.stopped:
            how.append(f"stopped: {self.stopped}")
        if self.signal is not None:
            how.append(f"signal={self.signal}")
        if self.exec_error:
            how.append(repr(self.exec_error))
        sizes = f"stdout={len(self.stdout)}B stderr={len(self.stderr)}B"
        if self.truncated:
            sizes += " (truncated)"
        blocked = f" violations={len(self.violations)}" if self.violations else ""
        return (
            f"<Outcome {' '.join(self.argv)[:60]!r} {', '.join(how)} "
            f"{self.duration:.2f}s {sizes}{blocked} {self.backend}>"
        )

    @property
    def returncode(self) -> int:
        """The exit status ``corral run`` uses for this outcome (see :func:`status_for`)."""
        return status_for(self.exit_code, self.signal, self.timed_out, self.oom_killed)

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 (violations do not change this)."""
        return self.returncode == 0

    @property
    def truncated(self) -> bool:
        """True when any output was dropped."""
        return self.stdout_truncated or self.stderr_truncated

    def text(self, stream: str = "stdout") -> str:
        """Decode ``stdout`` or ``stderr`` as UTF-8, replacing invalid bytes."""
        data = self.stdout if stream == "stdout" else self.stderr
        return data.decode("utf-8", "replace")

    def check(self) -> Outcome:
        """Return self when the command succeeded; raise otherwise.

        Raises:
            CommandFailed: the command timed out, was killed, or exited non-zero.
        """
        if self.ok:
            return self
        if self.timed_out:
            why = "timed out"
        elif self.stopped:
            why = f"was stopped ({self.stopped})"
        elif self.oom_killed:
            why = "was killed by the memory limit"
        elif self.signal is not None:
            why = f"was killed by signal {self.signal}"
        else:
            why = f"exited with status {self.exit_code}"
        raise CommandFailed(f"Command {' '.join(self.argv)!r} {why}", outcome=self)

    def raise_for_denial(self) -> Outcome:
        """Return self when nothing was blocked; raise :class:`PolicyDenied` otherwise."""
        if not self.violations:
            return self
        first = self.violations[0].describe()
        more = f" (and {len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
        raise PolicyDenied(f"The policy {first}{more}", outcome=self)

    def to_json(self, *, include_output: bool = True) -> dict[str, object]:
        """A JSON-ready dict (output decoded as UTF-8 with replacement)."""
        data: dict[str, object] = {
            "sandbox_id": self.sandbox_id,
            "backend": self.backend,
            "argv": list(self.argv),
            "returncode": self.returncode,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "oom_killed": self.oom_killed,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "output_dropped": self.output_dropped,
            "duration": round(self.duration, 6),
            "started_at": self.started_at,
            "violations": [v.to_json() for v in self.violations],
            "network": [n.to_json() for n in self.network],
            "degraded": list(self.degraded),
            "unsandboxed": self.unsandboxed,
            "exec_error": self.exec_error,
            "stopped": self.stopped,
            "credentials": list(self.credentials),
            "policy_digest": self.policy_digest,
            "stdout_sha256": self.stdout_sha256,
            "stderr_sha256": self.stderr_sha256,
            "stdout_size": self.stdout_size,
            "stderr_size": self.stderr_size,
        }
        if include_output:
            data["stdout"] = self.text("stdout")
            data["stderr"] = self.text("stderr")
        return data
