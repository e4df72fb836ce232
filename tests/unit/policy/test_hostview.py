"""HostView: one look's answers are the kernel's, and no look sees another's.

The view answers the checks of one look at the host (links that steer a
rule, what an entry resolves to, what a kept sandbox compares before each
command). Its answers must be exactly what ``os.lstat``, ``os.readlink`` and
``os.path.realpath`` say on a tree with every kind of link (absolute,
relative, chained, dangling, loops, through a file, ``..``), and a change of
the host between two looks must be seen by the second.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral.pipeline._request import ExecRequest
from corral.pipeline._resident_look import _looked_at
from corral.policy import Policy
from corral.policy._expand import _resolved, _steerable_link, expand_deny_read
from corral.policy._hostview import HostView


def _tree(root: Path) -> list[str]:
    """A tree of awkward links below *root*; returns paths to ask about."""
    (root / "real" / "sub").mkdir(parents=True)
    (root / "real" / "sub" / "secret").write_text("s")
    (root / "file").write_text("f")
    links = {
        "abs": str(root / "real"),
        "rel": "real/sub",
        "chain": "abs",
        "chain2": "./chain/sub/../sub",
        "dangling": "nowhere/at/all",
        "loop1": "loop2",
        "loop2": "loop1",
        "self": "self",
        "up": "real/sub/../..",
        "tofile": "file",
        "real/sub/back": "../../abs/sub",
        "real/sub/root": "/",
    }
    for name, target in links.items():
        os.symlink(target, root / name)
    tails = [
        "",
        "real",
        "real/sub/secret",
        "abs/sub/secret",
        "rel/secret",
        "chain/sub/secret",
        "chain2/secret",
        "dangling",
        "dangling/deeper",
        "loop1",
        "loop1/x/y",
        "self/x",
        "up/real/sub",
        "tofile",
        "tofile/below",
        "file/below",
        "missing",
        "missing/below/more",
        "missing/../real/sub",
        "real/./sub//secret",
        "real/sub/back/secret",
        "real/sub/root" + str(root) + "/abs/sub",
        "abs/sub/secret/",
        "real/sub/",
    ]
    return [str(root / tail) if tail else str(root) for tail in tails]


def _lstat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_mode, st.st_dev, st.st_ino


def test_the_view_answers_as_the_kernel_does(tmp_path: Path) -> None:
    paths = _tree(tmp_path)
    view = HostView()
    for path in paths:
        assert view.realpath(path) == os.path.realpath(path), path
        found = view.lstat(path)
        assert (found and (found.st_mode, found.st_dev, found.st_ino)) == (_lstat(path) or None)
        if found is not None and stat.S_ISLNK(found.st_mode):
            assert view.readlink(path) == os.readlink(path)
        else:
            assert view.readlink(path) is None
        # the rule _resolved kept before the view: lexists, realpath, lexists
        real = os.path.realpath(path)
        before = real if os.path.lexists(path) and os.path.lexists(real) else path
        assert _resolved(path, HostView()) == before, path
        assert _resolved(path, view) == before, path
    # asked again of the same view (answers from its memory): still the same
    for path in paths:
        assert view.realpath(path) == os.path.realpath(path), path


def test_each_look_sees_the_host_as_it_is_now(tmp_path: Path) -> None:
    # a view remembers one look's answers; a kept sandbox's look before each command
    # builds a new one, so a rename, a re-pointed link or a directory made anew between
    # two commands is seen by the very next look
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "secret").write_text("a")
    (tmp_path / "b" / "secret").write_text("b")
    os.symlink("a", tmp_path / "home")
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("old")
    ws = tmp_path / "ws"
    ws.mkdir()
    deny = (str(tmp_path / "home" / "secret"), str(tmp_path / "dir"), str(tmp_path / "file"))
    policy = Policy.for_workspace(str(ws), home=str(tmp_path / "nohome"))
    policy = policy.replace(filesystem=policy.filesystem.replace(deny_read=deny))
    request = ExecRequest.from_argv(["true"], cwd=str(ws))

    def look() -> object:
        return _looked_at(request, policy)

    first = look()
    assert first is not None and look() == first  # nothing changed: the same look
    assert str(tmp_path / "a" / "secret") in expand_deny_read(policy).filesystem.deny_read

    os.unlink(tmp_path / "home")  # re-pointed link
    os.symlink("b", tmp_path / "home")
    relinked = look()
    assert relinked != first
    assert str(tmp_path / "b" / "secret") in expand_deny_read(policy).filesystem.deny_read

    (tmp_path / "new").write_text("new")  # a file replaced by a rename
    os.rename(tmp_path / "new", tmp_path / "file")
    renamed = look()
    assert renamed != relinked

    os.rmdir(tmp_path / "dir")  # a directory made anew
    (tmp_path / "dir").mkdir()
    assert look() != renamed

    # a view itself is one moment: it does not see what changed after it looked
    view = HostView()
    assert view.realpath(deny[0]) == str(tmp_path / "b" / "secret")
    os.unlink(tmp_path / "home")
    os.symlink("a", tmp_path / "home")
    assert view.realpath(deny[0]) == str(tmp_path / "b" / "secret")
    assert HostView().realpath(deny[0]) == str(tmp_path / "a" / "secret")


def test_a_shared_view_steers_no_walk_otherwise(tmp_path: Path) -> None:
    # the steerable-link walk skips the parent of a path an earlier walk of the same look
    # found no link on: every verdict equals the one a walk of its own view gives
    paths = _tree(tmp_path)
    writable = (str(tmp_path / "real"),)  # real/sub/back and real/sub/root steer
    os.symlink("../real/sub/back", tmp_path / "real" / "via")
    paths += [str(tmp_path / "real" / p) for p in ("via/secret", "sub/x", "sub/back", "via")]
    expected = {path: _steerable_link(path, writable, HostView()) for path in paths}
    assert expected[str(tmp_path / "real/sub/back/secret")] == str(tmp_path / "real/sub/back")
    for order in (paths, sorted(paths), sorted(paths, key=len), sorted(paths, reverse=True)):
        view = HostView()
        for path in order:
            assert _steerable_link(path, writable, view) == expected[path], path
