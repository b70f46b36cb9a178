"""The metrics service's own pool samples, kept for the dashboard's time series across restarts.

`PoolHistory.record(snapshot)` turns the live view's latest ledger snapshot, once it is an interval
newer than the last sample, into one sample per pool (`tfmetrics.core.history.pool_samples`: the
figures of the Prometheus series), writes them to
`metrics_pool_sample` (ledger revision `0009_metrics_pool_samples`) and deletes the rows older than
`HISTORY_WINDOW` (24 h) by the service's clock. `load()` reads the kept rows back at start, so a
restarted service draws the last day; between the two the page reads the copy in memory, never the
table. The metrics service is the only writer of the table.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from tfmetrics.core.history import HISTORY_WINDOW, PoolSample, pool_samples
from tfmetrics.core.series import ClusterSnapshot

metadata = sa.MetaData()
metrics_pool_sample = sa.Table(
    "metrics_pool_sample",
    metadata,
    sa.Column("pool_name", sa.Text(), primary_key=True),
    sa.Column("sampled_at", sa.DateTime(timezone=True), primary_key=True),
    sa.Column("gpu_count", sa.Integer(), nullable=False),
    sa.Column("whole_idle_gpus", sa.Integer(), nullable=False),
    sa.Column("capacity_tflops_milli", sa.BigInteger(), nullable=False),
    sa.Column("allocated_tflops_milli", sa.BigInteger(), nullable=False),
    sa.Column("capacity_vram_bytes", sa.BigInteger(), nullable=False),
    sa.Column("allocated_vram_bytes", sa.BigInteger(), nullable=False),
    sa.Column("stranded_tflops_milli", sa.BigInteger(), nullable=False),
    sa.Column("stranded_vram_bytes", sa.BigInteger(), nullable=False),
    sa.Column("fragmentation_rate", sa.Float(), nullable=False),
)

_COLUMNS = tuple(column.name for column in metrics_pool_sample.columns if column.name != "pool_name")


def _row(sample: PoolSample) -> dict[str, object]:
    return {"pool_name": sample.pool, **{name: getattr(sample, name) for name in _COLUMNS}}


def _sample(row: sa.Row[object]) -> PoolSample:
    return PoolSample(pool=row.pool_name, **{name: getattr(row, name) for name in _COLUMNS})


class PoolHistory:
    """The last `window` of pool samples: in the ledger, and in memory for the page."""

    def __init__(
        self,
        engine: AsyncEngine,
        clock: Callable[[], datetime],
        interval: timedelta,
        window: timedelta = HISTORY_WINDOW,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.interval = interval
        self.window = window
        self.samples: list[PoolSample] = []

    def _cutoff(self) -> datetime:
        return self.clock() - self.window

    async def load(self) -> int:
        """Delete the rows older than the window, read the others into memory; returns how many."""
        cutoff = self._cutoff()
        table = metrics_pool_sample.c
        async with self.engine.begin() as connection:
            await connection.execute(sa.delete(metrics_pool_sample).where(table.sampled_at < cutoff))
            rows = await connection.execute(
                sa.select(metrics_pool_sample).order_by(table.sampled_at, table.pool_name)
            )
            self.samples = [_sample(row) for row in rows]
        return len(self.samples)

    async def store(self, samples: list[PoolSample]) -> None:
        """Write `samples` (a sample already stored for its pool and moment is kept as it is) and delete
        every row older than the window, in one transaction; then the same in memory."""
        cutoff = self._cutoff()
        async with self.engine.begin() as connection:
            if samples:
                statement = insert(metrics_pool_sample).values([_row(sample) for sample in samples])
                await connection.execute(statement.on_conflict_do_nothing())
            await connection.execute(
                sa.delete(metrics_pool_sample).where(metrics_pool_sample.c.sampled_at < cutoff)
            )
        stored = {(sample.pool, sample.sampled_at) for sample in self.samples}
        fresh = [sample for sample in samples if (sample.pool, sample.sampled_at) not in stored]
        kept = [sample for sample in self.samples if sample.sampled_at >= cutoff]
        self.samples = sorted(kept + fresh, key=lambda sample: (sample.sampled_at, sample.pool))

    def due(self, snapshot: ClusterSnapshot) -> bool:
        """Whether `snapshot` is `interval` or more newer than the last sample (or there is none yet)."""
        return not self.samples or snapshot.now - self.samples[-1].sampled_at >= self.interval

    async def record(self, snapshot: ClusterSnapshot | None) -> list[PoolSample]:
        """Store one sample per pool of `snapshot` when it is `due` (a ledger that cannot be read leaves
        a gap, never a copy of old figures); returns the samples stored."""
        if snapshot is None or not self.due(snapshot):
            return []
        samples = pool_samples(snapshot)
        await self.store(samples)
        return samples

    def since(self, start: datetime) -> list[PoolSample]:
        """The samples in memory taken at or after `start`, oldest first."""
        return [sample for sample in self.samples if sample.sampled_at >= start]
