"""Shell completion and the man page come from the commands' own option tables, and work.

Each shell loads the script ``corral completion SHELL`` prints and completes real
command lines; the shipped man page matches the tables (like the schema) and
renders without a warning.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from corral.cli import COMMANDS
from corral.cli._options import RUN_OPTIONS
from corral.cli._reference import MAN_PAGE, command_options, completion, man_page


def script(shell: str, tmp_path: object) -> str:
    path = f"{tmp_path}/corral.{shell}"
    with open(path, "w") as f:
        f.write(completion(shell))
    return path


def test_the_shipped_man_page_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "corral.cli._reference", "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    with open(MAN_PAGE, encoding="utf-8") as f:
        assert f.read() == man_page()


def test_the_man_page_names_every_command_and_option() -> None:
    page = man_page()
    for name in COMMANDS:
        assert ".SS corral " + name.replace("-", "\\-") + "\n" in page
    for option, *_ in RUN_OPTIONS:
        assert "\\fB" + option.replace("-", "\\-") + "\\fR" in page
    assert ".TP\ncorral image prune\n" in page


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed (groff-base)")
def test_the_man_page_renders_without_warnings() -> None:
    result = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", MAN_PAGE], capture_output=True, text=True
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_options_come_from_the_commands_parsers() -> None:
    options, subs = command_options("doctor")
    assert {"--matrix", "--progress", "--json"} <= {n for o in options for n in o.names}
    _options, subs = command_options("image")
    assert set(subs) == {"build", "list", "rm", "prune"}
    assert "--rebuild" in {n for o in subs["build"] for n in o.names}
    run = {n: o for o in command_options("run")[0] for n in o.names}
    assert run["--no-tty"].value is False and run["--backend"].value is True


def _bash_complete(path: str, line: str) -> list[str]:
    words = line.split(" ")
    program = (
        f"source {path}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
        f"COMP_CWORD={len(words) - 1}; _corral; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)
    return result.stdout.split()


def test_bash_completes_commands_options_and_sub_actions(tmp_path: object) -> None:
    path = script("bash", tmp_path)
    assert _bash_complete(path, "corral ru") == ["run"]
    assert _bash_complete(path, "corral run --max-o") == ["--max-output"]
    assert _bash_complete(path, "corral preview --apply") == ["--apply-on-success"]
    assert sorted(_bash_complete(path, "corral image ")) == ["build", "list", "prune", "rm"]
    assert _bash_complete(path, "corral image build --reb") == ["--rebuild"]
    assert _bash_complete(path, "corral doctor --mat") == ["--matrix"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_commands_options_and_sub_actions(tmp_path: object) -> None:
    path = script("fish", tmp_path)

    def complete(line: str) -> list[str]:
        result = subprocess.run(
            ["fish", "--no-config", "-c", f"source {path}; complete -C '{line}'"],
            capture_output=True,
            text=True,
            check=True,
        )
        return [row.split("\t")[0] for row in result.stdout.splitlines()]

    assert complete("corral ru") == ["run"]
    assert complete("corral run --max-o") == ["--max-output"]
    assert sorted(complete("corral image ")) == ["build", "list", "prune", "rm"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_loads_the_completion(tmp_path: object) -> None:
    path = script("zsh", tmp_path)
    assert subprocess.run(["zsh", "-n", path], capture_output=True).returncode == 0
    program = (
        f"autoload -U compinit; compinit -u -d {tmp_path}/zcd; source {path}; print $_comps[corral]"
    )
    result = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True)
    assert result.stdout.strip() == "_corral", result.stderr


def test_completion_refuses_an_unknown_shell() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "corral", "completion", "tcsh"], capture_output=True, text=True
    )
    assert result.returncode == 125 and "bash, zsh or fish" in result.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_the_same_help_style(command: str) -> None:
    from corral.cli._options import HELP_TEXT

    result = subprocess.run(
        [sys.executable, "-m", "corral", command, "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith(f"usage: corral {command}"), text[:80]
    _usage, _, rest = text.partition("\n\n")
    assert rest.strip() and not rest.startswith("options:"), "a summary follows the usage"
    assert "\n\noptions:\n" in text
    assert any(
        line.split() == ["-h,", "--help", *HELP_TEXT.split()] for line in text.splitlines()
    ), text
