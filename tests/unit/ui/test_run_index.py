"""``corral ui``'s run index: incremental reads of the audit log that verify the chain
as ``corral audit --verify`` does, and notice rewrites of what was already read."""

from __future__ import annotations

import os

from corral import _audit
from corral._jsonfast import dumps, loads
from corral.ui._runs import Filters, RunIndex
from tests.unit.test_audit import fill, lines, rewrite


def index_of(state: str) -> RunIndex:
    index = RunIndex(state)
    index.refresh()
    return index


def test_reads_incrementally_newest_first(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 5)
    index = index_of(state)
    runs, total = index.page(Filters(), start=0, limit=3)
    assert total == 5 and [r.seq for r in runs] == [5, 4, 3]
    assert runs[0].command == "echo 4" and runs[0].status == "blocked" and runs[0].violations == 1
    fill(state, 3)
    index.refresh()
    assert [r.seq for r in index.after(5, Filters())] == [6, 7, 8]
    assert index.chain().ok and index.chain().message == _audit.verify(state)[1]
    assert index.record(7) == loads(lines(state)[6])
    assert index.record(9) is None


def test_a_record_still_being_written_waits(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 2)
    with open(_audit.audit_path(state), "ab") as f:
        f.write(b'{"seq": 3, "argv": ["half')
    index = index_of(state)
    assert index.last_seq() == 2
    assert _audit.read_new(_audit.audit_path(state), 0)[0] == lines(state)[:2]


def test_an_edit_of_a_record_already_read_is_caught(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 4)
    index = index_of(state)
    assert index.chain().ok
    rows = lines(state)
    record = loads(rows[1])
    record["exit_status"] = 7  # same length as 0: the file keeps its size
    rows[1] = dumps(record).encode()
    rewrite(state, rows)
    os.utime(_audit.audit_path(state), ns=(1, 1))  # even with the old size and another mtime
    index.refresh()
    chain = index.chain()
    ok, message = _audit.verify(state)
    assert not ok and not chain.ok and chain.message == message
    assert index.record(2) is not None and index.record(2)["exit_status"] == 7  # type: ignore[index]


def test_records_cut_from_the_end_are_caught(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 4)
    index = index_of(state)
    rewrite(state, lines(state)[:3])
    index.refresh()
    chain = index.chain()
    assert not chain.ok and (chain.ok, chain.message) == _audit.verify(state)
    assert index.last_seq() == 3


def test_filters(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 12)
    index = index_of(state)
    runs, total = index.page(Filters(text="ECHO 1"), start=0, limit=50)
    assert total == 3 and [r.command for r in runs] == ["echo 11", "echo 10", "echo 1"]
    assert index.page(Filters(status="ok"), start=0, limit=50)[1] == 0
    assert index.page(Filters(backend="bubblewrap", session="s"), start=10, limit=5)[1] == 12
    assert [r.seq for r in index.page(Filters(), start=10, limit=5)[0]] == [2, 1]


def test_the_tail_matches_the_index(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 30)
    with open(_audit.audit_path(state), "ab") as f:
        f.write(b'{"seq": 31, "argv": ["half')  # still being written: not shown
    index = RunIndex(state)
    runs, total = index.tail(10)
    assert not index.indexed and total == 30
    index.refresh()
    assert index.indexed and runs == index.page(Filters(), start=0, limit=10)[0]
    assert index.tail(100) == (index.page(Filters(), start=0, limit=100)[0], 30)


def test_a_corrupt_head_is_reported_not_raised(tmp_path: object) -> None:
    state = str(tmp_path)
    fill(state, 3)
    with open(os.path.join(state, "audit.head"), "w", encoding="ascii") as f:
        f.write("three " + "0" * 64 + "\n")  # verify() used to raise ValueError here
    assert _audit.verify(state) == (False, "audit.head is corrupt")
    chain = index_of(state).chain()
    assert (chain.ok, chain.message) == (False, "audit.head is corrupt")
