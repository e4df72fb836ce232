"""Rendering a change set for review: diffs, --stat, escaping of hostile content."""

from __future__ import annotations

import os

from corral.preview._changes import compute_changes
from corral.preview._layers import Layer
from corral.preview._render import escape, render_diff, render_stat


def write(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())
    os.chmod(path, mode)


def changeset(tmp_path):
    ws, upper = str(tmp_path / "ws"), str(tmp_path / "upper")
    os.makedirs(ws)
    os.makedirs(upper)
    return ws, upper, lambda: compute_changes(Layer(upper, "overlay"), ws, preview_id="pv-test")


def test_unified_diff_of_a_text_change(tmp_path):
    ws, upper, changes = changeset(tmp_path)
    write(f"{ws}/a.py", "one\ntwo\nthree\n")
    write(f"{upper}/a.py", "one\n2\nthree\nfour")
    lines = list(render_diff(changes()))
    assert lines == [
        "=== modified a.py",
        "@@ -1,3 +1,4 @@",
        " one",
        "-two",
        "+2",
        " three",
        "+four",
        "\\ No newline at end of file",
    ]


def test_binary_files_are_shown_by_size_and_hash(tmp_path):
    _ws, upper, changes = changeset(tmp_path)
    write(f"{upper}/blob.bin", b"\x00\x01\x02")
    lines = list(render_diff(changes()))
    assert lines[0] == "=== added file blob.bin"
    assert lines[1] == "mode 0644"
    assert lines[2] == (
        "binary file, new: 3 bytes, sha256 "
        "ae4b3280e56e2faf83f414a6e3dabe9d5fbe18976544c05fed121accb85b53fc"
    )


def test_control_characters_from_the_sandbox_never_reach_the_terminal(tmp_path):
    _ws, upper, changes = changeset(tmp_path)
    write(f"{upper}/evil\x1b[2Jname", "\x1b]0;pwned\x07text\n")
    out = "\n".join([*render_diff(changes()), *render_stat(changes())])
    assert "\x1b" not in out
    assert "\x07" not in out
    assert "evil\\x1b[2Jname" in out
    assert "+\\x1b]0;pwned\\x07text" in out


def test_escape_keeps_tabs_and_printable_unicode_but_shows_invalid_bytes():
    assert escape("a\tb ü") == "a\tb ü"
    assert escape("x\x9by") == "x\\x9by"
    assert escape(os.fsdecode(b"bad\xffname")) == "bad\\xffname"


def test_stat_lines_and_summary(tmp_path):
    ws, upper, changes = changeset(tmp_path)
    write(f"{ws}/m.txt", "a\nb\n")
    write(f"{upper}/m.txt", "a\nc\nd\n", 0o755)
    write(f"{upper}/n.txt", "new\n")
    lines = list(render_stat(changes()))
    assert lines == [
        " M m.txt | +2 -1 (mode 0644 -> 0755)",
        " A n.txt | +1 -0",
        " 1 added, 1 modified; 3 line(s) added, 1 removed",
    ]


def test_colour_only_when_asked(tmp_path):
    _ws, upper, changes = changeset(tmp_path)
    write(f"{upper}/n.txt", "new\n")
    assert not any("\x1b[" in line for line in render_diff(changes(), color=False))
    assert any(line == "\x1b[32m+new\x1b[0m" for line in render_diff(changes(), color=True))
