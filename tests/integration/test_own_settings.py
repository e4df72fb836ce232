"""corral's own settings cannot be steered by a sandboxed command.

The attack (issue 10, section 5): with a writable home directory or
``--allow-write ~/.config``, the command plants ``~/.config/corral`` as a
link to a directory holding ``{"backend": "none"}``; every later run would
be unsandboxed. Each test makes the real attempt, then runs corral again and
checks on the host that the second command could not act outside the sandbox.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import World, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.backend("bubblewrap")]

PLANT = (
    'mkdir -p "$HOME/x" && printf \'{"backend": "none"}\' > "$HOME/x/settings.json" && '
    'mkdir -p "$HOME/.config" && ln -s "$HOME/x" "$HOME/.config/corral"; true'
)


def _second_run_stays_sandboxed(world: World, *options: str) -> None:
    """Run a command that writes outside; it must be refused or confined."""
    escaped = os.path.join(world.outside, "escaped")
    result = world.run(f"touch {escaped}; echo ran", *options, cwd=world.workspace)
    assert not os.path.exists(escaped), result.stderr.decode()
    if result.returncode == 125:  # the planted link is refused, by name
        assert b"is a symbolic link" in result.stderr, result.stderr
        assert b".config/corral" in result.stderr, result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout == b"ran\n"


def test_the_home_directory_is_refused_as_the_workspace(world: World) -> None:
    result = world.run("echo ran", cwd=world.home)
    assert result.returncode == 125
    assert b"refusing the workspace" in result.stderr
    assert b"--allow-home-workspace" in result.stderr
    result = world.run("echo ran", "--workspace", world.home)
    assert result.returncode == 125
    result = world.run("echo ran", "--workspace", os.path.dirname(world.home))
    assert result.returncode == 125
    assert b"a directory above" in result.stderr


def test_a_forced_home_workspace_cannot_plant_settings(world: World) -> None:
    first = world.run(PLANT, "--allow-home-workspace", cwd=world.home)
    assert first.returncode == 0, first.stderr
    _second_run_stays_sandboxed(world)
    _second_run_stays_sandboxed(world, "--backend", "bubblewrap")


def test_allow_write_config_cannot_plant_settings(world: World) -> None:
    os.makedirs(os.path.join(world.home, ".config"))
    first = world.run(PLANT, "--allow-write", os.path.join(world.home, ".config"))
    assert first.returncode == 0, first.stderr
    _second_run_stays_sandboxed(world)


def test_a_link_planted_outside_a_run_is_refused_by_name(world: World) -> None:
    """The loader's own rule, whatever wrote the link: corral does not follow it."""
    os.makedirs(os.path.join(world.home, "x"))
    world.write(os.path.join(world.home, "x", "settings.json"), '{"backend": "none"}')
    os.makedirs(os.path.join(world.home, ".config"))
    os.symlink(os.path.join(world.home, "x"), os.path.join(world.home, ".config", "corral"))
    result = world.run("echo ran")
    assert result.returncode == 125
    assert b".config/corral is a symbolic link to" in result.stderr
    _second_run_stays_sandboxed(world)


def test_a_planted_state_directory_does_not_forge_trust(world: World) -> None:
    """A linked ~/.local/state/corral with forged trust records trusts nothing."""
    import hashlib
    import json

    project = world.write(world.ws(".corral", "settings.json"), '{"backend": "none"}')
    with open(project, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    forged = os.path.join(world.home, "forged")
    world.write(
        os.path.join(forged, "trust.json"),
        json.dumps({"version": 1, "files": {project: {"sha256": digest}}}),
    )
    os.makedirs(os.path.join(world.home, ".local", "state"))
    os.symlink(forged, world.state_dir)
    escaped = os.path.join(world.outside, "escaped")
    result = world.run(f"touch {escaped}; echo ran")
    assert not os.path.exists(escaped)
    assert result.returncode == 0, result.stderr
    assert b".local/state/corral is a symbolic link" in result.stderr
    assert b"ignoring backend from untrusted" in result.stderr


def test_a_same_directory_settings_link_is_followed(world: World) -> None:
    config = os.path.join(world.home, ".config", "corral")
    world.write(os.path.join(config, "settings.work.json"), '{"resources": {"pids": 77}}')
    os.symlink("settings.work.json", os.path.join(config, "settings.json"))
    result = world.corral("policy", "--explain")
    assert result.returncode == 0, result.stderr
    assert b"77" in result.stdout


def test_corrals_own_installation_in_the_workspace_stays_unwritten(world: World) -> None:
    """corral installed in the project (a ``.venv`` there, an editable checkout).

    Its package, entry script, interpreter and ``site-packages`` (``.pth``
    files run at every start) run unsandboxed at the next hook call, client
    or server reload; a sandboxed command must not be able to write them.
    """
    import secrets
    import sys

    import corral

    package = os.path.dirname(os.path.abspath(corral.__file__))
    prefix = os.path.abspath(sys.prefix)
    workspace = os.path.dirname(prefix)
    if workspace == "/" or not os.access(prefix, os.W_OK) or not os.access(package, os.W_OK):
        pytest.skip("corral's environment is not a directory this user could write")
    name = f"corral-probe-{secrets.token_hex(4)}"
    site = next(p for p in sys.path if p.startswith(prefix) and p.endswith("site-packages"))
    targets = [os.path.join(prefix, "bin", name), os.path.join(site, name + ".pth")]
    if package.startswith(workspace + "/"):
        targets.append(os.path.join(package, name + ".py"))
    command = "; ".join(f"echo 'import os' > {t}" for t in targets) + "; echo ran"
    try:
        result = world.run(command, "--workspace", workspace, cwd=workspace)
        assert result.returncode == 0, result.stderr
        assert result.stdout == b"ran\n"
        assert [t for t in targets if os.path.lexists(t)] == []
    finally:
        for target in targets:
            if os.path.lexists(target):
                os.unlink(target)
