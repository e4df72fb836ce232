"""The audit log: one hash-chained JSON line per sandboxed run.

File: ``<state dir>/audit.jsonl``. Each record holds (DESIGN §9) the time,
sandbox id, agent session id, cwd, argv (secrets redacted), backend, policy
digest, exit status, duration, sha256 and size of stdout and stderr,
violations, network attempts, degraded rules, and ``prev``: the sha256 of the
previous line's bytes (64 zeros for the first). A side file ``audit.head``
holds the sequence number and hash of the last record, so that deleting the
*last* record is detected too.

:func:`verify` walks the chain and reports the first record that was edited,
inserted or removed. The chain is tamper-*evident* against anything that
cannot rewrite both files consistently - the sandbox itself cannot even read
the state directory - it is not a signature.

Writers take an exclusive ``flock`` on the log, so concurrent corral
processes append in a consistent order.
"""

from __future__ import annotations

import os
import time

from ._hashing import sha256 as _sha256
from ._jsonfast import JSONError, dumps, loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from .pipeline._outcome import Outcome

__all__ = [
    "GENESIS",
    "ChainCheck",
    "append",
    "audit_path",
    "iter_records",
    "read_new",
    "record_for",
    "verify",
]

GENESIS = "0" * 64
_TAIL = 65536


def audit_path(state_dir: str) -> str:
    """The audit log's path inside *state_dir*."""
    return os.path.join(state_dir, "audit.jsonl")


def record_for(
    outcome: Outcome,
    *,
    cwd: str,
    agent_session: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The audit fields for *outcome* (``seq`` and ``prev`` are added by :func:`append`)."""
    record: dict[str, Any] = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(outcome.started_at or time.time())),
        "sandbox_id": outcome.sandbox_id,
        "agent_session": agent_session,
        "cwd": cwd,
        "argv": list(outcome.argv),
        "backend": outcome.backend,
        "policy_digest": outcome.policy_digest,
        "exit_status": outcome.returncode,
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "timed_out": outcome.timed_out,
        "oom_killed": outcome.oom_killed,
        "duration": round(outcome.duration, 6),
        "stdout": {"sha256": outcome.stdout_sha256 or None, "size": outcome.stdout_size},
        "stderr": {"sha256": outcome.stderr_sha256 or None, "size": outcome.stderr_size},
        "output_dropped": outcome.output_dropped,
        "violations": [v.to_json() for v in outcome.violations],
        "network": [n.to_json() for n in outcome.network],
        "degraded": list(outcome.degraded),
        "unsandboxed": outcome.unsandboxed,
        "credentials": list(outcome.credentials),
    }
    if extra:
        record.update(extra)
    return record


def _last_line(fd: int) -> bytes | None:
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    chunk = min(size, _TAIL)
    while True:
        data = os.pread(fd, chunk, size - chunk)
        body = data[:-1] if data.endswith(b"\n") else data
        cut = body.rfind(b"\n")
        if cut >= 0 or chunk == size:
            return body[cut + 1 :]
        chunk = min(size, chunk * 4)


def append(state_dir: str, record: dict[str, Any]) -> dict[str, Any]:
    """Append *record* to the log under an exclusive lock; return it with ``seq``/``prev``.

    Raises:
        OSError: the log could not be written (the caller reports it; the
            command's result is not affected).
    """
    import fcntl

    from ._state import ensure_dir

    ensure_dir(state_dir)
    path = audit_path(state_dir)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        last = _last_line(fd)
        if last is None:
            prev, seq = GENESIS, 1
        else:
            prev = _sha256(last).hexdigest()
            try:
                seq = int(loads(last).get("seq", 0)) + 1
            except (JSONError, AttributeError, ValueError, TypeError):
                seq = 0  # the previous line is corrupt; verify() will say so
        full = {"seq": seq, **record, "prev": prev}
        line = dumps(full).encode()
        os.write(fd, line + b"\n")
        # The head is rewritten in place with one fixed-size pwrite, under the
        # log's lock: a rename here costs ~5 ms on ext4 (auto_da_alloc flush).
        head_fd = os.open(
            os.path.join(state_dir, "audit.head"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            os.pwrite(head_fd, f"{seq:>20} {_sha256(line).hexdigest()}\n".encode(), 0)
        finally:
            os.close(head_fd)
    finally:
        os.close(fd)
    return full


def iter_records(state_dir: str) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, raw line)`` for every record."""
    path = audit_path(state_dir)
    if not os.path.exists(path):
        return
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            yield number, line.rstrip(b"\n")


def read_new(path: str, position: int) -> tuple[list[bytes], int]:
    """The complete records written to the log at *path* after byte *position*.

    Returns ``(lines, new position)``; a record still being written (no
    newline yet) is left for the next call. When the log shrank below
    *position* (it was rotated or cut), reading starts over from its
    beginning: the caller sees ``new position < position`` only then, with the
    lines from the start. ``corral audit --follow`` and ``corral ui``'s live
    updates both read the log through this function.
    """
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return [], 0
    if size < position:
        position = 0
    if size == position:
        return [], position
    with open(path, "rb") as f:
        f.seek(position)
        data = f.read(size - position)
    end = data.rfind(b"\n")
    if end < 0:
        return [], position
    return [line for line in data[:end].split(b"\n") if line], position + end + 1


class ChainCheck:
    """The hash chain walked record by record: what :func:`verify` checks, kept incremental.

    Feed every line in order with :meth:`add`; :attr:`broken` names the first
    bad record (``None`` while the chain holds); :meth:`finish` adds the check
    of ``audit.head``. ``corral ui`` keeps one across refreshes of the log.
    """

    __slots__ = ("broken", "count", "prev")

    def __init__(self) -> None:
        self.prev = GENESIS  # the hash of the last line added
        self.count = 0
        self.broken: str | None = None

    def add(self, line: bytes, record: object, error: str | None = None) -> None:
        """Add the next *line*, parsed as *record* (or not JSON: *error* says why)."""
        self.count += 1
        number = self.count
        if self.broken is None:
            if error is not None:
                self.broken = f"line {number}: not valid JSON ({error}): the record was edited"
            elif not isinstance(record, dict):
                self.broken = f"line {number}: not a record"
            elif record.get("prev") != self.prev:
                self.broken = (
                    f"line {number}: its 'prev' does not match the hash of line {number - 1}: "
                    "a record before it was edited, inserted or deleted"
                )
            elif record.get("seq") != number:
                self.broken = f"line {number}: sequence number {record.get('seq')} where {number} was expected"
        self.prev = _sha256(line).hexdigest()

    def finish(self, state_dir: str) -> tuple[bool, str]:
        """``(ok, message)`` for the lines added so far and ``audit.head`` as it is now."""
        if self.broken is not None:
            return False, self.broken
        count = self.count
        try:
            with open(os.path.join(state_dir, "audit.head"), encoding="ascii") as f:
                head_seq, head_hash = f.read().split()
            recorded = int(head_seq)
        except FileNotFoundError:
            if count == 0:
                return True, "the audit log is empty"
            return False, "audit.head is missing: the log's end cannot be checked"
        except (OSError, ValueError, UnicodeDecodeError):
            return False, "audit.head is corrupt"
        if recorded != count or head_hash != self.prev:
            return False, (
                f"the log ends at record {count} but audit.head records {head_seq}: "
                "records were deleted from (or added to) the end"
            )
        return True, f"{count} records, chain intact"


def verify(state_dir: str) -> tuple[bool, str]:
    """Check the hash chain and the head; return ``(ok, message)``.

    The message names the first broken line: an edited record breaks the
    ``prev`` of the next one; a deleted or inserted record breaks ``prev`` or
    ``seq``; deleting the last records disagrees with ``audit.head``.
    """
    check = ChainCheck()
    for _number, line in iter_records(state_dir):
        try:
            check.add(line, loads(line))
        except JSONError as exc:
            check.add(line, None, str(exc))
        if check.broken is not None:
            return False, check.broken
    return check.finish(state_dir)
