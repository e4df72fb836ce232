"""Repository hygiene: layering, exports, reasons, docs and changelog, hot-path imports."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src", "corral")


def modules() -> dict[str, str]:
    """dotted module name -> file path, for every module of the package."""
    found = {}
    for directory, _dirs, files in os.walk(SRC):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                rel = os.path.relpath(path, os.path.dirname(SRC))[:-3].replace(os.sep, ".")
                found[rel.removesuffix(".__init__")] = path
    return found


def corral_imports(module: str, path: str) -> set[str]:
    """Absolute names of the corral modules *module* imports (any level, any place)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.startswith("corral"):
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("corral"))
    return {name for name in found if name in modules() or name.rpartition(".")[0] in modules()}


def test_policy_imports_nothing_else_from_corral() -> None:
    # leaves: each imports nothing of corral (the settings cache watches with _inotify)
    allowed = (
        "corral.policy",
        "corral._frozen",
        "corral._jsonfast",
        "corral._exceptions",
        "corral._inotify",
    )
    for module, path in modules().items():
        if module.startswith("corral.policy"):
            bad = {m for m in corral_imports(module, path) if not m.startswith(allowed)}
            assert not bad, f"{module} imports {bad}"


def test_lower_layers_do_not_import_upward() -> None:
    upper = (
        "corral.cli",
        "corral.integrations",
        "corral._sandbox",
        "corral._api",
        "corral.benchmarks",
        "corral.cluster",  # the SDK on a Ray cluster: built on the SDK
        "corral.ui",  # `corral ui`: an entry point like the CLI
    )
    for module, path in modules().items():
        if module.startswith(upper) or module in ("corral", "corral.__main__"):
            continue
        bad = {m for m in corral_imports(module, path) if m.startswith(upper)}
        assert not bad, f"{module} imports the upper layer {bad}"


def test_backends_do_not_import_the_runner() -> None:
    for module, path in modules().items():
        if module.startswith("corral.backends"):
            assert "corral.pipeline._runner" not in corral_imports(module, path), module


@pytest.mark.parametrize("package", ["corral", "corral.policy", "corral.backends"])
def test_all_is_sorted_and_resolvable(package: str) -> None:
    import importlib

    def isort_style(name: str) -> tuple[int, str]:  # ruff RUF022: CONSTANTS, Classes, functions
        group = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
        return group, name

    mod = importlib.import_module(package)
    names = list(mod.__all__)
    assert names == sorted(names, key=isort_style), f"{package}.__all__ is not sorted"
    for name in names:
        assert getattr(mod, name) is not None


def test_every_builtin_row_has_a_reason() -> None:
    from corral.backends._seccomp_rules import BROKER_RULES, DENY_RULES, unix_socket_rule
    from corral.backends.bubblewrap import SANDBOX_ENV
    from corral.policy._defaults import (
        DEFAULT_RESOURCES,
        ENV_PASS,
        PROTECTED_PATTERNS,
        SECRET_PATHS,
    )

    for table in (SECRET_PATHS, PROTECTED_PATTERNS, ENV_PASS):
        for item, reason in table:
            assert item and reason.strip(), item
    for name, _value, reason in DEFAULT_RESOURCES:
        assert reason.strip(), name
    for name, _value, reason in SANDBOX_ENV:
        assert reason.strip(), name
    for rule in (*DENY_RULES, *BROKER_RULES, unix_socket_rule()):
        assert rule[3].strip(), rule


def test_every_module_is_documented() -> None:
    text = ""
    for directory, _dirs, files in os.walk(os.path.join(ROOT, "docs")):
        for name in files:
            if name.endswith(".md"):
                with open(os.path.join(directory, name), encoding="utf-8") as f:
                    text += f.read()
    missing = []
    for path in modules().values():
        rel = os.path.relpath(path, SRC)
        if rel.endswith("__init__.py") or rel.startswith(
            ("testing" + os.sep, "benchmarks" + os.sep)
        ):
            continue
        if rel not in text and os.path.basename(rel) not in text:
            missing.append(rel)
    assert not missing, f"modules not mentioned in docs/: {missing}"


def test_changelog_fragments_exist_and_are_not_empty() -> None:
    directory = os.path.join(ROOT, "changelog.d")
    fragments = [f for f in os.listdir(directory) if f.endswith(".md")]
    assert fragments
    for name in fragments:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            assert f.read().strip(), name


def test_run_path_avoids_heavy_imports(tmp_path: object) -> None:
    """The hot path's import budget (docs/design.md): no json, re, typing, subprocess ..."""
    probe = (
        "import sys\n"
        "from corral.cli import main\n"
        "status = main(['run', '--memory', 'none', '--pids', 'none', '--', 'true'])\n"
        "heavy = sorted(m for m in ('json', 're', 'typing', 'dataclasses', 'subprocess', 'asyncio',\n"
        "    'argparse', 'enum', 'socket', 'threading', 'pathlib', 'fnmatch', 'inspect', 'signal',\n"
        "    'selectors', 'shlex', 'tempfile', 'difflib', 'hashlib', 'logging') if m in sys.modules)\n"
        "print(status, ','.join(heavy))\n"
    )
    from tests.conftest import bwrap_available

    if bwrap_available():
        pytest.skip(str(bwrap_available()))
    env = {
        "HOME": str(tmp_path),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CORRAL_SERVER": "off",  # the in-process path; the client's is checked below
    }
    ws = os.path.join(str(tmp_path), "ws")
    os.makedirs(os.path.join(ws, ".git"))
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import site; site.main()\n" + probe],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    status, _, heavy = result.stdout.strip().partition(" ")
    assert status == "0", result.stderr
    assert heavy == "", f"the run path imported {heavy}"


def test_the_server_clients_path_imports_almost_nothing(tmp_path: object) -> None:
    """``corral run`` through a server: beyond ``python -c pass`` only the client's few modules."""
    from tests.conftest import bwrap_available

    if bwrap_available():
        pytest.skip(str(bwrap_available()))
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "from corral.cli import main\n"
        "status = main(['run', '--memory', 'none', '--pids', 'none', '--', 'true'])\n"
        "print(status, ','.join(sorted(set(sys.modules) - before)))\n"
    )
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    ws = os.path.join(str(tmp_path), "ws")
    os.makedirs(os.path.join(ws, ".git"))
    corral = [sys.executable, "-m", "corral"]
    started = subprocess.run(
        [*corral, "server", "--detach"], env=env, capture_output=True, check=False
    )
    assert started.returncode == 0, started.stderr
    try:
        result = subprocess.run(
            [sys.executable, "-S", "-c", "import site; site.main()\n" + probe],
            cwd=ws,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        served = subprocess.run(
            [*corral, "server", "--status"], env=env, capture_output=True, text=True, check=False
        )
    finally:
        subprocess.run([*corral, "server", "--stop"], env=env, capture_output=True, check=False)
    status, _, loaded = result.stdout.strip().partition(" ")
    assert status == "0", result.stderr
    assert "served 1," in served.stdout, "the probe's run did not go through the server"
    allowed = {
        "_socket",
        "_signal",
        "_json",
        "__future__",
        "corral",
        "corral._version",
        "corral.cli",
        "corral.cli._client",
        "corral._jsonfast",
        "corral.server",  # a docstring-only package __init__
        "corral.server._wire",
        "corral._state",
    }
    assert set(loaded.split(",")) - allowed == set()


def test_the_hook_path_avoids_heavy_imports(tmp_path: object) -> None:
    """``corral hook claude-code`` in its own process: the same budget as the run path."""
    home = str(tmp_path)
    ws = os.path.join(home, "ws")
    os.makedirs(os.path.join(ws, ".git"))
    payload = (
        '{"session_id": "s", "cwd": "' + ws + '", "hook_event_name": "PreToolUse", '
        '"tool_name": "Bash", "tool_input": {"command": "ls"}}'
    )
    probe = (
        "import os, sys\n"
        "r, w = os.pipe(); os.write(w, sys.argv[1].encode()); os.close(w); os.dup2(r, 0)\n"
        "from corral.cli import main\n"
        "status = main(['hook', 'claude-code'])\n"
        "heavy = sorted(m for m in ('json', 're', 'typing', 'dataclasses', 'subprocess', 'asyncio',\n"
        "    'argparse', 'enum', 'socket', 'threading', 'pathlib', 'fnmatch', 'inspect', 'signal',\n"
        "    'selectors', 'shlex', 'tempfile', 'difflib', 'hashlib', 'logging') if m in sys.modules)\n"
        "print('', status, ','.join(heavy), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import site; site.main()\n" + probe, payload],
        cwd=ws,
        env={"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CORRAL_SERVER": "off"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert '"permissionDecision":"allow"' in result.stdout, result.stderr
    status, _, heavy = result.stderr.strip().rpartition("\n")[2].strip().partition(" ")
    assert status == "0", result.stderr
    assert heavy == "", f"the hook path imported {heavy}"
