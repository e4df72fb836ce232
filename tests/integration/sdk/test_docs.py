"""Every Python example in docs/sdk.md runs as written, from a project directory.

Each ```python block runs in a fresh interpreter whose working directory is a
git repository with a ``Makefile`` (``lint`` and ``test`` targets), as the
page says; a block fails the test by exiting non-zero (an exception, a failed
``check()`` or ``assert``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ..conftest import World, needs_bwrap

pytestmark = needs_bwrap

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "sdk.md")


def examples() -> list[str]:
    with open(DOC) as f:
        text = f.read()
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def test_the_page_has_examples() -> None:
    assert len(examples()) >= 8


@pytest.mark.parametrize("number", range(len(examples())))
def test_the_example_runs_as_written(world: World, number: int) -> None:
    code = examples()[number]
    World.write(world.ws("Makefile"), "lint:\n\t@echo linted\ntest:\n\t@echo tested\n")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=world.workspace,
        env=world.environ,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, (code, result.stdout.decode(), result.stderr.decode())
