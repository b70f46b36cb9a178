"""Campaign state in Postgres (revision 0004): anchors, campaigns, moves, and the per-pool lock.

Only the defrag planner writes these tables. `pool_lock` holds a session advisory lock for the whole
campaign, so two planner replicas never run one pool at once (a crashed holder's lock goes with its
connection); the partial unique index on running campaigns backs it up. SQL only; no decisions.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

metadata = sa.MetaData()
defrag_pool_state = sa.Table(
    "defrag_pool_state",
    metadata,
    sa.Column("pool_name", sa.Text(), primary_key=True),
    sa.Column("last_defrag_time", sa.DateTime(timezone=True), nullable=True),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
)
defrag_campaign = sa.Table(
    "defrag_campaign",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("pool_name", sa.Text(), nullable=False),
    sa.Column("trigger", sa.Text(), nullable=False),
    sa.Column("state", sa.Text(), nullable=False),
    sa.Column("window_start", sa.DateTime(timezone=True), nullable=True),
    sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("outcome", sa.Text(), nullable=True),
    sa.Column("current_node", sa.Text(), nullable=True),
    sa.Column("drained_nodes", JSONB(), nullable=False),
    sa.Column("failed_nodes", JSONB(), nullable=False),
    sa.Column("skipped_nodes", JSONB(), nullable=False),
    sa.Column("pods_evicted", sa.Integer(), nullable=False),
    sa.Column("stranded_pods", sa.Integer(), nullable=False),
)
defrag_move = sa.Table(
    "defrag_move",
    metadata,
    sa.Column("id", sa.BigInteger(), sa.Identity(always=True), primary_key=True),
    sa.Column("campaign_id", sa.Uuid(), nullable=False),
    sa.Column("node", sa.Text(), nullable=False),
    sa.Column("pod_namespace", sa.Text(), nullable=False),
    sa.Column("pod_name", sa.Text(), nullable=False),
    sa.Column("pod_uid", sa.Text(), nullable=False),
    sa.Column("owner_uid", sa.Text(), nullable=True),
    sa.Column("siblings_before", JSONB(), nullable=False),
    sa.Column("target_node", sa.Text(), nullable=False),
    sa.Column("state", sa.Text(), nullable=False),
    sa.Column("hold_allocation_id", sa.Uuid(), nullable=True),
    sa.Column("hold_expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("hold_released", sa.Boolean(), nullable=False),
    sa.Column("evicted_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("placed_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("placed_on", sa.Text(), nullable=True),
    sa.Column("reason", sa.Text(), nullable=True),
)


class CampaignBusyError(RuntimeError):
    """Another planner (or task) is running a campaign for this pool right now."""


@dataclass(frozen=True)
class CampaignRecord:
    """A campaign's stored state: enough to resume it after a restart."""

    id: UUID
    pool: str
    trigger: str
    state: str
    window_start: datetime | None
    deadline_at: datetime | None
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    current_node: str | None
    drained_nodes: tuple[str, ...]
    failed_nodes: Mapping[str, str]
    skipped_nodes: Mapping[str, str]
    pods_evicted: int
    stranded_pods: int


@dataclass(frozen=True)
class MoveRecord:
    """One eviction of a campaign and what became of its replacement and capacity hold."""

    campaign_id: UUID
    node: str
    pod_namespace: str
    pod_name: str
    pod_uid: str
    owner_uid: str | None
    siblings_before: tuple[str, ...]
    target_node: str
    state: str
    hold_allocation_id: UUID | None
    hold_expires_at: datetime | None
    hold_released: bool
    evicted_at: datetime | None
    placed_on: str | None


def _campaign(row: Any) -> CampaignRecord:
    return CampaignRecord(
        id=row.id,
        pool=row.pool_name,
        trigger=row.trigger,
        state=row.state,
        window_start=row.window_start,
        deadline_at=row.deadline_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        outcome=row.outcome,
        current_node=row.current_node,
        drained_nodes=tuple(row.drained_nodes),
        failed_nodes=dict(row.failed_nodes),
        skipped_nodes=dict(row.skipped_nodes),
        pods_evicted=row.pods_evicted,
        stranded_pods=row.stranded_pods,
    )


def _move(row: Any) -> MoveRecord:
    return MoveRecord(
        campaign_id=row.campaign_id,
        node=row.node,
        pod_namespace=row.pod_namespace,
        pod_name=row.pod_name,
        pod_uid=row.pod_uid,
        owner_uid=row.owner_uid,
        siblings_before=tuple(row.siblings_before),
        target_node=row.target_node,
        state=row.state,
        hold_allocation_id=row.hold_allocation_id,
        hold_expires_at=row.hold_expires_at,
        hold_released=row.hold_released,
        evicted_at=row.evicted_at,
        placed_on=row.placed_on,
    )


async def _set_move_state(
    connection: AsyncConnection, campaign_id: UUID, pod_uid: str, state: str, values: dict[str, Any]
) -> None:
    await connection.execute(
        sa.update(defrag_move)
        .where(defrag_move.c.campaign_id == campaign_id, defrag_move.c.pod_uid == pod_uid)
        .values(**values)
    )
    if state == "evicted":
        await connection.execute(
            sa.update(defrag_campaign)
            .where(defrag_campaign.c.id == campaign_id)
            .values(pods_evicted=defrag_campaign.c.pods_evicted + 1)
        )


class CampaignStore:
    """Campaign state on the ledger's database. Safe to use from several planner processes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    @contextlib.asynccontextmanager
    async def pool_lock(self, pool: str) -> AsyncIterator[None]:
        """Hold the pool's campaign lock, or raise `CampaignBusyError` at once if someone else has it."""
        async with self.engine.connect() as connection:
            key = sa.func.hashtextextended(f"tfdefrag-campaign:{pool}", 0)
            taken = (await connection.execute(sa.select(sa.func.pg_try_advisory_lock(key)))).scalar_one()
            await connection.commit()
            if not taken:
                raise CampaignBusyError(f"a defrag campaign for pool {pool} is already running")
            try:
                yield
            finally:
                await connection.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                await connection.commit()

    async def last_defrag_time(self, pool: str) -> datetime | None:
        async with self.engine.connect() as connection:
            query = sa.select(defrag_pool_state.c.last_defrag_time).where(
                defrag_pool_state.c.pool_name == pool
            )
            return (await connection.execute(query)).scalar_one_or_none()

    async def set_last_defrag_time(self, pool: str, moment: datetime, now: datetime) -> None:
        statement = insert(defrag_pool_state).values(pool_name=pool, last_defrag_time=moment, updated_at=now)
        statement = statement.on_conflict_do_update(
            index_elements=["pool_name"],
            set_={
                "last_defrag_time": sa.func.greatest(defrag_pool_state.c.last_defrag_time, moment),
                "updated_at": now,
            },
        )
        async with self.engine.begin() as connection:
            await connection.execute(statement)

    async def running_campaign(self, pool: str) -> CampaignRecord | None:
        query = sa.select(defrag_campaign).where(
            defrag_campaign.c.pool_name == pool, defrag_campaign.c.state == "running"
        )
        async with self.engine.connect() as connection:
            row = (await connection.execute(query)).first()
        return None if row is None else _campaign(row)

    async def get_campaign(self, campaign_id: UUID) -> CampaignRecord | None:
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    sa.select(defrag_campaign).where(defrag_campaign.c.id == campaign_id)
                )
            ).first()
        return None if row is None else _campaign(row)

    async def list_campaigns(self, pool: str) -> list[CampaignRecord]:
        query = (
            sa.select(defrag_campaign)
            .where(defrag_campaign.c.pool_name == pool)
            .order_by(defrag_campaign.c.started_at)
        )
        async with self.engine.connect() as connection:
            return [_campaign(row) for row in await connection.execute(query)]

    async def open_campaign(
        self,
        campaign_id: UUID,
        pool: str,
        trigger: str,
        *,
        window_start: datetime | None,
        deadline_at: datetime | None,
        now: datetime,
    ) -> CampaignRecord:
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.insert(defrag_campaign).values(
                    id=campaign_id,
                    pool_name=pool,
                    trigger=trigger,
                    state="running",
                    window_start=window_start,
                    deadline_at=deadline_at,
                    started_at=now,
                    drained_nodes=[],
                    failed_nodes={},
                    skipped_nodes={},
                    pods_evicted=0,
                    stranded_pods=0,
                )
            )
        record = await self.get_campaign(campaign_id)
        assert record is not None
        return record

    async def _update(self, campaign_id: UUID, **values: Any) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.update(defrag_campaign).where(defrag_campaign.c.id == campaign_id).values(**values)
            )

    async def set_current_node(self, campaign_id: UUID, node: str | None) -> None:
        await self._update(campaign_id, current_node=node)

    async def record_skips(self, campaign_id: UUID, skipped: Mapping[str, str]) -> None:
        await self._update(
            campaign_id, skipped_nodes=defrag_campaign.c.skipped_nodes.op("||")(sa.cast(dict(skipped), JSONB))
        )

    async def node_drained(self, campaign_id: UUID, node: str) -> None:
        await self._update(
            campaign_id,
            current_node=None,
            drained_nodes=defrag_campaign.c.drained_nodes.op("||")(sa.cast([node], JSONB)),
        )

    async def node_failed(self, campaign_id: UUID, node: str, reason: str, *, stranded: int = 0) -> None:
        await self._update(
            campaign_id,
            current_node=None,
            failed_nodes=defrag_campaign.c.failed_nodes.op("||")(sa.cast({node: reason}, JSONB)),
            stranded_pods=defrag_campaign.c.stranded_pods + stranded,
        )

    async def finish(self, campaign_id: UUID, outcome: str, now: datetime) -> None:
        await self._update(campaign_id, state="finished", outcome=outcome, finished_at=now, current_node=None)

    async def add_move(
        self,
        campaign_id: UUID,
        *,
        node: str,
        pod_namespace: str,
        pod_name: str,
        pod_uid: str,
        owner_uid: str | None,
        siblings_before: Sequence[str],
        target_node: str,
        hold_allocation_id: UUID | None,
        hold_expires_at: datetime | None,
    ) -> None:
        statement = insert(defrag_move).values(
            campaign_id=campaign_id,
            node=node,
            pod_namespace=pod_namespace,
            pod_name=pod_name,
            pod_uid=pod_uid,
            owner_uid=owner_uid,
            siblings_before=list(siblings_before),
            target_node=target_node,
            state="evicting",
            hold_allocation_id=hold_allocation_id,
            hold_expires_at=hold_expires_at,
            hold_released=hold_allocation_id is None,
        )
        async with self.engine.begin() as connection:
            await connection.execute(
                statement.on_conflict_do_nothing(index_elements=["campaign_id", "pod_uid"])
            )

    async def set_move_state(
        self,
        campaign_id: UUID,
        pod_uid: str,
        state: str,
        now: datetime,
        *,
        placed_on: str | None = None,
        reason: str | None = None,
        connection: AsyncConnection | None = None,
    ) -> None:
        """Move the pod's move to `state` (an eviction also counts in the campaign). With `connection`,
        within the caller's open transaction (it commits or rolls back with it)."""
        values: dict[str, Any] = {"state": state}
        if state == "evicted":
            values["evicted_at"] = now
        if state == "placed":
            values["placed_at"] = now
            values["placed_on"] = placed_on
        if reason is not None:
            values["reason"] = reason
        if connection is not None:
            await _set_move_state(connection, campaign_id, pod_uid, state, values)
            return
        async with self.engine.begin() as own:
            await _set_move_state(own, campaign_id, pod_uid, state, values)

    async def hold_released(self, hold_allocation_id: UUID) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.update(defrag_move)
                .where(defrag_move.c.hold_allocation_id == hold_allocation_id)
                .values(hold_released=True)
            )

    async def moves(self, campaign_id: UUID) -> list[MoveRecord]:
        query = (
            sa.select(defrag_move).where(defrag_move.c.campaign_id == campaign_id).order_by(defrag_move.c.id)
        )
        async with self.engine.connect() as connection:
            return [_move(row) for row in await connection.execute(query)]

    async def unreleased_holds(self) -> list[MoveRecord]:
        query = sa.select(defrag_move).where(
            defrag_move.c.hold_released.is_(False), defrag_move.c.hold_allocation_id.is_not(None)
        )
        async with self.engine.connect() as connection:
            return [_move(row) for row in await connection.execute(query)]
