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
policy logic here. Every tool publishes an output schema (its result is
structured content) and annotations (read-only, destructive, idempotent);
arguments a tool does not know (``timout``) are refused, never ignored, and
every error is one plain sentence naming what to do next in MCP terms. The
server's settings are loaded once, like ``corral run``
(defaults, user, project - tighten-only until trusted -, environment), for
the server's working directory, whose workspace every sandbox shares. Tool
arguments can only *tighten* that policy: ``read_only`` can only be turned
on, and a command's ``timeout`` is capped at the policy's.

Output is capped at ``integrations.mcp.maxOutput`` bytes per stream, with a
marker saying how much was cut. At most ``integrations.mcp.maxSandboxes``
sandboxes are open at once. When the client disconnects (stdin closes), every
running command is stopped (SIGKILL after ``resources.killGrace`` at most)
and every sandbox closed; ``sandbox_destroy`` does the same for one sandbox,
and a command stopped that way says why in its result (``stopped``). A
preview left without changes is removed, as ``corral run --preview`` does.
"""

# No ``from __future__ import annotations`` here: the MCP SDK builds each
# tool's input schema from its annotations, which refer to names local to
# build_server (pydantic's Field is imported there, as mcp is optional).
import os
from typing import TYPE_CHECKING, Annotated, Any, Literal, NotRequired

# pydantic (which builds the output schemas) needs typing_extensions' TypedDict before 3.12
from typing_extensions import TypedDict

from .._exceptions import CorralError

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

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


class SandboxInfo(TypedDict):
    """One open sandbox."""

    sandbox_id: str
    workspace: str
    preview_id: str | None
    read_only: bool
    network: str
    isolation: str


class SandboxList(TypedDict):
    """``sandbox_list``'s result."""

    sandboxes: list[SandboxInfo]


class ExecResult(TypedDict):
    """``sandbox_exec``'s result: the command's status, output and blocked operations."""

    returncode: int
    exit_code: int | None
    signal: int | None
    timed_out: bool
    oom_killed: bool
    stopped: str
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    duration: float
    violations: list[str]
    exec_error: str | None


class WriteResult(TypedDict):
    """``sandbox_write_file``'s result."""

    path: str
    bytes: int


class ReadResult(TypedDict):
    """``sandbox_read_file``'s result: one part of a file."""

    path: str
    encoding: Literal["text", "base64"]
    content: str
    offset: int
    bytes: int
    truncated: bool
    next_offset: int | None


class FileEntry(TypedDict):
    """One entry of a directory listing."""

    name: str
    path: str
    kind: str
    size: int


class ListResult(TypedDict):
    """``sandbox_list_files``'s result."""

    path: str
    entries: list[FileEntry]


class ChangeEntry(TypedDict):
    """One changed path of a preview, with its unified diff (or a binary/size summary)."""

    path: str
    kind: str
    old_path: NotRequired[str]
    old_type: NotRequired[str]
    new_type: NotRequired[str]
    old_size: NotRequired[int]
    new_size: NotRequired[int]
    old_target: NotRequired[str]
    new_target: NotRequired[str]
    old_mode: NotRequired[str]
    new_mode: NotRequired[str]
    content_changed: bool
    diff: str


class DiffResult(TypedDict):
    """``sandbox_diff``'s result."""

    preview: str
    workspace: str
    summary: dict[str, int]
    changes: list[ChangeEntry]
    diff_truncated: bool


class ApplyResult(TypedDict):
    """``sandbox_apply``'s result."""

    sandbox_id: str
    preview: str
    applied: list[str]
    skipped_conflicts: list[str]
    skipped_unsupported: list[str]
    failed: list[list[str]]
    preview_removed: bool
    #: ``[path, reason]`` of git inputs that landed and that the git check renamed out of
    #: git's way (``<name>.corral-quarantined``): the agent must learn they did not land
    quarantined: list[list[str]]


class DestroyResult(TypedDict):
    """``sandbox_destroy``'s result."""

    destroyed: str
    preview_removed: bool


def _cut(data: bytes, limit: int) -> tuple[str, bool]:
    """Decode *data*, keeping at most *limit* bytes and saying how many were cut."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    kept = data[:limit].decode("utf-8", "ignore")
    return f"{kept}\n[corral: output truncated, {len(data) - limit} more bytes not shown]", True


#: the SDK's hints that name Python arguments -> what an MCP client can do instead
_MCP_HINTS = {
    "raise it with max_output=..., or read in parts (offset=, limit=)": (
        "list a subdirectory, or read the file in parts with offset and limit"
    ),
    "create a new sandbox": "create one with sandbox_create",
    "give an existing directory as cwd, absolute or relative to the workspace": (
        "give an existing directory as cwd (relative to the workspace), or create it "
        "first with sandbox_exec"
    ),
}


class SandboxRegistry:
    """The sandboxes of one MCP server, with the server's settings.

    Raises :class:`ToolError <mcp.server.mcpserver.exceptions.ToolError>` for
    everything the client got wrong or the policy refused; its text is shown
    to the model as is.
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
                f"No sandbox {sandbox_id!r} is open (open sandboxes: {known}); "
                "create one with sandbox_create."
            )
        return sandbox

    def _with_preview(self, sandbox_id: str, what: str) -> Any:
        sandbox = self.get(sandbox_id)
        if sandbox.preview is None:
            raise self.error(
                f"Sandbox {sandbox_id} {what}: it has no preview, its commands write to the "
                "workspace directly; create one with sandbox_create (preview: true) to review "
                "changes before they land."
            )
        return sandbox

    def _failure(self, exc: CorralError) -> Exception:
        """The tool error for *exc*: its message (which says what failed) and hint, in MCP terms."""
        message = exc.message.rstrip(".")
        hint = _MCP_HINTS.get(exc.hint or "", exc.hint)
        return self.error(f"{message}." + (f" Hint: {hint}." if hint else ""))

    def describe(self, sandbox: Any) -> SandboxInfo:
        preview = sandbox.preview
        return {
            "sandbox_id": sandbox.id,
            "workspace": sandbox.workspace,
            "preview_id": None if preview is None else preview.id,
            "read_only": sandbox.policy.filesystem.read_only,
            "network": sandbox.policy.network.mode,
            "isolation": sandbox.policy.isolation,
        }

    async def _close(self, sandbox: Any, reason: str, *, discard: bool = False) -> bool:
        """Stop *sandbox*'s commands, close it; drop its preview if asked or left empty.

        Returns whether the preview was removed.
        """
        import asyncio

        await sandbox._close(reason)
        preview = sandbox.preview
        if preview is None:
            return False
        try:
            if discard or not await asyncio.to_thread(preview.changes):
                await asyncio.to_thread(preview.discard)
                return True
        except CorralError:
            if discard:
                raise
        return False

    # ------------------------------------------------------------ tools
    async def create(
        self, preview: bool | None, read_only: bool, isolation: str | None = None
    ) -> SandboxInfo:
        """Open a sandbox; with ``isolation: "vm"`` its micro-VM is booted before this returns.

        *isolation* can only raise the server's minimum isolation level.
        """
        import asyncio

        from .._sandbox import AsyncSandbox
        from ..policy import isolation_rank

        if len(self.sandboxes) >= self.max_sandboxes:
            raise self.error(
                f"{len(self.sandboxes)} sandboxes are open, the limit "
                "(integrations.mcp.maxSandboxes); destroy one with sandbox_destroy first."
            )
        use_preview = self.preview_default if preview is None else preview
        if isolation is not None and isolation_rank(isolation) < isolation_rank(
            self.policy.isolation
        ):
            raise self.error(
                f"isolation {isolation!r} is weaker than the server's minimum "
                f"{self.policy.isolation!r}; arguments can only tighten the policy: omit "
                "isolation or ask for a stronger level."
            )
        try:
            # the settings are loaded like the server's (rules still apply per command);
            # the only option a client can give tightens them
            sandbox = AsyncSandbox(
                cwd=self.cwd,
                environ=self.environ,
                preview=use_preview,
                agent_session=self.session,
                read_only=True if read_only else None,
                isolation=isolation,  # type: ignore[arg-type]
            )
        except CorralError as exc:
            raise self._failure(exc) from None
        try:
            # a VM session boots now: a refusal comes here, and the first command is fast
            await asyncio.to_thread(sandbox._start_vm)
        except CorralError as exc:
            await self._close(sandbox, "create failed", discard=True)
            raise self._failure(exc) from None
        self.sandboxes[sandbox.id] = sandbox
        return self.describe(sandbox)

    async def exec(
        self,
        sandbox_id: str,
        command: str | list[str],
        timeout: float | None,  # noqa: ASYNC109 - the sandbox's limit, not an await timeout
        stdin: str | None,
        cwd: str | None,
    ) -> ExecResult:
        sandbox = self.get(sandbox_id)
        limit = self.policy.resources.timeout
        if timeout is not None and limit is not None:
            timeout = min(timeout, limit)  # a tool argument never loosens the policy
        try:
            outcome = await sandbox.exec(command, timeout=timeout, stdin=stdin, cwd=cwd)
        except CorralError as exc:
            raise self._failure(exc) from None
        stdout, out_cut = _cut(outcome.stdout, self.max_output)
        stderr, err_cut = _cut(outcome.stderr, self.max_output)
        return {
            "returncode": outcome.returncode,
            "exit_code": outcome.exit_code,
            "signal": outcome.signal,
            "timed_out": outcome.timed_out,
            "oom_killed": outcome.oom_killed,
            "stopped": outcome.stopped,
            "stdout": stdout,
            "stderr": stderr,
            "stdout_truncated": out_cut or outcome.stdout_truncated,
            "stderr_truncated": err_cut or outcome.stderr_truncated,
            "duration": round(outcome.duration, 3),
            "violations": [v.describe() for v in outcome.violations],
            "exec_error": outcome.exec_error,
        }

    async def write_file(
        self,
        sandbox_id: str,
        path: str,
        content: str,
        parents: bool,
        encoding: Literal["text", "base64"] = "text",
    ) -> WriteResult:
        """Write *content* (UTF-8 text, or base64 of any bytes) to *path* from inside the sandbox."""
        sandbox = self.get(sandbox_id)
        data: bytes | str = content
        if encoding == "base64":
            import base64
            import binascii

            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise self.error(
                    f"content is not valid base64 ({exc}); nothing was written. Send standard "
                    'base64 (RFC 4648, with padding, no line breaks), or text with encoding="text".'
                ) from None
        try:
            await sandbox.write_file(path, data, parents=parents)
        except CorralError as exc:
            raise self._failure(exc) from None
        return {"path": path, "bytes": len(data if isinstance(data, bytes) else data.encode())}

    async def read_file(
        self,
        sandbox_id: str,
        path: str,
        offset: int,
        limit: int | None,
        encoding: Literal["text", "base64"],
    ) -> ReadResult:
        """At most ``min(limit, maxOutput)`` bytes of *path* from *offset*, as text or base64."""
        sandbox = self.get(sandbox_id)
        cap = self.max_output if limit is None else min(limit, self.max_output)
        if self.policy.resources.output is not None:  # the sandbox keeps no more than this
            cap = max(0, min(cap, self.policy.resources.output - 1))
        try:
            # one byte more than the cap tells whether anything follows
            data = await sandbox.read_file(path, offset=offset, limit=cap + 1)
        except CorralError as exc:
            raise self._failure(exc) from None
        more = len(data) > cap
        data = data[:cap]
        if encoding == "base64":
            import base64

            content = base64.b64encode(data).decode("ascii")
        else:
            try:
                content = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                if not (
                    more and exc.start >= len(data) - 3 and exc.reason == "unexpected end of data"
                ):
                    raise self.error(
                        f"{path} is not UTF-8 text (byte {offset + exc.start}); "
                        'read it with encoding="base64".'
                    ) from None
                data = data[: exc.start]  # a character cut by the cap: it starts the next part
                content = data.decode("utf-8")
        return {
            "path": path,
            "encoding": encoding,
            "content": content,
            "offset": offset,
            "bytes": len(data),
            "truncated": more,
            "next_offset": offset + len(data) if more else None,
        }

    async def list_files(self, sandbox_id: str, path: str) -> ListResult:
        sandbox = self.get(sandbox_id)
        try:
            entries = await sandbox.list_files(path)
        except CorralError as exc:
            raise self._failure(exc) from None
        return {"path": path, "entries": [e.fields() for e in entries]}

    async def diff(self, sandbox_id: str) -> DiffResult:
        """The change set, each change with its unified diff; all diffs within maxOutput."""
        import asyncio

        sandbox = self._with_preview(sandbox_id, "has no changes to show")
        try:
            changes = await sandbox.diff()
        except CorralError as exc:
            raise self._failure(exc) from None
        return await asyncio.to_thread(self._render_changes, changes)

    def _render_changes(self, changes: Any) -> DiffResult:
        from ..preview._render import unified_diff

        budget = self.max_output
        cut = False
        entries = []
        for change in changes:
            entry = change.to_json()
            if budget > 0:
                text = "\n".join(unified_diff(change, changes.workspace))
                data = text.encode()
                if len(data) > budget:
                    text, _ = _cut(data, budget)
                    cut = True
                budget -= len(data)
            else:
                text = "[corral: diff not shown, integrations.mcp.maxOutput reached]"
                cut = True
            entry["diff"] = text
            entries.append(entry)
        return {
            "preview": changes.preview_id,
            "workspace": changes.workspace,
            "summary": changes.counts(),
            "changes": entries,
            "diff_truncated": cut,
        }

    async def apply(self, sandbox_id: str, force: bool, skip_conflicts: bool) -> ApplyResult:
        sandbox = self._with_preview(sandbox_id, "has nothing to apply")
        try:
            result = await sandbox.apply(force=force, skip_conflicts=skip_conflicts)
        except CorralError as exc:
            raise self._failure(exc) from None
        return {
            "sandbox_id": sandbox_id,
            "preview": result.preview_id,
            "applied": list(result.applied),
            "skipped_conflicts": list(result.skipped_conflicts),
            "skipped_unsupported": list(result.skipped_unsupported),
            "failed": [list(f) for f in result.failed],
            "preview_removed": result.preview_removed,
            "quarantined": [list(q) for q in result.quarantined],
        }

    async def destroy(self, sandbox_id: str, discard: bool) -> DestroyResult:
        sandbox = self.get(sandbox_id)
        del self.sandboxes[sandbox_id]
        try:
            removed = await self._close(
                sandbox, f"sandbox_destroy was called for {sandbox_id}", discard=discard
            )
        except CorralError as exc:
            raise self._failure(exc) from None
        return {"destroyed": sandbox_id, "preview_removed": removed}

    async def close_all(self) -> None:
        """Stop every running command and close every sandbox (the client went away)."""
        import asyncio

        sandboxes = list(self.sandboxes.values())
        self.sandboxes.clear()
        # together: each may wait up to killGrace for a command that ignores SIGTERM
        await asyncio.gather(
            *(self._close(s, "the MCP client disconnected") for s in sandboxes),
            return_exceptions=True,
        )


def _tool_error(text: str) -> Any:
    from mcp.types import CallToolResult, TextContent

    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _strict_server_class() -> "type[MCPServer]":
    """An :class:`MCPServer` that refuses unknown arguments and words its errors plainly."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
    from pydantic import ValidationError

    class StrictServer(MCPServer):
        """Arguments outside a tool's input schema are an error (``timout`` is not ``timeout``)."""

        _schemas: dict[str, dict[str, Any]] | None = None

        async def list_tools(self) -> list[Any]:
            tools = await super().list_tools()
            for tool in tools:  # say in the schema what call_tool enforces
                tool.input_schema = {**tool.input_schema, "additionalProperties": False}
            return tools

        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            import difflib

            if self._schemas is None:
                self._schemas = {
                    t.name: t.input_schema.get("properties", {}) for t in await super().list_tools()
                }
            known = self._schemas.get(name)
            if known is not None:
                for key in arguments:
                    if key not in known:
                        close = difflib.get_close_matches(key, list(known), n=1)
                        return _tool_error(
                            f"{name} has no argument {key!r}"
                            + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; its arguments are: {', '.join(known) or 'none'}."
                        )
            try:
                return await super().call_tool(name, arguments, context)
            except UnexpectedToolError:
                raise
            except ToolError as exc:
                cause = exc.__cause__
                if isinstance(cause, ValidationError):
                    problems = "; ".join(
                        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                        for e in cause.errors()
                    )
                    return _tool_error(f"Invalid arguments for {name}: {problems}.")
                text = str(exc)
                prefix = f"Error executing tool {name}: "
                return _tool_error(text[len(prefix) :] if text.startswith(prefix) else text)

    return StrictServer


def build_server(registry: SandboxRegistry) -> "MCPServer":
    """The :class:`mcp.server.mcpserver.MCPServer` with corral's tools bound to *registry*."""
    from mcp.types import ToolAnnotations
    from pydantic import Field

    from .._version import __version__

    server: MCPServer = _strict_server_class()(
        "corral", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    SandboxId = Annotated[str, Field(description="the id sandbox_create returned", min_length=1)]

    def hints(
        *,
        read_only: bool = False,
        destructive: bool = False,
        idempotent: bool = False,
        open_world: bool = False,
    ) -> ToolAnnotations:
        return ToolAnnotations(
            read_only_hint=read_only,
            destructive_hint=destructive,
            idempotent_hint=idempotent,
            open_world_hint=open_world,
        )

    @server.tool(annotations=hints())
    async def sandbox_create(
        preview: Annotated[
            bool | None,
            Field(
                description="work on a copy-on-write preview (default: integrations.mcp.preview)"
            ),
        ] = None,
        read_only: Annotated[bool, Field(description="mount the workspace read-only")] = False,
        isolation: Annotated[
            Literal["process", "namespace", "kernel", "vm"] | None,
            Field(
                description=(
                    "the minimum isolation level (can only raise the server's); 'vm' keeps "
                    "one micro-VM for the sandbox's life"
                )
            ),
        ] = None,
    ) -> SandboxInfo:
        """Open a sandbox session: its id, workspace and private /tmp last until sandbox_destroy."""
        return await registry.create(preview, read_only, isolation)

    # destructive: without a preview a command writes to the workspace itself;
    # open world: the policy may allow hosts on the network
    @server.tool(annotations=hints(destructive=True, open_world=True))
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
    ) -> ExecResult:
        """Run a command in the sandbox; returns its exit status, output and blocked operations."""
        return await registry.exec(sandbox_id, command, timeout, stdin, cwd)

    @server.tool(annotations=hints(destructive=True, idempotent=True))
    async def sandbox_write_file(
        sandbox_id: SandboxId,
        path: Annotated[
            str, Field(description="path, relative to the workspace or absolute", min_length=1)
        ],
        content: Annotated[
            str, Field(description="the text to write, or its bytes in base64 (see encoding)")
        ],
        parents: Annotated[bool, Field(description="create missing parent directories")] = False,
        encoding: Annotated[
            Literal["text", "base64"],
            Field(description='"text" (written as UTF-8) or "base64" for binary content'),
        ] = "text",
    ) -> WriteResult:
        """Write a file from inside the sandbox (so the policy's write rules apply)."""
        return await registry.write_file(sandbox_id, path, content, parents, encoding)

    @server.tool(annotations=hints(read_only=True, idempotent=True))
    async def sandbox_read_file(
        sandbox_id: SandboxId,
        path: Annotated[
            str, Field(description="path, relative to the workspace or absolute", min_length=1)
        ],
        offset: Annotated[int, Field(description="bytes to skip from the start", ge=0)] = 0,
        limit: Annotated[
            int | None,
            Field(description="at most this many bytes (default and cap: the server's)", ge=1),
        ] = None,
        encoding: Annotated[
            Literal["text", "base64"],
            Field(description='"text" (UTF-8) or "base64" for binary files'),
        ] = "text",
    ) -> ReadResult:
        """Read (part of) a regular file as the sandbox sees it; secrets are hidden.

        A long file comes in parts: when truncated is true, read on from next_offset.
        """
        return await registry.read_file(sandbox_id, path, offset, limit, encoding)

    @server.tool(annotations=hints(read_only=True, idempotent=True))
    async def sandbox_list_files(
        sandbox_id: SandboxId,
        path: Annotated[
            str, Field(description="directory, relative to the workspace", min_length=1)
        ] = ".",
    ) -> ListResult:
        """List a directory as the sandbox sees it: name, path, kind and size of each entry."""
        return await registry.list_files(sandbox_id, path)

    @server.tool(annotations=hints(read_only=True, idempotent=True))
    async def sandbox_list() -> SandboxList:
        """The open sandboxes."""
        return {"sandboxes": [registry.describe(s) for s in registry.sandboxes.values()]}

    @server.tool(annotations=hints(read_only=True, idempotent=True))
    async def sandbox_diff(sandbox_id: SandboxId) -> DiffResult:
        """The preview's changes against the workspace: each added, modified, renamed or
        deleted path with its unified diff (all diffs together are capped in size)."""
        return await registry.diff(sandbox_id)

    @server.tool(annotations=hints(destructive=True))
    async def sandbox_apply(
        sandbox_id: SandboxId,
        force: Annotated[
            bool, Field(description="overwrite files that changed in the workspace")
        ] = False,
        skip_conflicts: Annotated[
            bool, Field(description="apply the rest, skip conflicting files")
        ] = False,
    ) -> ApplyResult:
        """Land the preview's changes in the real workspace (only when the user asked for it)."""
        return await registry.apply(sandbox_id, force, skip_conflicts)

    @server.tool(annotations=hints(destructive=True))
    async def sandbox_destroy(
        sandbox_id: SandboxId,
        discard: Annotated[
            bool, Field(description="also drop the preview's unapplied changes")
        ] = False,
    ) -> DestroyResult:
        """Stop the sandbox's commands (SIGKILL after the grace period) and remove it.

        Its preview is kept for review unless discard is true or it has no changes.
        """
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
