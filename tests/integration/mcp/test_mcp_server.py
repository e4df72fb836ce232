"""``corral mcp`` as a subprocess, driven by the official MCP SDK's client over stdio."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ..conftest import World, corral_executable, needs_bwrap, processes_with

mcp = pytest.importorskip(
    "mcp", reason="the mcp package (2.x) is not installed: pip install 'corral[mcp]'"
)

pytestmark = needs_bwrap


def server_params(world: World) -> Any:
    from mcp import StdioServerParameters

    return StdioServerParameters(
        command=corral_executable(), args=["mcp"], env=world.environ, cwd=world.workspace
    )


def with_client(world: World, body: Callable[[Any], Awaitable[Any]]) -> Any:
    from mcp import Client

    async def main() -> Any:
        async with Client(server_params(world), mode="legacy") as client:
            return await body(client)

    return asyncio.run(asyncio.wait_for(main(), 120))


async def call(client: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    data: dict[str, Any] = result.structured_content
    return data


async def call_error(client: Any, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text: str = result.content[0].text
    return text


def test_lists_the_sandbox_tools_with_schemas(world: World) -> None:
    from corral.integrations.mcp_server import TOOL_NAMES

    async def body(client: Any) -> None:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == set(TOOL_NAMES)
        exec_schema = tools["sandbox_exec"].input_schema
        assert set(exec_schema["required"]) == {"sandbox_id", "command"}
        assert all(t.description for t in tools.values())
        for tool in tools.values():
            assert tool.input_schema["additionalProperties"] is False, tool.name
            assert tool.output_schema["type"] == "object", tool.name
            assert tool.annotations is not None, tool.name
        assert {"returncode", "stdout", "violations", "stopped"} <= set(
            tools["sandbox_exec"].output_schema["properties"]
        )
        read_only = {n for n, t in tools.items() if t.annotations.read_only_hint}
        assert read_only == {
            "sandbox_read_file",
            "sandbox_list_files",
            "sandbox_list",
            "sandbox_diff",
        }
        destructive = {n for n, t in tools.items() if t.annotations.destructive_hint}
        assert {"sandbox_apply", "sandbox_destroy", "sandbox_exec"} <= destructive

    with_client(world, body)


def test_create_exec_write_read_list_destroy(world: World) -> None:
    async def body(client: Any) -> None:
        created = await call(client, "sandbox_create", preview=False)
        sid = created["sandbox_id"]
        assert created["workspace"] == world.workspace
        assert created["network"] == "none"
        ran = await call(
            client, "sandbox_exec", sandbox_id=sid, command="echo hi; echo err >&2; exit 3"
        )
        assert (ran["returncode"], ran["stdout"], ran["stderr"]) == (3, "hi\n", "err\n")
        argv = await call(client, "sandbox_exec", sandbox_id=sid, command=["printf", "%s", "a b"])
        assert argv["stdout"] == "a b"
        await call(
            client,
            "sandbox_write_file",
            sandbox_id=sid,
            path="src/app.py",
            content="print('ünïcode')\n",
            parents=True,
        )
        read = await call(client, "sandbox_read_file", sandbox_id=sid, path="src/app.py")
        assert read["content"] == "print('ünïcode')\n"
        assert (await call(client, "sandbox_exec", sandbox_id=sid, command="python3 src/app.py"))[
            "stdout"
        ] == "ünïcode\n"
        listing = await call(client, "sandbox_list_files", sandbox_id=sid, path="src")
        assert [(e["name"], e["kind"]) for e in listing["entries"]] == [("app.py", "file")]
        await call(client, "sandbox_exec", sandbox_id=sid, command="echo kept > /tmp/state")
        kept = await call(client, "sandbox_exec", sandbox_id=sid, command="cat /tmp/state")
        assert kept["stdout"] == "kept\n"
        assert [s["sandbox_id"] for s in (await call(client, "sandbox_list"))["sandboxes"]] == [sid]
        assert await call(client, "sandbox_destroy", sandbox_id=sid) == {
            "destroyed": sid,
            "preview_removed": False,
        }
        assert (await call(client, "sandbox_list"))["sandboxes"] == []

    with_client(world, body)
    with open(os.path.join(world.workspace, "src", "app.py")) as f:
        assert f.read() == "print('ünïcode')\n"  # preview=False: written to the workspace
    assert os.listdir(os.path.join(world.state_dir, "sessions")) == []


def test_the_sandbox_blocks_what_the_policy_forbids(world: World) -> None:
    async def body(client: Any) -> None:
        sid = (await call(client, "sandbox_create", preview=False))["sandbox_id"]
        escaped = await call(
            client,
            "sandbox_exec",
            sandbox_id=sid,
            command=f"echo pwned > {world.victim}; cat {world.secret}",
        )
        assert escaped["returncode"] != 0
        assert "SECRET" not in escaped["stdout"]
        protected = await call(
            client,
            "sandbox_exec",
            sandbox_id=sid,
            command="mkdir -p .git/hooks; echo x > .git/hooks/post-checkout",
        )
        assert protected["violations"]
        assert "filesystem.protect" in protected["violations"][0]
        message = await call_error(
            client, "sandbox_write_file", sandbox_id=sid, path=".bashrc", content="evil"
        )
        assert "filesystem.protect: **/.bashrc" in message
        read_only = (await call(client, "sandbox_create", preview=False, read_only=True))[
            "sandbox_id"
        ]
        refused = await call(client, "sandbox_exec", sandbox_id=read_only, command="touch new-file")
        assert refused["returncode"] != 0

    with_client(world, body)
    assert world.read(world.victim) == "original\n"
    assert not os.path.exists(os.path.join(world.workspace, ".bashrc"))
    assert not os.path.exists(os.path.join(world.workspace, "new-file"))


def test_bad_arguments_are_tool_errors_not_crashes(world: World) -> None:
    async def body(client: Any) -> None:
        assert "No sandbox 'sbx-nope' is open" in await call_error(
            client, "sandbox_exec", sandbox_id="sbx-nope", command="true"
        )
        assert "command" in await call_error(client, "sandbox_exec", sandbox_id="x")
        assert "timeout" in await call_error(
            client, "sandbox_exec", sandbox_id="x", command="true", timeout=-1
        )
        sid = (await call(client, "sandbox_create", preview=False))["sandbox_id"]
        assert "the shell command is empty" in await call_error(
            client, "sandbox_exec", sandbox_id=sid, command="   "
        )
        assert "No such file or directory" in await call_error(
            client, "sandbox_read_file", sandbox_id=sid, path="missing.txt"
        )
        assert "no preview" in await call_error(client, "sandbox_diff", sandbox_id=sid)
        assert "read_only" in await call_error(client, "sandbox_create", read_only="yes please")
        # the server is still fine
        assert (await call(client, "sandbox_exec", sandbox_id=sid, command="echo ok"))[
            "stdout"
        ] == "ok\n"

    with_client(world, body)


def test_unknown_arguments_are_refused_not_ignored(world: World) -> None:
    async def body(client: Any) -> None:
        sid = (await call(client, "sandbox_create", preview=False))["sandbox_id"]
        text = await call_error(client, "sandbox_exec", sandbox_id=sid, command="sleep 0", timout=1)
        assert text.startswith("sandbox_exec has no argument 'timout' (did you mean 'timeout'?)")
        assert "Error executing tool" not in text
        text = await call_error(client, "sandbox_exec", sandbox_id=sid, command="true", timeout=-1)
        assert text.startswith("Invalid arguments for sandbox_exec: timeout:"), text
        text = await call_error(client, "sandbox_read_file", sandbox_id=sid, path="missing.txt")
        assert text.count("Failed to") == 1 and "Error executing" not in text, text
        text = await call_error(client, "sandbox_exec", sandbox_id=sid, command="true", cwd="nope")
        assert "working directory" in text and "create it first with sandbox_exec" in text, text
        assert "doctor" not in text

    with_client(world, body)


def test_read_file_refuses_unbounded_files_and_reads_in_parts(world: World) -> None:
    settings = os.path.join(world.home, ".config", "corral", "settings.json")
    os.makedirs(os.path.dirname(settings))
    with open(settings, "w") as f:
        json.dump({"integrations": {"mcp": {"maxOutput": 1000}}}, f)
    os.mkfifo(os.path.join(world.workspace, "pipe"))
    with open(os.path.join(world.workspace, "text.txt"), "w") as f:
        f.write("é" * 1500)  # 3000 bytes of two-byte characters
    binary = bytes(range(256)) * 2
    with open(os.path.join(world.workspace, "blob.bin"), "wb") as f:
        f.write(binary)

    async def body(client: Any) -> None:
        import base64

        sid = (await call(client, "sandbox_create", preview=False))["sandbox_id"]
        for path in ("/dev/zero", "pipe"):
            text = await call_error(client, "sandbox_read_file", sandbox_id=sid, path=path)
            assert "not a regular file" in text
        parts, offset = [], 0
        while True:
            part = await call(
                client, "sandbox_read_file", sandbox_id=sid, path="text.txt", offset=offset
            )
            assert part["bytes"] <= 1000
            parts.append(part["content"])
            if not part["truncated"]:
                break
            offset = part["next_offset"]
        assert "".join(parts) == "é" * 1500 and len(parts) == 3
        limited = await call(
            client, "sandbox_read_file", sandbox_id=sid, path="text.txt", offset=2, limit=4
        )
        assert (limited["content"], limited["next_offset"]) == ("éé", 6)
        assert "base64" in await call_error(
            client, "sandbox_read_file", sandbox_id=sid, path="blob.bin"
        )
        blob = await call(
            client, "sandbox_read_file", sandbox_id=sid, path="blob.bin", encoding="base64"
        )
        assert base64.b64decode(blob["content"]) == binary and blob["truncated"] is False

    with_client(world, body)


def test_write_file_takes_base64_for_binary_content(world: World) -> None:
    binary = bytes(range(256)) + b"\0\xff\xfe"

    async def body(client: Any) -> None:
        import base64

        tools = {t.name: t for t in (await client.list_tools()).tools}
        schema = tools["sandbox_write_file"].input_schema["properties"]["encoding"]
        assert schema["enum"] == ["text", "base64"] and schema["default"] == "text"
        sid = (await call(client, "sandbox_create", preview=False))["sandbox_id"]
        encoded = base64.b64encode(binary).decode()
        written = await call(
            client,
            "sandbox_write_file",
            sandbox_id=sid,
            path="blob.bin",
            content=encoded,
            encoding="base64",
        )
        assert written == {"path": "blob.bin", "bytes": len(binary)}
        back = await call(
            client, "sandbox_read_file", sandbox_id=sid, path="blob.bin", encoding="base64"
        )
        assert back["content"] == encoded
        # text stays the default; the base64 text itself is written as is
        await call(client, "sandbox_write_file", sandbox_id=sid, path="t.txt", content=encoded)
        for bad in ("not base64!", "QUJD\nREVG", "QUJDRA"):  # junk, a line break, no padding
            text = await call_error(
                client,
                "sandbox_write_file",
                sandbox_id=sid,
                path="bad.bin",
                content=bad,
                encoding="base64",
            )
            assert "not valid base64" in text and "nothing was written" in text, text
        text = await call_error(
            client, "sandbox_write_file", sandbox_id=sid, path="x", content="", encoding="hex"
        )
        assert "encoding" in text
        # outside the workspace the policy refuses it as for text
        outside = await call_error(
            client,
            "sandbox_write_file",
            sandbox_id=sid,
            path=world.victim,
            content=encoded,
            encoding="base64",
        )
        assert "victim.txt" in outside

    with_client(world, body)
    with open(os.path.join(world.workspace, "blob.bin"), "rb") as f:
        assert f.read() == binary
    with open(os.path.join(world.workspace, "t.txt"), encoding="ascii") as f:
        assert f.read() == base64.b64encode(binary).decode()
    assert not os.path.exists(os.path.join(world.workspace, "bad.bin"))
    assert world.read(world.victim) == "original\n"


def test_output_is_capped_with_a_marker(world: World) -> None:
    settings = os.path.join(world.home, ".config", "corral", "settings.json")
    os.makedirs(os.path.dirname(settings))
    with open(settings, "w") as f:
        json.dump({"integrations": {"mcp": {"maxOutput": 1000, "maxSandboxes": 1}}}, f)

    async def body(client: Any) -> None:
        sid = (await call(client, "sandbox_create", preview=False))["sandbox_id"]
        big = await call(
            client, "sandbox_exec", sandbox_id=sid, command="head -c 5000 /dev/zero | tr '\\0' x"
        )
        assert big["stdout_truncated"] is True
        assert big["stdout"].startswith("x" * 1000)
        assert big["stdout"].endswith("[corral: output truncated, 4000 more bytes not shown]")
        assert "maxSandboxes" in await call_error(client, "sandbox_create", preview=False)

    with_client(world, body)


def test_a_command_timeout_cannot_exceed_the_policy(world: World) -> None:
    settings = os.path.join(world.home, ".config", "corral", "settings.json")
    os.makedirs(os.path.dirname(settings))
    with open(settings, "w") as f:
        json.dump({"resources": {"timeout": "1s"}}, f)

    async def body(client: Any) -> None:
        sid = (await call(client, "sandbox_create", preview=False))["sandbox_id"]
        ran = await call(client, "sandbox_exec", sandbox_id=sid, command="sleep 30", timeout=3600)
        assert ran["timed_out"] is True
        assert ran["duration"] < 10

    with_client(world, body)


def test_destroy_during_an_exec_stops_it_and_the_result_says_why(world: World) -> None:
    marker = f"corral-mcp-destroy-{os.getpid()}-{time.monotonic_ns()}"

    async def body(client: Any) -> tuple[dict[str, Any], float]:
        sid = (await call(client, "sandbox_create", preview=False))["sandbox_id"]
        ready = os.path.join(world.workspace, "ready")
        # it ignores SIGTERM and its timeout is far away: only killGrace's SIGKILL ends it
        command = f"trap '' TERM; : > {ready}; sleep 300 # {marker}"
        running = asyncio.ensure_future(
            call(client, "sandbox_exec", sandbox_id=sid, command=command, timeout=600)
        )
        while not os.path.exists(ready):  # noqa: ASYNC240 - the command signals through a file
            assert not running.done(), running.result()
            await asyncio.sleep(0.05)
        started = time.monotonic()
        assert (await call(client, "sandbox_destroy", sandbox_id=sid))["destroyed"] == sid
        return await running, time.monotonic() - started

    ran, elapsed = with_client(world, body)
    assert ran["stopped"].startswith("sandbox_destroy was called")
    assert ran["returncode"] == 137 and ran["timed_out"] is False
    assert elapsed < 60  # killGrace (2 s) plus slack for a loaded machine; the timeout is 600 s
    assert processes_with(marker) == []


CLIENT = """
import asyncio, sys
from mcp import Client, StdioServerParameters

async def main():
    params = StdioServerParameters(command=sys.argv[1], args=["mcp"], cwd=sys.argv[2],
                                   env={"HOME": sys.argv[3], "PATH": sys.argv[4]})
    async with Client(params, mode="legacy") as client:
        created = await client.call_tool("sandbox_create", {"preview": False})
        sid = created.structured_content["sandbox_id"]
        print("created", flush=True)
        # the marker arrives reversed, so that only the sandboxed command carries it
        await client.call_tool("sandbox_exec", {"sandbox_id": sid, "command": sys.argv[5][::-1]})

asyncio.run(main())
"""


def mcp_servers(parent: int) -> list[int]:
    """Pids of the ``corral mcp`` servers *parent* started (argv ends with corral and ``mcp``)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")[:-1]
        except OSError:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and argv[-2:] == [corral_executable().encode(), b"mcp"]:
            found.append(int(name))
    return found


def test_killing_the_client_leaves_no_sandbox_process_behind(world: World) -> None:
    marker = f"corral-mcp-orphan-{os.getpid()}-{time.monotonic_ns()}"
    client = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLIENT,
            corral_executable(),
            world.workspace,
            world.home,
            world.environ["PATH"],
            # it ignores SIGTERM: only the SIGKILL after killGrace stops it
            f"trap '' TERM; sleep 300 # {marker}"[::-1],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not processes_with(marker):
            assert time.monotonic() < deadline, "the sandboxed command never started"
            assert client.poll() is None, "the client exited early"
            time.sleep(0.05)
        servers = mcp_servers(client.pid)
        assert servers, "no corral mcp process found"
        client.send_signal(signal.SIGKILL)  # the client only: the server sees its stdin close
        client.wait(timeout=10)
        killed = time.monotonic()
        deadline = killed + 20
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with(marker) == [], "a sandboxed command outlived its client"
        while (
            any(os.path.exists(f"/proc/{pid}") for pid in servers) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert not [pid for pid in servers if os.path.exists(f"/proc/{pid}")], (
            "corral mcp kept running"
        )
        assert os.listdir(os.path.join(world.state_dir, "sessions")) == []
    finally:
        if client.poll() is None:
            client.kill()
        client.stdout.close()  # type: ignore[union-attr]
