"""One test suite, two twins: every SDK test runs against Sandbox and AsyncSandbox.

``open_sandbox`` yields an object with the sync method names; for the async
twin each call is driven to completion on one event loop owned by the fixture,
so the suite exercises the real coroutines (worker thread, cancellation
plumbing) with the same assertions.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from corral import AsyncSandbox, Sandbox
from tests.conftest import World


class AsyncTwin:
    """Drive an AsyncSandbox with sync calls (``close`` maps to ``aclose``)."""

    def __init__(self, sandbox: AsyncSandbox, loop: asyncio.AbstractEventLoop) -> None:
        self.sandbox = sandbox
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        if name == "close":
            name = "aclose"
        value = getattr(self.sandbox, name)
        if inspect.iscoroutinefunction(value):
            return lambda *args, **kwargs: self.loop.run_until_complete(value(*args, **kwargs))
        return value


@pytest.fixture(params=["sync", "async"])
def twin(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_sandbox(twin: str, world: World) -> Iterator[Callable[..., Any]]:
    # after ``world``: its check for stray processes runs once every sandbox (whose
    # resident sandbox lives as long as the session) is closed
    del world
    loop = asyncio.new_event_loop()
    opened: list[Any] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        if twin == "sync":
            sandbox: Any = Sandbox(*args, **kwargs)
        else:
            sandbox = AsyncTwin(AsyncSandbox(*args, **kwargs), loop)
        opened.append(sandbox)
        return sandbox

    yield factory
    for sandbox in opened:
        sandbox.close()
    loop.close()
