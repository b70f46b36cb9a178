"""Found by the fault campaign: a Postgres restart made the scheduler's periodic node check raise, and
the failed task stopped the whole scheduler (and with it `tfctl up`). The scheduler's periodic work
runs as the runtime's timers (`Components.timers`): a failed round now only waits for the next one."""

from __future__ import annotations

import asyncio

from tfcommon.runtime import Timer, run_timer


async def test_a_failed_periodic_round_is_retried_on_the_next_round() -> None:
    stop = asyncio.Event()
    rounds: list[str] = []

    async def check_nodes() -> None:
        rounds.append("round")
        if len(rounds) == 1:
            raise ConnectionError("the database system is starting up")
        stop.set()

    await asyncio.wait_for(run_timer("check-nodes", Timer(0.01, check_nodes), stop), timeout=10)
    assert rounds == ["round", "round"]
