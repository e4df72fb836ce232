"""The README's two commands, as written, work on a fresh Debian machine.

The commands are parsed from the README's first code block, not restated here:
each script they run with ``sh`` must be a POSIX sh script that dash (Debian's
``/bin/sh``) accepts - its syntax and its ``set`` options, the line that broke
``sh .ci/run`` when it used ``set -o pipefail`` - and ``.ci/run`` must install
a package for every tool the test suite looks for with ``shutil.which``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# tool the suite looks for -> the Debian package that provides it
TOOL_PACKAGES = {
    "bwrap": "bubblewrap",
    "cc": "gcc",
    "gcc": "gcc",
    "curl": "curl",
    "git": "git",
    "openssl": "openssl",
    "strace": "strace",
    "socat": "socat",
    "setpriv": "util-linux",
    "unshare": "util-linux",
    "tar": "tar",
    "dash": "dash",
    "bash": "bash",
    "python3": "python3",
    "zsh": "zsh",
    "fish": "fish",
    "groff": "groff-base",
    "node": "nodejs",
    "npm": "nodejs",  # NodeSource's nodejs holds npm; else .ci/run installs Debian's npm
    "podman": "podman",
    "catatonit": "catatonit",
    "runsc": "runsc",
    "docker": "docker.io",
    "dockerd": "docker.io",
    "mmdebstrap": "mmdebstrap",
    "qemu-system-x86_64": "qemu-system-x86",
    "busybox": "busybox-static",
    "lz4": "lz4",  # Debian 12's kernels are lz4-compressed: the image build's vmlinux
    "fuse-overlayfs": "fuse-overlayfs",
    "chromium": "chromium",  # tests/integration/ui drive it through Playwright
    # npm packages (installed globally with the apt package npm)
    "claude": "npm:@anthropic-ai/claude-code",
    "mcp-inspector": "npm:@modelcontextprotocol/inspector",
}
ESSENTIAL = {"tar", "util-linux", "dash", "bash"}  # on every Debian system (Essential: yes)


def readme_commands() -> list[list[str]]:
    """The shell words of each command line in the README's first code block."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    match = re.search(r"```sh\n(.*?)```", text, re.S)
    assert match, "the README starts with a ```sh block holding its two commands"
    commands = []
    for line in match.group(1).splitlines():
        if line.strip():
            for part in re.split(r"\s*&&\s*", line.strip()):
                commands.append(shlex.split(part))
    return commands


def sh_scripts() -> list[str]:
    """Every script the README's commands run with ``sh``."""
    scripts = [words[1] for words in readme_commands() if words[:1] == ["sh"]]
    assert scripts, "the README's commands run their scripts with sh"
    return scripts


def apt_packages(script: str) -> set[str]:
    """The packages *script* installs: ``apt-get install`` names, ``npm install -g`` ones as npm:NAME."""
    with open(os.path.join(ROOT, script), encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    found: set[str] = set()
    for line in text.splitlines():
        words = [w for w in line.split() if w != "sudo" and not w.startswith("$")]  # $SUDO apt-get
        if words[:1] in (["apt-get"], ["npm"]) and "install" in words:
            rest = words[words.index("install") + 1 :]
            names = {w for w in rest if not w.startswith("-") and not w.startswith(">")}
            if words[0] == "npm":  # npm:NAME without its version (@scope/name@1.2.3)
                names = {"npm:" + n[:1] + n[1:].partition("@")[0] for n in names}
            found |= names
    return found


def test_readme_commands_are_the_install_script_and_ci() -> None:
    assert sh_scripts() == ["scripts/install-debian.sh", ".ci/run"]
    first = readme_commands()[1]
    assert first[0] == ".venv/bin/corral", "the first command uses the venv the script made"


@pytest.mark.skipif(shutil.which("dash") is None, reason="dash is not installed (Debian's /bin/sh)")
@pytest.mark.parametrize("script", ["scripts/install-debian.sh", ".ci/run"])
def test_scripts_run_under_dash(script: str) -> None:
    assert script in sh_scripts()
    path = os.path.join(ROOT, script)
    syntax = subprocess.run(["dash", "-n", path], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "#!/bin/sh", f"{script} says which shell it is written for"
    options = [line.strip() for line in lines if re.match(r"\s*set\s+-", line)]
    assert options, f"{script} sets its error options"
    for line in options:
        result = subprocess.run(["dash", "-c", line], capture_output=True, text=True)
        assert result.returncode == 0, f"dash rejects {line!r}: {result.stderr}"


def test_recommended_packages_are_installed() -> None:
    for script in sh_scripts():
        with open(os.path.join(ROOT, script), encoding="utf-8") as f:
            code = [line for line in f if not line.lstrip().startswith("#")]
        assert not any("--no-install-recommends" in line for line in code), (
            f"{script} must install what packages recommend (e.g. catatonit, which podman needs for --init)"
        )


def test_ci_installs_every_tool_the_suite_looks_for() -> None:
    used: set[str] = set()
    for directory, _dirs, files in os.walk(os.path.join(ROOT, "tests")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    used |= set(re.findall(r"""shutil\.which\(["']([\w.-]+)["']\)""", f.read()))
    unknown = used - set(TOOL_PACKAGES)
    assert not unknown, f"add the Debian package of {sorted(unknown)} to TOOL_PACKAGES and .ci/run"
    packages = apt_packages(".ci/run")
    needed = {TOOL_PACKAGES[tool] for tool in used} | {"catatonit", "podman", "bubblewrap"}
    missing = needed - packages - ESSENTIAL
    assert not missing, f".ci/run does not install {sorted(missing)}"
    assert {"bubblewrap", "gcc", "python3-venv"} <= apt_packages("scripts/install-debian.sh")


def venv_command(script: str) -> list[str]:
    """The words of the line of *script* that makes ``.venv``."""
    with open(os.path.join(ROOT, script), encoding="utf-8") as f:
        lines = [line for line in f if not line.lstrip().startswith("#") and " -m venv " in line]
    assert len(lines) == 1, f"{script} makes its venv on one line"
    return shlex.split(lines[0])


@pytest.mark.skipif(
    subprocess.run(["/usr/bin/python3", "-c", "import ensurepip"], capture_output=True).returncode,
    reason="Debian's python3-venv is not installed (the README's first command installs it)",
)
def test_the_two_commands_run_in_order_in_one_clone(tmp_path: pytest.TempPathFactory) -> None:
    """The README's second command runs where its first made ``.venv`` already.

    Each script's own venv line runs in one directory, in the README's order, after a
    venv another interpreter made (the first ``python3`` on PATH: here a pyenv shim):
    ``.ci/run`` made its venv over the one ``install-debian.sh`` had made with that
    interpreter, and ensurepip failed, so ``sh .ci/run`` ended before any test.
    """
    debian = os.path.realpath("/usr/bin/python3")
    steps = [
        [shutil.which("python3") or "/usr/bin/python3", "-m", "venv", ".venv"],
        venv_command("scripts/install-debian.sh"),
        venv_command(".ci/run"),
    ]
    for step in steps:
        made = subprocess.run(step, cwd=tmp_path, capture_output=True, text=True)
        assert made.returncode == 0, f"{shlex.join(step)}: {made.stderr}"
        pip = subprocess.run(
            [".venv/bin/python", "-c", "import pip, sys; print(sys._base_executable)"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert pip.returncode == 0, pip.stderr
    assert os.path.realpath(pip.stdout.strip()) == debian, "the scripts' venv is Debian's python"
