"""``corral audit``: show, follow or verify the hash-chained audit log."""

from __future__ import annotations

import argparse
import sys
import time

from ..._audit import audit_path, read_new, verify
from ..._jsonfast import JSONError, loads
from ..._state import state_dir
from .. import EXIT_USAGE, print_error

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral audit",
        description="Show the audit log: one record per sandboxed run, hash-chained.",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the raw JSON records (one per line)"
    )
    parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new records as they arrive"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="check the hash chain; exit 1 and name the first bad record if it was edited or cut",
    )
    parser.add_argument(
        "-n", "--lines", type=int, default=20, help="how many recent records to show (default 20)"
    )
    return parser


def _row(record: dict[str, object]) -> str:
    argv = record.get("argv") or []
    command = " ".join(str(a) for a in argv) if isinstance(argv, list) else str(argv)
    if len(command) > 60:
        command = command[:57] + "..."
    violations = record.get("violations") or []
    flag = f" blocked={len(violations)}" if isinstance(violations, list) and violations else ""
    return (
        f"{record.get('seq', '?'):>5} {record.get('time', '?')} {record.get('sandbox_id', '?')} "
        f"{record.get('backend', '?'):<10} exit={record.get('exit_status', '?'):<3} "
        f"{float(str(record.get('duration') or 0)):7.3f}s{flag}  {command}"
    )


def _show(line: bytes, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(line.decode("utf-8", "replace") + "\n")
        return
    try:
        record = loads(line)
    except JSONError:
        sys.stdout.write(f"  (unreadable record: {line[:80]!r})\n")
        return
    sys.stdout.write(_row(record if isinstance(record, dict) else {}) + "\n")


def main(args: list[str]) -> int:
    """Entry point."""
    try:
        ns = _parser().parse_args(args)
    except SystemExit as exc:
        return 0 if exc.code == 0 else EXIT_USAGE
    directory = state_dir()
    if ns.verify:
        ok, message = verify(directory)
        (sys.stdout if ok else sys.stderr).write(("" if ok else "corral: ") + message + "\n")
        return 0 if ok else 1
    path = audit_path(directory)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        data = b""
    complete = data[: data.rfind(b"\n") + 1]  # a record still being written is followed later
    lines = complete.splitlines()
    for line in lines[-ns.lines :] if ns.lines > 0 else ([] if ns.follow else lines):
        _show(line, ns.json)
    sys.stdout.flush()
    if not ns.follow:
        return 0
    position = len(complete)
    try:
        while True:
            time.sleep(0.25)
            lines, new_position = read_new(path, position)
            if new_position < position:
                print_error("the audit log shrank; starting over from its beginning")
            position = new_position
            for line in lines:
                _show(line, ns.json)
            if lines:
                sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
