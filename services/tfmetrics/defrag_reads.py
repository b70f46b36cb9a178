"""Reads the defrag planner's campaigns (ledger revision `0004_defrag_campaigns`) for the dashboard.

Per pool: the running campaign, if any, and the last finished one. Read-only, plain SQL over the
planner's table (the metrics service never imports the planner); the planner is the only writer.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tfmetrics.core.dashboard import CampaignSummary

_CAMPAIGNS = sa.text(
    """
    SELECT DISTINCT ON (pool_name, state) pool_name, trigger, state, started_at, finished_at, deadline_at,
           outcome, current_node, drained_nodes, failed_nodes, skipped_nodes, pods_evicted, stranded_pods
    FROM defrag_campaign
    ORDER BY pool_name, state, started_at DESC
    """
)


def _count(value: Any) -> int:
    return len(value) if isinstance(value, list | dict) else 0


async def latest_campaigns(engine: AsyncEngine) -> list[CampaignSummary]:
    """Each pool's running campaign and its last finished one, by pool name."""
    async with engine.connect() as connection:
        rows = (await connection.execute(_CAMPAIGNS)).all()
    return [
        CampaignSummary(
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
        for row in rows
    ]
