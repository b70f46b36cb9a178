"""`SqlLedger`: the Postgres ledger (SQLAlchemy 2 async, psycopg 3) behind reserve, release and reads.

Capacity is taken with a conditional `UPDATE gpu ... WHERE used + x <= capacity RETURNING`, so racing
writers can never over-allocate (the `CHECK` constraints are the backstop). Every change writes its
history rows and its outbox event in the same transaction; the outbox relay publishes them.
This module does not publish to NATS and does not decide placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID

import psycopg
import sqlalchemy as sa
from sqlalchemy import Engine, Executable, Row, and_, create_engine, select, text, update
from sqlalchemy.dialects.postgresql import JSONB, Insert, insert
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from tfcommon.events import (
    AllocationCreated,
    AllocationReleased,
    Event,
    GpuShare,
    WorkloadRef,
    derived_event_id,
)
from tfcommon.ledger import tables
from tfcommon.ledger.records import (
    DEFRAG_SOURCE_MARKER,
    OPERATOR_NODE_LABELS,
    PLANNER_MARKER_PREFIXES,
    AllocationRecord,
    DefragCampaignSummary,
    GpuRecord,
    GpuSpec,
    HeldShare,
    HistoryKind,
    HistoryRecord,
    HoldFor,
    HoldRecord,
    InsufficientCapacity,
    LedgerInputError,
    NamespaceShare,
    NodeRecord,
    NodeSpec,
    NodeState,
    PendingSubmission,
    PlacementFacts,
    PoolRecord,
    QuotaHeld,
    ReservationRejected,
    ReservationRequest,
    ReservationResult,
    Reserved,
    ShareRecord,
    ShareRequest,
)
from tfcommon.ledger.urls import ledger_url
from tfcommon.service_metrics import record_ledger_retry

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

DEADLOCK_ATTEMPTS = 5
FACTS_FETCHED_AT_ONCE = 2_000
"""Rows `placement_facts` fetches at a time: converting 80,000 GPU rows in one call holds the
interpreter for tens of milliseconds, in which the event loop's thread cannot run."""
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure


def utc_now() -> datetime:
    return datetime.now(UTC)


class SqlLedger:
    """The ledger on Postgres. Build with `create()`; `close()` releases the connection pool.

    All methods are safe to call concurrently, from any number of processes.
    """

    def __init__(self, engine: AsyncEngine, *, clock: Clock = utc_now) -> None:
        self.engine = engine
        self._clock = clock
        self._reader: Engine | None = None
        self._reader_lock = threading.Lock()

    @classmethod
    def create(cls, database_url: str, *, pool_size: int = 10, clock: Clock = utc_now) -> SqlLedger:
        """A ledger on `database_url` (`postgresql+psycopg://...`); connects lazily, on first use."""
        engine = create_async_engine(
            ledger_url(database_url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
        )
        return cls(engine, clock=clock)

    async def close(self) -> None:
        with self._reader_lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            await asyncio.to_thread(reader.dispose)
        await self.engine.dispose()

    # ------------------------------------------------------------------------------ registration

    async def upsert_pool(self, name: str) -> None:
        """Create the pool if it is new; registering it again changes nothing."""
        if not name or name != name.strip():
            raise LedgerInputError(f"pool.name: {name!r} must be a non-empty name without surrounding spaces")
        statement = insert(tables.pool).values(name=name).on_conflict_do_nothing(index_elements=["name"])
        async with self.engine.begin() as connection:
            await connection.execute(statement)

    async def upsert_node(self, node: NodeSpec) -> None:
        """Create or update the node (and its pool). `cordoned` is left as it is on an update, and so
        are the defrag planner's markers in `labels` and `annotations` (`PLANNER_MARKER_PREFIXES`) and
        the operator's labels (`OPERATOR_NODE_LABELS`): an agent that registers again must not erase a
        drain in progress or a `do-not-disrupt`."""
        now = self._clock()
        values = {
            "name": node.name,
            "pool_name": node.pool,
            "labels": dict(node.labels),
            "taints": [dict(taint) for taint in node.taints],
            "annotations": dict(node.annotations),
            "cpu_allocatable_milli": node.cpu_allocatable_milli,
            "memory_allocatable_bytes": node.memory_allocatable_bytes,
            "ready": node.ready,
            "updated_at": now,
        }
        statement = insert(tables.node).values(**values)
        updates: dict[str, Any] = {key: statement.excluded[key] for key in values if key != "name"}
        for column in ("labels", "annotations"):
            updates[column] = statement.excluded[column].op("||")(_planner_markers(tables.node.c[column]))
        statement = statement.on_conflict_do_update(index_elements=["name"], set_=updates)
        async with self.engine.begin() as connection:
            await connection.execute(
                insert(tables.pool).values(name=node.pool).on_conflict_do_nothing(index_elements=["name"])
            )
            await connection.execute(statement)

    async def upsert_gpu(self, gpu: GpuSpec) -> None:
        """Create or update the GPU's inventory (node, index, model, capacity, phase); `used_*` is kept.

        Raises `LedgerInputError` when the node is unknown or the new capacity is below what is reserved.
        """
        now = self._clock()
        values = {
            "uuid": gpu.uuid,
            "node_name": gpu.node,
            "index": gpu.index,
            "model": gpu.model,
            "vendor": gpu.vendor,
            "capacity_tflops_milli": gpu.capacity_tflops_milli,
            "capacity_vram_bytes": gpu.capacity_vram_bytes,
            "phase": gpu.phase,
            "numa_node": gpu.numa_node,
            "updated_at": now,
        }
        statement = insert(tables.gpu).values(**values)
        changed = {key: statement.excluded[key] for key in values if key != "uuid"}
        statement = statement.on_conflict_do_update(
            index_elements=["uuid"], set_={**changed, "version": tables.gpu.c.version + 1}
        )
        try:
            async with self.engine.begin() as connection:
                await connection.execute(statement)
        except IntegrityError as error:
            constraint = _constraint_name(error)
            if constraint == "fk_gpu_node_name_node":
                raise LedgerInputError(
                    f"gpu.node: node {gpu.node!r} is not registered; upsert the node before its GPUs"
                ) from error
            if constraint in ("ck_gpu_used_tflops_within_capacity", "ck_gpu_used_vram_within_capacity"):
                raise LedgerInputError(
                    f"gpu.capacity: GPU {gpu.uuid} would have less capacity than is reserved on it; "
                    "release its allocations (or mark it Unknown) before shrinking it"
                ) from error
            if constraint == "uq_gpu_node_name_index":
                raise LedgerInputError(
                    f"gpu.index: node {gpu.node!r} already has another GPU at index {gpu.index}"
                ) from error
            raise

    async def set_gpu_phase(self, gpu_uuid: str, phase: str) -> bool:
        """Set the GPU's phase (e.g. `Unknown` when it disappears); False when the GPU is not known."""
        statement = (
            update(tables.gpu)
            .where(tables.gpu.c.uuid == gpu_uuid)
            .values(phase=phase, version=tables.gpu.c.version + 1, updated_at=self._clock())
            .returning(tables.gpu.c.uuid)
        )
        async with self.engine.begin() as connection:
            return (await connection.execute(statement)).first() is not None

    async def record_heartbeat(self, node_name: str, *, ready: bool = True) -> bool:
        """Stamp the node's `last_heartbeat_at` with now; False when the node is not registered."""
        now = self._clock()
        statement = (
            update(tables.node)
            .where(tables.node.c.name == node_name)
            .values(last_heartbeat_at=now, ready=ready, updated_at=now)
            .returning(tables.node.c.name)
        )
        async with self.engine.begin() as connection:
            return (await connection.execute(statement)).first() is not None

    async def set_node_label(self, node_name: str, key: str, value: str | None) -> bool:
        """Set the node's label `key` to `value`, or remove it when `value` is None; False when the node is
        not registered."""
        labels: Any = tables.node.c.labels
        changed = labels.op("-")(key) if value is None else labels.op("||")(sa.literal({key: value}, JSONB))
        return await self._update_node(node_name, labels=changed)

    async def set_node_cordoned(self, node_name: str, cordoned: bool) -> bool:
        """Cordon or uncordon a node (no new placements on it); False when the node is not registered."""
        return await self._update_node(node_name, cordoned=cordoned)

    async def _update_node(self, node_name: str, **values: Any) -> bool:
        statement = (
            update(tables.node)
            .where(tables.node.c.name == node_name)
            .values(**values, updated_at=self._clock())
            .returning(tables.node.c.name)
        )
        async with self.engine.begin() as connection:
            return (await connection.execute(statement)).first() is not None

    # ------------------------------------------------------------------------------------ reads

    async def list_pools(self) -> list[PoolRecord]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(select(tables.pool).order_by(tables.pool.c.name))
            return [PoolRecord(name=row.name, created_at=row.created_at) for row in rows]

    async def list_nodes(self) -> list[NodeRecord]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(select(tables.node).order_by(tables.node.c.name))
            return [_node_record(row) for row in rows]

    async def list_gpus(self) -> list[GpuRecord]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                select(tables.gpu).order_by(tables.gpu.c.node_name, tables.gpu.c.index)
            )
            return [_gpu_record(row) for row in rows]

    async def placement_facts(self) -> PlacementFacts:
        """Every node, GPU and active allocation in one consistent snapshot (a repeatable-read
        transaction), read and decoded in a worker thread over a connection of its own: at 10,000
        nodes that is 90,000 rows and about 2 s of CPU, which would otherwise stall the event loop
        (and every submission waiting on it) in one stretch."""
        return await asyncio.to_thread(self._read_placement_facts)

    def _read_placement_facts(self) -> PlacementFacts:
        with self._blocking_reader().connect() as connection:
            connection = connection.execution_options(
                isolation_level="REPEATABLE READ", stream_results=True, yield_per=FACTS_FETCHED_AT_ONCE
            )
            with connection.begin():
                nodes = [
                    _node_record(row)
                    for row in connection.execute(select(tables.node).order_by(tables.node.c.name))
                ]
                gpus = [
                    _gpu_record(row)
                    for row in connection.execute(
                        select(tables.gpu).order_by(tables.gpu.c.node_name, tables.gpu.c.index)
                    )
                ]
                allocations = _allocation_records(
                    connection.execute(
                        select(tables.allocation)
                        .where(tables.allocation.c.state != "released")
                        .order_by(tables.allocation.c.created_at, tables.allocation.c.id)
                    ).all()
                )
        return PlacementFacts(nodes=nodes, gpus=gpus, allocations=allocations)

    def _blocking_reader(self) -> Engine:
        """A synchronous engine on the same database, one pooled connection, for worker threads."""
        with self._reader_lock:
            if self._reader is None:
                self._reader = create_engine(self.engine.url, pool_size=1, max_overflow=1, pool_pre_ping=True)
            return self._reader

    async def get_gpu(self, gpu_uuid: str) -> GpuRecord | None:
        async with self.engine.connect() as connection:
            row = (await connection.execute(select(tables.gpu).where(tables.gpu.c.uuid == gpu_uuid))).first()
            return None if row is None else _gpu_record(row)

    async def active_allocations(self) -> list[AllocationRecord]:
        """Every allocation not yet released (reserved or committed), oldest first."""
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                select(tables.allocation)
                .where(tables.allocation.c.state != "released")
                .order_by(tables.allocation.c.created_at, tables.allocation.c.id)
            )
            return _allocation_records(rows.all())

    async def get_allocation(self, allocation_id: UUID) -> AllocationRecord | None:
        async with self.engine.connect() as connection:
            return await _load_allocation(connection, allocation_id)

    async def get_allocations(self, allocation_ids: Sequence[UUID]) -> dict[UUID, AllocationRecord]:
        """The allocations (in any state) among `allocation_ids`, by id, read in one query."""
        if not allocation_ids:
            return {}
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                select(tables.allocation).where(tables.allocation.c.allocation_id.in_(allocation_ids))
            )
            return {record.allocation_id: record for record in _allocation_records(rows.all())}

    async def history(self, allocation_id: UUID | None = None) -> list[HistoryRecord]:
        """History entries in the order they were written, for one allocation or all of them."""
        query = select(tables.allocation_history).order_by(tables.allocation_history.c.id)
        if allocation_id is not None:
            query = query.where(tables.allocation_history.c.allocation_id == allocation_id)
        async with self.engine.connect() as connection:
            return [
                HistoryRecord(
                    allocation_id=row.allocation_id,
                    gpu_uuid=row.gpu_uuid,
                    kind=row.kind,
                    occurred_at=row.occurred_at,
                    cause=row.cause,
                    tflops_milli=row.tflops_milli,
                    vram_bytes=row.vram_bytes,
                    reason=row.reason,
                )
                for row in await connection.execute(query)
            ]

    # ------------------------------------------------------- billing, dashboard and defrag planner

    async def held_shares(self, start: datetime, end: datetime) -> list[HeldShare]:
        """Every GPU share that held capacity at some moment in [start, end), by the moment it opened
        (then by allocation and GPU): each share from its `opened` history entry to its first `released`
        or `evicted` one (none yet: still held)."""
        allocation = tables.allocation.c
        history = tables.allocation_history.c
        opened_at = sa.func.min(history.occurred_at).filter(history.kind == "opened")
        closed_at = sa.func.min(history.occurred_at).filter(history.kind.in_(("released", "evicted")))
        query = (
            select(
                allocation.allocation_id,
                allocation.gpu_uuid,
                allocation.workload_namespace,
                allocation.workload_name,
                allocation.workload_uid,
                allocation.workload_owner,
                allocation.qos,
                allocation.pool_name,
                tables.gpu.c.model,
                allocation.request_tflops_milli,
                allocation.request_vram_bytes,
                allocation.limit_tflops_milli,
                allocation.limit_vram_bytes,
                allocation.eviction_protection_s,
                opened_at.label("opened_at"),
                closed_at.label("closed_at"),
            )
            .select_from(
                tables.allocation.join(
                    tables.allocation_history,
                    and_(
                        history.allocation_id == allocation.allocation_id,
                        history.gpu_uuid == allocation.gpu_uuid,
                    ),
                ).join(tables.gpu, tables.gpu.c.uuid == allocation.gpu_uuid)
            )
            .group_by(allocation.id, tables.gpu.c.model)
            .having(and_(opened_at < end, sa.or_(closed_at.is_(None), closed_at > start)))
            .order_by(opened_at, allocation.id)
        )
        async with self.engine.connect() as connection:
            rows = (await connection.execute(query)).all()
        return [
            HeldShare(
                allocation_id=row.allocation_id,
                gpu_uuid=row.gpu_uuid,
                workload=WorkloadRef(
                    namespace=row.workload_namespace,
                    name=row.workload_name,
                    uid=row.workload_uid,
                    workload=row.workload_owner,
                ),
                qos=row.qos,
                pool=row.pool_name,
                gpu_model=row.model,
                request_tflops_milli=row.request_tflops_milli,
                request_vram_bytes=row.request_vram_bytes,
                limit_tflops_milli=row.limit_tflops_milli,
                limit_vram_bytes=row.limit_vram_bytes,
                eviction_protection_s=row.eviction_protection_s,
                start=row.opened_at,
                end=row.closed_at,
            )
            for row in rows
        ]

    async def latest_defrag_campaigns(self) -> list[DefragCampaignSummary]:
        """Each pool's running defrag campaign, if any, and its last finished one, by pool name (the
        planner's `defrag_campaign` table, read-only)."""
        query = text(
            f"""
            SELECT DISTINCT ON (pool_name, state) {_CAMPAIGN_FIELDS}
            FROM defrag_campaign
            ORDER BY pool_name, state, started_at DESC
            """
        )
        async with self.engine.connect() as connection:
            return [_campaign_summary(row) for row in await connection.execute(query)]

    async def defrag_campaigns_since(self, start: datetime, *, limit: int) -> list[DefragCampaignSummary]:
        """The defrag campaigns running now or finished at or after `start`, the `limit` that started
        last, oldest first."""
        query = text(
            f"""
            SELECT {_CAMPAIGN_FIELDS}
            FROM defrag_campaign
            WHERE state = 'running' OR finished_at >= :start
            ORDER BY started_at DESC, pool_name
            LIMIT :limit
            """
        )
        async with self.engine.connect() as connection:
            rows = (await connection.execute(query, {"start": start, "limit": limit})).all()
        return [_campaign_summary(row) for row in reversed(rows)]

    async def pending_workloads(self, limit: int) -> tuple[list[PendingSubmission], int]:
        """The first `limit` workloads the scheduler keeps pending, in its own order (highest priority,
        then QoS, then the oldest), and how many are pending in all (the scheduler's `scheduler_workload`
        table, read-only)."""
        query = text(
            """
            SELECT namespace, name, submission, reason, submitted_at, count(*) OVER () AS total
            FROM scheduler_workload
            WHERE state = 'pending'
            ORDER BY priority DESC, qos_rank DESC, submitted_at
            LIMIT :limit
            """
        )
        async with self.engine.connect() as connection:
            rows = (await connection.execute(query, {"limit": limit})).all()
        pending = [
            PendingSubmission(
                namespace=row.namespace,
                name=row.name,
                submission=row.submission if isinstance(row.submission, dict) else {},
                reason=row.reason,
                submitted_at=row.submitted_at,
            )
            for row in rows
        ]
        return pending, (rows[0].total if rows else 0)

    async def set_node_markers(
        self, node_name: str, labels: Mapping[str, str | None], annotations: Mapping[str, str | None]
    ) -> bool:
        """Set the node's `labels` and `annotations` given a value and remove those given None, in one
        update (the defrag planner's markers, mirrored from the cluster for the scheduler's view); False
        when the node is not registered."""
        values: dict[str, Any] = {}
        for name, changes in (("labels", labels), ("annotations", annotations)):
            merged: Any = tables.node.c[name].op("||")(
                sa.cast({key: value for key, value in changes.items() if value is not None}, JSONB)
            )
            for key in (key for key, value in changes.items() if value is None):
                merged = merged.op("-")(key)
            values[name] = merged
        return await self._update_node(node_name, **values)

    # ---------------------------------------------------------------------------------- changes

    async def reserve(self, request: ReservationRequest, *, commit: bool = False) -> ReservationResult:
        """Take the shares' capacity on every GPU, or on none, and announce `AllocationCreated`.

        Returns `Reserved` (with `replayed=True` when this `allocation_id` was already reserved: no
        capacity is taken twice and no second event is written), `InsufficientCapacity` naming the
        first GPU and resource that lacked room, or `ReservationRejected` for an unknown GPU or pool, a
        GPU on another node or one that is not Running. Never over-allocates, whatever the concurrency.
        With `commit=True` the allocation is written already bound (`committed`, with both history
        entries), saving the separate `commit()` transaction where binding cannot fail (local mode).
        """
        return (await self.reserve_many([request], commit=commit))[0]

    async def namespace_shares(self, namespaces: Sequence[str] | None = None) -> list[NamespaceShare]:
        """The shares of every allocation not yet released in `namespaces` (all when None)."""
        async with self.engine.connect() as connection:
            return await _namespace_shares(connection, namespaces)

    async def reserve_within_quota(
        self,
        request: ReservationRequest,
        check: Callable[[Sequence[NamespaceShare]], str | None],
        *,
        commit: bool = False,
    ) -> ReservationResult | QuotaHeld:
        """`reserve()` only if `check(the namespace's current shares)` returns None, in one transaction.

        The transaction first takes a lock on the namespace (a Postgres transaction-scoped advisory
        lock), so the usage `check` reads cannot change before the reservation commits: two schedulers
        placing in one namespace at once are checked one after the other and cannot overshoot its
        quota together. A release takes no lock (it only lowers usage). Returns `QuotaHeld` with the
        check's message when it refuses; nothing is written then."""
        namespace = request.workload.namespace
        for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
            try:
                async with self.engine.begin() as connection:
                    refusal = check(await _locked_namespace_shares(connection, [namespace]))
                    if refusal is not None:
                        return QuotaHeld(refusal)
                    try:
                        async with connection.begin_nested():
                            return await _reserve_one(connection, request, self._clock(), commit)
                    except _PartialReservationError:
                        return await _unreserved_result(connection, request)
                    except IntegrityError as error:
                        return _refusal_result(request, error)
            except DBAPIError as error:
                if _sqlstate(error) not in RETRYABLE_SQLSTATES or attempt == DEADLOCK_ATTEMPTS:
                    raise
                record_ledger_retry("reserve_within_quota")
        raise AssertionError("unreachable")

    async def reserve_many(
        self,
        requests: Sequence[ReservationRequest],
        *,
        commit: bool = False,
        then: Executable | None = None,
    ) -> list[ReservationResult]:
        """`reserve()` each request, in order, in one transaction: one commit for the whole batch.

        Each request is one SQL statement and all or nothing on its own, so one that does not fit
        does not undo the others. Results come back in request order. If a statement wrote part of a
        reservation (another writer reserved the same allocation id at the same moment), the batch is
        rolled back and redone with a savepoint per request; if Postgres aborts the batch to break a
        deadlock with another writer, it is retried from the start. `then`, when given, is the
        caller's own record of the batch: one statement run in the same transaction after the
        reservations (it sees them), so it commits with them or not at all, without a transaction of
        its own.
        """
        for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
            try:
                try:
                    return await self._reserve_batch(requests, commit=commit, isolated=False, then=then)
                except (_PartialReservationError, IntegrityError):
                    return await self._reserve_batch(requests, commit=commit, isolated=True, then=then)
            except DBAPIError as error:
                if _sqlstate(error) not in RETRYABLE_SQLSTATES or attempt == DEADLOCK_ATTEMPTS:
                    raise
                record_ledger_retry("reserve")
                log.info(
                    "reservation batch aborted to break a deadlock; retrying",
                    extra={"outcome": "retry", "attempt": attempt, "batch": len(requests)},
                )
        raise AssertionError("unreachable")

    async def _reserve_batch(
        self,
        requests: Sequence[ReservationRequest],
        *,
        commit: bool,
        isolated: bool,
        then: Executable | None,
    ) -> list[ReservationResult]:
        now = self._clock()
        results: list[ReservationResult] = []
        async with self.engine.begin() as connection:
            if not isolated and requests:
                results = await _reserve_pipelined(connection, requests, now, commit)
            elif isolated:
                for request in requests:
                    try:
                        async with connection.begin_nested():
                            results.append(await _reserve_one(connection, request, now, commit))
                    except _PartialReservationError:
                        results.append(await _unreserved_result(connection, request))
                    except IntegrityError as refusal:
                        results.append(_refusal_result(request, refusal))
            if then is not None:
                await connection.execute(then)
        return results

    async def commit(self, allocation_id: UUID, cause: UUID | None = None) -> bool:
        """Mark a reserved allocation as bound to its workload. Idempotent: False if it was not `reserved`."""
        now = self._clock()
        allocation = tables.allocation.c
        async with self.engine.begin() as connection:
            committed = await connection.execute(
                update(tables.allocation)
                .where(and_(allocation.allocation_id == allocation_id, allocation.state == "reserved"))
                .values(state="committed", committed_at=now)
                .returning(
                    allocation.gpu_uuid, allocation.request_tflops_milli, allocation.request_vram_bytes
                )
            )
            shares = [(row[0], row[1], row[2]) for row in committed]
            if not shares:
                return False
            await _append_history(
                connection, allocation_id, shares, kind="committed", occurred_at=now, cause=cause
            )
            return True

    async def release(
        self, allocation_id: UUID, reason: str, cause: UUID | None = None, *, evicted: bool = False
    ) -> bool:
        """Close the allocation and give its capacity back, announcing `AllocationReleased` once.

        Idempotent: releasing an allocation that is unknown or already released returns False and
        changes nothing (no capacity, no history, no event). `evicted` records the history entry as
        `evicted` instead of `released`.
        """
        kind = _release_kind(reason, evicted=evicted)
        async with self.engine.begin() as connection:
            return await _release_in(connection, allocation_id, reason, cause, self._clock(), kind)

    # ----------------------------------------------------------------------------- capacity holds

    async def reserve_hold(self, request: ReservationRequest, held_for: HoldFor) -> ReservationResult:
        """Reserve a capacity hold like `reserve()` (not committed) and record, in the same transaction,
        whom it is kept for; `claim_hold` hands it to that workload's replacement. Replaying it
        changes nothing."""
        now = self._clock()
        try:
            async with self.engine.begin() as connection:
                result = await _reserve_one(connection, request, now, False)
                if isinstance(result, Reserved):
                    await connection.execute(
                        insert(tables.allocation_hold)
                        .values(
                            allocation_id=request.allocation_id,
                            pool_name=held_for.pool,
                            workload_namespace=held_for.namespace,
                            workload_name=held_for.name,
                            owner_uid=held_for.owner_uid,
                            expires_at=held_for.expires_at,
                            created_at=now,
                        )
                        .on_conflict_do_nothing(index_elements=["allocation_id"])
                    )
                return result
        except _PartialReservationError:
            async with self.engine.connect() as connection:
                return await _unreserved_result(connection, request)
        except IntegrityError as refusal:
            return _refusal_result(request, refusal)

    async def active_holds(self) -> list[HoldRecord]:
        """The holds not yet claimed, expired or released, oldest first (one indexed query)."""
        async with self.engine.connect() as connection:
            return await _holds(connection, self._clock())

    async def expired_holds(self) -> list[HoldRecord]:
        """The holds past their expiry that were neither claimed nor released: capacity nobody will
        take, for the defrag planner's sweep to release (whatever its own records say)."""
        async with self.engine.connect() as connection:
            return await _holds(connection, self._clock(), expired=True)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[LedgerTransaction]:
        """One transaction the caller fills with its own statements, the holds read, one batch of
        pipelined reservations, releases and events for the outbox; it commits when the block ends
        without an error (one commit, one fsync, for the caller's record and the ledger's changes
        together), and writes nothing at all otherwise.

        Raises `BatchAbandonedError`, after rolling everything back, when the batch cannot finish as one
        transaction: another writer reserved the same allocation id at the same moment, or Postgres
        aborted the transaction to break a deadlock. The caller redoes its batch with
        `reserve_many()`, which handles both (or, without reservations, redoes the block).
        """
        try:
            async with self.engine.begin() as connection:
                yield LedgerTransaction(connection, self._clock)
        except DBAPIError as error:
            if _sqlstate(error) not in RETRYABLE_SQLSTATES:
                raise
            record_ledger_retry("reserve")
            raise BatchAbandonedError(f"the transaction was aborted to break a deadlock: {error}") from error

    async def claim_hold(self, hold_id: UUID, request: ReservationRequest) -> ReservationResult | None:
        """Swap the hold for `request` (its replacement's allocation, committed) in one transaction:
        release the hold (history `released`, reason `defrag hold claimed by <namespace>/<name>`),
        reserve `request` on the hold's GPUs, and mark the hold claimed by it.

        None when the hold is gone, claimed, released or expired: place the workload normally.
        `ReservationRejected` (nothing changed) when `request` is not on the hold's pool, node and GPUs
        or asks more than the hold on a GPU; another result of `reserve()` likewise changes nothing.
        """
        now = self._clock()
        hold = tables.allocation_hold.c
        try:
            async with self.engine.begin() as connection:
                held = (
                    await connection.execute(
                        select(tables.allocation_hold)
                        .where(
                            hold.allocation_id == hold_id, hold.claimed_at.is_(None), hold.expires_at > now
                        )
                        .with_for_update()
                    )
                ).first()
                record = await _load_allocation(connection, hold_id) if held is not None else None
                if held is None or record is None or record.state == "released":
                    return None
                refusal = _outside_hold(record, request)
                if refusal is not None:
                    return refusal
                workload = request.workload
                reason = f"defrag hold claimed by {workload.namespace}/{workload.name}"
                if not await _release_in(connection, hold_id, reason, request.cause, now, "released"):
                    return None  # released by another party since it was read
                result = await _reserve_one(connection, request, now, True)
                if not isinstance(result, Reserved) or result.replayed:
                    raise _ClaimUndoneError(result)
                await connection.execute(
                    update(tables.allocation_hold)
                    .where(hold.allocation_id == hold_id)
                    .values(claimed_by=request.allocation_id, claimed_at=now)
                )
                return result
        except _ClaimUndoneError as undone:
            return undone.result
        except _PartialReservationError:
            return None

    async def node_states(self) -> list[NodeState]:
        """Every node's `NodeState`, by name, in one light query: the drain marker is tested in SQL
        and no labels, annotations or GPUs are read (the scheduler re-checks its nodes every second)."""
        async with self.engine.connect() as connection:
            return [NodeState._make(row) for row in await connection.execute(_NODE_STATES)]

    async def node_inventory(self, name: str) -> tuple[NodeRecord, list[GpuRecord]] | None:
        """The node and its GPUs (by index), read over one connection; None when the ledger has no such
        node. What the scheduler rebuilds one node of its view from."""
        async with self.engine.connect() as connection:
            node = (await connection.execute(select(tables.node).where(tables.node.c.name == name))).first()
            if node is None:
                return None
            gpus = await connection.execute(
                select(tables.gpu).where(tables.gpu.c.node_name == name).order_by(tables.gpu.c.index)
            )
            return _node_record(node), [_gpu_record(row) for row in gpus]


_RESERVE_STATEMENT = text(
    """
WITH shares AS (
    SELECT * FROM jsonb_to_recordset(CAST(:shares AS jsonb)) AS s(
        gpu_uuid text, share_index integer, tflops_milli bigint, vram_bytes bigint,
        limit_tflops_milli bigint, limit_vram_bytes bigint
    )
),
fresh AS (
    SELECT NOT EXISTS (SELECT 1 FROM allocation WHERE allocation_id = CAST(:allocation_id AS uuid)) AS ok
),
open_node AS (
    SELECT NOT EXISTS (
        SELECT 1 FROM node WHERE node.name = :node
          AND (node.cordoned OR node.labels ? :drain_marker OR node.annotations ? :drain_marker)
    ) AS ok
),
fitting AS (
    SELECT gpu.uuid FROM gpu JOIN shares s ON gpu.uuid = s.gpu_uuid
    WHERE (SELECT ok FROM fresh) AND (SELECT ok FROM open_node)
      AND gpu.node_name = :node AND gpu.phase = 'Running'
      AND gpu.used_tflops_milli + s.tflops_milli <= gpu.capacity_tflops_milli
      AND gpu.used_vram_bytes + s.vram_bytes <= gpu.capacity_vram_bytes
    ORDER BY gpu.uuid
    FOR UPDATE OF gpu
),
taken AS (
    UPDATE gpu SET
        used_tflops_milli = gpu.used_tflops_milli + s.tflops_milli,
        used_vram_bytes = gpu.used_vram_bytes + s.vram_bytes,
        version = gpu.version + 1,
        updated_at = :now
    FROM shares s
    WHERE gpu.uuid = s.gpu_uuid
      AND (SELECT count(*) FROM fitting) = :share_count
      AND gpu.node_name = :node AND gpu.phase = 'Running'
      AND gpu.used_tflops_milli + s.tflops_milli <= gpu.capacity_tflops_milli
      AND gpu.used_vram_bytes + s.vram_bytes <= gpu.capacity_vram_bytes
    RETURNING gpu.uuid
),
allocated AS (
    INSERT INTO allocation (
        allocation_id, gpu_uuid, share_index, state, workload_namespace, workload_name, workload_uid,
        workload_owner, qos, isolation, pool_name, node_name, request_tflops_milli, request_vram_bytes,
        limit_tflops_milli, limit_vram_bytes, created_at, committed_at, eviction_protection_s
    )
    SELECT CAST(:allocation_id AS uuid), s.gpu_uuid, s.share_index, :state, :namespace, :name,
        CAST(:uid AS text), CAST(:owner AS text), :qos, :isolation, :pool, :node, s.tflops_milli,
        s.vram_bytes, s.limit_tflops_milli, s.limit_vram_bytes, :now, CAST(:committed_at AS timestamptz),
        CAST(:eviction_protection_s AS bigint)
    FROM shares s
    WHERE (SELECT count(*) FROM taken) = :share_count
    ON CONFLICT DO NOTHING
    RETURNING gpu_uuid, request_tflops_milli, request_vram_bytes
),
opened AS (
    INSERT INTO allocation_history (
        allocation_id, gpu_uuid, kind, occurred_at, cause, tflops_milli, vram_bytes
    )
    SELECT CAST(:allocation_id AS uuid), a.gpu_uuid, k.kind, :now, CAST(:cause AS uuid),
        a.request_tflops_milli, a.request_vram_bytes
    FROM allocated a
    CROSS JOIN jsonb_array_elements_text(CAST(:history_kinds AS jsonb)) WITH ORDINALITY AS k(kind, position)
    WHERE (SELECT count(*) FROM allocated) = :share_count
    ORDER BY k.position, a.gpu_uuid
),
announced AS (
    INSERT INTO outbox (event_id, subject, event_type, payload, occurred_at)
    SELECT CAST(:event_id AS uuid), :subject, :event_type, CAST(:payload AS jsonb), :now
    WHERE (SELECT count(*) FROM allocated) = :share_count
    RETURNING id
)
SELECT (SELECT ok FROM fresh) AS fresh,
       (SELECT count(*) FROM taken) AS taken,
       (SELECT count(*) FROM allocated) AS allocated,
       (SELECT count(*) FROM announced) AS announced
"""
)
"""One reservation in one round trip: lock the chosen GPUs in UUID order (a fixed order, so multi-GPU
reservations cannot deadlock each other) keeping only those with room, take capacity only when every
share has room, then write the allocation rows, their history and the outbox event. Nothing is written
when the allocation id exists already, a share lacks room, or the node is cordoned or being drained by
the defrag planner (its `tensor-fusion.ai/defrag-source` marker): no scheduler may place there, however
stale its view."""


_RESERVE_QUERY = re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", _RESERVE_STATEMENT.text)
"""`_RESERVE_STATEMENT` in psycopg's parameter style, for pipeline mode."""


_NODE_STATES = select(
    tables.node.c.name,
    tables.node.c.pool_name,
    tables.node.c.cordoned,
    tables.node.c.ready,
    tables.node.c.last_heartbeat_at,
    sa.or_(
        tables.node.c.labels.has_key(DEFRAG_SOURCE_MARKER),
        tables.node.c.annotations.has_key(DEFRAG_SOURCE_MARKER),
    ).label("draining"),
).order_by(tables.node.c.name)
"""`NodeState` of every node, in the field order of `NodeState`."""


_NAMESPACE_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")


async def _locked_namespace_shares(
    connection: AsyncConnection, namespaces: Sequence[str]
) -> list[NamespaceShare]:
    """Lock each namespace's quota for the rest of the transaction (in name order, so two transactions
    locking several never deadlock), then read its shares: usage that cannot change before commit."""
    for namespace in sorted(set(namespaces)):
        await connection.execute(_NAMESPACE_LOCK, {"key": f"tf-quota:{namespace}"})
    return await _namespace_shares(connection, namespaces)


async def _namespace_shares(
    connection: AsyncConnection, namespaces: Sequence[str] | None
) -> list[NamespaceShare]:
    allocation, gpu = tables.allocation, tables.gpu
    query = (
        select(
            allocation.c.workload_namespace,
            allocation.c.allocation_id,
            allocation.c.request_tflops_milli,
            allocation.c.request_vram_bytes,
            allocation.c.limit_tflops_milli,
            allocation.c.limit_vram_bytes,
            gpu.c.capacity_tflops_milli,
        )
        .join(gpu, gpu.c.uuid == allocation.c.gpu_uuid)
        .where(allocation.c.state != "released")
    )
    if namespaces is not None:
        query = query.where(allocation.c.workload_namespace.in_(list(namespaces)))
    return [NamespaceShare(*row) for row in await connection.execute(query)]


class BatchAbandonedError(Exception):
    """`SqlLedger.transaction()` rolled its batch back; redo it with `reserve_many()`."""


class LedgerTransaction:
    """The contract of an open `SqlLedger.transaction()`: `connection` for the caller's own statements
    (they commit with the ledger's changes or not at all), the holds as this transaction sees them,
    `reserve_many()` sent in one round trip, `release()`, and `announce()` for an event of the caller's
    own that must go out exactly when its change commits (an eviction's `PodEvicted`). Results are
    final only once the block has committed."""

    def __init__(self, connection: AsyncConnection, clock: Clock) -> None:
        self.connection = connection
        self._clock = clock

    async def active_holds(self) -> list[HoldRecord]:
        """`SqlLedger.active_holds()`, read in this transaction."""
        return await _holds(self.connection, self._clock())

    async def locked_namespace_shares(self, namespaces: Sequence[str]) -> list[NamespaceShare]:
        """The shares of `namespaces`, read after taking each namespace's quota lock (the one
        `SqlLedger.reserve_within_quota` takes) until this transaction ends: check a quota on them, then
        reserve in this transaction, and no other scheduler's reservation in those namespaces lands in
        between."""
        return await _locked_namespace_shares(self.connection, namespaces)

    async def reserve_many(
        self,
        requests: Sequence[ReservationRequest],
        *,
        commit: bool = False,
        then: Executable | None = None,
    ) -> list[ReservationResult]:
        """`SqlLedger.reserve_many()` within this transaction, pipelined. A racing writer that took part
        of a reservation raises `BatchAbandonedError` (the whole transaction rolls back)."""
        try:
            results = await _reserve_pipelined(self.connection, requests, self._clock(), commit)
        except (_PartialReservationError, IntegrityError) as error:
            raise BatchAbandonedError(f"a racing writer took part of a reservation: {error}") from error
        if then is not None:
            await self.connection.execute(then)
        return results

    async def release(
        self, allocation_id: UUID, reason: str, cause: UUID | None = None, *, evicted: bool = False
    ) -> bool:
        """`SqlLedger.release()` within this transaction: the capacity, the history entry and the
        `AllocationReleased` event commit with the caller's statements or not at all."""
        kind = _release_kind(reason, evicted=evicted)
        return await _release_in(self.connection, allocation_id, reason, cause, self._clock(), kind)

    async def announce(self, *events: Event) -> int:
        """Write `events` to the outbox in this transaction (one statement): the relay publishes them, in
        this order, once the transaction has committed, and never if it rolls back. Once per event id:
        an id the outbox holds already is not written again (an event announced before is not
        announced twice). Returns how many were written."""
        return await _write_outbox_once(self.connection, events)


def _holds_query(*, expired: bool) -> Executable:
    """The unclaimed holds whose allocation is live, expired ones or the others, given `:now`."""
    hold = tables.allocation_hold.c
    allocation = tables.allocation.c
    now = sa.bindparam("now", type_=sa.DateTime(timezone=True))
    return (
        select(
            tables.allocation,
            hold.pool_name.label("hold_pool"),
            hold.workload_namespace.label("hold_namespace"),
            hold.workload_name.label("hold_name"),
            hold.owner_uid.label("hold_owner_uid"),
            hold.expires_at.label("hold_expires_at"),
        )
        .join(tables.allocation_hold, hold.allocation_id == allocation.allocation_id)
        .where(
            hold.claimed_at.is_(None),
            hold.expires_at <= now if expired else hold.expires_at > now,
            allocation.state != "released",
        )
        .order_by(hold.created_at, allocation.id)
    )


_ACTIVE_HOLDS = _holds_query(expired=False)
_EXPIRED_HOLDS = _holds_query(expired=True)
"""Built once: each submission batch reads the holds, and building the statement cost more than running it."""


async def _holds(connection: AsyncConnection, now: datetime, *, expired: bool = False) -> list[HoldRecord]:
    """The unclaimed holds with a live allocation, oldest first: unexpired ones, or with `expired`
    the expired ones."""
    query = _EXPIRED_HOLDS if expired else _ACTIVE_HOLDS
    rows = (await connection.execute(query, {"now": now})).all()
    held_for = {
        row.allocation_id: HoldFor(
            pool=row.hold_pool,
            namespace=row.hold_namespace,
            name=row.hold_name,
            owner_uid=row.hold_owner_uid,
            expires_at=row.hold_expires_at,
        )
        for row in rows
    }
    return [HoldRecord(record, held_for[record.allocation_id]) for record in _allocation_records(rows)]


class _PartialReservationError(Exception):
    """A reservation statement wrote part of a reservation; its transaction or savepoint must roll back."""


async def _reserve_one(
    connection: AsyncConnection, request: ReservationRequest, now: datetime, commit: bool
) -> ReservationResult:
    allocation, parameters = _reservation_parameters(request, now, commit)
    row = (await connection.execute(_RESERVE_STATEMENT, parameters)).one()
    return await _judged(
        connection, request, allocation, (row.fresh, row.taken, row.allocated, row.announced)
    )


async def _reserve_pipelined(
    connection: AsyncConnection, requests: Sequence[ReservationRequest], now: datetime, commit: bool
) -> list[ReservationResult]:
    """Every request's statement sent at once (psycopg pipeline mode): one round trip for the batch.

    A statement that fails (an unknown pool, a lost deadlock) fails the transaction; the caller redoes
    the batch one savepoint per request."""
    prepared = [_reservation_parameters(request, now, commit) for request in requests]
    driver = (await connection.get_raw_connection()).driver_connection
    assert driver is not None
    cursors = []
    try:
        async with driver.pipeline():
            for _allocation, parameters in prepared:
                cursor = driver.cursor()
                await cursor.execute(_RESERVE_QUERY, parameters, prepare=True)
                cursors.append(cursor)
        rows = [await cursor.fetchone() for cursor in cursors]
    except psycopg.Error as error:
        raise _PartialReservationError(f"pipelined reservation failed: {error}") from error
    results: list[ReservationResult] = []
    for request, (allocation, _parameters), row in zip(requests, prepared, rows, strict=True):
        assert row is not None
        results.append(await _judged(connection, request, allocation, tuple(row)))
    return results


def _planner_markers(column: Any) -> Any:
    """The entries of a node's JSONB `column` the defrag planner or the operator owns, as a JSONB object
    (maybe empty)."""
    entry = sa.func.jsonb_each(column).table_valued("key", "value").render_derived()
    owned = sa.or_(
        *(entry.c.key.startswith(prefix) for prefix in PLANNER_MARKER_PREFIXES),
        entry.c.key.in_(OPERATOR_NODE_LABELS),
    )
    aggregated = (
        sa.select(sa.func.jsonb_object_agg(entry.c.key, entry.c.value)).where(owned).scalar_subquery()
    )
    return sa.func.coalesce(aggregated, sa.text("'{}'::jsonb"))


def _reservation_parameters(
    request: ReservationRequest, now: datetime, commit: bool
) -> tuple[AllocationRecord, dict[str, Any]]:
    allocation = _reserved_record(request, now)
    if commit:
        allocation = replace(allocation, state="committed", committed_at=now)
    event = _allocation_created(allocation, request.cause, now)
    shares = request.shares
    return allocation, {
        "shares": json.dumps(
            [
                {
                    "gpu_uuid": share.gpu_uuid,
                    "share_index": index,
                    "tflops_milli": share.tflops_milli,
                    "vram_bytes": share.vram_bytes,
                    "limit_tflops_milli": share.effective_limit_tflops_milli,
                    "limit_vram_bytes": share.effective_limit_vram_bytes,
                }
                for index, share in enumerate(shares)
            ]
        ),
        "share_count": len(shares),
        "drain_marker": DEFRAG_SOURCE_MARKER,
        "allocation_id": request.allocation_id,
        "node": request.node,
        "now": now,
        "state": allocation.state,
        "committed_at": allocation.committed_at,
        "namespace": request.workload.namespace,
        "name": request.workload.name,
        "uid": request.workload.uid,
        "owner": request.workload.workload,
        "qos": request.qos,
        "isolation": request.isolation,
        "pool": request.pool,
        "eviction_protection_s": request.eviction_protection_s,
        "cause": request.cause,
        "history_kinds": '["opened", "committed"]' if commit else '["opened"]',
        "event_id": event.event_id,
        "subject": event.routing_subject(),
        "event_type": event.event_type(),
        "payload": event.model_dump_json(),
    }


async def _judged(
    connection: AsyncConnection,
    request: ReservationRequest,
    allocation: AllocationRecord,
    counts: tuple[Any, ...],
) -> ReservationResult:
    """The result of one reservation statement from its counts (`fresh`, `taken`, `allocated`,
    `announced`); raises `_PartialReservationError` when it wrote part of a reservation."""
    fresh, taken, allocated, announced = counts
    if announced == 1 and allocated == len(request.shares):
        return Reserved(allocation=allocation)
    if taken or allocated:
        raise _PartialReservationError(str(request.allocation_id))
    if not fresh:
        existing = await _load_allocation(connection, request.allocation_id)
        if existing is not None:
            return Reserved(allocation=existing, replayed=True)
    return await _unreserved_result(connection, request)


async def _unreserved_result(connection: AsyncConnection, request: ReservationRequest) -> ReservationResult:
    """Why `request` was not reserved, read after its writes were undone: it exists (a replay), or the
    first share (in lock order) that has no room."""
    existing = await _load_allocation(connection, request.allocation_id)
    if existing is not None:
        return Reserved(allocation=existing, replayed=True)
    node = (
        await connection.execute(
            select(tables.node.c.cordoned, tables.node.c.labels, tables.node.c.annotations).where(
                tables.node.c.name == request.node
            )
        )
    ).first()
    if node is not None and node.cordoned:
        return ReservationRejected(
            field="node", message=f"node {request.node!r} is cordoned; pick another node or uncordon it"
        )
    if node is not None and (DEFRAG_SOURCE_MARKER in node.labels or DEFRAG_SOURCE_MARKER in node.annotations):
        return ReservationRejected(
            field="node",
            message=f"node {request.node!r} is being drained by the defrag planner ({DEFRAG_SOURCE_MARKER}); "
            "pick another node",
        )
    ordered = sorted(request.shares, key=lambda share: share.gpu_uuid)
    rows = {
        row.uuid: row
        for row in await connection.execute(
            select(tables.gpu).where(tables.gpu.c.uuid.in_([share.gpu_uuid for share in ordered]))
        )
    }
    for share in ordered:
        refusal = _share_refusal(request, share, rows.get(share.gpu_uuid))
        if refusal is not None:
            return refusal
    # Room was freed by a release committed after the statement ran: report the first share as full.
    first = ordered[0]
    return InsufficientCapacity(
        gpu_uuid=first.gpu_uuid,
        resource="tflops",
        requested=first.tflops_milli,
        available=0,
        capacity=rows[first.gpu_uuid].capacity_tflops_milli if first.gpu_uuid in rows else 0,
    )


def _share_refusal(
    request: ReservationRequest, share: ShareRequest, row: Row[Any] | None
) -> ReservationResult | None:
    gpu_uuid = share.gpu_uuid
    if row is None:
        return ReservationRejected(
            field="shares[].gpu_uuid", message=f"GPU {gpu_uuid} is not in the ledger; pick a registered GPU"
        )
    if row.node_name != request.node:
        return ReservationRejected(
            field="node", message=f"GPU {gpu_uuid} is on node {row.node_name!r}, not {request.node!r}"
        )
    if row.phase != "Running":
        return ReservationRejected(
            field="shares[].gpu_uuid",
            message=f"GPU {gpu_uuid} is {row.phase}, not Running; it cannot take new allocations",
        )
    free_tflops = row.capacity_tflops_milli - row.used_tflops_milli
    if share.tflops_milli > free_tflops:
        return InsufficientCapacity(
            gpu_uuid=gpu_uuid,
            resource="tflops",
            requested=share.tflops_milli,
            available=free_tflops,
            capacity=row.capacity_tflops_milli,
        )
    free_vram = row.capacity_vram_bytes - row.used_vram_bytes
    if share.vram_bytes > free_vram:
        return InsufficientCapacity(
            gpu_uuid=gpu_uuid,
            resource="vram",
            requested=share.vram_bytes,
            available=free_vram,
            capacity=row.capacity_vram_bytes,
        )
    return None


class _ClaimUndoneError(Exception):
    """A hold's claim could not reserve the replacement; its transaction rolls back."""

    def __init__(self, result: ReservationResult) -> None:
        super().__init__(str(result))
        self.result = result


def _outside_hold(hold: AllocationRecord, request: ReservationRequest) -> ReservationRejected | None:
    """Why `request` cannot take `hold`'s place, or None when it asks at most the hold on its GPUs."""
    if request.pool != hold.pool:
        return ReservationRejected(
            field="pool", message=f"the hold is in pool {hold.pool!r}, not {request.pool!r}"
        )
    if request.node != hold.node:
        return ReservationRejected(
            field="node", message=f"the hold is on node {hold.node!r}, not {request.node!r}"
        )
    held = {share.gpu_uuid: share for share in hold.shares}
    if sorted(share.gpu_uuid for share in request.shares) != sorted(held):
        return ReservationRejected(
            field="shares[].gpu_uuid",
            message=f"the hold is on GPUs {', '.join(sorted(held))}; a claim takes exactly those GPUs",
        )
    for share in request.shares:
        kept = held[share.gpu_uuid]
        if share.tflops_milli > kept.tflops_milli or share.vram_bytes > kept.vram_bytes:
            return ReservationRejected(
                field="shares",
                message=f"asks more than the hold on GPU {share.gpu_uuid}; place the workload normally",
            )
    return None


def _release_kind(reason: str, *, evicted: bool) -> HistoryKind:
    """The history kind of a release, once its reason is checked."""
    if not reason:
        raise LedgerInputError("reason: empty; say why the allocation ends (e.g. pod-deleted, evicted)")
    return "evicted" if evicted else "released"


async def _release_in(
    connection: AsyncConnection,
    allocation_id: UUID,
    reason: str,
    cause: UUID | None,
    now: datetime,
    kind: HistoryKind,
) -> bool:
    """`release()`'s writes inside the caller's transaction; False (nothing written) when the
    allocation is unknown or already released. Only the transaction that flips the state gives capacity
    back: concurrent releases serialise on the allocation rows and the later ones find nothing to flip."""
    allocation = tables.allocation.c
    gpu = tables.gpu.c
    released = (
        await connection.execute(
            update(tables.allocation)
            .where(and_(allocation.allocation_id == allocation_id, allocation.state != "released"))
            .values(state="released", released_at=now, release_reason=reason)
            .returning(allocation.gpu_uuid, allocation.request_tflops_milli, allocation.request_vram_bytes)
        )
    ).all()
    if not released:
        return False
    shares = sorted((row[0], row[1], row[2]) for row in released)
    for gpu_uuid, tflops_milli, vram_bytes in shares:
        await connection.execute(
            update(tables.gpu)
            .where(gpu.uuid == gpu_uuid)
            .values(
                used_tflops_milli=gpu.used_tflops_milli - tflops_milli,
                used_vram_bytes=gpu.used_vram_bytes - vram_bytes,
                version=gpu.version + 1,
                updated_at=now,
            )
        )
    await _append_history(
        connection, allocation_id, shares, kind=kind, occurred_at=now, cause=cause, reason=reason
    )
    record = await _load_allocation(connection, allocation_id)
    assert record is not None
    await _write_outbox(
        connection,
        AllocationReleased(
            event_id=derived_event_id(allocation_id, AllocationReleased),
            occurred_at=now,
            cause=cause,
            allocation_id=allocation_id,
            workload=record.workload,
            node=record.node,
            reason=reason,
            evicted=kind == "evicted",
        ),
    )
    return True


async def _append_history(
    connection: AsyncConnection,
    allocation_id: UUID,
    shares: Iterable[tuple[str, int, int]],
    *,
    kind: HistoryKind,
    occurred_at: datetime,
    cause: UUID | None,
    reason: str | None = None,
) -> None:
    await connection.execute(
        insert(tables.allocation_history),
        [
            {
                "allocation_id": allocation_id,
                "gpu_uuid": gpu_uuid,
                "kind": kind,
                "occurred_at": occurred_at,
                "cause": cause,
                "tflops_milli": tflops_milli,
                "vram_bytes": vram_bytes,
                "reason": reason,
            }
            for gpu_uuid, tflops_milli, vram_bytes in shares
        ],
    )


def _outbox_rows(events: Sequence[Event]) -> Insert:
    return insert(tables.outbox).values(
        [
            {
                "event_id": event.event_id,
                "subject": event.routing_subject(),
                "event_type": event.event_type(),
                "payload": event.model_dump(mode="json"),
                "occurred_at": event.occurred_at,
            }
            for event in events
        ]
    )


async def _write_outbox(connection: AsyncConnection, event: Event) -> None:
    await connection.execute(_outbox_rows([event]))


async def _write_outbox_once(connection: AsyncConnection, events: Sequence[Event]) -> int:
    if not events:
        return 0
    written = await connection.execute(
        _outbox_rows(events)
        .on_conflict_do_nothing(index_elements=[tables.outbox.c.event_id])
        .returning(tables.outbox.c.id)
    )
    return len(written.all())


def _reserved_record(request: ReservationRequest, now: datetime) -> AllocationRecord:
    return AllocationRecord(
        allocation_id=request.allocation_id,
        workload=request.workload,
        pool=request.pool,
        node=request.node,
        qos=request.qos,
        isolation=request.isolation,
        state="reserved",
        shares=tuple(
            ShareRecord(
                gpu_uuid=share.gpu_uuid,
                tflops_milli=share.tflops_milli,
                vram_bytes=share.vram_bytes,
                limit_tflops_milli=share.effective_limit_tflops_milli,
                limit_vram_bytes=share.effective_limit_vram_bytes,
            )
            for share in sorted(request.shares, key=lambda share: share.gpu_uuid)
        ),
        created_at=now,
        committed_at=None,
        released_at=None,
        release_reason=None,
    )


def _allocation_created(allocation: AllocationRecord, cause: UUID | None, now: datetime) -> AllocationCreated:
    return AllocationCreated(
        event_id=derived_event_id(allocation.allocation_id, AllocationCreated),
        occurred_at=now,
        cause=cause,
        allocation_id=allocation.allocation_id,
        workload=allocation.workload,
        pool=allocation.pool,
        node=allocation.node,
        shares=tuple(
            GpuShare(gpu_uuid=share.gpu_uuid, tflops_milli=share.tflops_milli, vram_bytes=share.vram_bytes)
            for share in allocation.shares
        ),
        qos=allocation.qos,
        isolation=allocation.isolation,
    )


async def _load_allocation(connection: AsyncConnection, allocation_id: UUID) -> AllocationRecord | None:
    rows = await connection.execute(
        select(tables.allocation)
        .where(tables.allocation.c.allocation_id == allocation_id)
        .order_by(tables.allocation.c.gpu_uuid)
    )
    records = _allocation_records(rows.all())
    return records[0] if records else None


def _allocation_records(rows: Sequence[Row[Any]]) -> list[AllocationRecord]:
    grouped: dict[UUID, list[Row[Any]]] = {}
    for row in rows:
        grouped.setdefault(row.allocation_id, []).append(row)
    records = []
    for allocation_id, share_rows in grouped.items():
        first = share_rows[0]
        records.append(
            AllocationRecord(
                allocation_id=allocation_id,
                workload=WorkloadRef(
                    namespace=first.workload_namespace,
                    name=first.workload_name,
                    uid=first.workload_uid,
                    workload=first.workload_owner,
                ),
                pool=first.pool_name,
                node=first.node_name,
                qos=first.qos,
                isolation=first.isolation,
                state=first.state,
                shares=tuple(
                    ShareRecord(
                        gpu_uuid=row.gpu_uuid,
                        tflops_milli=row.request_tflops_milli,
                        vram_bytes=row.request_vram_bytes,
                        limit_tflops_milli=row.limit_tflops_milli,
                        limit_vram_bytes=row.limit_vram_bytes,
                    )
                    for row in sorted(share_rows, key=lambda row: cast(str, row.gpu_uuid))
                ),
                created_at=first.created_at,
                committed_at=first.committed_at,
                released_at=first.released_at,
                release_reason=first.release_reason,
            )
        )
    return records


def _node_record(row: Row[Any]) -> NodeRecord:
    return NodeRecord(
        name=row.name,
        pool=row.pool_name,
        labels=row.labels,
        taints=row.taints,
        annotations=row.annotations,
        cpu_allocatable_milli=row.cpu_allocatable_milli,
        memory_allocatable_bytes=row.memory_allocatable_bytes,
        cordoned=row.cordoned,
        ready=row.ready,
        last_heartbeat_at=row.last_heartbeat_at,
    )


def _gpu_record(row: Row[Any]) -> GpuRecord:
    return GpuRecord(
        uuid=row.uuid,
        node=row.node_name,
        index=row._mapping["index"],
        model=row.model,
        vendor=row.vendor,
        capacity_tflops_milli=row.capacity_tflops_milli,
        capacity_vram_bytes=row.capacity_vram_bytes,
        used_tflops_milli=row.used_tflops_milli,
        used_vram_bytes=row.used_vram_bytes,
        phase=row.phase,
        numa_node=row.numa_node,
        version=row.version,
    )


def _refusal_result(request: ReservationRequest, refusal: IntegrityError) -> ReservationResult:
    if _constraint_name(refusal) == "fk_allocation_pool_name_pool":
        return ReservationRejected(
            field="pool", message=f"pool {request.pool!r} is not in the ledger; register it first"
        )
    raise refusal


def _sqlstate(error: DBAPIError) -> str | None:
    sqlstate = getattr(error.orig, "sqlstate", None)
    return sqlstate if isinstance(sqlstate, str) else None


def _constraint_name(error: IntegrityError) -> str | None:
    diagnostics = getattr(error.orig, "diag", None)
    name = getattr(diagnostics, "constraint_name", None)
    return name if isinstance(name, str) else None


_CAMPAIGN_FIELDS = """pool_name, trigger, state, started_at, finished_at, deadline_at, outcome, current_node,
    drained_nodes, failed_nodes, skipped_nodes, pods_evicted, stranded_pods"""
"""The `defrag_campaign` columns a `DefragCampaignSummary` is read from."""


def _count(value: Any) -> int:
    return len(value) if isinstance(value, list | dict) else 0


def _campaign_summary(row: Row[Any]) -> DefragCampaignSummary:
    return DefragCampaignSummary(
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
