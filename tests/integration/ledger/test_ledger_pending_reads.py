"""`pending_workloads()`: the scheduler's pending workloads as other readers (the metrics dashboard) see
them, in the scheduler's order, cut at a limit with the count of them all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import PendingSubmission
from tfcommon.ledger.sql import SqlLedger

pytestmark = pytest.mark.integration

T0 = datetime(2031, 5, 1, tzinfo=UTC)
PLAIN = ("allocation_id", "namespace", "name", "priority", "qos_rank", "state", "reason", "submitted_at")
WORKLOAD = sa.table(
    "scheduler_workload",
    *(sa.column(name) for name in (*PLAIN, "updated_at")),
    sa.column("submission", JSONB),
)
"""The scheduler's table (`tfscheduler.workloads`), as much of it as these tests write."""


async def a_workload(
    ledger: SqlLedger, name: str, *, priority: int, qos_rank: int, minutes: int, state: str = "pending"
) -> dict[str, Any]:
    submission = {"workload": {"namespace": "team-c", "name": name}, "request": {"gpu_count": priority + 1}}
    async with ledger.engine.begin() as connection:
        await connection.execute(
            sa.insert(WORKLOAD).values(
                allocation_id=uuid4(),
                namespace="team-c",
                name=name,
                priority=priority,
                qos_rank=qos_rank,
                state=state,
                reason=f"{name} waits",
                submitted_at=T0 + timedelta(minutes=minutes),
                updated_at=T0,
                submission=submission,
            )
        )
    return submission


async def test_pending_workloads_come_in_the_schedulers_order_cut_at_the_limit(ledger: SqlLedger) -> None:
    port: Ledger = ledger
    assert await port.pending_workloads(10) == ([], 0)
    low = await a_workload(ledger, "low", priority=0, qos_rank=3, minutes=0)
    await a_workload(ledger, "high-late", priority=5, qos_rank=1, minutes=2)
    await a_workload(ledger, "high-early", priority=5, qos_rank=1, minutes=1)
    await a_workload(ledger, "high-better-qos", priority=5, qos_rank=2, minutes=3)
    await a_workload(ledger, "placed", priority=9, qos_rank=3, minutes=0, state="placed")

    pending, total = await port.pending_workloads(10)

    assert total == 4
    assert [workload.name for workload in pending] == ["high-better-qos", "high-early", "high-late", "low"]
    assert pending[-1] == PendingSubmission(
        namespace="team-c", name="low", submission=low, reason="low waits", submitted_at=T0
    )
    first, total = await port.pending_workloads(2)
    assert ([workload.name for workload in first], total) == (["high-better-qos", "high-early"], 4)
