"""`enabled-replicas` in local mode: how many pods of a workload the scheduler has taken over.

In Kubernetes the webhook keeps the count (`tfcommon.ledger.takeover`); a submission through the local
API (`tfctl submit`) carries the webhook's claim instead (`Submission.takeover`), and a pod of the
workload counts as taken over while it is live here (pending or placed: deleting or ending it frees its
place, and the replacement of an evicted pod keeps the claim, so it counts in its stead). Counting and
submitting happen under a per-workload lock, in this process and across scheduler processes (a
Postgres advisory lock), so concurrent submissions never take over more than the cap.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tfscheduler.workloads import LIVE_STATES, scheduler_workload

_LOCK_WORKLOAD = sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 7467))")


class TakeoverCounter:
    """Counts the live pods of a workload under `enabled-replicas`, holding the workload's lock."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._lock = asyncio.Lock()  # one waiter on the advisory lock per process, not one per request

    @asynccontextmanager
    async def counting(self, workload_key: str, allocation_id: UUID) -> AsyncIterator[int]:
        """How many other pods of `workload_key` are taken over (live), with the workload locked until
        the block ends: submit within it, so the next count sees this pod."""
        table = scheduler_workload.c
        count = (
            sa.select(sa.func.count())
            .select_from(scheduler_workload)
            .where(
                table.state.in_(LIVE_STATES),
                table.submission["takeover"]["workload_key"].astext == workload_key,
                table.allocation_id != allocation_id,
            )
        )
        async with self._lock, self.engine.begin() as connection:
            await connection.execute(_LOCK_WORKLOAD, {"key": workload_key})
            yield int(await connection.scalar(count) or 0)
