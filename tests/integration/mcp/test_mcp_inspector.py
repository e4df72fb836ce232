"""``corral mcp`` driven by the official MCP Inspector's CLI mode (npm ``@modelcontextprotocol/inspector``).

Each Inspector call starts the server over stdio, makes one request and
exits; the server must answer with the schemas, annotations and error texts
a client renders, and then exit with it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest

from ..conftest import World, corral_executable, needs_bwrap

pytest.importorskip(
    "mcp", reason="the mcp package (2.x) is not installed: pip install 'corral[mcp]'"
)

pytestmark = needs_bwrap

INSPECTOR = shutil.which("mcp-inspector")


def inspector(world: World, *args: str) -> tuple[int, Any]:
    if INSPECTOR is None:
        pytest.skip(
            "the MCP Inspector is not installed: npm install -g @modelcontextprotocol/inspector"
        )
    env = {**world.environ, "MCP_CATALOG_PATH": os.path.join(world.root, "catalog.json")}
    result = subprocess.run(
        [
            INSPECTOR,
            "--cli",
            "-e",
            f"HOME={world.home}",
            "-e",
            f"PATH={world.environ['PATH']}",
            corral_executable(),
            "mcp",
            *args,
        ],
        cwd=world.workspace,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    # the result is the first JSON document on stdout (an error summary may follow)
    text = result.stdout.decode()
    data, _ = json.JSONDecoder().raw_decode(text.lstrip())
    return result.returncode, data


def test_the_inspector_sees_schemas_and_annotations(world: World) -> None:
    status, listed = inspector(world, "--method", "tools/list")
    assert status == 0
    tools = {t["name"]: t for t in listed["tools"]}
    assert "sandbox_exec" in tools and "sandbox_read_file" in tools
    for name, tool in tools.items():
        assert tool["inputSchema"]["additionalProperties"] is False, name
        assert tool["outputSchema"]["type"] == "object", name
        assert set(tool["annotations"]) >= {"readOnlyHint", "destructiveHint"}, name
    assert tools["sandbox_diff"]["annotations"]["readOnlyHint"] is True
    assert tools["sandbox_apply"]["annotations"]["destructiveHint"] is True
    read = tools["sandbox_read_file"]["inputSchema"]["properties"]
    assert {"offset", "limit", "encoding"} <= set(read)


def test_the_inspector_gets_structured_results_and_plain_errors(world: World) -> None:
    status, created = inspector(
        world,
        "--method",
        "tools/call",
        "--tool-name",
        "sandbox_create",
        "--tool-arg",
        "preview=false",
    )
    assert status == 0 and created["structuredContent"]["workspace"] == world.workspace
    status, refused = inspector(
        world,
        "--method", "tools/call", "--tool-name", "sandbox_exec",
        "--tool-arg", "sandbox_id=sbx-x", "command=true", "timout=5",
    )  # fmt: skip
    assert refused["isError"] is True
    assert refused["content"][0]["text"] == (
        "sandbox_exec has no argument 'timout' (did you mean 'timeout'?); "
        "its arguments are: sandbox_id, command, timeout, stdin, cwd."
    )
    # each call's server closed its sandbox and left nothing behind
    assert os.listdir(os.path.join(world.state_dir, "sessions")) == []
