"""Two schedulers placing in one namespace at once, against real Postgres and NATS: the quota is checked
in the reservation's own ledger transaction (`SqlLedger.reserve_within_quota`), so together they never
overshoot it, however their in-memory views lag."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from scheduler_builders import a_submission, register_nodes
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.core.quota import NamespaceQuota, Usage, usage_of_shares
from tfscheduler.engine import Scheduler

pytestmark = pytest.mark.integration
LONG = timedelta(hours=1)


async def test_two_schedulers_placing_at_once_stay_within_the_namespace_quota(
    database_url: str, bus: NatsEventBus
) -> None:
    quota = NamespaceQuota(namespace="team-a", total_requests_tflops_milli=50_000, max_workers=4)
    ledgers = [SqlLedger.create(database_url, pool_size=8) for _ in range(2)]
    try:
        await register_nodes(ledgers[0], nodes=2, gpus=4)  # room for 80 pods of 10 TFLOPS
        schedulers = [
            Scheduler(ledger, bus, quotas={"team-a": quota}, heartbeat_timeout=LONG, name=f"scheduler-{n}")
            for n, ledger in enumerate(ledgers)
        ]
        for scheduler in schedulers:
            await scheduler.start()
        pods = [a_submission(tflops_milli=10_000) for _ in range(24)]
        statuses = await asyncio.gather(*(schedulers[n % 2].submit(pod) for n, pod in enumerate(pods)))
        placed = [s for s in statuses if s.state == "placed"]
        used = usage_of_shares(await ledgers[0].namespace_shares(["team-a"])).get("team-a", Usage())
        assert used.workers == len(placed) == 4  # maxWorkers, not 4 per scheduler
        assert used.requests_tflops_milli == 40_000
        waiting = [s for s in statuses if s.state == "pending"]
        assert len(waiting) == 20
        assert all(
            "GPUResourceQuota team-a/team-a: total.maxWorkers would be 5 of 4" in (s.reason or "")
            for s in waiting
        )
    finally:
        for ledger in ledgers:
            await ledger.close()
