"""Reads the defrag planner's campaigns (ledger revision `0004_defrag_campaigns`) for the dashboard.

Per pool: the running campaign, if any, and the last finished one (`latest_campaigns`); and every
campaign that overlaps a time window, for the marks on the history charts (`campaigns_since`).
Read-only, plain SQL over the planner's table (the metrics service never imports the planner); the
planner is the only writer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tfmetrics.core.dashboard import CampaignSummary

_FIELDS = """pool_name, trigger, state, started_at, finished_at, deadline_at, outcome, current_node,
    drained_nodes, failed_nodes, skipped_nodes, pods_evicted, stranded_pods"""
_CAMPAIGNS = sa.text(
    f"""
    SELECT DISTINCT ON (pool_name, state) {_FIELDS}
    FROM defrag_campaign
    ORDER BY pool_name, state, started_at DESC
    """
)
_CAMPAIGNS_SINCE = sa.text(
    f"""
    SELECT {_FIELDS}
    FROM defrag_campaign
    WHERE state = 'running' OR finished_at >= :start
    ORDER BY started_at DESC, pool_name
    LIMIT :limit
    """
)
MARKED_CAMPAIGNS_LIMIT = 500
"""The most campaigns one history window marks, the newest (the planner runs a few a day per pool)."""


def _count(value: Any) -> int:
    return len(value) if isinstance(value, list | dict) else 0


def _summary(row: Any) -> CampaignSummary:
    return CampaignSummary(
        pool=row.pool_name,
        trigger=row.trigger,
        running=row.state == "running",
        started_at=row.started_at,
        finished_at=row.finished_at,
        deadline_at=row.deadline_at,
        outcome=row.outcome,
        current_node=row.current_node,
        nodes_drained=_count(row.drained_nodes),
        nodes_failed=_count(row.failed_nodes),
        nodes_skipped=_count(row.skipped_nodes),
        pods_evicted=row.pods_evicted,
        stranded_pods=row.stranded_pods,
    )


async def latest_campaigns(engine: AsyncEngine) -> list[CampaignSummary]:
    """Each pool's running campaign and its last finished one, by pool name."""
    async with engine.connect() as connection:
        rows = (await connection.execute(_CAMPAIGNS)).all()
    return [_summary(row) for row in rows]


async def campaigns_since(engine: AsyncEngine, start: datetime) -> list[CampaignSummary]:
    """Every campaign running now or finished at or after `start`, oldest first."""
    async with engine.connect() as connection:
        rows = (
            await connection.execute(_CAMPAIGNS_SINCE, {"start": start, "limit": MARKED_CAMPAIGNS_LIMIT})
        ).all()
    return [_summary(row) for row in reversed(rows)]
