"""Run a coroutine to its end from a test, in a thread of its own.

The browser tests' Playwright (a session fixture) keeps an event loop running in the main thread for the whole
session, where ``asyncio.run`` refuses to start another; a fresh thread has no loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
