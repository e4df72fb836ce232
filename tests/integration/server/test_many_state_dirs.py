"""Two hundred state directories at once: every run succeeds, one server serves them all.

The first ``corral run`` of a state directory starts a server for it; a
server started while one of the same configuration runs hands its directory
over to that one and exits (:mod:`corral.server._hub`), so the user's 200
directories are served by one process (a user holds at most ``MAX_SERVERS``
servers in any case: :mod:`corral.server._slots`). A driver process runs
``corral run -- true`` in 200 state directories at once (the Python client,
then the compiled client), counts the corral server processes of its
directories the whole time, then stops the servers and waits until no
process of the test is left.

The driver runs in a network namespace of its own: slots are abstract unix
sockets, per network namespace, so the test neither takes the slots of other
corral users of this machine nor is disturbed by them. It runs once as root
and once as uid 65534 (or, in an unprivileged test run, as that user in the
host's network namespace).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from corral.server._slots import MAX_SERVERS
from tests.conftest import World, corral_command, fast_client_path, unreadable_for

STATE_DIRS = 200
PARALLEL = 16  # clients at once; each starts at most one server

DRIVER = r"""
import json, os, subprocess, sys, threading, time
from concurrent.futures import ThreadPoolExecutor

config = json.loads(sys.argv[1])
root, base, clients = config["root"], config["env"], config["clients"]
corral = config["corral"]
states = [os.path.join(root, "states", str(n)) for n in range(config["count"])]

def env_of(state):
    return {**base, "XDG_STATE_HOME": state}

def servers():
    found = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if b"server" in words and any(w.startswith(root.encode()) for w in words):
            found.add(int(pid))
    return found

most, done = [0], threading.Event()
def count():
    while not done.is_set():
        most[0] = max(most[0], len(servers()))
        time.sleep(0.02)
counter = threading.Thread(target=count)
counter.start()

def run(client, state):
    r = subprocess.run([*client, "run", "--", "true"], env=env_of(state), cwd=config["cwd"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    return r.returncode, r.stderr.decode(errors="replace")

def listening():
    return [s for s in states if os.path.exists(os.path.join(s, "corral", "server", "server.sock"))]

def settle():
    # the servers the clients started come up and take their directories, or hand them
    # over and exit: every directory listens, and the server processes stay the same
    deadline = time.monotonic() + 60
    seen = None
    while time.monotonic() < deadline:
        now = (len(listening()), sorted(servers()))
        if now == seen and now[0] == len(states):
            break
        seen = now
        time.sleep(0.5)
    return len(servers())

results, settled = {}, []
with ThreadPoolExecutor(config["parallel"]) as pool:
    for name, client in clients.items():
        results[name] = list(pool.map(lambda s: run(client, s), states))
        settled.append(settle())
done.set()
counter.join()
live = listening()

# why a started server served its directory itself (the assertion's message)
here = []
for state in states:
    try:
        with open(os.path.join(state, "corral", "server", "server.log")) as f:
            here += [line.strip() for line in f if " here: " in line]
    except OSError:
        pass
served, pids, unanswered = 0, {}, []
for state in live:
    status = subprocess.run([*corral, "server", "--status", "--json"], env=env_of(state),
                            capture_output=True)
    data = json.loads(status.stdout or b"null") or {}
    if "pid" not in data:
        unanswered.append([state, status.returncode, status.stderr.decode(errors="replace")])
        continue
    if data["pid"] not in pids:  # one server's count, asked through any of its directories
        served += data["served"]
    pids[data["pid"]] = data["state_dirs"]
for state in states:
    subprocess.run([*corral, "server", "--stop"], env=env_of(state), capture_output=True)
deadline = time.monotonic() + 60
while servers() and time.monotonic() < deadline:
    time.sleep(0.1)
print(json.dumps({"results": results, "most": most[0], "settled": settled, "served": served,
                  "listening": len(live), "directories": sorted(pids.values()), "here": here,
                  "unanswered": unanswered,
                  "left": sorted(servers())}))
"""


def _drive(world: World, prefix: list[str]) -> dict[str, object]:
    # two rounds: the first starts the servers, the second meets the ones that could not start
    fast = fast_client_path()
    second = ("fast-client", [fast]) if fast is not None else ("python-client-2", corral_command())
    clients = {"python-client": corral_command(), second[0]: second[1]}
    env = {k: v for k, v in world.environ.items() if k != "CORRAL_SERVER"}
    config = {
        "root": world.root,
        "env": env,
        "clients": clients,
        "corral": corral_command(),
        "count": STATE_DIRS,
        "cwd": world.workspace,
        "parallel": PARALLEL,
    }
    driver = world.write(os.path.join(world.root, "driver.py"), DRIVER)
    result = subprocess.run(
        [*prefix, sys.executable, driver, json.dumps(config)],
        capture_output=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    data: dict[str, object] = json.loads(result.stdout)
    return data


def _check(data: dict[str, object]) -> None:
    results = data["results"]
    assert isinstance(results, dict)
    for name, runs in results.items():
        assert len(runs) == STATE_DIRS
        for status, stderr in runs:
            assert status == 0, f"{name}: exit {status}: {stderr}"
            # the degraded limits of an unprivileged run say so on each run (recorded)
            lines = [
                line
                for line in stderr.splitlines()
                if not line.endswith("was not enforced (allowed by allowDegraded)")
            ]
            # no warning: a server could start (or take the directory) every time
            assert lines == [], f"{name}: {stderr}"
    # a server started for a directory lives only until it has handed the directory over
    assert 0 < int(data["most"]) <= MAX_SERVERS + PARALLEL  # type: ignore[call-overload]
    # every directory is served, by one server (two started at once: one hands over)
    assert data["listening"] == STATE_DIRS
    assert data["unanswered"] == []
    assert data["settled"] == [1, 1], (data["settled"], data["here"])
    assert data["directories"] == [STATE_DIRS], data["directories"]
    # the second round (and part of the first) went through it
    assert int(data["served"]) >= STATE_DIRS, data["served"]  # type: ignore[call-overload]
    assert data["left"] == []


def _needs_unshare() -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a network namespace of its own")


#: The default limits an unprivileged user cannot hold on a cgroup v1 host, degraded.
UNPRIVILEGED_SETTINGS = (
    '{"allowDegraded": ["resources.memory", "resources.pids", "resources.cpus"]}\n'
)


def test_two_hundred_state_dirs_as_root(world: World) -> None:
    _needs_unshare()
    _check(_drive(world, ["unshare", "--net"]))


def test_two_hundred_state_dirs_as_an_unprivileged_user(world: World) -> None:
    if os.geteuid() != 0:  # CI's unprivileged pass: this user's own slots
        _check(_drive(world, []))
        return
    _needs_unshare()
    problem = unreadable_for(65534, sys.executable, os.path.dirname(corral_command()[0]))
    if problem is not None:
        pytest.skip(problem)
    # no cgroup to put the default limits in for this user on a cgroup v1 host: degrade
    # them (recorded), as the unprivileged escape pass does
    settings = world.write(os.path.join(world.root, "settings.json"), UNPRIVILEGED_SETTINGS)
    world.environ.setdefault("CORRAL_SETTINGS", settings)
    for directory, dirs, files in os.walk(world.root):
        for name in [directory, *(os.path.join(directory, n) for n in dirs + files)]:
            os.lchown(name, 65534, 65534)
    prefix = ["unshare", "--net", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    _check(_drive(world, prefix))
