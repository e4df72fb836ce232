"""A server that gets no inotify instance still starts, serves, and never serves stale code.

The kernel's refusal is real: the test runs in a user namespace (and a network
namespace, for its own server slots) whose ``max_inotify_instances`` is 0, so
``inotify_init1`` fails with ``EMFILE`` as it does when a user's 128
instances are spent. corral runs from a copy of its package, which the test
then edits; the server must notice before it serves the next request. Its
hook answers, without the settings cache (it needs inotify), read the files
each time: an edited deny rule applies to the next call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import corral
from tests.conftest import World

DRIVER = r"""
import json, os, subprocess, sys, time

package, state = sys.argv[1], sys.argv[2]
corral = [sys.executable, "-m", "corral"]

def run(*args):
    r = subprocess.run([*corral, *args], capture_output=True, timeout=120)
    return r.returncode, r.stdout.decode(), r.stderr.decode()

def server_log():
    with open(os.path.join(state, "server", "server.log")) as f:
        return f.read()

out = {"start": run("server", "--detach")}
status = json.loads(run("server", "--status", "--json")[1] or "null")
out["first"] = run("run", "--", "echo", "first")
out["served"] = json.loads(run("server", "--status", "--json")[1] or "null")["served"]

# the hook, answered by this server without a settings cache: an edited deny rule applies at once
rules = os.path.join(os.getcwd(), ".claude", "settings.json")
os.makedirs(os.path.dirname(rules), exist_ok=True)
with open(rules, "w") as f:
    f.write('{"permissions": {"deny": []}}')
payload = json.dumps({"session_id": "s", "cwd": os.getcwd(), "hook_event_name": "PreToolUse",
                      "tool_name": "Bash", "tool_input": {"command": "rm -rf build"}}).encode()

def hook():
    r = subprocess.run([os.path.join(package, "_bin", "corral-client"), "hook", "claude-code"],
                       input=payload, capture_output=True, timeout=60)
    return json.loads(r.stdout)["hookSpecificOutput"]["permissionDecision"] if r.stdout else r.stderr.decode()

out["hooks_before"] = [hook() for _ in range(3)]
with open(rules, "r+") as f:
    f.truncate(0)
    f.write('{"permissions": {"deny": ["Bash(rm:*)"]}}')
out["hook_after"] = hook()
hook_status = json.loads(run("server", "--status", "--json")[1] or "null")
out["hook_status"] = [hook_status["hooks"], hook_status["settings_cache"]]
with open(os.path.join(package, "server", "_wire.py"), "a") as f:
    f.write("# edited\n")
out["second"] = run("run", "--", "echo", "second")  # at once: before any periodic check
deadline = time.monotonic() + 30
while os.path.exists(f"/proc/{status['pid']}") and time.monotonic() < deadline:
    time.sleep(0.05)
out["old_gone"] = not os.path.exists(f"/proc/{status['pid']}")
out["log"] = server_log()
new = json.loads(run("server", "--status", "--json")[1] or "null")
if new is not None:
    run("server", "--stop")
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{new['pid']}") and time.monotonic() < deadline:
        time.sleep(0.05)
print(json.dumps(out))
"""


def test_without_inotify_the_server_serves_and_retires_on_a_code_change(world: World) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux)")
    copy = os.path.join(world.root, "lib")
    package = os.path.join(copy, "corral")
    shutil.copytree(
        os.path.dirname(corral.__file__),
        package,
        ignore=shutil.ignore_patterns("__pycache__"),
        symlinks=True,
    )
    env = {k: v for k, v in world.environ.items() if k != "CORRAL_SERVER"}
    env["PYTHONPATH"] = copy
    state = os.path.join(world.home, ".local", "state", "corral")
    result = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--net",
            "sh",
            "-c",
            'echo 0 > /proc/sys/user/max_inotify_instances && exec "$0" -c "$@"',
            sys.executable,
            DRIVER,
            package,
            state,
        ],
        env=env,
        cwd=world.workspace,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    out = json.loads(result.stdout)
    assert out["start"][0] == 0, out["start"]
    assert out["first"] == [0, "first\n", ""]
    assert out["served"] == 1
    assert out["hooks_before"] == ["allow"] * 3
    assert out["hook_after"] == "deny"
    assert out["hook_status"] == [4, None]  # all four served, and by reading the files
    assert out["second"][:2] == [0, "second\n"]
    assert out["old_gone"]
    log = out["log"]
    assert "no inotify (Too many open files): checking the code's files by stat" in log
    assert "settings cache: off (no inotify)" in log
    # seen at the request (or by the idle check before it): the old server never served it
    assert "code changed on disk (_wire.py)" in log
    assert "exiting: served 1," in log
