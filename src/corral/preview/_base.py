"""Conflict detection: did the real workspace change under a preview?

Apply must refuse to overwrite a file that changed in the real workspace
since the preview began. Recording the whole workspace at the start would
make set-up cost grow with the workspace; instead corral relies on two facts
and records only what the change set touches.

1. **ctime.** Every change to a file - content, mode, owner, a rename onto
   it, a new file - sets its ctime to the current time, and nobody can set
   it back. The kernel stamps it from the coarse clock (which lags the
   real time by up to a tick or two) or, on filesystems with fine-grained
   timestamps, from the real time. So when a preview is created corral
   reads the real time ``T`` and waits until the coarse clock has caught up
   with it (about 7 ms on a 250 Hz kernel): a change made before has
   ``ctime < T`` whichever clock stamped it, a change made after has
   ``ctime >= T``. At apply time "exists and ``ctime >= T``" therefore
   means "created or changed since the preview began".

2. **Absence needs a record.** A file deleted from the real workspace leaves
   no ctime behind. At the end of every run corral records, for each path
   the change set touches and not recorded yet, whether it was ``present``
   (with its type), ``absent``, or already ``changed`` (ctime rule) - and,
   for an absent path whose parent directory changed since ``T``,
   ``unknown``. A path recorded present and missing at apply was deleted in
   the real workspace: a conflict.

The copy mechanism knows the whole starting tree anyway: its manifest is the
record (``present`` for every copied entry, ``absent`` otherwise).

Limits (see docs/preview.md): filesystems with coarse timestamps (FAT: 2 s)
can hide a change made in the same interval; a clock stepped backwards can
too.
"""

from __future__ import annotations

import os
import time

from ._layers import kind_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = ["ABSENT", "CHANGED", "UNKNOWN", "base_time_ns", "exact", "find_conflicts", "observe"]

#: record values (``present:<kind>`` otherwise)
ABSENT = "absent"
CHANGED = "changed"
UNKNOWN = "unknown"

_CLOCK_REALTIME_COARSE = 5  # Linux clock id; ctime is stamped from this clock


def base_time_ns() -> int:
    """A preview's base time ``T``: now, once the coarse clock has caught up with it.

    Every change made before the call has ``ctime < T`` and every change
    after it ``ctime >= T``, whether the filesystem stamps ctime from the
    coarse or the fine clock.
    """
    now = time.time_ns()
    try:
        while time.clock_gettime_ns(_CLOCK_REALTIME_COARSE) < now:
            time.sleep(0.001)
    except OSError:  # pragma: no cover - every Linux since 2.6.32 has the coarse clock
        pass
    return now


def observe(
    workspace: str, rel: str, base_ns: int, records: Mapping[str, str] | None = None
) -> str:
    """What the real workspace shows at *rel* now, judged against base time *base_ns*.

    ``present:<kind>``, ``changed`` (ctime at or after the base time),
    ``absent``, or ``unknown`` (absent, and its directory changed since the
    base time: it may have been deleted). *records* can vouch for
    directories that changed only by corral's own apply (``exact:`` records).
    """
    path = f"{workspace}/{rel}"
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return UNKNOWN if _parent_changed(workspace, rel, base_ns, records or {}) else ABSENT
    kind = kind_of(st.st_mode)
    if kind != "dir" and st.st_ctime_ns >= base_ns:
        return CHANGED
    return f"present:{kind}"


def exact(workspace: str, rel: str) -> str:
    """An ``exact:<kind>:<inode>:<ctime>`` record of *rel* as it is now (``absent`` if missing).

    Written after apply: the path then counts as unchanged as long as it
    still matches, although its ctime is after the base time.
    """
    try:
        st = os.lstat(f"{workspace}/{rel}" if rel else workspace)
    except (FileNotFoundError, NotADirectoryError):
        return ABSENT
    return f"exact:{kind_of(st.st_mode)}:{st.st_ino}:{st.st_ctime_ns}"


def _matches_exact(record: str | None, st: os.stat_result) -> bool:
    if record is None or not record.startswith("exact:"):
        return False
    _tag, kind, ino, ctime = record.split(":")
    return kind == kind_of(st.st_mode) and int(ino) == st.st_ino and int(ctime) == st.st_ctime_ns


def _parent_changed(workspace: str, rel: str, base_ns: int, records: Mapping[str, str]) -> bool:
    """Whether the nearest existing ancestor of *rel* changed since *base_ns*.

    A directory's ctime changes when entries are added or removed; a file
    in the way (``a`` for ``a/b``) changes its own when it is replaced. Either
    way an unchanged ancestor means *rel* did not exist at the base time.
    """
    parts = rel.split("/")[:-1]
    while True:
        path = "/".join([workspace, *parts]) if parts else workspace
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            if not parts:
                return True
            parts.pop()
            continue
        if _matches_exact(records.get("/".join(parts)), st):
            return False
        return st.st_ctime_ns >= base_ns


def find_conflicts(
    workspace: str, paths: Iterable[str], records: Mapping[str, str], base_ns: int
) -> list[tuple[str, str]]:
    """``(path, why)`` for each of *paths* changed in the real workspace since the base time."""
    conflicts: list[tuple[str, str]] = []
    for rel in paths:
        recorded = records.get(rel)
        if recorded is not None and recorded.startswith("exact:"):
            try:
                st: os.stat_result | None = os.lstat(f"{workspace}/{rel}")
            except (FileNotFoundError, NotADirectoryError):
                st = None
            if st is None:
                conflicts.append((rel, "deleted in the real workspace since corral applied it"))
            elif not _matches_exact(recorded, st) and (
                kind_of(st.st_mode) != "dir" or recorded.split(":")[1] != "dir"
            ):
                conflicts.append((rel, "changed in the real workspace since corral applied it"))
            continue
        now = observe(workspace, rel, base_ns, records)
        if recorded == CHANGED:
            conflicts.append((rel, "changed in the real workspace while the preview ran"))
        elif recorded == UNKNOWN:
            conflicts.append(
                (rel, "its directory changed in the real workspace while the preview ran")
            )
        elif now == CHANGED:
            conflicts.append((rel, "changed in the real workspace since the preview began"))
        elif now == UNKNOWN and recorded is None:
            conflicts.append(
                (rel, "its directory changed in the real workspace since the preview began")
            )
        elif recorded == ABSENT and now.startswith("present:"):
            conflicts.append((rel, "created in the real workspace since the preview began"))
        elif recorded is not None and recorded.startswith("present:") and now != recorded:
            what = "deleted" if not now.startswith("present:") else "replaced"
            conflicts.append((rel, f"{what} in the real workspace since the preview began"))
    return conflicts
