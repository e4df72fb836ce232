"""``corral mcp``: sandboxes as MCP tools, over stdio, with the official ``mcp`` SDK (2.x).

Tools (all results are JSON objects; failures are tool errors with a
message the model can act on, never crashes):

==========================  =====================================================
``sandbox_create``          open a sandbox session (on a preview of the workspace
                            by default, ``integrations.mcp.preview``)
``sandbox_exec``            run a command (argv list or shell string)
``sandbox_write_file``      write a file from inside the sandbox
``sandbox_read_file``       read a file as the sandbox sees it
``sandbox_list_files``      list a directory as the sandbox sees it
``sandbox_list``            the open sandboxes
``sandbox_diff``            the preview's change set
``sandbox_apply``           land the preview's changes in the workspace
``sandbox_destroy``         stop and remove a sandbox
==========================  =====================================================

Each tool is a thin call into :class:`~corral.AsyncSandbox`; there is no
policy logic here. The server's settings are loaded once, like ``corral run``
(defaults, user, project - tighten-only until trusted -, environment), for
the server's working directory, whose workspace every sandbox shares. Tool
arguments can only *tighten* that policy: ``read_only`` can only be turned
on, and a command's ``timeout`` is capped at the policy's.

Output is capped at ``integrations.mcp.maxOutput`` bytes per stream, with a
marker saying how much was cut. At most ``integrations.mcp.maxSandboxes``
sandboxes are open at once. When the client disconnects (stdin closes), every
running command is stopped and every sandbox closed.
"""

# No ``from __future__ import annotations`` here: the MCP SDK builds each
# tool's input schema from its annotations, which refer to names local to
# build_server (pydantic's Field is imported there, as mcp is optional).
import os
from typing import Annotated, Any

from .._exceptions import CorralError

__all__ = ["TOOL_NAMES", "SandboxRegistry", "build_server", "serve"]

TOOL_NAMES: tuple[str, ...] = (
    "sandbox_create",
    "sandbox_exec",
    "sandbox_write_file",
    "sandbox_read_file",
    "sandbox_list_files",
    "sandbox_list",
    "sandbox_diff",
    "sandbox_apply",
    "sandbox_destroy",
)

INSTRUCTIONS = (
    "corral runs commands in sandboxes: the workspace is writable (by default through a "
    "copy-on-write preview, so changes are reviewed with sandbox_diff and land only with "
    "sandbox_apply), secrets are hidden, the network is off unless the user's policy allows "
    "hosts, and persistence points (.git/hooks, shell rc files, agent configs) are "
    "write-protected. Operations the policy blocks are listed in 'violations'; do not try to "
    "get around them, tell the user which rule blocked what."
)


def _cut(data: bytes, limit: int) -> tuple[str, bool]:
    """Decode *data*, keeping at most *limit* bytes and saying how many were cut."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    kept = data[:limit].decode("utf-8", "ignore")
    return f"{kept}\n[corral: output truncated, {len(data) - limit} more bytes not shown]", True


class SandboxRegistry:
    """The sandboxes of one MCP server, with the server's settings.

    Raises :class:`ToolError <mcp.server.mcpserver.exceptions.ToolError>` for
    everything the client got wrong or the policy refused.
    """

    def __init__(self, *, cwd: str | None = None, environ: dict[str, str] | None = None) -> None:
        from ..policy import load_settings

        self.environ = dict(os.environ if environ is None else environ)
        self.cwd = cwd or os.getcwd()
        resolved = load_settings(cwd=self.cwd, environ=self.environ)
        self.workspace = resolved.workspace
        self.policy = resolved.policy
        self.warnings = resolved.warnings
        self.max_sandboxes = int(resolved.integrations.get("mcp.maxSandboxes", 8))
        self.max_output = int(resolved.integrations.get("mcp.maxOutput", 65536))
        self.preview_default = bool(resolved.integrations.get("mcp.preview", True))
        self.session = f"mcp-{os.getpid()}"
        self.sandboxes: dict[str, Any] = {}

    # ------------------------------------------------------------ helpers
    @staticmethod
    def error(message: str) -> Exception:
        from mcp.server.mcpserver.exceptions import ToolError

        return ToolError(message)

    def get(self, sandbox_id: str) -> Any:
        sandbox = self.sandboxes.get(sandbox_id)
        if sandbox is None:
            known = ", ".join(self.sandboxes) or "none"
            raise self.error(
                f"no sandbox {sandbox_id!r} is open (open sandboxes: {known}); "
                "create one with sandbox_create"
            )
        return sandbox

    def _failure(self, action: str, exc: CorralError) -> Exception:
        hint = f" Hint: {exc.hint}" if exc.hint else ""
        return self.error(f"Failed to {action}: {exc.message}{hint}")

    def describe(self, sandbox: Any) -> dict[str, Any]:
        preview = sandbox.preview
        return {
            "sandbox_id": sandbox.id,
            "workspace": sandbox.workspace,
            "preview_id": None if preview is None else preview.id,
            "read_only": sandbox.policy.filesystem.read_only,
            "network": sandbox.policy.network.mode,
        }

    # ------------------------------------------------------------ tools
    async def create(self, preview: bool | None, read_only: bool) -> dict[str, Any]:
        from .._sandbox import AsyncSandbox

        if len(self.sandboxes) >= self.max_sandboxes:
            raise self.error(
                f"{len(self.sandboxes)} sandboxes are open, the limit "
                f"(integrations.mcp.maxSandboxes); destroy one first"
            )
        use_preview = self.preview_default if preview is None else preview
        try:
            # the settings are loaded like the server's (rules still apply per command);
            # the only option a client can give tightens them
            sandbox = AsyncSandbox(
                cwd=self.cwd,
                environ=self.environ,
                preview=use_preview,
                agent_session=self.session,
                read_only=True if read_only else None,
            )
        except CorralError as exc:
            raise self._failure("create the sandbox", exc) from None
        self.sandboxes[sandbox.id] = sandbox
        return self.describe(sandbox)

    async def exec(
        self,
        sandbox_id: str,
        command: str | list[str],
        timeout: float | None,  # noqa: ASYNC109 - the sandbox's limit, not an await timeout
        stdin: str | None,
        cwd: str | None,
    ) -> dict[str, Any]:
        sandbox = self.get(sandbox_id)
        limit = self.policy.resources.timeout
        if timeout is not None and limit is not None:
            timeout = min(timeout, limit)  # a tool argument never loosens the policy
        try:
            outcome = await sandbox.exec(command, timeout=timeout, stdin=stdin, cwd=cwd)
        except CorralError as exc:
            raise self._failure("run the command", exc) from None
        stdout, out_cut = _cut(outcome.stdout, self.max_output)
        stderr, err_cut = _cut(outcome.stderr, self.max_output)
        return {
            "returncode": outcome.returncode,
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "timed_out": outcome.timed_out,
            "oom_killed": outcome.oom_killed,
            "stdout": stdout,
            "stderr": stderr,
            "stdout_truncated": out_cut or outcome.stdout_truncated,
            "stderr_truncated": err_cut or outcome.stderr_truncated,
            "duration": round(outcome.duration, 3),
            "violations": [v.describe() for v in outcome.violations],
            "exec_error": outcome.exec_error,
            "stopped": outcome.stopped,
        }

    async def write_file(
        self, sandbox_id: str, path: str, content: str, parents: bool
    ) -> dict[str, Any]:
        sandbox = self.get(sandbox_id)
        try:
            await sandbox.write_file(path, content, parents=parents)
        except CorralError as exc:
            raise self._failure(f"write {path}", exc) from None
        return {"path": path, "bytes": len(content.encode())}

    async def read_file(self, sandbox_id: str, path: str) -> dict[str, Any]:
        sandbox = self.get(sandbox_id)
        try:
            data = await sandbox.read_file(path)
        except CorralError as exc:
            raise self._failure(f"read {path}", exc) from None
        content, cut = _cut(data, self.max_output)
        return {"path": path, "content": content, "size": len(data), "truncated": cut}

    async def list_files(self, sandbox_id: str, path: str) -> dict[str, Any]:
        sandbox = self.get(sandbox_id)
        try:
            entries = await sandbox.list_files(path)
        except CorralError as exc:
            raise self._failure(f"list {path}", exc) from None
        return {"path": path, "entries": [e.fields() for e in entries]}

    async def diff(self, sandbox_id: str) -> dict[str, Any]:
        sandbox = self.get(sandbox_id)
        try:
            changes = await sandbox.diff()
        except CorralError as exc:
            raise self._failure("compute the diff", exc) from None
        data: dict[str, Any] = changes.to_json()
        return data

    async def apply(self, sandbox_id: str, force: bool, skip_conflicts: bool) -> dict[str, Any]:
        sandbox = self.get(sandbox_id)
        try:
            result = await sandbox.apply(force=force, skip_conflicts=skip_conflicts)
        except CorralError as exc:
            raise self._failure("apply the changes", exc) from None
        data = result.to_json() if hasattr(result, "to_json") else {"applied": True}
        return {"sandbox_id": sandbox_id, "result": data}

    async def destroy(self, sandbox_id: str, discard: bool) -> dict[str, Any]:
        sandbox = self.get(sandbox_id)
        if discard and sandbox.preview is not None:
            try:
                await sandbox.discard()
            except CorralError as exc:
                raise self._failure("discard the preview", exc) from None
        del self.sandboxes[sandbox_id]
        await sandbox._close(f"sandbox_destroy was called for {sandbox_id}")
        return {"destroyed": sandbox_id}

    async def close_all(self) -> None:
        """Stop every running command and close every sandbox (the client went away)."""
        import asyncio

        sandboxes = list(self.sandboxes.values())
        self.sandboxes.clear()
        # together: each may wait up to killGrace for a command that ignores SIGTERM
        await asyncio.gather(*(s._close("the MCP client disconnected") for s in sandboxes))


def build_server(registry: SandboxRegistry) -> Any:
    """The :class:`mcp.server.mcpserver.MCPServer` with corral's tools bound to *registry*."""
    from mcp.server.mcpserver import MCPServer
    from pydantic import Field

    from .._version import __version__

    server = MCPServer(
        "corral", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    SandboxId = Annotated[str, Field(description="the id sandbox_create returned", min_length=1)]

    @server.tool()
    async def sandbox_create(
        preview: Annotated[
            bool | None,
            Field(
                description="work on a copy-on-write preview (default: integrations.mcp.preview)"
            ),
        ] = None,
        read_only: Annotated[bool, Field(description="mount the workspace read-only")] = False,
    ) -> dict[str, Any]:
        """Open a sandbox session: its id, workspace and private /tmp last until sandbox_destroy."""
        return await registry.create(preview, read_only)

    @server.tool()
    async def sandbox_exec(
        sandbox_id: SandboxId,
        command: Annotated[
            str | list[str],
            Field(description="a shell string (run with /bin/sh -c) or an argv list", min_length=1),
        ],
        timeout: Annotated[  # noqa: ASYNC109 - the sandbox's limit, not an await timeout
            float | None,
            Field(
                description="seconds before the command is stopped (capped at the policy's)", gt=0
            ),
        ] = None,
        stdin: Annotated[str | None, Field(description="text fed to the command's stdin")] = None,
        cwd: Annotated[
            str | None, Field(description="working directory, relative to the workspace")
        ] = None,
    ) -> dict[str, Any]:
        """Run a command in the sandbox; returns its exit status, output and blocked operations."""
        return await registry.exec(sandbox_id, command, timeout, stdin, cwd)

    @server.tool()
    async def sandbox_write_file(
        sandbox_id: SandboxId,
        path: Annotated[
            str, Field(description="path, relative to the workspace or absolute", min_length=1)
        ],
        content: Annotated[str, Field(description="the text to write")],
        parents: Annotated[bool, Field(description="create missing parent directories")] = False,
    ) -> dict[str, Any]:
        """Write a file from inside the sandbox (so the policy's write rules apply)."""
        return await registry.write_file(sandbox_id, path, content, parents)

    @server.tool()
    async def sandbox_read_file(
        sandbox_id: SandboxId,
        path: Annotated[
            str, Field(description="path, relative to the workspace or absolute", min_length=1)
        ],
    ) -> dict[str, Any]:
        """Read a file as the sandbox sees it (secrets are hidden)."""
        return await registry.read_file(sandbox_id, path)

    @server.tool()
    async def sandbox_list_files(
        sandbox_id: SandboxId,
        path: Annotated[
            str, Field(description="directory, relative to the workspace", min_length=1)
        ] = ".",
    ) -> dict[str, Any]:
        """List a directory as the sandbox sees it: name, path, kind and size of each entry."""
        return await registry.list_files(sandbox_id, path)

    @server.tool()
    async def sandbox_list() -> dict[str, Any]:
        """The open sandboxes."""
        return {"sandboxes": [registry.describe(s) for s in registry.sandboxes.values()]}

    @server.tool()
    async def sandbox_diff(sandbox_id: SandboxId) -> dict[str, Any]:
        """The preview's changes against the workspace: added, modified, deleted files, diffs."""
        return await registry.diff(sandbox_id)

    @server.tool()
    async def sandbox_apply(
        sandbox_id: SandboxId,
        force: Annotated[
            bool, Field(description="overwrite files that changed in the workspace")
        ] = False,
        skip_conflicts: Annotated[
            bool, Field(description="apply the rest, skip conflicting files")
        ] = False,
    ) -> dict[str, Any]:
        """Land the preview's changes in the real workspace (only when the user asked for it)."""
        return await registry.apply(sandbox_id, force, skip_conflicts)

    @server.tool()
    async def sandbox_destroy(
        sandbox_id: SandboxId,
        discard: Annotated[
            bool, Field(description="also drop the preview's unapplied changes")
        ] = False,
    ) -> dict[str, Any]:
        """Stop the sandbox's commands and remove it (a preview is kept unless discard is true)."""
        return await registry.destroy(sandbox_id, discard)

    return server


async def serve() -> None:
    """Run the server on stdin/stdout until the client disconnects; then close every sandbox."""
    registry = SandboxRegistry()
    server = build_server(registry)
    import anyio

    try:
        await server.run_stdio_async()
    finally:
        # The client is gone (stdin closed, or stdout broke): the task group may
        # already be cancelled, so shield the clean-up from that cancellation.
        with anyio.CancelScope(shield=True):
            await registry.close_all()
