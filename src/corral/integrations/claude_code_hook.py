"""The Claude Code ``PreToolUse`` hook: decide each tool call by corral's policy.

Claude Code pipes one JSON object to the hook (``session_id``,
``transcript_path``, ``cwd``, ``hook_event_name``, ``tool_name``,
``tool_input``, ...) and reads a decision from its stdout::

    {"hookSpecificOutput": {"hookEventName": "PreToolUse",
                            "permissionDecision": "allow" | "deny" | "ask",
                            "permissionDecisionReason": "...",
                            "updatedInput": {...}}}

Decisions (:func:`decide`):

* ``Bash`` and ``Monitor`` (:data:`SHELL_TOOLS`): the user's own Claude Code
  ``deny``/``ask`` rules are applied to the original command first
  (:mod:`._permissions`; Claude Code would apply them only to the rewritten
  one): ``deny``, or ``ask`` with the rewritten command. Otherwise ``allow``
  with ``updatedInput`` = the whole original ``tool_input`` whose ``command``
  becomes ``/abs/corral-client run --agent-session ID --keep --report-fd 3 --shell bash -c ...``
  (the compiled fast client when it is usable, else the Python CLI). The
  original travels in a quoted heredoc (:func:`rewrite_command`), so quotes,
  newlines, heredocs, ``$()`` and any unicode reach ``bash -c`` unchanged,
  with no escaping.
  Commands matching ``integrations.claudeCode.unsandboxedCommands`` get
  ``ask``: the user approves running them *without* corral.
* ``Write``, ``Edit``, ``MultiEdit``, ``NotebookEdit``, ``EnterWorktree``:
  ``deny`` when a sandboxed command could not write the path
  (:class:`._access.PathRules`), with the reason; otherwise no decision
  (Claude Code's own permission rules apply - corral never widens them for
  tools it does not sandbox).
* ``Read``, ``Grep``, ``Glob``: ``deny`` on secret paths, and searches that
  would reach one; otherwise no decision.
* :data:`UNSANDBOXABLE` tools (code run inside Claude Code's process or in
  another shell language): ``deny``; a ``Skill`` whose file has shell
  injections (``!`cmd```, run by Claude Code when the skill loads): ``deny``.
* Any other tool: blocked when its input carries something to execute
  (:data:`COMMAND_FIELDS`; corral's own MCP tools excepted); ``deny`` when a
  field naming a file (:data:`PATH_FIELDS`) names a secret path; else no decision.
  The hook's matcher is ``*`` so that it sees tools it does not know.

Anything else - malformed JSON, a missing field, another event, an unknown
tool carrying a command, bad settings, an internal error - raises :class:`HookError`; the
command then exits 2 with the reason on stderr, which Claude Code treats as
"block this tool call" (fail closed: a broken hook never lets a command
through unsandboxed).

This module is on the hook's hot path: it imports no heavy module (no
:mod:`json`, :mod:`re`, :mod:`shlex`). It reads no process-wide state either
(the environment comes in as an argument): the corral server runs it for
its clients.
"""

from __future__ import annotations

import os
import posixpath

from ._shell import quote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from ..policy import ResolvedSettings

__all__ = [
    "COMMAND_FIELDS",
    "FILE_TOOLS",
    "MATCHER",
    "PATH_FIELDS",
    "READ_TOOLS",
    "SHELL_TOOLS",
    "UNSANDBOXABLE",
    "HookError",
    "anchored_cwd",
    "corral_command",
    "decide",
    "expand_user",
    "handoff_command",
    "rewrite_command",
]

#: Tools that run a shell command in ``command``: it runs under ``corral run`` instead.
SHELL_TOOLS: tuple[str, ...] = ("Bash", "Monitor")
#: Tools whose target path must be writable, and the tool_input field naming it.
#: ``MultiEdit`` no longer exists in current Claude Code; it stays for older versions.
#: ``EnterWorktree`` creates a git worktree at ``path`` (when given) from the agent's process.
FILE_TOOLS: dict[str, str] = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
    "EnterWorktree": "path",
}
#: Tools that read, and how they name what they read.
READ_TOOLS: dict[str, str] = {"Read": "file_path", "Grep": "path", "Glob": "path"}
#: Tools that run code corral cannot sandbox (it runs inside Claude Code's own process or
#: in another shell language): denied, with the reason.
UNSANDBOXABLE: dict[str, str] = {
    "PowerShell": "PowerShell commands cannot run in corral's sandbox; use the Bash tool",
    "REPL": "the REPL runs JavaScript inside Claude Code's own process, outside the sandbox; "
    "use the Bash tool (node -e ...) instead",
    "Workflow": "a workflow script runs inside Claude Code's own process, outside the sandbox",
}
#: tool_input fields that carry something to execute: a tool the hook has no rule for
#: that has one of them is blocked (exit 2) - an unknown tool must not run commands unsandboxed.
COMMAND_FIELDS: tuple[str, ...] = (
    "command",
    "commands",
    "cmd",
    "script",
    "scriptPath",
    "code",
    "shell",
    "exec",
    "executable",
)
#: tool_input fields that name a file: a tool the hook has no rule for (an MCP filesystem
#: server, say) may not name a secret path in any of them.
PATH_FIELDS: tuple[str, ...] = (
    "path",
    "paths",
    "file_path",
    "filePath",
    "file",
    "filename",
    "notebook_path",
    "directory",
    "dir",
    "source",
    "destination",
    "target",
    "cwd",
)
#: The matcher of corral's hook: every tool, so that unknown tools are judged too.
MATCHER = "*"
#: corral's own MCP servers (``corral mcp`` as a user server and as the plugin's): their
#: tools run commands inside corral's sandboxes already.
OWN_MCP_PREFIXES: tuple[str, ...] = ("mcp__corral__", "mcp__plugin_corral_corral__")

#: The shell the rewritten command runs the original with (what Claude Code's Bash tool uses).
SHELL = "bash"


class HookError(Exception):
    """The hook cannot decide; Claude Code must block the call (exit 2, reason on stderr)."""


def corral_command(argv0: str, executable: str) -> tuple[str, ...]:
    """How the Python CLI is started again: the absolute path of the running script.

    When corral was started as ``python -m corral`` (*argv0* is the package's
    ``__main__.py``) or by ``python -c`` (the fast client's fallback), the
    interpreter and ``-m corral`` instead.
    """
    if posixpath.basename(argv0) == "__main__.py" or argv0 in ("", "-c"):
        return (posixpath.abspath(executable), "-m", "corral")
    return (posixpath.abspath(argv0),)


#: The heredoc delimiter of a rewritten command (``_`` is appended until no line equals it).
DELIMITER = "CORRAL_COMMAND_END"
#: The delimiter of the heredoc inside the sandboxed script (when the cwd carries).
INNER_DELIMITER = "CORRAL_INNER_END"
#: The variable that carries the host part of a rewritten command (a single-quoted word).
HOST_VARIABLE = "__corral_host"
#: The variables that carry the sandboxed script's constant parts before and after the original.
PRE_VARIABLE = "__corral_pre"
POST_VARIABLE = "__corral_post"
#: The shell variable a heredoc hands the original command over in (never exported).
VARIABLE = "__corral_command"


def rewrite_command(
    command: str, *, session_id: str, corral: Sequence[str], workspace: str | None = None
) -> str:
    r"""The shell command that runs *command* under ``corral run`` (for bash, as Claude Code runs it).

    The command goes in a quoted heredoc that bash's ``read`` builtin takes into
    a shell variable, so its text is not escaped at all - quoting it as a word
    would cost three bytes per ``'``, multiplied again by Claude Code's own
    quoting (E2BIG where the original runs) - and no shell word of the
    rewritten command contains it (Claude Code's checks of ``bash -c '<text>'``
    see nothing to check). Without *workspace* the rewritten command is ~120
    bytes plus the original (with it, ~1400: see :func:`_cwd_carrying`)::

        IFS= read -r -d '' __corral_command <<'CORRAL_COMMAND_END' ||:
        <original>
        CORRAL_COMMAND_END
        /abs/corral-client run --agent-session ID --shell bash -c "${__corral_command%?}"

    ``%?`` drops the newline the heredoc adds; no command runs before corral
    (``read`` is a builtin), and ``corral run`` gets the original exactly.

    With *workspace* (an absolute, symlink-free path) a ``cd`` carries to the
    next call as it does without corral (:func:`_cwd_carrying`): the sandboxed
    bash ``eval``\ s the original (as Claude Code's own shell does) and, when it
    exits 0, writes ``pwd -P`` into a report directory corral made writable for
    this run only (or the kept sandbox's own); corral checks that untrusted claim
    (one line, a regular file of at most 4 KiB, after resolving links a
    directory at or under *workspace*) and hands it to the outer shell on
    descriptor 3, which ``cd``\ s there. The exit status is the command's, exactly.

    Raises:
        HookError: *command* contains a NUL byte (no shell could run it).
    """
    try:
        prefix = (
            f"{' '.join(quote(word) for word in corral)} run --agent-session {quote(session_id)}"
        )
        quote(command)  # the NUL check
    except ValueError as exc:
        raise HookError(f"cannot sandbox the command: {exc}") from None
    lines = set(command.split("\n"))
    inner = _delimiter(INNER_DELIMITER, lines)
    delimiter = _delimiter(DELIMITER, lines | {inner})
    if workspace is None:
        return (
            f"IFS= read -r -d '' {VARIABLE} <<'{delimiter}' ||:\n{command}\n{delimiter}\n"
            f'{prefix} --shell {SHELL} -c "${{{VARIABLE}%?}}"'
        )
    return _cwd_carrying(command, delimiter, inner, prefix, workspace)


#: Handed-off commands older than this are removed when the hook writes a new one.
HANDOFF_MAX_AGE = 24 * 3600.0


def handoff_command(
    command: str,
    *,
    session_id: str,
    corral: Sequence[str],
    env: Mapping[str, str],
    workspace: str,
) -> str:
    """A rewritten command that names neither the original nor any shell syntax.

    For a workspace that is a linked git worktree: Claude Code 2.1.331 refuses,
    in a session isolated in a worktree, every command it cannot parse as plain
    simple commands (the heredoc of :func:`rewrite_command`) and every one that
    hands text naming git to a shell (``corral run -c 'git status'``). So the
    original goes into a new private file in corral's state directory
    (``hook-commands/``, hidden from every sandbox by the default secret
    paths), and the rewritten command is the simple command
    ``/abs/corral-client run --agent-session ID --keep --shell bash --workspace WS
    --command-file FILE`` (in the session's kept sandbox, see
    :mod:`corral.server._kept`). The workspace is named, as in
    :func:`rewrite_command`: corral must not find it again from where the
    shell is by then, which a sandboxed command can re-point (see
    :func:`anchored_cwd`).
    Claude Code's own shell does not run the original, so a ``cd`` does not
    carry to the next call here (docs/integrations.md, "Limits"). Files older
    than :data:`HANDOFF_MAX_AGE` are removed as new ones are written.

    Raises:
        HookError: *command* contains a NUL byte, or the file cannot be written.
    """
    import secrets
    import time

    from ..policy._locations import default_home, state_dir

    if "\0" in command:
        raise HookError("cannot sandbox the command: it contains a NUL byte")
    directory = posixpath.join(state_dir(home=default_home(env), environ=env), "hook-commands")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        now = time.time()
        for name in os.listdir(directory):
            path = posixpath.join(directory, name)
            try:
                if now - os.lstat(path).st_mtime > HANDOFF_MAX_AGE:
                    os.unlink(path)
            except OSError:
                pass
        path = posixpath.join(directory, f"{secrets.token_hex(16)}.sh")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.fsencode(command))
    except OSError as exc:
        raise HookError(f"cannot hand the command to corral: {exc}") from None
    words = [*corral, "run", "--agent-session", session_id, "--keep", "--shell", SHELL]
    words += ["--workspace", workspace]
    return " ".join(quote(word) for word in [*words, "--command-file", path])


def _delimiter(base: str, lines: set[str]) -> str:
    while base in lines:
        base += "_"
    return base


#: The sandboxed script's prologue in a kept sandbox (``$CORRAL_SESSION_STATE`` is ``63``,
#: the descriptor of the session's state channel, see :mod:`corral.server._kept`): the
#: exported variables the previous call of the session left there are sourced - inside the
#: sandbox, where they were written - keeping this run's ``SHLVL``, ``CORRAL_SANDBOX_ID`` and
#: a ``PWD`` that names the real directory. ``__corral_k`` (this run's id) marks the run
#: kept: on exit status 0 the script's end writes ``export -p``, ``return``, the id and
#: ``pwd -P`` to the channel in one write; otherwise an ``EXIT`` trap writes ``export -p``
#: alone. Sourced by the next call, the state stops at ``return``. ``/dev/fd/63`` is a new
#: open file description (read from the start), ``>&63`` writes at the channel's own offset,
#: after what the call was given; neither is an open for writing (a round trip to the write
#: broker each).
_KEPT_PROLOGUE = (
    "__corral_s=${CORRAL_SESSION_STATE-}; unset CORRAL_SESSION_STATE\n"
    'if [ "$__corral_s" = 63 ]; then __corral_v="$SHLVL $CORRAL_SANDBOX_ID"; '
    ". /dev/fd/63 2>&-; SHLVL=${__corral_v% *} "
    "CORRAL_SANDBOX_ID=${__corral_v#* } __corral_o=${OLDPWD-}; cd -P . 2>&-; "
    "OLDPWD=$__corral_o\n"
    "__corral_k=$CORRAL_SANDBOX_ID __corral_x=\n"
    "trap '[ -n \"$__corral_x\" ] || { export -p >&63; } 2>&-' EXIT; fi\n"
)


def _cwd_carrying(command: str, delimiter: str, inner: str, prefix: str, workspace: str) -> str:
    """The rewritten command that also carries the sandboxed shell's final directory and exports.

    The inner script (the heredoc's text, given to ``bash -c``) is the original
    in a second heredoc (:data:`INNER_DELIMITER`; the original's lines never
    equal either delimiter), ``eval``'d, then ``pwd -P`` into ``$__corral_d/cwd`` on
    exit status 0 - in a kept sandbox at the end of its shell state file instead,
    after ``return`` and this run's id (:data:`_KEPT_PROLOGUE`) - (a failed report -
    a policy that denies writes to the report directory - changes no status and
    prints nothing of the shell's).

    corral, not the host shell, handles the report (``--report-fd 3``,
    :mod:`corral.server._cwd_report`): in a fresh sandbox (no server, or a run that
    cannot be kept) it makes a private report directory under the caller's
    ``$TMPDIR``, writable by this run only, and names it in ``$CORRAL_REPORT_DIR``; the
    agent session's kept sandbox in the corral server (:mod:`corral.server._kept`)
    has its own private report directory instead and carries exported variables
    from call to call there (:data:`_KEPT_PROLOGUE`). Afterwards corral reads the
    report (no link followed, a regular file of at most 4 KiB, one line), removes
    the fresh directory, and - only on exit status 0 - writes the directory it
    names, with every link resolved on the host, to descriptor 3 if that is the
    workspace or a directory under it. The host shell reads descriptor 3 with
    ``$(exec corral ...)`` (one fork, which becomes corral; the command's own
    stdout is moved to descriptor 4 and back) and runs ``cd`` to it only when the
    exit status is 0, the line has no newline and no ``..`` component, and it is
    *workspace* or under it (a second check of what corral checked). That ``cd`` is
    ``builtin cd -P``: a ``cd`` function of the user's shell (rvm, autoenv and the
    like source files found in the directory they enter) must not act on a
    directory the sandboxed command could write. The exit status is the command's,
    exactly, given back by a shell function (``return``; no subshell). Besides
    corral itself, the host half runs no program: no ``mktemp``, ``head``, ``rm``.

    Only the original goes through ``read`` (bash reads a heredoc's pipe one byte
    per ``read(2)``). corral's own constant parts - the inner script's text before
    and after the original, and the host part - are single-quoted words assigned
    to variables (:data:`PRE_VARIABLE`, :data:`POST_VARIABLE`,
    :data:`HOST_VARIABLE`), which bash takes as it parses the command; the host
    part is then ``eval``'d. So the only commands Claude Code's own rule
    matching sees are ``read`` and ``eval`` (a user's ``Bash(rm:*)`` deny rule
    must not match every sandboxed command), and the original is still not
    escaped at all.
    """
    report = "cwd"
    # the sandboxed script is PRE + the original (with the newline its heredoc adds) + POST
    pre = f"IFS= read -r -d '' __corral_c <<'{inner}' ||:\n"
    post = (
        f"{inner}\n"
        "__corral_d=${CORRAL_REPORT_DIR-} __corral_k= __corral_x=; unset CORRAL_REPORT_DIR\n"
        f"{_KEPT_PROLOGUE}"
        'eval "${__corral_c%?}" || exit\n'
        # kept: one write to the state channel - the exports, and the report after "return"
        # and this run's id (sourced by the next call, the state stops at return)
        'if [ -n "$__corral_k" ]; then __corral_x=1; { { export -p; '
        "printf 'return\\n%s\\n' \"$__corral_k\"; pwd -P; } >&63; } 2>&- || :\n"
        f'elif [ -n "$__corral_d" ]; then {{ pwd -P >"$__corral_d"/{report}; }} 2>&- || :; fi\n'
        "exit 0"
    )
    ws = quote(workspace)
    # Claude Code runs a command with no redirection of its own with < /dev/null; the
    # heredocs here make it leave the rewritten one's stdin alone (its own pipe), so corral
    # gives that stdin back for every command without a "<" at all (a subset of Claude
    # Code's rule, the rest as before): what the command reads is what it reads without
    # corral, and a kept session's next shell, started ahead with /dev/null, fits it
    stdin = " </dev/null" if "<" not in command else ""
    host = (
        f"{{ __corral_w=$(exec {prefix} --workspace {ws} --keep --report-fd 3 --shell {SHELL} "
        f'-c "${PRE_VARIABLE}${VARIABLE}${POST_VARIABLE}" 3>&1 >&4 4>&-{stdin}); }} 4>&1\n'
        "__corral_s=$?\n"
        'if [ "$__corral_s" = 0 ]; then\n'
        "  case $__corral_w in\n"
        "    *$'\\n'*|*/..|*/../*) ;;\n"
        f'    {ws}|{ws}/*) builtin cd -P -- "$__corral_w" 2>/dev/null ;;\n'
        "  esac\n"
        "fi\n"
        '__corral_r() { return "$1"; }\n'
        '__corral_r "$__corral_s"'
    )
    # only the original goes through read (one byte per read(2) from a heredoc's pipe: ~0.5 us
    # each); corral's constant parts are single-quoted words, which bash takes as it parses.
    # The host part is a word too, so Claude Code's own rule matching sees only read and eval
    # (a user's Bash(rm:*) deny rule must not match every sandboxed command)
    return (
        f"IFS= read -r -d '' {VARIABLE} <<'{delimiter}' ||:\n{command}\n{delimiter}\n"
        f"{PRE_VARIABLE}={quote(pre)}\n{POST_VARIABLE}={quote(post)}\n"
        f"{HOST_VARIABLE}={quote(host)}\n"
        f'eval "${HOST_VARIABLE}"'
    )


def _decision(decision: str, reason: str, updated: dict[str, Any] | None = None) -> dict[str, Any]:
    output: dict[str, Any] = {
        "hookEventName": "PreToolUse",
        "permissionDecision": decision,
        "permissionDecisionReason": reason,
    }
    if updated is not None:
        output["updatedInput"] = updated
    return {"hookSpecificOutput": output}


def _field(mapping: Mapping[str, Any], name: str, where: str, *, optional: bool = False) -> Any:
    value = mapping.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise HookError(f"the hook input has no {where}{name} string")
    return value


def anchored_cwd(cwd: str, project: str | None, home: str) -> str:
    """Where a Bash call's workspace and settings are found from: never through a link a
    sandboxed command can re-point.

    *project* is Claude Code's project directory (``CLAUDE_PROJECT_DIR`` in the
    hook's environment), the directory the user started it in. The call's own
    *cwd* is the path text Claude Code keeps for its shell, and every directory
    in the project's workspace is writable by the project's sandboxes: one of
    them (a background call running next to this one) can replace a directory
    with a link to another repository, and the text then leads there - and so
    would the workspace found from it. So:

    * *project*'s own path counts up to its first link that lies in a git work
      tree (a directory with a :func:`~corral.policy._settings.git_top_level`,
      as :func:`corral.policy.find_workspace` counts it): such a link
      is in some project's workspace, where a sandbox can re-point it;
    * a *cwd* at or below *project* counts up to (not including) its first
      component below *project* that is a link (a Claude Code worktree,
      ``.claude/worktrees/NAME``, is a plain directory: its own workspace);
    * a *cwd* outside *project* (where Claude Code's shell lands when a carried
      ``cd`` was re-pointed) counts as *project*: the call runs there with the
      project's workspace, read-only where it is not in it.

    Without a usable *project* (unset, not absolute) *cwd* is returned as it is.
    """
    if not project or not project.startswith("/"):
        return cwd
    from ..policy._settings import git_top_level

    project = posixpath.normpath(project)
    top = _followed(project, "/", lambda parent: git_top_level(parent, home=home) is not None)
    if top != project:
        return top
    here = posixpath.normpath(cwd)
    if here != top and not here.startswith(top.rstrip("/") + "/"):
        return top
    return _followed(here[len(top) :], top, lambda _parent: True)


def _followed(path: str, start: str, counts: Callable[[str], bool]) -> str:
    """*start* joined with *path*'s components up to the first that is a link (or missing)
    in a directory for which *counts* is true."""
    import stat

    done = start
    for part in path.split("/"):
        if not part:
            continue
        step = posixpath.join(done, part)
        try:
            link = stat.S_ISLNK(os.lstat(step).st_mode)
        except OSError:
            break  # missing: nothing below it to find a workspace from
        if link and counts(done):
            break
        done = step
    return done


def parse_payload(data: bytes) -> dict[str, Any]:
    """Parse and check the PreToolUse JSON Claude Code sent.

    Raises:
        HookError: not JSON, not an object, not a PreToolUse event, or a field
            is missing or of the wrong type.
    """
    from .._jsonfast import JSONError, loads

    try:
        payload = loads(data)
    except JSONError as exc:
        raise HookError(f"the hook input is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise HookError("the hook input is not a JSON object")
    event = payload.get("hook_event_name")
    if event != "PreToolUse":
        raise HookError(f"this hook handles PreToolUse events, not {event!r}")
    for name in ("session_id", "cwd", "tool_name"):
        _field(payload, name, "")
    if not payload["cwd"].startswith("/"):
        raise HookError(f"the hook input's cwd is not absolute: {payload['cwd']!r}")
    if not isinstance(payload.get("tool_input"), dict):
        raise HookError("the hook input has no tool_input object")
    return payload


def decide(
    payload: Mapping[str, Any],
    resolved: ResolvedSettings,
    *,
    corral: Sequence[str],
    environ: Mapping[str, str] | None = None,
    pid: int | None = None,
) -> dict[str, Any] | None:
    """The hook's answer for one parsed *payload* (``None``: no decision, Claude Code decides).

    *corral* starts corral in a rewritten command; *environ* (default
    :data:`os.environ`) gives ``$HOME`` for ``~`` in tool paths; *pid* is the
    hook's process, below the Claude Code whose command-line rules apply.

    Raises:
        HookError: a tool without a rule whose input carries a command, a
            tool_input without the needed field, or unreadable permission rules.
    """
    from ._access import PathRules

    tool = payload["tool_name"]
    tool_input: dict[str, Any] = payload["tool_input"]
    cwd: str = payload["cwd"]
    env: Mapping[str, str] = os.environ if environ is None else environ
    if tool in SHELL_TOOLS:
        if tool == "Monitor" and tool_input.get("command") is None:
            return None  # a WebSocket monitor runs no command (network tools are Claude Code's)
        return _shell_decision(tool, tool_input, payload, resolved, corral, env, pid)
    rules = PathRules(resolved.policy, environ=env)
    if tool in FILE_TOOLS:
        optional = tool == "EnterWorktree"  # without a path: under the project's .claude/
        given = _field(tool_input, FILE_TOOLS[tool], "tool_input.", optional=optional)
        if given is None:
            return None
        path = _absolute(given, cwd, env)
        denial = rules.write_denial(path)
        if denial is not None:
            return _decision(
                "deny",
                f"corral: {tool} of {path} is not allowed: {denial}. "
                "Write inside the workspace instead, or ask the user to change the policy.",
            )
        return None
    if tool == "Read":
        path = _absolute(_field(tool_input, "file_path", "tool_input."), cwd, env)
        denial = rules.read_denial(path)
        if denial is not None:
            return _decision("deny", f"corral: reading {path} is not allowed: {denial}.")
        return None
    if tool in ("Grep", "Glob"):
        root = _absolute(_field(tool_input, "path", "tool_input.", optional=True) or cwd, cwd, env)
        pattern = tool_input.get("pattern") if tool == "Glob" else None
        if pattern is not None and not isinstance(pattern, str):
            raise HookError("the hook input has no tool_input.pattern string")
        denial = rules.search_denial(root, pattern)
        if denial is not None:
            return _decision("deny", f"corral: this {tool} is not allowed: {denial}.")
        return None
    if tool in UNSANDBOXABLE:
        return _decision("deny", f"corral: {tool} is not allowed: {UNSANDBOXABLE[tool]}.")
    if tool == "Skill":
        name = _field(tool_input, "skill", "tool_input.")
        runs = _skill_running_commands(name, cwd, env)
        if runs is not None:
            return _decision(
                "deny",
                f"corral: the skill {name!r} is not allowed: {runs} runs shell commands "
                "(!`...`) when it loads, in Claude Code's own process, outside the sandbox. "
                "Run what it needs with the Bash tool instead.",
            )
        return None
    if tool.startswith(OWN_MCP_PREFIXES):
        return None
    carried = [f for f in COMMAND_FIELDS if tool_input.get(f) not in (None, "", [], {})]
    if carried:
        raise HookError(
            f"corral has no rule for the tool {tool!r} and its input carries something to "
            f"execute ({', '.join(carried)}): it would run outside the sandbox, so the call "
            "is blocked. Use the Bash tool"
        )
    for name in PATH_FIELDS:
        value = tool_input.get(name)
        for given in value if isinstance(value, list) else [value]:
            if not isinstance(given, str) or not given:
                continue
            path = _absolute(given, cwd, env)
            denial = rules.read_denial(path)
            if denial is not None:
                return _decision("deny", f"corral: {tool} may not touch {path} ({name}): {denial}.")
    return None


#: How deep :func:`_skill_running_commands` looks for a plugin's skill under the plugins dir.
_PLUGIN_DEPTH = 6


def _skill_running_commands(name: str, cwd: str, environ: Mapping[str, str]) -> str | None:
    """The file of skill *name* that has shell injections (``!`cmd```), if one has.

    Claude Code runs a skill's (or custom command's) ``!`cmd``` lines when it
    loads it, in its own process - no PreToolUse hook sees them. The skill's
    files are looked for where Claude Code finds them: ``.claude/skills/NAME/SKILL.md``
    and ``.claude/commands/NAME.md`` (``a:b`` is ``a/b.md``) in the session's
    directory and every one above it, the same under the user's config
    directory, and ``skills/SKILL/SKILL.md`` / ``commands/SKILL.md`` of
    installed plugins (``plugin:skill``). Built-in skills have no file.
    """
    from ._permissions import ancestors, claude_config_dir

    parts = [p for p in name.split(":") if p and p not in (".", "..")]
    if not parts or any("/" in p for p in parts):
        return None
    config = claude_config_dir(environ)
    bases = [config, *(posixpath.join(d, ".claude") for d in ancestors(cwd))]
    candidates = []
    for base in bases:
        candidates.append(posixpath.join(base, "skills", name, "SKILL.md"))
        candidates.append(posixpath.join(base, "commands", *parts[:-1], parts[-1] + ".md"))
    leaf = parts[-1]
    for root, dirs, _files in _walk(posixpath.join(config, "plugins"), _PLUGIN_DEPTH):
        if posixpath.basename(root) == "skills" and leaf in dirs:
            candidates.append(posixpath.join(root, leaf, "SKILL.md"))
        if posixpath.basename(root) == "commands":
            candidates.append(posixpath.join(root, leaf + ".md"))
    for path in candidates:
        try:
            with open(path, "rb") as f:
                text = f.read(1 << 20)
        except OSError:
            continue
        if b"!`" in text or b"```!" in text:
            return path
    return None


def _walk(top: str, depth: int) -> list[tuple[str, list[str], list[str]]]:
    found = []
    for root, dirs, files in os.walk(top):
        found.append((root, dirs, files))
        if root[len(top) :].count("/") >= depth:
            dirs[:] = []
    return found


def _shell_decision(
    tool: str,
    tool_input: dict[str, Any],
    payload: Mapping[str, Any],
    resolved: ResolvedSettings,
    corral: Sequence[str],
    env: Mapping[str, str],
    pid: int | None,
) -> dict[str, Any]:
    """Bash and Monitor: the user's deny/ask rules on the original command, then the rewrite."""
    from . import _permissions

    command = _field(tool_input, "command", "tool_input.")
    try:
        verdict = _permissions.judge((tool, "Bash"), command, payload["cwd"], env, pid=pid)
    except _permissions.RulesError as exc:
        raise HookError(f"cannot read your Claude Code permission rules: {exc}") from None
    if verdict is not None and verdict[0] == "deny":
        return _decision(
            "deny",
            f"corral: the command matches your Claude Code deny rule {verdict[1]!r} ({verdict[2]})",
        )
    from ..policy import match_word

    for pattern in resolved.integrations.get("claudeCode.unsandboxedCommands", ()):
        if match_word(pattern, command):
            return _decision(
                "ask",
                f"corral: this command matches integrations.claudeCode.unsandboxedCommands "
                f"({pattern!r}) and would run WITHOUT the sandbox. Check the whole command "
                "before you approve it.",
            )
    worktree, real_workspace = _workspace_layout(resolved.workspace)
    if worktree:
        rewritten = handoff_command(
            command,
            session_id=payload["session_id"],
            corral=corral,
            env=env,
            workspace=real_workspace,
        )
    else:
        rewritten = rewrite_command(
            command, session_id=payload["session_id"], corral=corral, workspace=real_workspace
        )
    updated = {**tool_input, "command": rewritten}
    if verdict is not None:
        return _decision(
            "ask",
            f"corral: the command matches your Claude Code ask rule {verdict[1]!r} "
            f"({verdict[2]}); if you approve, it runs in corral's sandbox",
            updated,
        )
    return _decision(
        "allow",
        "corral: the command runs in corral's sandbox (workspace writable, secrets hidden, "
        "no network unless allowed); blocked operations are reported on stderr",
        updated,
    )


def _workspace_layout(workspace: str) -> tuple[bool, str]:
    """Whether *workspace* is a linked git worktree, and its real path (through the settings cache)."""
    from ..policy._watched import cached, depends_on
    from ..policy._worktree import linked_worktree_common_dir

    def read(_env: Mapping[str, str]) -> tuple[bool, str]:
        depends_on(workspace)
        return linked_worktree_common_dir(workspace) is not None, posixpath.realpath(workspace)

    return cached("workspace-layout", workspace, {}, read)


def _absolute(path: str, cwd: str, environ: Mapping[str, str]) -> str:
    """*path* made absolute, *not* normalized: ``link/..`` must reach the kernel-like resolver."""
    return posixpath.join(cwd, expand_user(path, environ))


def expand_user(path: str, environ: Mapping[str, str]) -> str:
    """:func:`os.path.expanduser` with *environ*'s ``$HOME`` instead of this process's."""
    if not path.startswith("~"):
        return path
    end = path.find("/", 1)
    if end < 0:
        end = len(path)
    import pwd

    try:
        if end == 1:
            home = environ["HOME"] if "HOME" in environ else pwd.getpwuid(os.getuid()).pw_dir
        else:
            home = pwd.getpwnam(path[1:end]).pw_dir
    except KeyError:
        return path
    home = home.rstrip("/")
    return (home + path[end:]) or "/"
