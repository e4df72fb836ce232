"""Served runs take their settings from the server's cache, and obey an edit at once.

The real attempt: a run through a real server, then the user settings file is
rewritten (in place, and by a rename) and the very next run must see the new
value; a rule (which depends on the command line, the one input the cache key
leaves out) must still apply per command.
"""

from __future__ import annotations

import json
import os
import subprocess

from tests.conftest import World, client_command, needs_bwrap
from tests.integration.server.conftest import status

pytestmark = needs_bwrap


def _settings(world: World, document: dict[str, object], *, rename: bool = False) -> None:
    path = os.path.join(world.home, ".config", "corral", "settings.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    target = path + ".new" if rename else path
    with open(target, "w", encoding="utf-8") as f:
        json.dump(document, f)
    if rename:
        os.replace(target, path)


def _probe(world: World, *argv: str) -> str:
    client = client_command("corral-client")
    result = subprocess.run(
        [*client, "run", "--", "/bin/sh", "-c", 'printf %s "$PROBE"', *argv],
        cwd=world.workspace,
        env=world.environ,
        capture_output=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.decode()


def _reused(world: World) -> int:
    data = status(world)
    assert data is not None and data["settings_cache"] is not None, "no settings cache here"
    reused = data["settings_cache"]["reused"]
    assert isinstance(reused, int)
    return reused


def test_a_settings_edit_reaches_the_very_next_served_run(served: World) -> None:
    _settings(served, {"env": {"set": {"PROBE": "one"}}})
    assert [_probe(served) for _ in range(3)] == ["one"] * 3
    assert _reused(served) >= 1  # the later runs came from the cache
    _settings(served, {"env": {"set": {"PROBE": "two"}}})  # written in place
    assert _probe(served) == "two"
    _settings(served, {"env": {"set": {"PROBE": "three"}}}, rename=True)
    assert _probe(served) == "three"
    os.unlink(os.path.join(served.home, ".config", "corral", "settings.json"))
    assert _probe(served) == ""


def test_rules_still_follow_each_command_line(served: World) -> None:
    rules = [{"match": "/bin/sh -c * ruled", "env": {"set": {"PROBE": "by rule"}}}]
    _settings(served, {"env": {"set": {"PROBE": "plain"}}, "rules": rules})
    for _ in range(2):
        assert _probe(served, "ruled") == "by rule"
        assert _probe(served, "other") == "plain"
