"""A command's own extended attributes are never read as overlay metadata (issue 10, section 5).

A command that sets ``user.overlay.opaque`` (or the whiteout and redirect
attributes) on a directory must not make the preview report, or apply,
deletions of files it never deleted.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.preview.conftest import World

MARKERS = (
    ("user.overlay.opaque", b"y"),
    ("user.overlay.opaque", b"x"),
    ("user.overlay.redirect", b"/elsewhere"),
    ("user.overlay.metacopy", b""),
    ("user.fuseoverlayfs.opaque", b"y"),
)


@pytest.mark.parametrize(("name", "value"), MARKERS)
def test_command_xattrs_are_not_overlay_metadata(world: World, name: str, value: bytes) -> None:
    world.write("d/keep1.txt", "one\n")
    world.write("d/keep2.txt", "two\n")
    preview = world.preview("overlay")
    code = (
        "import os; open('d/new.txt', 'w').write('new'); "
        "open('d/empty', 'w').close(); "
        f"os.setxattr('d/empty', 'user.overlay.whiteout', b''); "
        f"os.setxattr('d', {name!r}, {value!r}); print('set')"
    )
    outcome = world.run(preview, f'/usr/bin/python3 -c "{code}"')
    if b"set" not in (outcome.stdout or b""):
        pytest.skip(f"the overlay refuses {name} here: {outcome.stderr!r}")
    changes = {c.path: c.kind for c in preview.changes()}
    assert "d/keep1.txt" not in changes and "d/keep2.txt" not in changes, changes
    assert changes.get("d/new.txt") == "added"
    assert changes.get("d/empty") == "added"
    preview.apply()
    assert world.read("d/keep1.txt") == "one\n"
    assert world.read("d/keep2.txt") == "two\n"
    assert os.path.exists(os.path.join(world.workspace, "d", "empty"))
