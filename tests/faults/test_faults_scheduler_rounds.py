"""Found by the fault campaign: a Postgres restart made the scheduler's periodic node check raise, and
the failed task stopped the whole scheduler (and with it `tfctl up`). A failed round now only waits
for the next one."""

from __future__ import annotations

import asyncio

from tfscheduler.app import _every


async def test_a_failed_periodic_round_is_retried_on_the_next_round() -> None:
    stop = asyncio.Event()
    rounds: list[str] = []

    async def check_nodes() -> None:
        rounds.append("round")
        if len(rounds) == 1:
            raise ConnectionError("the database system is starting up")
        stop.set()

    await asyncio.wait_for(_every(0.01, stop, check_nodes), timeout=10)
    assert rounds == ["round", "round"]
