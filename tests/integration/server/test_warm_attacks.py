"""Attacks on warm sandboxes (ATK6): a change of the host between a warm sandbox's start
and its use, and what one run can leave for the next, made for real through a real server."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ..conftest import World, needs_bwrap
from .test_warm_sandboxes import _run, _warm_ready

pytestmark = needs_bwrap


def test_a_masked_file_relinked_under_its_name_stays_masked(served: World) -> None:
    """The host unlinks a hidden file's name and links the same inode back under it (a
    hardlink backup restored, ``ln``/``rm``/``ln``): its kind, device and inode are as
    before, but the unlink detached the warm sandbox's mask from the name."""
    token = served.write(os.path.join(served.home, "token.txt"), "LINKED-TOKEN\n")
    settings = os.path.join(served.home, ".config", "corral", "settings.json")
    served.write(settings, json.dumps({"filesystem": {"denyRead": [token]}}))
    _ran_warm, _out, err, code = _run(served, "true")
    assert code == 0, err
    _warm_ready(served)
    backup = token + ".bak"
    os.link(token, backup)
    os.unlink(token)
    os.link(backup, token)
    os.unlink(backup)
    ran_warm, out, _err, _code = _run(served, f"cat {token}")
    assert "LINKED-TOKEN" not in out, f"ran warm: {ran_warm}"


def _guard(served: World, secret: str) -> None:
    """Hide *secret* by name and have a warm sandbox planned from the host as it is now."""
    settings = os.path.join(served.home, ".config", "corral", "settings.json")
    served.write(settings, json.dumps({"filesystem": {"denyRead": [secret]}}))
    _ran_warm, _out, err, code = _run(served, "true")
    assert code == 0, err
    _warm_ready(served)


def test_a_masked_file_written_anew_with_its_old_inode_number_stays_masked(
    served: World,
) -> None:
    """``rm token; write token``: ext4 gives the new file the inode number just freed."""
    token = served.write(os.path.join(served.home, "token.txt"), "OLD-TOKEN\n")
    _guard(served, token)
    before = os.lstat(token).st_ino
    for _ in range(50):  # other processes may take the freed number first: try again
        os.unlink(token)
        served.write(token, "NEW-TOKEN\n")
        if os.lstat(token).st_ino == before:
            break
    else:
        pytest.skip(
            "the freed inode number went to another file (a busy machine, or no reuse here)"
        )
    ran_warm, out, _err, _code = _run(served, f"cat {token}")
    assert "NEW-TOKEN" not in out, f"ran warm: {ran_warm}"


def test_a_masked_directory_made_anew_with_its_old_inode_number_stays_masked(
    served: World,
) -> None:
    """``rm -rf creds; mkdir creds``: ext4 gives the new directory the freed inode number,
    and the removal detached the warm sandbox's mask (its birth time is new)."""
    creds = os.path.join(served.home, "creds")
    served.write(os.path.join(creds, "key"), "OLD-KEY\n")
    _guard(served, creds)
    before = os.lstat(creds).st_ino
    shutil.rmtree(creds)
    for _ in range(50):  # other processes may take the freed number first: try again
        os.mkdir(creds)
        if os.lstat(creds).st_ino == before:
            break
        os.rmdir(creds)
    else:
        pytest.skip("the freed inode number went elsewhere (a busy machine, or no reuse here)")
    served.write(os.path.join(creds, "key"), "NEW-KEY\n")
    ran_warm, out, _err, _code = _run(served, f"cat {creds}/key")
    assert "NEW-KEY" not in out, f"ran warm: {ran_warm}"


def test_a_named_host_socket_the_service_made_anew_is_the_one_reached(served: World) -> None:
    """``network.allowUnixSockets`` binds the named socket into the sandbox: a service that
    restarted since the warm sandbox started has a new socket there (the old one is dead),
    and the run reaches the new one, as a fresh run would."""
    from ..egress.test_unix_sockets import CLIENT, Server, answers

    named = os.path.join(served.outside, "svc", "named.sock")
    client = served.write(os.path.join(served.outside, "client.py"), CLIENT)
    settings = os.path.join(served.home, ".config", "corral", "settings.json")
    served.write(settings, json.dumps({"network": {"allowUnixSockets": [named]}}))
    server = Server(named)
    try:
        _ran_warm, out, err, code = _run(served, f"python3 {client} {named}")
        assert (code, answers(out.encode())) == (0, {named: "OK pong"}), err
        _warm_ready(served)
        server.close()
        os.unlink(named)
        server = Server(named)
        ran_warm, out, err, code = _run(served, f"python3 {client} {named}")
        assert (code, answers(out.encode())) == (0, {named: "OK pong"}), (ran_warm, err)
        assert not ran_warm  # retired by the look at the host: its broker knew the old one
    finally:
        server.close()
