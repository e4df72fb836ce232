"""The server's settings cache (corral.policy._watched): reused only while nothing it read changed.

Every test warms the cache until a hook answer is *reused* (so the test could
fail: a stale answer would be served), then makes a real change on disk -
an edit in place, a rename over the file, a parent directory replaced, a
symbolic link swapped, a mount over a directory - and checks that the very
next hook answer obeys it. Real inotify, real files, the real hook answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral._inotify import Inotify
from corral.cli.commands.hook import answer
from corral.policy import _watchcache, _watched

DENY = {"permissions": {"deny": ["Bash(rm:*)"]}}
NONE: dict[str, object] = {"permissions": {"deny": []}}


class Hook:
    """A workspace, a home, and the hook answered in this process through a fresh cache."""

    def __init__(self, root: Path, cache: _watchcache.WatchedCache) -> None:
        self.root = root
        self.cache = cache
        self.home = root / "home"
        self.workspace = root / "ws"
        (self.workspace / ".git").mkdir(parents=True)
        self.home.mkdir()
        self.environ = {"HOME": str(self.home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def decision(self, command: str = "rm -rf build", tool: str = "Bash") -> str:
        field = "command" if tool == "Bash" else "file_path"
        payload = {
            "session_id": "s",
            "cwd": str(self.workspace),
            "hook_event_name": "PreToolUse",
            "tool_name": tool,
            "tool_input": {field: command},
        }
        result = answer(
            "claude-code",
            json.dumps(payload).encode(),
            environ=self.environ,
            python_cli=("/usr/bin/python3", "-m", "corral"),
        )
        assert result.status == 0, result.stderr
        if not result.stdout:
            return "none"
        return str(json.loads(result.stdout)["hookSpecificOutput"]["permissionDecision"])

    def warm(self, expected: str, **kwargs: str) -> None:
        """Answer until the answer comes from the cache (fails if it never does)."""
        reused = self.cache.reused
        for _ in range(4):
            assert self.decision(**kwargs) == expected
        assert self.cache.reused > reused, "the cache never reused an answer"


@pytest.fixture
def hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hook]:
    try:
        inotify = Inotify()
    except OSError as exc:
        pytest.skip(f"no inotify instance for this user: {exc}")
    cache = _watchcache.WatchedCache(inotify)
    monkeypatch.setattr(_watched, "_cache", cache)
    try:
        yield Hook(tmp_path, cache)
    finally:
        cache.close()
        inotify.close()


def _write(path: Path, document: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def _in_place(path: Path, document: object) -> None:
    with open(path, "r+") as f:  # same inode, truncated and rewritten
        f.truncate(0)
        f.write(json.dumps(document))


def _by_rename(path: Path, document: object) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)


def _parent_replaced(path: Path, document: object) -> None:
    fresh = path.parent.with_name(path.parent.name + ".new")
    _write(fresh / path.name, document)
    old = path.parent.with_name(path.parent.name + ".old")
    os.rename(path.parent, old)
    os.rename(fresh, path.parent)
    shutil.rmtree(old)


EDITS: dict[str, Callable[[Path, object], None]] = {
    "in place": _in_place,
    "by rename": _by_rename,
    "parent directory replaced": _parent_replaced,
}


@pytest.mark.parametrize("edit", EDITS)
@pytest.mark.parametrize("where", ["project", "user"])
def test_a_deny_rule_added_applies_to_the_very_next_call(hook: Hook, edit: str, where: str) -> None:
    base = hook.workspace if where == "project" else hook.home
    rules = base / ".claude" / "settings.json"
    _write(rules, NONE)
    hook.warm("allow")
    EDITS[edit](rules, DENY)
    assert hook.decision() == "deny"
    hook.warm("deny")
    EDITS[edit](rules, NONE)
    assert hook.decision() == "allow"


def test_a_rules_file_created_where_none_was_applies_at_once(hook: Hook) -> None:
    hook.warm("allow")
    _write(hook.workspace / "sub" / ".claude" / "settings.json", DENY)  # below: not read
    assert hook.decision() == "allow"
    _write(hook.workspace / ".claude" / "settings.local.json", DENY)
    assert hook.decision() == "deny"


def test_a_symlink_swap_anywhere_on_the_path_applies_at_once(hook: Hook) -> None:
    good, bad = hook.root / "rules-good", hook.root / "rules-bad"
    _write(good / "settings.json", NONE)
    _write(bad / "settings.json", DENY)
    (hook.workspace / ".claude").symlink_to(good)  # the directory is a link
    hook.warm("allow")
    swap = hook.workspace / ".claude.tmp"
    swap.symlink_to(bad)
    os.replace(swap, hook.workspace / ".claude")
    assert hook.decision() == "deny"
    # a link to a link: the file itself, then the middle link's target, changes
    os.unlink(hook.workspace / ".claude")
    (hook.workspace / ".claude").mkdir()
    middle = hook.root / "middle.json"
    middle.symlink_to(good / "settings.json")
    (hook.workspace / ".claude" / "settings.json").symlink_to(middle)
    hook.warm("allow")
    swap = hook.root / "middle.tmp"
    swap.symlink_to(bad / "settings.json")
    os.replace(swap, middle)
    assert hook.decision() == "deny"
    hook.warm("deny")
    _in_place(bad / "settings.json", NONE)  # the final target, written through its own name
    assert hook.decision() == "allow"


def test_a_hard_link_written_under_another_name_applies_at_once(hook: Hook) -> None:
    rules = hook.workspace / ".claude" / "settings.json"
    _write(rules, NONE)
    other = hook.root / "elsewhere.json"
    os.link(rules, other)
    hook.warm("allow")
    _in_place(other, DENY)
    assert hook.decision() == "deny"


def test_corral_settings_edits_apply_at_once(hook: Hook) -> None:
    """The user's corral settings decide Write: a new denyWrite applies to the next call."""
    target = str(hook.workspace / "notes.txt")
    hook.warm("none", command=target, tool="Write")
    _write(
        hook.home / ".config" / "corral" / "settings.json",
        {"filesystem": {"denyWrite": [target]}},
    )
    assert hook.decision(target, tool="Write") == "deny"
    hook.warm("deny", command=target, tool="Write")
    (hook.home / ".config" / "corral" / "settings.json").unlink()
    assert hook.decision(target, tool="Write") == "none"


def test_the_environment_is_part_of_the_key(hook: Hook) -> None:
    _write(hook.root / "claude-config" / "settings.json", DENY)
    hook.warm("allow")
    hook.environ["CLAUDE_CONFIG_DIR"] = str(hook.root / "claude-config")
    assert hook.decision() == "deny"
    del hook.environ["CLAUDE_CONFIG_DIR"]
    assert hook.decision() == "allow"


def test_without_watches_left_every_call_reads_the_files(
    hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch limit reached: nothing is stored, and every decision is still right."""
    monkeypatch.setattr(_watchcache, "MAX_WATCHES", 0)
    rules = hook.workspace / ".claude" / "settings.json"
    _write(rules, NONE)
    for _ in range(3):
        assert hook.decision() == "allow"
    _in_place(rules, DENY)
    assert hook.decision() == "deny"
    assert (hook.cache.stored, hook.cache.reused) == (0, 0)


def test_an_unwatchable_filesystem_is_never_cached(
    hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path on a filesystem outside the trusted list (here: none is trusted) is read each time."""
    monkeypatch.setattr(_watchcache, "LOCAL_FILESYSTEMS", frozenset())
    for _ in range(3):
        assert hook.decision() == "allow"
    assert (hook.cache.stored, hook.cache.reused) == (0, 0)


MOUNT_SCRIPT = r"""
import json, os, subprocess, sys
from corral._inotify import Inotify
from corral.cli.commands.hook import answer
from corral.policy import _watched

root = sys.argv[1]
ws = os.path.join(root, "ws")
cache = _watched.install(Inotify())
payload = json.dumps({"session_id": "s", "cwd": ws, "hook_event_name": "PreToolUse",
                      "tool_name": "Bash", "tool_input": {"command": "rm -rf build"}}).encode()
env = {"HOME": os.path.join(root, "home")}

def decision():
    out = answer("claude-code", payload, environ=env, python_cli=("python3",)).stdout
    return json.loads(out)["hookSpecificOutput"]["permissionDecision"]

for _ in range(4):
    assert decision() == "allow"
assert cache.reused > 0
subprocess.run(["mount", "--bind", os.path.join(root, "deny"), os.path.join(ws, ".claude")],
               check=True)
print(decision())
"""


def test_a_mount_over_a_watched_directory_applies_at_once(tmp_path: Path) -> None:
    """A bind mount sends no inotify event; the mount table's change empties the cache."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1)")
    (tmp_path / "ws" / ".git").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    _write(tmp_path / "ws" / ".claude" / "settings.json", NONE)
    _write(tmp_path / "deny" / "settings.json", DENY)
    argv = [unshare, "--user", "--map-root-user", "--mount", sys.executable, "-c"]
    result = subprocess.run(
        [*argv, MOUNT_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0 and "unshare" in result.stderr and "Traceback" not in result.stderr:
        pytest.skip(f"no user and mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "deny\n"


TRACE_SCRIPT = r"""
import json, os, sys
from corral.integrations._permissions import file_rules
from corral.policy import _watched, load_settings, trust_project

root = sys.argv[1]
env = {"HOME": os.path.join(root, "home"), "CORRAL_SETTINGS": os.path.join(root, "extra.json")}
workspace = os.path.join(root, "worktree")
trust_project(workspace, environ=env)
cwd = os.path.join(workspace, "sub")

def both():
    load_settings(cwd=cwd, environ=env)
    file_rules(cwd, env)

both()  # imports and first-use work happen outside the traced window
recorder = _watched._Recorder()
_watched._local.recorder = recorder
os.write(2, b"=====BEGIN\n")
both()
os.write(2, b"=====END\n")
_watched._local.recorder = None
print(json.dumps(sorted(recorder.paths)))
"""


def test_every_path_the_loaders_touch_is_recorded(tmp_path: Path) -> None:
    """strace the settings and rules loaders: every path a system call names is a dependency.

    The cache is only as exact as this list; a new file read without
    ``depends_on`` fails here. ``/etc/passwd`` (and NSS's configuration) is
    read for the user database's home, a fact re-checked on every reuse instead.
    """
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("no strace")
    repo = tmp_path / "repo"
    (repo / ".git" / "worktrees" / "wt").mkdir(parents=True)
    (repo / ".git" / "worktrees" / "wt" / "commondir").write_text("../..\n")
    (repo / ".git" / "objects").mkdir()
    (repo / ".git" / "refs").mkdir()
    worktree = tmp_path / "worktree"
    (repo / ".git" / "worktrees" / "wt" / "gitdir").write_text(f"{worktree}/.git\n")
    (worktree / "sub").mkdir(parents=True)
    (worktree / ".git").write_text(f"gitdir: {repo}/.git/worktrees/wt\n")
    _write(tmp_path / "home" / ".config" / "corral" / "settings.json", {"env": {"set": {"A": "1"}}})
    _write(tmp_path / "extra.json", {"resources": {"timeout": "5m"}})
    _write(worktree / ".corral" / "settings.json", {"env": {"set": {"B": "2"}}})
    _write(worktree / ".claude" / "settings.json", DENY)
    _write(tmp_path / "home" / ".claude" / "settings.json", DENY)
    trace = tmp_path / "trace"
    argv = [strace, "-f", "-qq", "-e", "trace=%file,getdents64,write", "-o", str(trace)]
    result = subprocess.run(
        [*argv, sys.executable, "-c", TRACE_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0 and "PTRACE" in result.stderr.upper():
        pytest.skip(f"strace cannot trace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    recorded = set(json.loads(result.stdout))
    lines = trace.read_text().splitlines()
    begin = next(i for i, line in enumerate(lines) if "=====BEGIN" in line)
    end = next(i for i, line in enumerate(lines) if "=====END" in line)
    touched = set()
    for line in lines[begin + 1 : end]:
        call = line.split(None, 1)[1] if line[:1].isdigit() else line
        if call.startswith(("write(", "getcwd(")) or '"' not in call:
            continue
        touched.add(call.split('"')[1])
    assert touched, "the trace saw no file access: it checks nothing"
    components = {part for path in recorded for part in path.split("/")}

    def covered(path: str) -> bool:
        if not path.startswith("/"):  # openat relative to a directory it opened
            return all(part in components for part in path.split("/") if part)
        return any(r == path or r.startswith(path.rstrip("/") + "/") for r in recorded)

    facts = {"/etc/passwd", "/etc/nsswitch.conf", "/etc/group"}
    missing = sorted(p for p in touched - facts if p and not covered(p))
    assert not missing, f"read without being recorded as dependencies: {missing}"


def _rewritten(hook: Hook) -> str:
    payload = {
        "session_id": "s",
        "cwd": str(hook.workspace),
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "true"},
    }
    result = answer(
        "claude-code",
        json.dumps(payload).encode(),
        environ=hook.environ,
        python_cli=("/usr/bin/python3", "-m", "corral"),
    )
    assert result.status == 0, result.stderr
    return str(json.loads(result.stdout)["hookSpecificOutput"]["updatedInput"]["command"])


def test_the_fast_client_made_unusable_is_not_named_by_the_next_call(
    hook: Hook, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast-client check is cached too: a chmod -x of the binary applies at once."""
    from corral.server import _fastclient

    built = _fastclient.client_path()
    if not os.access(built, os.X_OK):
        pytest.skip("the fast client is not built (make native)")
    client = hook.root / "bin" / "corral-client"
    client.parent.mkdir()
    shutil.copy2(built, client)
    monkeypatch.setattr(_fastclient, "client_path", lambda: str(client))
    reused = hook.cache.reused
    for _ in range(3):
        assert f"{client} run " in _rewritten(hook)
    assert hook.cache.reused > reused
    client.chmod(0o644)
    assert f"{client} run " not in _rewritten(hook)
    assert "/usr/bin/python3 -m corral run " in _rewritten(hook)


def test_a_workspace_turned_into_a_linked_worktree_is_handed_off_at_once(hook: Hook) -> None:
    """The workspace's layout is cached too: a .git file appearing changes the rewrite."""
    for _ in range(3):
        assert "--command-file" not in _rewritten(hook)
    common = hook.root / "repo" / ".git"
    (common / "worktrees" / "ws").mkdir(parents=True)
    (common / "objects").mkdir(exist_ok=True)
    (common / "refs").mkdir(exist_ok=True)
    (common / "worktrees" / "ws" / "commondir").write_text("../..\n")
    os.rmdir(hook.workspace / ".git")
    (hook.workspace / ".git").write_text(f"gitdir: {common}/worktrees/ws\n")
    # nothing vouches for it yet (a planted .git file): not a worktree
    assert "--command-file" not in _rewritten(hook)
    (common / "worktrees" / "ws" / "gitdir").write_text(f"{hook.workspace}/.git\n")
    assert "--command-file" in _rewritten(hook)
