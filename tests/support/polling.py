"""Poll a condition until it holds, failing the test with what was awaited: `eventually` in an event
loop (the probe plain or async), `wait_for` in plain code (subprocesses, kubectl, a remote API)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T | None]] | Callable[[], T | None],
    what: str = "condition",
    *,
    timeout_s: float = 20.0,
    every_s: float = 0.05,
) -> T:
    """Call `probe` (plain or async) every `every_s` until it returns something other than None or
    False, and return that; raise AssertionError naming `what` once `timeout_s` has passed.

    A probe returning a value (a row, a response) is met by any value, 0 and empty ones included;
    one returning a bool is met by True.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result is not None and result is not False:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout_s}s")
        await asyncio.sleep(every_s)


def wait_for(what: str, check: Callable[[], T | None], *, within_s: float, every_s: float) -> T:
    """Call `check` every `every_s` until it returns something truthy, and return that; raise
    AssertionError naming `what` once `within_s` has passed. Blocks: for code outside an event loop."""
    deadline = time.monotonic() + within_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {within_s:.0f}s")
        time.sleep(every_s)
