"""The scheduler's workload table (`scheduler_workload`, revision 0003): submissions and their state.

Only the scheduler writes it. Inserting is idempotent per allocation id; pending rows are what the
scheduler retries when capacity or quota frees. This module does SQL only; decisions live elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tfscheduler.core.lifecycle import INITIAL_STATE, Transition, sources, target
from tfscheduler.core.preemption import QOS_RANK
from tfscheduler.submission import Submission, WorkloadState

metadata = sa.MetaData()
scheduler_workload = sa.Table(
    "scheduler_workload",
    metadata,
    sa.Column("allocation_id", sa.Uuid(), primary_key=True),
    sa.Column("namespace", sa.Text(), nullable=False),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("uid", sa.Text(), nullable=True),
    sa.Column("submission", JSONB(), nullable=False),
    sa.Column("priority", sa.Integer(), nullable=False),
    sa.Column("qos_rank", sa.Integer(), nullable=False),
    sa.Column("state", sa.Text(), nullable=False),
    sa.Column("reason", sa.Text(), nullable=True),
    sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)


_INSERT_MANY = sa.text(
    """
INSERT INTO scheduler_workload (
    allocation_id, namespace, name, uid, submission, priority, qos_rank, state, submitted_at, updated_at
)
SELECT r.allocation_id, r.namespace, r.name, r.uid, r.submission, r.priority, r.qos_rank,
    :initial, :now, :now
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(
    allocation_id uuid, namespace text, name text, uid text, submission jsonb,
    priority integer, qos_rank integer
)
ON CONFLICT (allocation_id) DO NOTHING
RETURNING allocation_id
"""
)

_KEEP_PENDING = sa.text(
    """
UPDATE scheduler_workload AS w SET reason = r.reason, updated_at = :now
FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS r(allocation_id uuid, reason text)
WHERE w.allocation_id = r.allocation_id AND w.state = ANY(:waiting)
RETURNING w.allocation_id
"""
)


LIVE_STATES = ("pending", "placed")


_MARK_PLACED = sa.text(
    """
UPDATE scheduler_workload AS w SET state = :placed, reason = NULL, updated_at = :now
WHERE w.allocation_id = ANY(:allocation_ids) AND w.state = ANY(:placeable)
  AND EXISTS (SELECT 1 FROM allocation AS a WHERE a.allocation_id = w.allocation_id AND a.state <> 'released')
"""
)


def mark_placed(allocation_ids: list[UUID], now: datetime) -> sa.TextClause:
    """The stored workloads among `allocation_ids` that hold a live allocation, moved to `placed`: run in
    the reservations' transaction, so a workload is placed exactly when its allocation is written."""
    return _MARK_PLACED.bindparams(
        allocation_ids=allocation_ids,
        now=now,
        placed=target(Transition.PLACE),
        placeable=list(sources(Transition.PLACE)),
    )


@dataclass(frozen=True)
class StoredWorkload:
    allocation_id: UUID
    submission: Submission
    state: WorkloadState
    reason: str | None
    submitted_at: datetime


def _stored(row: Any) -> StoredWorkload:
    return StoredWorkload(
        allocation_id=row.allocation_id,
        submission=Submission.model_validate(row.submission),
        state=row.state,
        reason=row.reason,
        submitted_at=row.submitted_at,
    )


class WorkloadStore:
    """Submitted workloads in the ledger database. Safe to use from several scheduler processes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def insert(self, allocation_id: UUID, submission: Submission, now: datetime) -> StoredWorkload:
        """Record a new submission as pending; an existing row is returned unchanged."""
        statement = (
            insert(scheduler_workload)
            .values(
                allocation_id=allocation_id,
                namespace=submission.workload.namespace,
                name=submission.workload.name,
                uid=submission.workload.uid,
                submission=submission.model_dump(mode="json"),
                priority=submission.priority,
                qos_rank=QOS_RANK[submission.request.qos],
                state=INITIAL_STATE,
                submitted_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["allocation_id"])
        )
        async with self.engine.begin() as connection:
            await connection.execute(statement)
            row = (
                await connection.execute(
                    sa.select(scheduler_workload).where(scheduler_workload.c.allocation_id == allocation_id)
                )
            ).one()
            return _stored(row)

    async def insert_many(
        self,
        entries: Sequence[tuple[UUID, Submission]],
        now: datetime,
        *,
        connection: AsyncConnection | None = None,
    ) -> dict[UUID, StoredWorkload]:
        """`insert` each entry in one statement; returns every entry's row, new or existing, by id. With
        `connection`, within the caller's open transaction (it commits or rolls back with it)."""
        submissions = dict(entries)
        if not submissions:
            return {}
        if connection is not None:
            return await _insert_many(connection, submissions, now)
        async with self.engine.begin() as own:
            return await _insert_many(own, submissions, now)

    async def keep_pending(
        self, reasons: dict[UUID, str], now: datetime, *, connection: AsyncConnection | None = None
    ) -> set[UUID]:
        """Set each still-pending workload's reason in one statement; returns the ids that were pending.
        With `connection`, within the caller's open transaction (it commits or rolls back with it)."""
        if not reasons:
            return set()
        rows = [{"allocation_id": str(key), "reason": reason} for key, reason in reasons.items()]
        parameters = {"rows": json.dumps(rows), "now": now, "waiting": list(sources(Transition.WAIT))}
        if connection is not None:
            return {allocation_id for (allocation_id,) in await connection.execute(_KEEP_PENDING, parameters)}
        async with self.engine.begin() as own:
            return {allocation_id for (allocation_id,) in await own.execute(_KEEP_PENDING, parameters)}

    async def get(self, allocation_id: UUID) -> StoredWorkload | None:
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    sa.select(scheduler_workload).where(scheduler_workload.c.allocation_id == allocation_id)
                )
            ).first()
            return None if row is None else _stored(row)

    async def transition(
        self,
        allocation_id: UUID,
        transition: Transition,
        reason: str | None,
        now: datetime,
        *,
        connection: AsyncConnection | None = None,
    ) -> bool:
        """Apply `transition` (`tfscheduler.core.lifecycle`) to the workload, only from a state the
        table allows it from; True when it moved. With `connection`, within the caller's open
        transaction (it commits or rolls back with it)."""
        moved = (
            sa.update(scheduler_workload)
            .where(
                scheduler_workload.c.allocation_id == allocation_id,
                scheduler_workload.c.state.in_(sources(transition)),
            )
            .values(state=target(transition), reason=reason, updated_at=now)
            .returning(scheduler_workload.c.allocation_id)
        )
        if connection is not None:
            return (await connection.execute(moved)).first() is not None
        async with self.engine.begin() as own:
            return (await own.execute(moved)).first() is not None

    async def pending(self) -> list[StoredWorkload]:
        """Pending workloads, highest priority first, then the oldest."""
        table = scheduler_workload.c
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                sa.select(scheduler_workload)
                .where(table.state == "pending")
                .order_by(table.priority.desc(), table.qos_rank.desc(), table.submitted_at)
            )
            return [_stored(row) for row in rows]

    async def live_by_name(self, namespace: str, name: str) -> StoredWorkload | None:
        """The pending or placed workload named `namespace/name`, if any (the newest)."""
        table = scheduler_workload.c
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    sa.select(scheduler_workload)
                    .where(table.namespace == namespace, table.name == name, table.state.in_(LIVE_STATES))
                    .order_by(table.submitted_at.desc())
                    .limit(1)
                )
            ).first()
            return None if row is None else _stored(row)

    async def gang_members(self, group_key: str) -> list[StoredWorkload]:
        """The live (pending or placed) workloads of the gang `group_key`, the oldest first."""
        table = scheduler_workload.c
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                sa.select(scheduler_workload)
                .where(
                    table.state.in_(LIVE_STATES),
                    table.submission["gang"]["group_key"].astext == group_key,
                )
                .order_by(table.submitted_at, table.allocation_id)
            )
            return [_stored(row) for row in rows]

    async def by_ids(self, allocation_ids: list[UUID]) -> dict[UUID, StoredWorkload]:
        if not allocation_ids:
            return {}
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                sa.select(scheduler_workload).where(scheduler_workload.c.allocation_id.in_(allocation_ids))
            )
            return {row.allocation_id: _stored(row) for row in rows}


async def _insert_many(
    connection: AsyncConnection, submissions: dict[UUID, Submission], now: datetime
) -> dict[UUID, StoredWorkload]:
    rows = [
        {
            "allocation_id": str(allocation_id),
            "namespace": submission.workload.namespace,
            "name": submission.workload.name,
            "uid": submission.workload.uid,
            "submission": submission.model_dump(mode="json"),
            "priority": submission.priority,
            "qos_rank": QOS_RANK[submission.request.qos],
        }
        for allocation_id, submission in submissions.items()
    ]
    inserted = await connection.execute(
        _INSERT_MANY, {"rows": json.dumps(rows), "now": now, "initial": INITIAL_STATE}
    )
    found = {
        allocation_id: StoredWorkload(allocation_id, submissions[allocation_id], INITIAL_STATE, None, now)
        for (allocation_id,) in inserted
    }
    missing = [allocation_id for allocation_id in submissions if allocation_id not in found]
    if missing:
        existing = await connection.execute(
            sa.select(scheduler_workload).where(scheduler_workload.c.allocation_id.in_(missing))
        )
        found.update({row.allocation_id: _stored(row) for row in existing})
    return found
