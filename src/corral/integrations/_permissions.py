"""The user's Claude Code ``Bash`` permission rules, judged against the original command.

Claude Code checks ``permissions.deny`` and ``permissions.ask`` *after* the
hook, against the command the hook returned. corral's hook rewrites every
Bash command into ``corral-client run ... -c '<original>'``, which no rule like
``Bash(rm:*)`` matches any more; so the hook applies those rules itself,
to the command the model wrote (:func:`judge`): a ``deny`` rule denies it, an
``ask`` rule asks (and what the user approves still runs sandboxed).

The layers read (:func:`rule_files`) are every settings file Claude Code
reads from disk: managed policy (``/etc/claude-code/managed-settings.json``
and ``managed-settings.d/*.json``), the user's (``$CLAUDE_CONFIG_DIR`` or
``~/.claude``: ``settings.json``), and the project's ``.claude/settings.json``
and ``.claude/settings.local.json`` in the session's directory *and every
directory above it* (Claude Code reads one project directory; reading all of
them can only add deny/ask rules, never remove one), and the
``--settings`` and ``--disallowedTools`` of the Claude Code process above the
hook (:func:`command_line_rules`).

Matching follows Claude Code's rule syntax (``Tool``, ``Tool(*)``,
``Tool(prefix:*)`` with a word boundary, ``Tool(glob with *)`` where a lone
trailing `` *`` also matches nothing, exact text otherwise), applied to
every simple command of a compound one (split at ``;``, ``&``, ``|``,
newlines, ``$(``, backquotes and parentheses outside quotes), each both as
written and normalized (:func:`simple_commands`: quotes removed, a path's
base name, every start after a wrapper such as ``env`` or ``sudo``, a shell's
``-c`` string). A rule that could match is applied: for deny and ask,
matching too much is the safe side. A command whose name only an expansion
makes (``$(echo rm)``, ``r${x}m``) is not judged; the sandbox holds there.

Hot path: no :mod:`re`, no :mod:`shlex`, no :mod:`json` (see
docs/design.md, "Start-up budget").
"""

from __future__ import annotations

import os

from ..policy._watched import depends_on, depends_on_listing

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "MANAGED_DIR",
    "RulesError",
    "ancestors",
    "claude_config_dir",
    "file_rules",
    "judge",
    "matches",
    "rule_files",
    "simple_commands",
]

#: Where Claude Code reads managed (enterprise) settings on Linux.
MANAGED_DIR = "/etc/claude-code"

_SEPARATORS = frozenset(";&|\n()`")
_WRAPPERS = frozenset(
    {
        "env",
        "command",
        "builtin",
        "exec",
        "nohup",
        "time",
        "nice",
        "sudo",
        "doas",
        "xargs",
        "stdbuf",
        "timeout",
        "setsid",
        "ionice",
        "chrt",
        "taskset",
        "unbuffer",
        "eval",
        "busybox",
        # reserved words that start a simple command: `if rm x`, `then rm x`, `! rm x`
        "!",
        "if",
        "then",
        "else",
        "elif",
        "do",
        "while",
        "until",
        "coproc",
    }
)

#: Shells whose ``-c STRING`` is itself a command line (judged like the original).
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "rbash"})

#: ``find``'s options whose following words are a command.
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


class RulesError(Exception):
    """A settings file that holds permission rules cannot be read or is malformed."""


def claude_config_dir(environ: Mapping[str, str]) -> str:
    """The user's Claude Code directory: ``$CLAUDE_CONFIG_DIR``, else ``~/.claude``."""
    return environ.get("CLAUDE_CONFIG_DIR") or os.path.join(environ.get("HOME") or "/", ".claude")


def ancestors(directory: str) -> list[str]:
    """*directory* (normalized) and every directory above it, up to ``/``."""
    found = [os.path.normpath(directory)]
    while found[-1] != "/":
        found.append(os.path.dirname(found[-1]))
    return found


def rule_files(cwd: str, environ: Mapping[str, str]) -> list[str]:
    """Every settings file whose ``permissions`` Claude Code may apply to a session in *cwd*."""
    files = [os.path.join(MANAGED_DIR, "managed-settings.json")]
    dropins = os.path.join(MANAGED_DIR, "managed-settings.d")
    depends_on_listing(dropins)
    try:
        names = sorted(n for n in os.listdir(dropins) if n.endswith(".json"))
    except OSError:
        names = []
    files += [os.path.join(dropins, n) for n in names]
    files.append(os.path.join(claude_config_dir(environ), "settings.json"))
    for directory in ancestors(cwd):
        files.append(os.path.join(directory, ".claude", "settings.json"))
        files.append(os.path.join(directory, ".claude", "settings.local.json"))
    return list(dict.fromkeys(files))


def _rules(path: str) -> tuple[list[str], list[str]]:
    """The (deny, ask) rules of one settings file; a missing file has none."""
    depends_on(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return [], []  # Claude Code (the same user) cannot read it either
    except OSError as exc:
        raise RulesError(f"cannot read {path}: {exc.strerror}") from None
    return _parse(data, path)


def file_rules(
    cwd: str, environ: Mapping[str, str]
) -> tuple[tuple[str, list[str], list[str]], ...]:
    """``(file, deny rules, ask rules)`` of every file of :func:`rule_files`, in order.

    Through the server's exact settings cache (:mod:`corral.policy._watched`):
    reused only while inotify reports no change to any of those files, their
    directories or the managed drop-in directory's listing.

    Raises:
        RulesError: a file is unreadable or malformed.
    """
    from ..policy._watched import cached

    def read(env: Mapping[str, str]) -> tuple[tuple[str, list[str], list[str]], ...]:
        return tuple((path, *_rules(path)) for path in rule_files(cwd, env))

    return cached("claude-code-rules", cwd, environ, read)


def _parse(data: bytes | str, path: str) -> tuple[list[str], list[str]]:
    if not data.strip():
        return [], []
    from .._jsonfast import JSONError, loads

    try:
        settings = loads(data)
    except JSONError as exc:
        raise RulesError(f"{path} is not valid JSON ({exc})") from None
    permissions = settings.get("permissions") if isinstance(settings, dict) else None
    if permissions is None:
        return [], []
    if not isinstance(permissions, dict):
        raise RulesError(f"{path}: 'permissions' is not an object")
    found: list[list[str]] = []
    for key in ("deny", "ask"):
        rules = permissions.get(key, [])
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise RulesError(f"{path}: 'permissions.{key}' is not a list of strings")
        found.append(rules)
    return found[0], found[1]


def judge(
    tools: Iterable[str],
    command: str,
    cwd: str,
    environ: Mapping[str, str],
    *,
    pid: int | None = None,
) -> tuple[str, str, str] | None:
    """``("deny" | "ask", rule, file)`` for the first rule of *tools* matching *command*.

    Deny rules of every layer come before ask rules (Claude Code's order).
    ``None``: no deny or ask rule matches. *pid* is the hook's process: the
    Claude Code above it gives the rules of its own command line
    (:func:`command_line_rules`).

    Raises:
        RulesError: a settings file is unreadable or malformed (the
            caller blocks the call: the user's rules cannot be known).
    """
    names = tuple(tools)
    layers = list(file_rules(cwd, environ))
    if pid is not None:
        layers += command_line_rules(pid)
    commands: list[str] | None = None
    for index, verdict in ((1, "deny"), (2, "ask")):
        for layer in layers:
            path, rules = layer[0], layer[index]
            for rule in rules:
                if commands is None:
                    commands = simple_commands(command)
                if _rule_matches(rule, names, command, commands):
                    return verdict, rule, path
    return None


#: How many processes up from the hook Claude Code is looked for (sh -c, then Claude Code).
_MAX_ANCESTORS = 8


def command_line_rules(pid: int) -> list[tuple[str, list[str], list[str]]]:
    """The deny/ask rules on the command line of the Claude Code that started hook *pid*.

    The hook runs as ``sh -c '<hook> || exit 2'`` under Claude Code; its
    ancestors are walked (at most :data:`_MAX_ANCESTORS`) to the first whose
    program is ``claude``, and its ``--settings FILE|JSON`` and
    ``--disallowedTools RULE...`` are read. No Claude Code among them (the
    hook run by hand, a test): no rules.

    Raises:
        RulesError: ``--settings`` names an unreadable or malformed file.
    """
    current = pid
    for _ in range(_MAX_ANCESTORS):
        parent = _parent(current)
        if parent is None or parent <= 1:
            return []
        current = parent
        argv = _argv(current)
        if argv and _is_claude(argv):
            return _flag_layers(current, argv)
    return []


def _read_proc(path: str) -> bytes:
    """The whole of a /proc file, read unbuffered (cheaper than :func:`open` for these)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _parent(pid: int) -> int | None:
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            stat = os.read(fd, 4096)  # one line, written whole; the parent is its 4th field
        finally:
            os.close(fd)
        return int(stat[stat.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _argv(pid: int) -> list[str]:
    try:
        data = _read_proc(f"/proc/{pid}/cmdline")
    except OSError:
        return []
    return [a.decode("utf-8", "surrogateescape") for a in data.split(b"\0")[:-1]]


def _is_claude(argv: list[str]) -> bool:
    program = os.path.basename(argv[0])
    if program in ("claude", "claude.exe"):
        return True
    # node .../@anthropic-ai/claude-code/cli.js
    return program.startswith("node") and any("claude-code" in a for a in argv[1:3])


def _flag_layers(pid: int, argv: list[str]) -> list[tuple[str, list[str], list[str]]]:
    layers: list[tuple[str, list[str], list[str]]] = []
    i = 1
    while i < len(argv):
        arg = argv[i]
        name, _, inline = arg.partition("=")
        if name == "--settings":
            value = inline if inline else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 0 if inline else 1
            layers.append(("claude --settings", *_flag_settings(pid, value)))
        elif name in ("--disallowedTools", "--disallowed-tools"):
            values = [inline] if inline else []
            while not inline and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                i += 1
                values.append(argv[i])
            deny = [rule for value in values for rule in _split_rules(value)]
            layers.append((f"claude {name}", deny, []))
        elif arg == "--":
            break
        i += 1
    return layers


def _flag_settings(pid: int, value: str) -> tuple[list[str], list[str]]:
    if value.lstrip().startswith("{"):
        return _parse(value, "claude --settings")
    if not os.path.isabs(value):
        try:
            value = os.path.join(os.readlink(f"/proc/{pid}/cwd"), value)
        except OSError:
            raise RulesError(f"cannot find Claude Code's --settings file {value!r}") from None
    return _rules(value)


def _split_rules(value: str) -> list[str]:
    """``"Bash(git:*) Edit,Write"``: rules separated by commas or spaces outside parentheses."""
    rules: list[str] = []
    current: list[str] = []
    depth = 0
    for c in value:
        if c in ", " and depth == 0:
            if current:
                rules.append("".join(current))
            current = []
            continue
        depth += c == "("
        depth -= c == ")" and depth > 0
        current.append(c)
    if current:
        rules.append("".join(current))
    return rules


def _rule_matches(rule: str, tools: tuple[str, ...], whole: str, commands: list[str]) -> bool:
    rule = rule.strip()
    for tool in tools:
        if rule == tool:
            return True
        if rule.startswith(tool + "(") and rule.endswith(")"):
            pattern = rule[len(tool) + 1 : -1]
            return any(matches(pattern, text) for text in [whole.strip(), *commands])
    return False


def matches(pattern: str, text: str) -> bool:
    """Whether the specifier *pattern* of a ``Bash(...)`` rule matches the command *text*."""
    if pattern in ("", "*"):
        return True
    if pattern.endswith(":*"):
        prefix = pattern[:-2]
        return text == prefix or text.startswith(prefix + " ") or text.startswith(prefix + "\t")
    if "*" not in pattern:
        return text == pattern
    if pattern.endswith(" *") and pattern.count("*") == 1 and text == pattern[:-2]:
        return True
    return _wildcard(pattern, text)


def _wildcard(pattern: str, text: str) -> bool:
    parts = pattern.split("*")
    if not text.startswith(parts[0]):
        return False
    position = len(parts[0])
    last = parts[-1]
    for part in parts[1:-1]:
        found = text.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return len(text) - position >= len(last) and text.endswith(last)


def simple_commands(command: str, _depth: int = 0) -> list[str]:
    """The simple commands of *command*, each as written and in normalized forms.

    Normalized forms: quotes removed (``$'...'`` decoded), ``VAR=value``
    prefixes dropped, a command named by path also named by its base name
    (``/bin/rm`` is ``rm``), and after a wrapper command or reserved word
    every later word as the start of a command (a wrapper's options may take
    arguments: ``sudo -u root rm``); the ``-c`` string of a shell and the
    command of ``find -exec`` are judged as commands of their own.

    Raises:
        RulesError: a wrapper runs more than :data:`_MAX_WRAPPED_WORDS` words
            (too many starts to try; the caller blocks the call).
    """
    out: list[str] = []
    for segment in _segments(command):
        written = segment.strip()
        if not written:
            continue
        out.append(written)
        words = _words(written)
        while words and "=" in words[0] and not words[0].startswith("="):
            words = words[1:]  # VAR=value prefixes
        _normalized(words, out, _depth)
    return out


#: How many words after a wrapper are each tried as the start of the command it runs.
_MAX_WRAPPED_WORDS = 256


def _normalized(words: list[str], out: list[str], depth: int, wrapped: bool = False) -> None:
    """Append the forms of the command *words* (and of the commands it runs) to *out*.

    *wrapped*: every suffix of the words is already being tried (a wrapper's),
    so a wrapper among them is not expanded again.
    """
    if not words:
        return
    out.append(" ".join(words))
    name = words[0].rsplit("/", 1)[-1]
    if name != words[0]:
        out.append(" ".join([name, *words[1:]]))
    if depth > 8:
        return
    if name in _WRAPPERS:
        if not wrapped:
            if len(words) > _MAX_WRAPPED_WORDS:
                raise RulesError(
                    f"a command of more than {_MAX_WRAPPED_WORDS} words run by {name!r}"
                    " cannot be judged against them"
                )
            for start in range(1, len(words)):
                if not words[start].startswith("-") and "=" not in words[start]:
                    _normalized(words[start:], out, depth + 1, wrapped=True)
    elif name in _SHELLS:
        for i, word in enumerate(words[1:-1], 1):
            if not word.startswith("-"):
                break
            if "c" in word[1:] and not word.startswith("--"):
                out.extend(simple_commands(words[i + 1], depth + 1))
                break
    elif name == "find":
        for i, word in enumerate(words):
            if word in _FIND_EXEC:
                _normalized(words[i + 1 :], out, depth + 1)


def _segments(command: str) -> list[str]:
    """*command* split at control operators and substitutions outside single quotes.

    A ``$(...)`` or backquoted substitution inside double quotes is a command of
    its own: the quoting state is saved when it opens and restored when it closes.
    """
    segments: list[str] = []
    current: list[str] = []
    quote = ""
    saved: list[tuple[str, str]] = []  # (what closes the substitution, the quote outside it)
    i = 0
    while i < len(command):
        c = command[i]
        if quote == "'":
            if c == "'":
                quote = ""
            current.append(c)
        elif quote == "$'":  # ANSI-C quoting: a backslash escapes the quote too
            if c == "\\" and i + 1 < len(command):
                current.append(command[i : i + 2])
                i += 1
            else:
                quote = "" if c == "'" else quote
                current.append(c)
        elif c == "$" and quote == "" and command[i + 1 : i + 2] == "'":
            quote = "$'"
            current.append("$'")
            i += 1
        elif c == "\\" and i + 1 < len(command):
            current.append(command[i : i + 2])
            i += 1
        elif saved and c == saved[-1][0] and (c == ")" or quote == ""):
            quote = saved.pop()[1]
            segments.append("".join(current))
            current = []
        elif c == "$" and command[i + 1 : i + 2] == "(":
            saved.append((")", quote))
            quote = ""
            segments.append("".join(current))
            current = []
            i += 1
        elif c == "`":
            saved.append(("`", quote))
            quote = ""
            segments.append("".join(current))
            current = []
        elif quote == '"':
            if c == '"':
                quote = ""
            current.append(c)
        elif c in "'\"":
            quote = c
            current.append(c)
        elif c in _SEPARATORS:
            segments.append("".join(current))
            current = []
        elif c in "{}" and not "".join(current).strip():
            pass  # a group's braces: { rm x; }
        else:
            current.append(c)
        i += 1
    segments.append("".join(current))
    return segments


def _words(segment: str) -> list[str]:
    """*segment*'s words with quotes and backslashes removed (no expansions)."""
    words: list[str] = []
    word: list[str] = []
    quote = ""
    started = False
    i = 0
    while i < len(segment):
        c = segment[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"' and i + 1 < len(segment):
                i += 1
                word.append(segment[i])
            else:
                word.append(c)
        elif c == "$" and segment[i + 1 : i + 2] == "'":
            end, text = _ansi_c(segment, i + 2)
            word.append(text)
            started = True
            i = end
        elif c in "'\"":
            quote = c
            started = True
        elif c == "\\" and i + 1 < len(segment):
            i += 1
            if segment[i] != "\n":
                word.append(segment[i])
                started = True
        elif c in " \t":
            if word or started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(c)
        i += 1
    if word or started:
        words.append("".join(word))
    return words


_C_ESCAPES = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r"}
_C_ESCAPES.update({"t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "?": "?"})


def _ansi_c(segment: str, start: int) -> tuple[int, str]:
    """Bash's ``$'...'`` from *start* (after the quote): (index of the closing quote, its text)."""
    text: list[str] = []
    i = start
    while i < len(segment) and segment[i] != "'":
        c = segment[i]
        if c != "\\" or i + 1 >= len(segment):
            text.append(c)
            i += 1
            continue
        e = segment[i + 1]
        i += 2
        digits, base, width = "", 0, 0
        if e in "01234567":
            digits, base, width = e, 8, 2
        elif e in "xuU":
            base, width = 16, {"x": 2, "u": 4, "U": 8}[e]
        elif e == "c" and i < len(segment):
            text.append(chr(ord(segment[i]) & 0x1F))
            i += 1
            continue
        else:
            text.append(_C_ESCAPES.get(e, "\\" + e))
            continue
        allowed = "01234567" if base == 8 else "0123456789abcdefABCDEF"
        while width and i < len(segment) and segment[i] in allowed:
            digits += segment[i]
            i += 1
            width -= 1
        text.append(chr(int(digits, base) % 0x110000) if digits else "\\" + e)
    return i, "".join(text)
