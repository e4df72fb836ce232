"""The peer checks' ``/proc/PID/status`` parser against a line-by-line reading of real files."""

from __future__ import annotations

import os
import subprocess
import sys

from corral._procfs import read_text, status_fields
from corral.server._peers import _CONTEXT_FIELDS, _SECURITY_FIELDS

_FIELDS = _SECURITY_FIELDS + _CONTEXT_FIELDS + ("Name", "Pid", "NoSuchField")


def _by_lines(text: str, names: tuple[str, ...]) -> dict[str, str]:
    found = dict.fromkeys(names, "")
    for line in text.split("\n"):
        key, _, value = line.partition(":")
        if key in found:
            found[key] = " ".join(value.split())
    return found


def test_every_status_file_on_this_host_parses_as_line_by_line() -> None:
    checked = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            text = read_text(f"/proc/{pid}/status")
        except OSError:
            continue  # exited meanwhile
        assert status_fields(text, _FIELDS) == _by_lines(text, _FIELDS), pid
        checked += 1
    assert checked > 5


def test_a_process_name_cannot_forge_a_field() -> None:
    """``comm`` is the one line a process writes itself; a newline in it is escaped."""
    code = (
        "import sys, time\n"
        "open('/proc/self/comm', 'w').write('\\nUid:\\t4242 424')\n"
        "print('ready', flush=True); time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        text = read_text(f"/proc/{child.pid}/status")
        assert "4242" in text  # the name is there, escaped
        uid = status_fields(text, ("Uid",))["Uid"]
        assert uid.split() == [str(os.getuid())] * 4
    finally:
        child.kill()
        child.communicate()
