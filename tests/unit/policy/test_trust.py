"""Trust records: `corral trust` and `corral trust --status`."""

from __future__ import annotations

import json
import os
import stat

import pytest

from corral._exceptions import SettingsError
from corral.policy import TrustStatus, _trust, trust_project, trust_status
from corral.policy._digest import sha256_hex

from .conftest import SettingsWorld


def records(world: SettingsWorld) -> dict[str, dict[str, str]]:
    with open(world.trust_file) as file:
        document = json.load(file)
    assert document["version"] == 1
    return document["files"]  # type: ignore[no-any-return]


def test_trust_records_the_sha256_of_each_file(world: SettingsWorld) -> None:
    world.project({"network": {"mode": "open"}})
    world.local({"image": "x"})
    assert world.trust() == [world.project_file, world.local_file]
    recorded = records(world)
    with open(world.project_file, "rb") as file:
        assert recorded[world.project_file]["sha256"] == sha256_hex(file.read())
    assert recorded[world.local_file]["trustedAt"].endswith("Z")


def test_trust_records_are_private(world: SettingsWorld) -> None:
    world.project({})
    world.trust()
    assert stat.S_IMODE(os.stat(world.trust_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(world.trust_file)).st_mode) == 0o700
    leftovers = [n for n in os.listdir(os.path.dirname(world.trust_file)) if ".tmp-" in n]
    assert leftovers == []


def test_trusting_nothing_writes_nothing(world: SettingsWorld) -> None:
    assert world.trust() == []
    assert not os.path.exists(world.trust_file)


def test_trust_keeps_the_records_of_other_projects(world: SettingsWorld) -> None:
    world.write(
        world.trust_file,
        {
            "version": 1,
            "files": {
                "/other/.corral/settings.json": {
                    "sha256": "0" * 64,
                    "trustedAt": "2020-01-01T00:00:00Z",
                }
            },
        },
    )
    world.project({})
    world.trust()
    assert set(records(world)) == {"/other/.corral/settings.json", world.project_file}


def test_an_invalid_project_file_is_not_trusted(world: SettingsWorld) -> None:
    world.project({"netwrok": {}})
    with pytest.raises(SettingsError, match='unknown key \\(did you mean "network"\\?\\)'):
        world.trust()
    world.project("{")
    with pytest.raises(SettingsError, match="malformed JSON at line 1 column 2"):
        world.trust()
    assert not os.path.exists(world.trust_file)


def test_an_unreadable_project_file_is_an_error(world: SettingsWorld) -> None:
    os.makedirs(world.project_file)
    with pytest.raises(SettingsError, match="cannot read the file: not a regular file"):
        world.trust()


def test_corrupt_trust_records_are_not_overwritten(world: SettingsWorld) -> None:
    world.write(world.trust_file, "[]")
    world.project({})
    with pytest.raises(SettingsError) as info:
        world.trust()
    assert "cannot update trust records" in str(info.value)
    assert info.value.hint == "fix or remove the file (removing it untrusts every project)"
    with open(world.trust_file) as file:
        assert file.read() == "[]"


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"version": 2, "files": {}},
        {"version": 1},
        {"version": 1, "files": {"/p": "abc"}},
        {"version": 1, "files": {"/p": {"sha256": "short"}}},
    ],
)
def test_malformed_trust_records_are_reported(world: SettingsWorld, document: object) -> None:
    path = world.write(world.trust_file, document)
    found, problem = _trust.read_trust_records(path)
    assert found == {}
    assert problem is not None
    assert problem.startswith("ignoring malformed trust records")


def test_a_failed_write_leaves_no_temporary_file(
    world: SettingsWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.project({})

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("corral.policy._files.os.replace", fail)
    with pytest.raises(SettingsError, match="cannot write trust records: No space left on device"):
        world.trust()
    assert os.listdir(os.path.dirname(world.trust_file)) == ["trust.json.lock"]


def test_an_unwritable_state_dir_is_an_error(world: SettingsWorld) -> None:
    world.write(os.path.join(world.home, ".local", "state"), "a file, not a directory")
    world.project({})
    with pytest.raises(SettingsError, match="cannot write trust records"):
        world.trust()


def test_trust_follows_xdg_state_home(world: SettingsWorld) -> None:
    state = os.path.join(world.root, "state")
    world.environ["XDG_STATE_HOME"] = state
    world.project({})
    world.trust()
    assert os.path.exists(os.path.join(state, "corral", "trust.json"))


def test_status_reports_each_file(world: SettingsWorld) -> None:
    def states() -> list[str]:
        found = trust_status(world.workspace, home=world.home, environ=world.environ)
        assert [s.path for s in found] == [world.project_file, world.local_file]
        return [s.state for s in found]

    assert states() == ["missing", "missing"]
    world.project({})
    assert states() == ["untrusted", "missing"]
    world.trust()
    world.local({})
    assert states() == ["trusted", "untrusted"]
    world.project({"image": "x"})
    assert states() == ["changed", "untrusted"]


def test_status_carries_the_digest(world: SettingsWorld) -> None:
    world.project({})
    (project, local) = trust_status(world.workspace, home=world.home, environ=world.environ)
    with open(world.project_file, "rb") as file:
        assert project == TrustStatus(
            path=world.project_file, state="untrusted", sha256=sha256_hex(file.read())
        )
    assert local.sha256 is None


def test_trust_needs_an_existing_workspace(world: SettingsWorld) -> None:
    with pytest.raises(SettingsError, match="does not exist or is not a directory"):
        trust_project(os.path.join(world.root, "nope"), home=world.home, environ=world.environ)


def test_trust_defaults_to_the_process_environment(
    world: SettingsWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", world.home)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    world.project({})
    assert trust_project(world.workspace) == [world.project_file]
    assert trust_status(world.workspace)[0].state == "trusted"


def test_trust_records_are_never_read_or_written_through_a_link(world: SettingsWorld) -> None:
    """A linked state directory (planted by a sandboxed command) is refused, not followed."""
    world.project({"network": {"mode": "open"}})
    state = os.path.dirname(world.trust_file)
    forged = os.path.join(os.path.dirname(world.home), "forged")
    os.makedirs(forged)
    os.makedirs(os.path.dirname(state), exist_ok=True)
    os.symlink(forged, state)
    with pytest.raises(SettingsError, match="is a symbolic link to"):
        world.trust()
    assert os.listdir(forged) == []  # nothing written through the link
    with open(world.project_file, "rb") as file:
        digest = sha256_hex(file.read())
    with open(os.path.join(forged, "trust.json"), "w") as file:
        json.dump({"version": 1, "files": {world.project_file: {"sha256": digest}}}, file)
    resolved = world.load()
    assert resolved.policy.network.mode == "none"  # the forged record trusts nothing
    assert any("is a symbolic link" in warning for warning in resolved.warnings)


def test_project_settings_are_not_read_through_a_link_leaving_the_workspace(
    world: SettingsWorld,
) -> None:
    elsewhere = os.path.join(os.path.dirname(world.home), "elsewhere")
    os.makedirs(elsewhere)
    with open(os.path.join(elsewhere, "settings.json"), "w") as file:
        file.write('{"resources": {"pids": 7}}')
    os.symlink(elsewhere, os.path.join(world.workspace, ".corral"))
    with pytest.raises(SettingsError, match=r"\.corral is a symbolic link to"):
        world.load()
