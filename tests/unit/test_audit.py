"""The audit log's hash chain: appends chain, edits and deletions are detected."""

from __future__ import annotations

import os
import threading

from corral import _audit
from corral._jsonfast import dumps, loads
from corral.pipeline._outcome import Outcome, Violation


def outcome(i: int) -> Outcome:
    return Outcome(
        sandbox_id=f"sbx-{i}",
        backend="bubblewrap",
        argv=("echo", str(i)),
        exit_code=0,
        violations=(
            Violation(kind="fs-write", target="/w/.bashrc", rule="filesystem.protect: **/.bashrc"),
        ),
    )


def fill(state: str, n: int) -> None:
    for i in range(n):
        _audit.append(state, _audit.record_for(outcome(i), cwd="/w", agent_session="s"))


def lines(state: str) -> list[bytes]:
    with open(_audit.audit_path(state), "rb") as f:
        return f.read().splitlines()


def rewrite(state: str, rows: list[bytes]) -> None:
    with open(_audit.audit_path(state), "wb") as f:
        f.write(b"".join(r + b"\n" for r in rows))


def test_records_chain_and_verify(tmp_path: object) -> None:
    state = str(tmp_path)
    assert _audit.verify(state) == (True, "the audit log is empty")
    fill(state, 5)
    ok, message = _audit.verify(state)
    assert ok and message == "5 records, chain intact"
    first, second = (loads(x) for x in lines(state)[:2])
    assert first["prev"] == _audit.GENESIS and first["seq"] == 1 and second["seq"] == 2
    assert first["agent_session"] == "s" and first["violations"][0]["target"] == "/w/.bashrc"


def test_detects_an_edited_record(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 4)
    rows = lines(state)
    record = loads(rows[1])
    record["exit_status"] = 99
    rows[1] = dumps(record).encode()
    rewrite(state, rows)
    ok, message = _audit.verify(state)
    assert not ok and message.startswith("line 3")


def test_detects_a_deleted_record_in_the_middle_and_at_the_end(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 4)
    rows = lines(state)
    rewrite(state, rows[:1] + rows[2:])
    assert not _audit.verify(state)[0]
    rewrite(state, rows[:3])
    ok, message = _audit.verify(state)
    assert not ok and "deleted from (or added to) the end" in message


def test_detects_garbage(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 2)
    rewrite(state, [*lines(state), b"{not json"])
    ok, message = _audit.verify(state)
    assert not ok and "not valid JSON" in message


def test_concurrent_appends_keep_the_chain(tmp_path: object) -> None:
    state = str(tmp_path)
    threads = [threading.Thread(target=fill, args=(state, 25)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _audit.verify(state) == (True, "100 records, chain intact")
    assert oct(os.stat(_audit.audit_path(state)).st_mode & 0o777) == oct(0o600)
