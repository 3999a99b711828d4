"""tests/helpers/aio.py: a coroutine runs to its end from a test while the main thread's loop runs (as
Playwright's does for the browser tests' whole session)."""

from __future__ import annotations

import asyncio

import pytest
from helpers import aio


async def forty_two() -> int:
    return 42


def test_a_coroutine_runs_where_asyncio_run_refuses() -> None:
    async def inside_a_running_loop() -> int:
        refused = forty_two()
        with pytest.raises(RuntimeError, match="running event loop"):
            asyncio.run(refused)
        refused.close()
        return aio.run(forty_two())

    assert aio.run(inside_a_running_loop()) == 42  # a loop of its own: the main thread may have one running
