"""`workload_recommendation` in the ledger: one row per workload, its latest autoscaling recommendation.

Written only by the metrics service (`RecommendationStore.replace`: an upsert per workload holding GPUs,
the rows of the others deleted, in one transaction); read by the
webhook through `RecommendationCache` (refreshed off the admission path) and by `tfctl get
recommendations`. The table comes from Alembic revision `0006_metrics_recommendations`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from types import MappingProxyType

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from tfcommon.recommendations import Recommendation

_log = logging.getLogger("tfcommon.ledger.recommendations")

metadata = sa.MetaData()
workload_recommendation = sa.Table(
    "workload_recommendation",
    metadata,
    sa.Column("workload_key", sa.Text(), primary_key=True),
    sa.Column("pool", sa.Text(), nullable=False),
    sa.Column("qos", sa.Text(), nullable=False),
    sa.Column("gpu_count", sa.Integer(), nullable=False),
    sa.Column("request_tflops_milli", sa.BigInteger(), nullable=False),
    sa.Column("limit_tflops_milli", sa.BigInteger(), nullable=False),
    sa.Column("request_vram_bytes", sa.BigInteger(), nullable=False),
    sa.Column("limit_vram_bytes", sa.BigInteger(), nullable=False),
    sa.Column("current_request_tflops_milli", sa.BigInteger(), nullable=False),
    sa.Column("current_limit_tflops_milli", sa.BigInteger(), nullable=False),
    sa.Column("current_request_vram_bytes", sa.BigInteger(), nullable=False),
    sa.Column("current_limit_vram_bytes", sa.BigInteger(), nullable=False),
    sa.Column("sample_count", sa.Integer(), nullable=False),
    sa.Column("sufficient", sa.Boolean(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=False),
    sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
)

_FIELDS = tuple(column.name for column in workload_recommendation.columns)


def _record(row: sa.Row[object]) -> Recommendation:
    return Recommendation(**{name: getattr(row, name) for name in _FIELDS})


def _rows(recommendations: Iterable[Recommendation]) -> list[dict[str, object]]:
    return [{name: getattr(item, name) for name in _FIELDS} for item in recommendations]


def _upsert(rows: list[dict[str, object]]) -> sa.Insert:
    statement = insert(workload_recommendation).values(rows)
    return statement.on_conflict_do_update(
        index_elements=["workload_key"],
        set_={name: statement.excluded[name] for name in _FIELDS if name != "workload_key"},
    )


class RecommendationStore:
    """The recommendations on Postgres: latest one per workload."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def save(self, recommendations: Iterable[Recommendation]) -> int:
        """Insert or replace each workload's recommendation in one transaction; returns how many."""
        rows = _rows(recommendations)
        if rows:
            async with self.engine.begin() as connection:
                await connection.execute(_upsert(rows))
        return len(rows)

    async def replace(self, recommendations: Iterable[Recommendation]) -> int:
        """Make these the whole stored set in one transaction: upsert each, delete every other workload's
        row (a workload that holds no GPU any more is forgotten); returns how many are stored."""
        rows = _rows(recommendations)
        kept = [row["workload_key"] for row in rows]
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.delete(workload_recommendation).where(workload_recommendation.c.workload_key.not_in(kept))
            )
            if rows:
                await connection.execute(_upsert(rows))
        return len(rows)

    async def all(self) -> list[Recommendation]:
        """Every stored recommendation, ordered by workload key."""
        async with self.engine.connect() as connection:
            rows = (
                await connection.execute(
                    sa.select(workload_recommendation).order_by(workload_recommendation.c.workload_key)
                )
            ).all()
        return [_record(row) for row in rows]


class RecommendationCache:
    """The stored recommendations held in memory for the admission hot path, refreshed by a task.

    `current()` never touches the database; `refresh()` replaces the whole mapping at once (a new
    object, so verdict caches keyed on its identity notice the change). A failed refresh keeps the
    previous mapping: a ledger outage never blocks admission.
    """

    def __init__(self, store: RecommendationStore) -> None:
        self.store = store
        self.last_error: str | None = None
        self._current: Mapping[str, Recommendation] = MappingProxyType({})

    def current(self) -> Mapping[str, Recommendation]:
        return self._current

    async def refresh(self) -> Mapping[str, Recommendation]:
        try:
            stored = await self.store.all()
        except Exception as error:
            self.last_error = str(error).splitlines()[0] if str(error) else type(error).__name__
            _log.warning(
                "recommendation refresh failed; keeping the previous ones",
                extra={"event": "recommendations.refresh_failed", "reason": self.last_error},
            )
            return self._current
        fresh = {item.workload_key: item for item in stored}
        if fresh != dict(self._current):
            self._current = MappingProxyType(fresh)
        self.last_error = None
        return self._current
