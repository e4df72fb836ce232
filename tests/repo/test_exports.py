"""The public API: ``corral.__all__`` is sorted, complete, and every name resolves lazily."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import corral

INIT = os.path.join(os.path.dirname(corral.__file__), "__init__.py")


def _type_checking_names() -> set[str]:
    """Names imported under ``if TYPE_CHECKING:`` in corral/__init__.py (what type checkers see)."""
    with open(INIT, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names: set[str] = set()
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
            for stmt in node.body:  # type: ignore[attr-defined]
                if isinstance(stmt, ast.ImportFrom):
                    names.update(alias.asname or alias.name for alias in stmt.names)
    return names


def test_all_is_sorted_and_unique() -> None:
    assert list(corral.__all__) == sorted(set(corral.__all__))


def test_all_lists_every_lazy_name_and_the_type_checking_imports_match() -> None:
    lazy = set(corral._LAZY)
    assert set(corral.__all__) == lazy | {"__version__"}
    assert _type_checking_names() == lazy


def test_every_public_name_resolves_to_its_modules_object() -> None:
    import importlib

    for name in corral.__all__:
        if name == "__version__":
            continue
        module = importlib.import_module(corral._LAZY[name], "corral")
        assert getattr(corral, name) is getattr(module, name), name


def test_the_sdk_is_exported() -> None:
    for name in ("Sandbox", "AsyncSandbox", "run", "arun", "FileInfo"):
        assert name in corral.__all__


def test_import_corral_stays_cheap() -> None:
    code = "import sys, corral; print(sorted(m for m in sys.modules if m.startswith('corral')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['corral', 'corral._version']"
