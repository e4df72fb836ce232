"""One-shot helpers: :func:`run` and :func:`arun` run one command in a fresh sandbox.

They create a :class:`~corral.Sandbox` (or :class:`~corral.AsyncSandbox`)
with the given options, run the command, close the sandbox and return the
:class:`~corral.Outcome`.

Example::

    import corral

    outcome = corral.run(["pytest", "-q"], workspace="/src/app", timeout=300)
    print(outcome.returncode, outcome.violations)
"""

from __future__ import annotations

from ._sandbox import AsyncSandbox, Sandbox

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Unpack

    from ._options import SandboxOptions
    from .pipeline._outcome import Outcome

__all__ = ["arun", "run"]


def run(
    command: str | Sequence[str],
    *,
    timeout: float | str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | str | None = None,
    cwd: str | None = None,
    **options: Unpack[SandboxOptions],
) -> Outcome:
    """Run *command* in a fresh sandbox and return its Outcome.

    *timeout*, *env*, *stdin* and *cwd* apply to the command (see
    :meth:`Sandbox.exec <corral.Sandbox.exec>`); every other keyword is a
    sandbox option (see :class:`~corral.AsyncSandbox` and
    :class:`~corral._options.SandboxOptions`), e.g. ``workspace=``,
    ``network=``, ``memory=``, or ``policy=`` for a complete Policy.

    Raises:
        UsageError: bad settings, options or command; nothing ran.
        SandboxError: the sandbox could not be provided; nothing ran.
    """
    with Sandbox(**options) as sandbox:
        return sandbox.exec(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)


async def arun(
    command: str | Sequence[str],
    *,
    timeout: float | str | None = None,  # noqa: ASYNC109 - the sandbox's wall-clock limit, not an await timeout
    env: Mapping[str, str] | None = None,
    stdin: bytes | str | None = None,
    cwd: str | None = None,
    **options: Unpack[SandboxOptions],
) -> Outcome:
    """The async twin of :func:`run`; cancelling it stops the command."""
    async with AsyncSandbox(**options) as sandbox:
        return await sandbox.exec(command, timeout=timeout, env=env, stdin=stdin, cwd=cwd)
