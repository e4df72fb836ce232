"""``--json-out`` names the caller's own streams, in-process and through the corral server."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import World


@pytest.mark.parametrize("target", ["-", "/dev/stdout", "/dev/stderr"])
def test_json_out_to_the_callers_stream(served: World, client: str, target: str) -> None:
    stream = "stderr" if target == "/dev/stderr" else "stdout"
    for env in ({"CORRAL_SERVER": "off"}, {}):
        result = served.corral(
            "run", "--json-out", target, "-c", "echo hi; exit 3", env=env, client=client
        )
        assert result.returncode == 3, result.stderr
        lines = getattr(result, stream).decode().splitlines()
        assert lines[0] == "hi" or stream == "stderr"
        outcome = json.loads(lines[-1])
        assert outcome["returncode"] == 3 and outcome["stdout_size"] == 3
        assert not os.path.exists(served.ws("-")), "a file named '-' was written"
