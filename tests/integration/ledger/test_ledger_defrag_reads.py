"""`latest_defrag_campaigns()` and `defrag_campaigns_since()`: the planner's campaigns as other readers
(the metrics dashboard) see them, their node lists reduced to counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import DefragCampaignSummary
from tfcommon.ledger.sql import SqlLedger

pytestmark = pytest.mark.integration

T0 = datetime(2031, 4, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
PLAIN = "id pool_name started_at trigger state finished_at deadline_at outcome current_node pods_evicted"
CAMPAIGN = sa.table(
    "defrag_campaign",
    *(sa.column(name) for name in (*PLAIN.split(), "stranded_pods")),
    *(sa.column(name, JSONB) for name in ("drained_nodes", "failed_nodes", "skipped_nodes")),
)
"""The planner's table (`tfdefrag.store`), as much of it as these tests write."""


async def a_campaign(ledger: SqlLedger, pool: str, started: datetime, **columns: Any) -> None:
    row: dict[str, Any] = {
        "trigger": "cron",
        "state": "finished",
        "finished_at": started + HOUR / 2,
        "outcome": "completed",
        "drained_nodes": [],
        "failed_nodes": {},
        "skipped_nodes": {},
        "pods_evicted": 0,
        "stranded_pods": 0,
        **columns,
    }
    async with ledger.engine.begin() as connection:
        await connection.execute(
            sa.insert(CAMPAIGN).values(id=uuid4(), pool_name=pool, started_at=started, **row)
        )


def summary(pool: str, started: datetime, **fields: Any) -> DefragCampaignSummary:
    values: dict[str, Any] = {
        "trigger": "cron",
        "running": False,
        "finished_at": started + HOUR / 2,
        "deadline_at": None,
        "outcome": "completed",
        "current_node": None,
        "nodes_drained": 0,
        "nodes_failed": 0,
        "nodes_skipped": 0,
        "pods_evicted": 0,
        "stranded_pods": 0,
        **fields,
    }
    return DefragCampaignSummary(pool=pool, started_at=started, **values)


async def test_each_pool_shows_its_running_campaign_and_its_last_finished_one(ledger: SqlLedger) -> None:
    port: Ledger = ledger
    await a_campaign(ledger, "alpha", T0 - 3 * HOUR)
    await a_campaign(
        ledger,
        "alpha",
        T0 - HOUR,
        outcome="deadline",
        drained_nodes=["n1", "n2"],
        failed_nodes={"n3": "pods stranded"},
        skipped_nodes={"n4": "busy", "n5": "pinned"},
        pods_evicted=5,
        stranded_pods=1,
    )
    await a_campaign(
        ledger,
        "alpha",
        T0,
        trigger="manual",
        state="running",
        finished_at=None,
        deadline_at=T0 + 2 * HOUR,
        outcome=None,
        current_node="n6",
    )
    await a_campaign(ledger, "beta", T0 - 2 * HOUR)

    latest = await port.latest_defrag_campaigns()

    assert sorted(latest, key=lambda campaign: (campaign.pool, campaign.started_at)) == [
        summary(
            "alpha",
            T0 - HOUR,
            outcome="deadline",
            nodes_drained=2,
            nodes_failed=1,
            nodes_skipped=2,
            pods_evicted=5,
            stranded_pods=1,
        ),
        summary(
            "alpha",
            T0,
            trigger="manual",
            running=True,
            finished_at=None,
            deadline_at=T0 + 2 * HOUR,
            outcome=None,
            current_node="n6",
        ),
        summary("beta", T0 - 2 * HOUR),
    ]

    since = await port.defrag_campaigns_since(T0 - 2 * HOUR, limit=10)

    assert [(campaign.pool, campaign.started_at) for campaign in since] == [
        ("beta", T0 - 2 * HOUR),
        ("alpha", T0 - HOUR),
        ("alpha", T0),
    ], "the ones finished in the window and the running one, oldest first"
    newest = await port.defrag_campaigns_since(T0 - 2 * HOUR, limit=2)
    assert [(campaign.pool, campaign.started_at) for campaign in newest] == [
        ("alpha", T0 - HOUR),
        ("alpha", T0),
    ]
