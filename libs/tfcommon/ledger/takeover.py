"""`enabled-replicas` counting in the ledger: at most N taken-over pods per workload, never more.

A claim inserts one `takeover_slot` row under a per-workload advisory lock, only while the workload
holds fewer than N rows, so concurrent admissions (any number of webhook replicas) never exceed N.
Releasing deletes the row; the count is the number of rows, so it cannot leak or drift. The table
comes from Alembic revisions `0002_takeover_slots` and `0010_takeover_slot_pod_uid` (the uid of the
pod holding a slot, written by the scheduler when it first sees the pod). A claim may also free slots
the caller found stale (`tfwebhook.core.takeover`), in the same transaction. `TakeoverGate` adds the
hot-path cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

metadata = sa.MetaData()
takeover_slot = sa.Table(
    "takeover_slot",
    metadata,
    sa.Column("slot_id", sa.Text(), primary_key=True),
    sa.Column("workload_key", sa.Text(), nullable=False, index=True),
    sa.Column("claimed_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
    sa.Column("pod_uid", sa.Text(), nullable=True),
)


@dataclass(frozen=True)
class HeldSlot:
    """One held slot of a workload: `pod_uid` once the scheduler has seen its pod (None before), and
    how many seconds ago it was claimed, by the database's clock."""

    slot_id: str
    pod_uid: str | None
    claimed_age_s: float


_LOCK_WORKLOAD = sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 7466))")


async def _held(connection: AsyncConnection, workload_key: str) -> int:
    count = await connection.scalar(
        sa.select(sa.func.count())
        .select_from(takeover_slot)
        .where(takeover_slot.c.workload_key == workload_key)
    )
    return int(count or 0)


class TakeoverLedger:
    """The takeover slots on Postgres. Safe to call concurrently from any number of processes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def claim(
        self, slot_id: str, workload_key: str, limit: int, *, stale: Collection[str] = ()
    ) -> bool:
        """Take slot `slot_id` of `workload_key` if fewer than `limit` are held; True when held.

        Idempotent: claiming a slot id that is already held (a retried or reinvoked admission) is
        granted again without counting twice. The workload's slots named in `stale` (whose pods are
        gone or terminating) are released first, in the same transaction.
        """
        async with self.engine.begin() as connection:
            await connection.execute(_LOCK_WORKLOAD, {"key": workload_key})
            if stale:
                await connection.execute(
                    takeover_slot.delete().where(
                        takeover_slot.c.workload_key == workload_key,
                        takeover_slot.c.slot_id.in_(list(stale)),
                        takeover_slot.c.slot_id != slot_id,
                    )
                )
            existing = await connection.scalar(
                sa.select(takeover_slot.c.workload_key).where(takeover_slot.c.slot_id == slot_id)
            )
            if existing is not None:
                return bool(existing == workload_key)
            if await _held(connection, workload_key) >= limit:
                return False
            await connection.execute(
                takeover_slot.insert().values(slot_id=slot_id, workload_key=workload_key)
            )
            return True

    async def has_room(self, workload_key: str, limit: int, slot_id: str | None = None) -> bool:
        """Whether a claim would be granted now; writes nothing (dry runs)."""
        async with self.engine.connect() as connection:
            if slot_id is not None:
                existing = await connection.scalar(
                    sa.select(takeover_slot.c.workload_key).where(takeover_slot.c.slot_id == slot_id)
                )
                if existing is not None:
                    return bool(existing == workload_key)
            return await _held(connection, workload_key) < limit

    async def release(self, slot_id: str) -> bool:
        """Free the slot of a pod that is gone; True the first time, False when it was not held."""
        async with self.engine.begin() as connection:
            result = await connection.execute(
                takeover_slot.delete().where(takeover_slot.c.slot_id == slot_id)
            )
            return bool(result.rowcount)

    async def sweep(self, live_slot_ids: Collection[str], claimed_before: datetime) -> int:
        """Release every slot claimed before `claimed_before` whose pod is not in `live_slot_ids`.

        For a full resync (e.g. after a watch restart): frees slots of pods that were admitted but
        never created, or deleted while nobody watched. The grace period protects pods still being
        created. Returns how many slots were released.
        """
        async with self.engine.begin() as connection:
            statement = takeover_slot.delete().where(takeover_slot.c.claimed_at < claimed_before)
            if live_slot_ids:
                statement = statement.where(takeover_slot.c.slot_id.not_in(list(live_slot_ids)))
            result = await connection.execute(statement)
            return int(result.rowcount)

    async def held(self, workload_key: str) -> int:
        async with self.engine.connect() as connection:
            return await _held(connection, workload_key)

    async def held_slots(self, workload_key: str) -> list[HeldSlot]:
        """Every slot `workload_key` holds now, with its pod's uid (if seen) and its age."""
        age = sa.func.extract("epoch", sa.func.now() - takeover_slot.c.claimed_at)
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                sa.select(takeover_slot.c.slot_id, takeover_slot.c.pod_uid, age)
                .where(takeover_slot.c.workload_key == workload_key)
                .order_by(takeover_slot.c.claimed_at)
            )
            return [HeldSlot(slot_id, pod_uid, float(seconds)) for slot_id, pod_uid, seconds in rows]

    async def record_pod(self, slot_id: str, pod_uid: str) -> bool:
        """Note that the pod `pod_uid` holding `slot_id` exists; True when this is the first note."""
        async with self.engine.begin() as connection:
            result = await connection.execute(
                takeover_slot.update()
                .where(takeover_slot.c.slot_id == slot_id, takeover_slot.c.pod_uid.is_(None))
                .values(pod_uid=pod_uid)
            )
            return bool(result.rowcount)


async def release_takeover(engine: AsyncEngine, slot_id: str) -> bool:
    """Release the `enabled-replicas` slot named by a deleted pod's `tensor-fusion.ai/takeover-slot`."""
    return await TakeoverLedger(engine).release(slot_id)


class TakeoverGate:
    """`TakeoverLedger` with a hot-path cache that can only say "full", so it never admits past N.

    A workload found full is answered from memory for `full_ttl_s`; a slot released meanwhile is
    seen when the entry expires (or at once when released through this gate). Grants always go to
    the database, because only the atomic insert can promise the limit.
    """

    def __init__(
        self,
        ledger: TakeoverLedger,
        *,
        full_ttl_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.full_ttl_s = full_ttl_s
        self._clock = clock
        self._full_until: dict[tuple[str, int], float] = {}

    def _known_full(self, workload_key: str, limit: int) -> bool:
        until = self._full_until.get((workload_key, limit))
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._full_until[(workload_key, limit)]
        return False

    async def claim(self, slot_id: str, workload_key: str, limit: int) -> bool:
        if limit <= 0 or self._known_full(workload_key, limit):
            return False
        granted = await self.ledger.claim(slot_id, workload_key, limit)
        if not granted and self.full_ttl_s > 0:
            self._full_until[(workload_key, limit)] = self._clock() + self.full_ttl_s
        return granted

    async def has_room(self, workload_key: str, limit: int, slot_id: str | None = None) -> bool:
        if limit <= 0 or self._known_full(workload_key, limit):
            return False
        return await self.ledger.has_room(workload_key, limit, slot_id)

    async def release(self, slot_id: str) -> bool:
        released = await self.ledger.release(slot_id)
        if released:
            self._full_until.clear()
        return released
