"""The real Claude Code CLI as a test harness: a scripted Messages API on loopback.

:class:`ScriptedModel` is an HTTP server on 127.0.0.1 that answers Claude
Code's ``POST /v1/messages`` the way the Anthropic API does (server-sent
events when the request streams, JSON otherwise). The agent loop's requests
(those that offer tools) get the scripted tool calls one per turn, then a
final text; every other request (titles, summaries) gets a short text. The
requests are kept, so a test reads the tool results Claude Code sent back.

:func:`run_claude` runs ``claude -p`` headless against it, with
``IS_SANDBOX=1`` when running as root (Claude Code refuses
``--dangerously-skip-permissions`` as root otherwise; it is not used here, but
root runs need it all the same). Tests skip with the precise reason when the
CLI is not installed (CI installs it from npm: ``.ci/run``).
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
from typing import Any

import pytest

__all__ = ["ScriptedModel", "claude_cli", "run_claude"]


def claude_cli() -> str:
    """The ``claude`` executable (``$CORRAL_TEST_CLAUDE`` or PATH), or skip the test."""
    path = os.environ.get("CORRAL_TEST_CLAUDE") or shutil.which("claude")
    if not path:
        pytest.skip(
            "the Claude Code CLI is not installed (npm install -g @anthropic-ai/claude-code)"
        )
    return path


class ScriptedModel:
    """A Messages API server that calls the scripted tools in order, then says "done".

    Example::

        with ScriptedModel([("Bash", {"command": "ls"})]) as model:
            run_claude(world, model)
            model.tool_results()   # [("README\\n", False)]
    """

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = list(calls)
        self.requests: list[dict[str, Any]] = []
        self._turn = 0
        self._lock = threading.Lock()
        model = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._send(200, "application/json", b"")

            def do_GET(self) -> None:
                self._send(200, "application/json", b"{}")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
                    self._send(200, "application/json", b'{"input_tokens": 10}')
                    return
                content = model._answer(body)
                if body.get("stream"):
                    self._send(200, "text/event-stream", _events(content, body))
                else:
                    self._send(
                        200, "application/json", json.dumps(_message(content, body)).encode()
                    )

            def _send(self, status: int, kind: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        if not body.get("tools"):
            return [{"type": "text", "text": "ok"}]
        with self._lock:
            self.requests.append(body)
            turn = self._turn
            self._turn += 1
        if turn < len(self.calls):
            name, tool_input = self.calls[turn]
            return [
                {"type": "tool_use", "id": f"toolu_{turn:04d}", "name": name, "input": tool_input}
            ]
        return [{"type": "text", "text": "done"}]

    def tool_results(self) -> list[tuple[str, bool]]:
        """Each scripted call's result as Claude Code reported it: (text, is_error)."""
        if not self.requests:
            return []
        results = []
        for message in self.requests[-1].get("messages", []):
            content = message.get("content")
            if message.get("role") != "user" or not isinstance(content, list):
                continue
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    results.append((_text(block.get("content")), bool(block.get("is_error"))))
        return results


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def _message(content: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "claude-scripted"),
        "content": content,
        "stop_reason": "tool_use" if content[0]["type"] == "tool_use" else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }


def _events(content: list[dict[str, Any]], body: dict[str, Any]) -> bytes:
    message = _message(content, body)
    out = []

    def event(kind: str, data: dict[str, Any]) -> None:
        out.append(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n")

    event("message_start", {"message": {**message, "content": [], "stop_reason": None}})
    for index, block in enumerate(content):
        if block["type"] == "tool_use":
            event("content_block_start", {"index": index, "content_block": {**block, "input": {}}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            event(
                "content_block_start",
                {"index": index, "content_block": {"type": "text", "text": ""}},
            )
            delta = {"type": "text_delta", "text": block["text"]}
        event("content_block_delta", {"index": index, "delta": delta})
        event("content_block_stop", {"index": index})
    event(
        "message_delta",
        {
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": 10},
        },
    )
    event("message_stop", {})
    return "".join(out).encode()


def run_claude(
    home: str,
    cwd: str,
    model: ScriptedModel,
    *,
    environ: dict[str, str],
    args: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """``claude -p`` in *cwd* with *home* as its home, talking to *model*.

    *prefix* runs it under another identity (``setpriv --reuid=65534 ...``).
    """
    env = {
        **environ,
        "HOME": home,
        "ANTHROPIC_BASE_URL": model.url,
        "ANTHROPIC_API_KEY": "sk-ant-test-scripted",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
    }
    if os.geteuid() == 0 and not prefix:
        env["IS_SANDBOX"] = "1"
    return subprocess.run(
        [*prefix, claude_cli(), "-p", "run the scripted tools", "--output-format", "json", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
