"""The command line's options as data: shell completion and the man page come from here.

:func:`command_options` reads each subcommand's own option table - ``RUN_OPTIONS``
(plus the command's ``EXTRA_HELP``) for the run-like commands, the
``argparse`` parser for the others (taken from the command as it would parse
``--help``, so the table cannot drift from what the command accepts). From
them :func:`completion` writes the bash, zsh and fish completion scripts
(``corral completion SHELL``) and :func:`man_page` the roff page shipped as
``corral/man/corral.1``; ``python -m corral.cli._reference --check`` (``make
check``, ``tests/repo``) fails when the shipped page is stale, ``--write``
regenerates it.

Cold path: never imported by ``corral run``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys

from . import COMMANDS, EXIT_USAGE, print_error

__all__ = ["SHELLS", "Option", "command_options", "completion", "main", "man_page"]

SHELLS = ("bash", "zsh", "fish")
MAN_PAGE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "man", "corral.1")

#: run-like commands: RUN_OPTIONS plus the module's EXTRA_HELP (``("--opt X", help)`` rows)
_RUN_LIKE = ("run", "shell", "preview", "policy")


class Option:
    """One option: its spellings, whether it takes a value, its help line."""

    __slots__ = ("help", "names", "value")

    def __init__(self, names: tuple[str, ...], value: bool, help: str) -> None:
        self.names = names
        self.value = value
        self.help = help


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def _parser_of(command: str) -> argparse.ArgumentParser | None:
    """The ``argparse`` parser *command* builds, caught as it parses ``--help`` (nothing runs)."""
    module = importlib.import_module(COMMANDS[command][0])
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[assignment, method-assign]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            module.main(["--help"])
    except _Captured as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    return None


def command_options(command: str) -> tuple[list[Option], dict[str, list[Option]]]:
    """*command*'s options, and its sub-actions' (``image build``...) by name."""
    from ._options import HELP_TEXT, RUN_OPTIONS

    help_option = Option(("-h", "--help"), False, HELP_TEXT)
    if command in _RUN_LIKE:
        options = [Option((o,), kind != "flag", text) for o, kind, _t, text in RUN_OPTIONS]
        module = importlib.import_module(COMMANDS[command][0])
        for left, text in getattr(module, "EXTRA_HELP", ()):
            name, _, value = left.partition(" ")
            options.append(Option((name,), bool(value), text))
        return [help_option, *options], {}
    parser = _parser_of(command)
    if parser is None:
        return [help_option], {}
    return _argparse_options(parser)


def _argparse_options(
    parser: argparse.ArgumentParser,
) -> tuple[list[Option], dict[str, list[Option]]]:
    options: list[Option] = []
    subs: dict[str, list[Option]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                subs[name] = _argparse_options(sub)[0]
        elif action.option_strings:
            options.append(
                Option(tuple(action.option_strings), action.nargs != 0, action.help or "")
            )
    return options, subs


def _summaries(parser_subs: dict[str, list[Option]], command: str) -> dict[str, str]:
    """Help lines of *command*'s sub-actions (``image build`` -> "build (or reuse) an image")."""
    parser = _parser_of(command) if parser_subs else None
    found: dict[str, str] = {}
    if parser is None:
        return found
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found[choice.dest] = choice.help or ""
    return found


# ------------------------------------------------------------------ completion
def completion(shell: str) -> str:
    """The completion script for *shell* (``bash``, ``zsh`` or ``fish``)."""
    table = {name: command_options(name) for name in COMMANDS}
    if shell == "bash":
        return _bash(table)
    if shell == "zsh":
        return "#compdef corral\n" + _zsh(table)
    if shell == "fish":
        return _fish(table)
    raise ValueError(shell)


def _words(options: list[Option]) -> str:
    return " ".join(name for option in options for name in option.names)


def _valued(options: list[Option]) -> str:
    return "|".join(name for option in options if option.value for name in option.names)


def _bash(table: dict[str, tuple[list[Option], dict[str, list[Option]]]]) -> str:
    lines = [
        "# bash completion for corral (generated by 'corral completion bash')",
        "_corral() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        "    local cmd=${COMP_WORDS[1]} sub=${COMP_WORDS[2]} words valued",
        '    if [ "$COMP_CWORD" -eq 1 ]; then',
        f'        COMPREPLY=($(compgen -W "{" ".join(COMMANDS)}" -- "$cur")); return',
        "    fi",
        '    case "$cmd" in',
    ]
    for name, (options, subs) in table.items():
        lines.append(f"    {name})")
        if subs:
            lines.append('        if [ "$COMP_CWORD" -eq 2 ]; then')
            lines.append(
                f'            COMPREPLY=($(compgen -W "{" ".join(subs)}" -- "$cur")); return'
            )
            lines.append("        fi")
            lines.append('        case "$sub" in')
            for sub, sub_options in subs.items():
                lines.append(
                    f'        {sub}) words="{_words(sub_options)}"; '
                    f'valued="{_valued(sub_options)}";;'
                )
            lines.append("        esac;;")
        else:
            lines.append(f'        words="{_words(options)}"; valued="{_valued(options)}";;')
    lines += [
        "    esac",
        '    if [ -n "$valued" ] && [[ "|$valued|" == *"|$prev|"* ]]; then',
        '        COMPREPLY=($(compgen -f -- "$cur")); return',
        "    fi",
        '    if [[ "$cur" == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        "    else",
        '        COMPREPLY=($(compgen -c -f -- "$cur"))',
        "    fi",
        "}",
        "complete -F _corral corral",
        "",
    ]
    return "\n".join(lines)


def _zsh_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]")


def _zsh_specs(options: list[Option]) -> list[str]:
    specs = []
    for option in options:
        for name in option.names:
            value = ":value:_files" if option.value else ""
            specs.append(f"'{name}[{_zsh_quote(option.help)}]{value}'")
    return specs


def _zsh(table: dict[str, tuple[list[Option], dict[str, list[Option]]]]) -> str:
    commands = [f"'{name}:{_zsh_quote(summary)}'" for name, (_m, summary) in COMMANDS.items()]
    lines = [
        "# zsh completion for corral (generated by 'corral completion zsh')",
        "_corral() {",
        "    local -a commands",
        f"    commands=({' '.join(commands)})",
        "    if (( CURRENT == 2 )); then",
        "        _describe 'corral command' commands; return",
        "    fi",
        "    case $words[2] in",
    ]
    for name, (options, subs) in table.items():
        if subs:
            lines.append(f"    {name})")
            lines.append("        if (( CURRENT == 3 )); then")
            lines.append(f"            compadd -- {' '.join(subs)}; return")
            lines.append("        fi")
            lines.append("        case $words[3] in")
            for sub, sub_options in subs.items():
                specs = " ".join(_zsh_specs(sub_options))
                lines.append(f"        {sub}) _arguments -s {specs} '*:file:_files';;")
            lines.append("        esac;;")
        else:
            specs = " ".join(_zsh_specs(options))
            lines.append(f"    {name}) shift words; (( CURRENT-- ))")
            lines.append(f"        _arguments -s {specs} '*::command:_normal';;")
    lines += [
        "    esac",
        "}",
        'if [ "$funcstack[1]" = "_corral" ]; then _corral "$@"; else',
        "    compdef _corral corral",
        "fi",
        "",
    ]
    return "\n".join(lines)


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish(table: dict[str, tuple[list[Option], dict[str, list[Option]]]]) -> str:
    lines = [
        "# fish completion for corral (generated by 'corral completion fish')",
        "complete -c corral -f",
    ]
    for name, (_module, summary) in COMMANDS.items():
        lines.append(
            f"complete -c corral -n __fish_use_subcommand -a {name} -d {_fish_quote(summary)}"
        )
    for name, (options, subs) in table.items():
        when = f"'__fish_seen_subcommand_from {name}'"
        groups = [(when, options)]
        for sub, sub_options in subs.items():
            lines.append(f"complete -c corral -n {when} -a {sub}")
            groups.append(
                (
                    f"'__fish_seen_subcommand_from {name}; and __fish_seen_subcommand_from {sub}'",
                    sub_options,
                )
            )
        for condition, group in groups:
            for option in group:
                for spelling in option.names:
                    flag = (
                        f"-l {spelling[2:]}" if spelling.startswith("--") else f"-o {spelling[1:]}"
                    )
                    value = " -r -F" if option.value else ""
                    lines.append(
                        f"complete -c corral -n {condition} {flag}{value} -d {_fish_quote(option.help)}"
                    )
    lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------ man page
def _roff(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        ("\\&" + line) if line.startswith((".", "'")) else line for line in text.split("\n")
    )


def man_page() -> str:
    """``corral(1)`` in roff, from the command table and each command's options."""
    from .._version import __version__
    from . import __doc__ as cli_doc

    exit_text = (cli_doc or "").split("\n\n")[1].replace("\n", " ")
    out = [
        f'.TH CORRAL 1 "" "corral {__version__}" "User Commands"',
        ".SH NAME",
        "corral \\- run an AI agent's commands in a sandbox under one policy",
        ".SH SYNOPSIS",
        ".B corral",
        ".I COMMAND",
        "[\\fIOPTIONS\\fR] ...",
        ".SH DESCRIPTION",
        _roff(
            "corral runs the commands of an AI coding agent - and of its plugins, hooks and MCP "
            "servers - inside a sandbox, under one policy (filesystem, network, resources, "
            "environment, credentials), enforced by the strongest isolation the machine offers. "
            "A rule it cannot enforce is an error, never a silent weakening."
        ),
        ".SH COMMANDS",
    ]
    for name, (_module, summary) in COMMANDS.items():
        options, subs = command_options(name)
        out += [".SS " + _roff(f"corral {name}"), _roff(summary[:1].upper() + summary[1:] + ".")]
        out += _man_options(options)
        if subs:
            summaries = _summaries(subs, name)
            for sub, sub_options in subs.items():
                out += [".TP", _roff(f"corral {name} {sub}"), _roff(summaries.get(sub, ""))]
                out += _man_options(sub_options, indent=True)
    out += [
        ".SH EXIT STATUS",
        _roff(exit_text),
        ".SH ENVIRONMENT",
        ".TP",
        ".B CORRAL_SERVER",
        _roff("off (or 0): run in-process, never through the corral server."),
        ".TP",
        ".B CORRAL_SETTINGS, CORRAL_BACKEND, CORRAL_ISOLATION, CORRAL_PROFILE",
        _roff("a settings layer between the project's and the command line's."),
        ".SH FILES",
        ".TP",
        ".I ~/.config/corral/settings.json",
        _roff("user settings."),
        ".TP",
        ".I .corral/settings.json",
        _roff("project settings (applied in full once trusted: corral trust)."),
        ".TP",
        ".I ~/.local/state/corral/audit.jsonl",
        _roff("the hash-chained audit log of every run."),
        ".SH SEE ALSO",
        _roff("corral COMMAND --help; corral completion bash|zsh|fish; docs/policy-reference.md."),
        "",
    ]
    return "\n".join(out)


def _man_options(options: list[Option], *, indent: bool = False) -> list[str]:
    out = [".RS"] if indent and options else []
    for option in options:
        names = ", ".join(f"\\fB{_roff(n)}\\fR" for n in option.names)
        out += [".TP", names + (" \\fIVALUE\\fR" if option.value else ""), _roff(option.help)]
    if indent and options:
        out.append(".RE")
    return out


# ------------------------------------------------------------------ entry points
def main(args: list[str]) -> int:
    """``corral completion SHELL``: print the completion script for bash, zsh or fish."""
    from ._options import HELP_TEXT

    if args[:1] in (["-h"], ["--help"]) or len(args) != 1 or args[0] not in SHELLS:
        usage = (
            "usage: corral completion bash|zsh|fish\n\nPrint the shell completion script, e.g.\n"
            "  corral completion bash > ~/.local/share/bash-completion/completions/corral\n"
            "  corral completion zsh > ~/.zfunc/_corral\n"
            "  corral completion fish > ~/.config/fish/completions/corral.fish\n\n"
            f"options:\n  -h, --help  {HELP_TEXT}\n"
        )
        if args[:1] in (["-h"], ["--help"]):
            sys.stdout.write(usage)
            return 0
        print_error("expected one shell: bash, zsh or fish", "corral completion --help")
        return EXIT_USAGE
    sys.stdout.write(completion(args[0]))
    return 0


def _check_or_write(argv: list[str]) -> int:
    """``--check``: the shipped man page matches the option tables; ``--write``: regenerate it."""
    page = man_page()
    if argv == ["--write"]:
        os.makedirs(os.path.dirname(MAN_PAGE), exist_ok=True)
        with open(MAN_PAGE, "w", encoding="utf-8") as f:
            f.write(page)
        return 0
    try:
        with open(MAN_PAGE, encoding="utf-8") as f:
            shipped = f.read()
    except OSError:
        shipped = ""
    if shipped != page:
        sys.stderr.write(f"{MAN_PAGE} is stale: run 'python -m corral.cli._reference --write'\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_check_or_write(sys.argv[1:]))
