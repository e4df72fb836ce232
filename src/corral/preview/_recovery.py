"""Completing applies that were interrupted (their process died)."""

from __future__ import annotations

import os

from ._mechanism import remove_tree
from ._store import _LOCK, _META, _Lock, _previews_dir, _read_json, _valid_id

__all__ = ["recover_interrupted"]


def recover_interrupted(state_dir: str) -> list[str]:
    """Complete every apply that was interrupted (its process died); return one message each.

    An apply in progress holds its preview's lock; a journal whose lock is
    free belongs to a dead process and is rolled forward (see
    :mod:`corral.preview._apply`). Cheap when there is nothing to do: one
    ``listdir`` of a directory that normally does not exist.
    """
    from ._apply import journal_dir
    from ._preview import Preview  # (it recovers before it lists or opens: imported late)

    directory = journal_dir(state_dir)
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    names = sorted(n for n in entries if n.endswith(".json"))
    for stale in (n for n in entries if n.endswith(".json.tmp")):
        _remove_stale_journal(state_dir, directory, stale)
    messages: list[str] = []
    for name in names:
        preview_id = name[: -len(".json")]
        if not _valid_id(preview_id):
            continue
        path = os.path.join(_previews_dir(state_dir), preview_id)
        lock = _Lock(os.path.join(path, _LOCK), f"preview {preview_id}")
        try:
            if not lock.acquire(wait=False):
                continue  # a live apply owns it
        except FileNotFoundError:
            os.makedirs(
                path, mode=0o700, exist_ok=True
            )  # the preview is gone; still finish the journal
            if not lock.acquire(wait=False):
                continue
        try:
            try:
                journal = _read_json(os.path.join(directory, name))
            except FileNotFoundError:
                continue  # finished meanwhile
            except ValueError:
                messages.append(
                    f"could not read the interrupted apply journal {name}; left in place"
                )
                continue
            meta_path = os.path.join(path, _META)
            if os.path.exists(meta_path):
                preview = Preview(state_dir, _read_json(meta_path))
            else:
                preview = Preview(
                    state_dir,
                    {
                        "id": preview_id,
                        "workspace": journal["workspace"],
                        "mechanism": "overlay",
                        "created": 0.0,
                        "base_ns": 0,
                    },
                )
            with preview._workspace_lock():
                failures = preview._complete(journal)
            text = f"completed the interrupted apply of {preview_id} to {journal['workspace']}"
            if failures:
                text += f"; {len(failures)} operation(s) failed: " + "; ".join(
                    f"{p}: {e}" for p, e in failures[:5]
                )
            messages.append(text)
            if not os.path.exists(meta_path) and os.path.isdir(path):
                remove_tree(path)
        finally:
            lock.release()
    return messages


def _remove_stale_journal(state_dir: str, directory: str, name: str) -> None:
    """Remove a journal that was never committed (its writer died before the rename)."""
    preview_id = name[: -len(".json.tmp")]
    if not _valid_id(preview_id):
        return
    lock = _Lock(os.path.join(_previews_dir(state_dir), preview_id, _LOCK), f"preview {preview_id}")
    try:
        if not lock.acquire(wait=False):
            return  # being written right now
    except FileNotFoundError:
        pass
    try:
        os.unlink(os.path.join(directory, name))
    except FileNotFoundError:
        pass
    finally:
        lock.release()
