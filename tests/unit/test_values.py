"""Value objects and small pure pieces: Record, ExecRequest, Outcome, _jsonfast, fd placement."""

from __future__ import annotations

import os

import pytest

from corral._exceptions import CommandFailed, InvalidRequest, PolicyDenied
from corral._frozen import FrozenInstanceError, Record
from corral._jsonfast import JSONError, dumps, loads
from corral.pipeline._engine_setup import _dup_actions
from corral.pipeline._outcome import Outcome, Violation, status_for
from corral.pipeline._request import ExecRequest, redact


class Point(Record):
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


def test_record_is_frozen_keyword_only_and_compares_by_value() -> None:
    p = Point(x=1)
    assert p == Point(x=1, y=0) and hash(p) == hash(Point(x=1))
    assert p != Point(x=2) and repr(p) == "Point(x=1, y=0, tags=())"
    with pytest.raises(FrozenInstanceError):
        p.x = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing required field 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown field"):
        Point(x=1, z=2)  # type: ignore[call-arg]
    assert p.replace(y=5) == Point(x=1, y=5) and p.fields() == {"x": 1, "y": 0, "tags": ()}
    import pickle

    assert pickle.loads(pickle.dumps(p)) == p


def test_request_validation() -> None:
    with pytest.raises(InvalidRequest):
        ExecRequest.from_argv([])
    with pytest.raises(InvalidRequest):
        ExecRequest.from_argv(["a\x00b"])
    with pytest.raises(InvalidRequest):
        ExecRequest.from_argv(["x"], timeout=0)
    with pytest.raises(InvalidRequest):
        ExecRequest.from_argv(["x"], cwd="relative")
    with pytest.raises(InvalidRequest):
        ExecRequest.from_shell("   ")
    req = ExecRequest.from_shell("echo $HOME", stdin="hi")
    assert (
        req.argv == ("/bin/sh", "-c", "echo $HOME")
        and req.stdin == b"hi"
        and req.stdin_mode == "data"
    )
    assert req.sandbox_id.startswith("sbx-") and req.command_line() == "echo $HOME"


def test_redaction() -> None:
    argv = [
        "curl",
        "-H",
        "x",
        "--token",
        "abc123",
        "--password=hunter2",
        "API_KEY=zzz",
        "https://u:pw4x@h/",
    ]
    assert redact(argv, ["pw4x"]) == (
        "curl",
        "-H",
        "x",
        "--token",
        "***",
        "--password=***",
        "API_KEY=***",
        "https://u:***@h/",
    )


def test_exit_status_mapping_and_checks() -> None:
    assert status_for(3, None, False, False) == 3
    assert status_for(None, 9, False, False) == 137
    assert status_for(None, 15, True, False) == 124
    assert status_for(137, None, False, True) == 137
    ok = Outcome(sandbox_id="s", backend="b", argv=("x",), exit_code=0)
    assert ok.check() is ok and ok.raise_for_denial() is ok
    with pytest.raises(CommandFailed, match="exited with status 2"):
        ok.replace(exit_code=2).check()
    v = Violation(kind="network", target="evil.test:443", rule="not in network.allow")
    assert v.describe() == "blocked connection to evil.test:443 (not in network.allow)"
    with pytest.raises(PolicyDenied):
        ok.replace(violations=(v,)).raise_for_denial()
    assert ok.to_json()["returncode"] == 0


def test_jsonfast_round_trip_and_strictness() -> None:
    data = {"a": [1, 2.5, None, True, "é\n\u2028"], "b": {"c": []}}
    assert loads(dumps(data)) == data and loads(dumps(data).encode()) == data
    for bad in ('{"a":1,"a":2}', "NaN", "[1] 2", "", "{", b"\xff"):
        with pytest.raises(JSONError):
            loads(bad)
    with pytest.raises(ValueError):
        dumps(float("nan"))
    assert dumps({"b": 1, "a": 2}, sort_keys=True) == '{"a":2,"b":1}'


def test_dup_actions_place_fds_without_clobbering() -> None:
    # parent fd 4 must land on 3 while parent fd 3 must land on 4
    actions = _dup_actions([(4, 3), (3, 4)])
    fds = {3: "A", 4: "B"}
    for action in actions:
        kind, *rest = action
        if kind == os.POSIX_SPAWN_DUP2:
            src, dst = rest
            fds[dst] = fds[src]
        else:
            fds.pop(rest[0], None)
    assert fds[3] == "B" and fds[4] == "A"
    assert all(n in (3, 4) for n in fds)
