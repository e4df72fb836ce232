"""The runs behind ``corral ui``: an incremental index of the audit log.

The page must show its first screen of 10,000 records within 300 ms of server
time, and stay live as records arrive, so the log is not re-read per request:
:class:`RunIndex` keeps a compact :class:`Run` per record and the state of the
hash chain, and :meth:`RunIndex.refresh` reads only what was appended since
(through :func:`corral._audit.read_new`, the reader ``corral audit --follow``
uses). The chain is verified as it is read with
:class:`corral._audit.ChainCheck`, the walker behind ``corral audit --verify``
(the same checks, the same messages), and ``audit.head`` is checked on every
refresh. A rewrite of records already read is caught too: the bytes read so
far are hashed, and a refresh whose prefix no longer has that hash (or a log
that shrank, or another file at the path) starts over from the beginning.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .._audit import ChainCheck, audit_path, read_new

__all__ = ["Chain", "Filters", "Run", "RunIndex"]


class Run(NamedTuple):
    """What the runs table shows of one audit record (the full record is read on demand).

    A named tuple: 10,000 of them are built when a server starts (a frozen
    dataclass takes three times as long to build).
    """

    seq: int
    line: int
    offset: int
    time: str
    sandbox_id: str
    agent_session: str
    backend: str
    command: str
    exit_status: int | None
    duration: float
    violations: int
    network: int
    denied: int
    limits: tuple[str, ...]
    denied_hosts: tuple[str, ...]

    @property
    def status(self) -> str:
        """``"blocked"`` (a violation), ``"failed"`` (non-zero exit) or ``"ok"``."""
        if self.violations:
            return "blocked"
        return "ok" if self.exit_status == 0 else "failed"


def _limits(record: dict[str, Any]) -> tuple[str, ...]:
    hit = []
    if record.get("timed_out"):
        hit.append("timeout")
    if record.get("oom_killed"):
        hit.append("memory (OOM)")
    if record.get("output_dropped"):
        hit.append("output")
    for violation in record.get("violations") or ():
        if isinstance(violation, dict) and violation.get("kind") == "limit":
            hit.append(str(violation.get("target", "limit")))
    return tuple(hit)


def _run(seq: int, line: int, offset: int, record: dict[str, Any]) -> Run:
    get = record.get
    argv = get("argv") or []
    command = " ".join(map(str, argv)) if isinstance(argv, list) else str(argv)
    network = get("network") or ()
    denied_hosts = tuple(
        str(n.get("host", "?"))
        for n in network
        if isinstance(n, dict) and n.get("decision") == "deny"
    )
    status = get("exit_status")
    duration = get("duration")
    violations = get("violations") or ()
    limited = get("timed_out") or get("oom_killed") or get("output_dropped") or violations
    return Run(
        seq=seq,
        line=line,
        offset=offset,
        time=str(get("time") or ""),
        sandbox_id=str(get("sandbox_id") or ""),
        agent_session=str(get("agent_session") or ""),
        backend=str(get("backend") or "?"),
        command=command,
        exit_status=status if isinstance(status, int) else None,
        duration=float(duration) if isinstance(duration, (int, float)) else 0.0,
        violations=len(violations),
        network=len(network),
        denied=len(denied_hosts),
        limits=_limits(record) if limited else (),
        denied_hosts=denied_hosts,
    )


@dataclass(frozen=True, slots=True)
class Chain:
    """The verification state of the hash chain: ``ok`` (``None``: not known yet) and a sentence."""

    ok: bool | None
    message: str


@dataclass(frozen=True, slots=True)
class Filters:
    """The runs table's filters (empty strings match everything)."""

    text: str = ""
    backend: str = ""
    status: str = ""  # "", "ok", "failed", "blocked"
    session: str = ""

    def __bool__(self) -> bool:
        return bool(self.text or self.backend or self.status or self.session)

    def match(self, run: Run) -> bool:
        """Whether *run* passes every filter."""
        if self.backend and run.backend != self.backend:
            return False
        if self.status and run.status != self.status:
            return False
        if self.session and self.session not in (run.agent_session, run.sandbox_id):
            return False
        return not self.text or self.text.lower() in run.command.lower()


@dataclass
class _State:
    """What was read so far (replaced wholesale when the log is rewritten)."""

    inode: int = -1
    position: int = 0
    mtime_ns: int = 0
    prefix: Any = field(default_factory=hashlib.sha256)
    runs: list[Run] = field(default_factory=list)
    check: ChainCheck = field(default_factory=ChainCheck)


class RunIndex:
    """The audit log of *state_dir*, indexed; thread-safe.

    Example::

        index = RunIndex(state_dir)
        index.refresh()
        runs, total = index.page(Filters(backend="bubblewrap"), start=0, limit=50)
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.path = audit_path(state_dir)
        self._lock = threading.Lock()
        self._state = _State()
        self._indexed = threading.Event()  # set once the whole log was read
        self._builder: threading.Thread | None = None

    @property
    def indexed(self) -> bool:
        """Whether the whole log has been read once (until then, see :meth:`tail`)."""
        return self._indexed.is_set()

    def build_in_background(self) -> None:
        """Start reading the whole log in a thread, unless that was done or is under way."""
        with self._lock:
            if self._indexed.is_set() or self._builder is not None:
                return
            self._builder = threading.Thread(
                target=self.refresh, name="corral-ui-index", daemon=True
            )
            self._builder.start()

    def tail(self, limit: int) -> tuple[list[Run], int]:
        """The newest *limit* runs (newest first) and how many records the log holds.

        Parses only those records (the rest is counted, not parsed) - what a
        fresh server shows while :meth:`build_in_background` reads everything
        (the chain's state is not known until then).
        """
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return [], 0
        end = data.rfind(b"\n") + 1  # a record still being written is left out
        total = data.count(b"\n", 0, end)
        runs: list[Run] = []
        stop = end - 1
        number = total
        while stop > 0 and len(runs) < limit:
            start = data.rfind(b"\n", 0, stop) + 1
            raw = data[start:stop]
            try:
                record = json.loads(raw)
            except ValueError:
                record = None
            if not isinstance(record, dict):
                record = {}
            seq = record.get("seq")
            runs.append(_run(seq if isinstance(seq, int) else number, number, start, record))
            number -= 1
            stop = start - 1
        return runs, total

    def refresh(self) -> None:
        """Read what was appended since the last refresh (or everything, if the log was rewritten)."""
        with self._lock:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._state = _State()
                self._indexed.set()
                return
            state = self._state
            if st.st_size == state.position and st.st_mtime_ns == state.mtime_ns:
                return
            if st.st_ino != state.inode or st.st_size < state.position or not self._same_prefix():
                state = self._state = _State(inode=st.st_ino)
            if not self._read(state):  # shrank between the stat and the read
                state = self._state = _State(inode=st.st_ino)
                self._read(state)
            state.mtime_ns = st.st_mtime_ns
        self._indexed.set()

    def _same_prefix(self) -> bool:
        state = self._state
        digest = hashlib.sha256()
        remaining = state.position
        with open(self.path, "rb") as f:
            while remaining > 0:
                chunk = f.read(min(remaining, 1 << 20))
                if not chunk:
                    return False
                digest.update(chunk)
                remaining -= len(chunk)
        return bool(digest.digest() == state.prefix.digest())

    def _read(self, state: _State) -> bool:
        """Index the records after ``state.position``; ``False`` if the log shrank meanwhile."""
        lines, position = read_new(self.path, state.position)
        if position < state.position:
            return False
        offset = state.position
        check = state.check
        for raw in lines:
            state.prefix.update(raw + b"\n")
            try:
                # plain json (not _jsonfast's duplicate-key check: 3x slower over 10,000
                # records); a doctored record is caught by the chain, not by parsing
                record = json.loads(raw)
            except ValueError as exc:
                check.add(raw, None, str(exc))
                record = {}
            else:
                check.add(raw, record)
                if not isinstance(record, dict):
                    record = {}
            seq = record.get("seq")
            number = check.count
            state.runs.append(_run(seq if isinstance(seq, int) else number, number, offset, record))
            offset += len(raw) + 1
        state.position = position
        return True

    def chain(self) -> Chain:
        """The chain's state as of the last refresh, with ``audit.head`` read now.

        The same checks and messages as ``corral audit --verify``
        (:class:`corral._audit.ChainCheck`). A head that disagrees with the
        records read (a writer may have appended meanwhile) refreshes once more.
        """
        ok, message, records_broken = self._finish()
        if not ok and not records_broken:
            self.refresh()
            ok, message, records_broken = self._finish()
        return Chain(ok, message)

    def _finish(self) -> tuple[bool, str, bool]:
        """``ChainCheck.finish`` on a copy of the chain's state; and whether a record broke it."""
        with self._lock:
            check = self._state.check
            copy = ChainCheck()
            copy.count, copy.prev, copy.broken = check.count, check.prev, check.broken
        ok, message = copy.finish(self.state_dir)
        return ok, message, copy.broken is not None

    def runs(self) -> list[Run]:
        """Every run, oldest first (a snapshot)."""
        with self._lock:
            return list(self._state.runs)

    def page(self, filters: Filters, *, start: int, limit: int) -> tuple[list[Run], int]:
        """Runs newest first, from *start*, at most *limit*; and how many match in all."""
        with self._lock:
            runs = self._state.runs
            if not filters:
                total = len(runs)
                stop = max(total - start, 0)
                return runs[max(stop - limit, 0) : stop][::-1], total
            matching = [r for r in reversed(runs) if filters.match(r)]
        return matching[start : start + limit], len(matching)

    def after(self, seq: int, filters: Filters) -> list[Run]:
        """Runs with a sequence number above *seq* that pass *filters*, oldest first."""
        with self._lock:
            runs = self._state.runs
            found = []
            for run in reversed(runs):
                if run.seq <= seq:
                    break
                if filters.match(run):
                    found.append(run)
        return found[::-1]

    def last_seq(self) -> int:
        """The newest record's sequence number (0 when the log is empty)."""
        with self._lock:
            runs = self._state.runs
            return runs[-1].seq if runs else 0

    def record(self, seq: int) -> dict[str, Any] | None:
        """The full audit record number *seq*, read from the log now; ``None`` if absent."""
        with self._lock:
            runs = self._state.runs
            run = runs[seq - 1] if 0 < seq <= len(runs) and runs[seq - 1].seq == seq else None
            if run is None:
                run = next((r for r in runs if r.seq == seq), None)
        if run is None:
            return None
        with open(self.path, "rb") as f:
            f.seek(run.offset)
            raw = f.readline().rstrip(b"\n")
        try:
            record = json.loads(raw)
        except ValueError:
            return None
        return record if isinstance(record, dict) and record.get("seq") == seq else None

    def backends(self) -> list[str]:
        """The backends that appear in the log, sorted."""
        with self._lock:
            return sorted({r.backend for r in self._state.runs})
