"""`SqlLedger`: the Postgres ledger (SQLAlchemy 2 async, psycopg 3) behind reserve, release and reads.

Capacity is taken with a conditional `UPDATE gpu ... WHERE used + x <= capacity RETURNING`, so racing
writers can never over-allocate (the `CHECK` constraints are the backstop). Every change writes its
history rows and its outbox event in the same transaction; the outbox relay publishes them.
This module does not publish to NATS and does not decide placement.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID

from sqlalchemy import Row, and_, select, update
from sqlalchemy.dialects.postgresql import insert
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
    AllocationRecord,
    GpuRecord,
    GpuSpec,
    HistoryKind,
    HistoryRecord,
    InsufficientCapacity,
    LedgerInputError,
    NodeRecord,
    NodeSpec,
    PoolRecord,
    ReservationRejected,
    ReservationRequest,
    ReservationResult,
    Reserved,
    ShareRecord,
)
from tfcommon.ledger.urls import ledger_url

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]

DEADLOCK_ATTEMPTS = 5
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure


def utc_now() -> datetime:
    return datetime.now(UTC)


class _ReservationAbortedError(Exception):
    """Leaves a transaction without committing, carrying the result to return."""

    def __init__(self, result: ReservationResult) -> None:
        super().__init__("rolled back")
        self.result = result


class SqlLedger:
    """The ledger on Postgres. Build with `create()`; `close()` releases the connection pool.

    All methods are safe to call concurrently, from any number of processes.
    """

    def __init__(self, engine: AsyncEngine, *, clock: Clock = utc_now) -> None:
        self.engine = engine
        self._clock = clock

    @classmethod
    def create(cls, database_url: str, *, pool_size: int = 10, clock: Clock = utc_now) -> SqlLedger:
        """A ledger on `database_url` (`postgresql+psycopg://...`); connects lazily, on first use."""
        engine = create_async_engine(
            ledger_url(database_url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
        )
        return cls(engine, clock=clock)

    async def close(self) -> None:
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
        """Create or update the node (and its pool). `cordoned` is left as it is on an update."""
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
        statement = statement.on_conflict_do_update(
            index_elements=["name"], set_={key: statement.excluded[key] for key in values if key != "name"}
        )
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

    async def set_node_cordoned(self, node_name: str, cordoned: bool) -> bool:
        """Cordon or uncordon a node (no new placements on it); False when the node is not registered."""
        statement = (
            update(tables.node)
            .where(tables.node.c.name == node_name)
            .values(cordoned=cordoned, updated_at=self._clock())
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

    # ---------------------------------------------------------------------------------- changes

    async def reserve(self, request: ReservationRequest) -> ReservationResult:
        """Take the shares' capacity on every GPU, or on none, and announce `AllocationCreated`.

        Returns `Reserved` (with `replayed=True` when this `allocation_id` was already reserved: no
        capacity is taken twice and no second event is written), `InsufficientCapacity` naming the
        first GPU and resource that lacked room, or `ReservationRejected` for an unknown GPU or pool, a
        GPU on another node or one that is not Running. Never over-allocates, whatever the concurrency.
        """
        return (await self.reserve_many([request]))[0]

    async def reserve_many(self, requests: Sequence[ReservationRequest]) -> list[ReservationResult]:
        """`reserve()` each request, in order, in one transaction: one commit for the whole batch.

        Each request is still all or nothing on its own (a savepoint each), so one that does not fit
        does not undo the others. Results come back in request order. If Postgres aborts the batch to
        break a deadlock with another writer, the batch is retried from the start.
        """
        for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
            try:
                return await self._reserve_batch(requests)
            except DBAPIError as error:
                if _sqlstate(error) not in RETRYABLE_SQLSTATES or attempt == DEADLOCK_ATTEMPTS:
                    raise
                log.info(
                    "reservation batch aborted to break a deadlock; retrying",
                    extra={"outcome": "retry", "attempt": attempt, "batch": len(requests)},
                )
        raise AssertionError("unreachable")

    async def _reserve_batch(self, requests: Sequence[ReservationRequest]) -> list[ReservationResult]:
        now = self._clock()
        results: list[ReservationResult] = []
        # A lone request needs no savepoint: refusing it rolls the whole transaction back.
        alone = len(requests) == 1
        try:
            async with self.engine.begin() as connection:
                for request in requests:
                    existing = await _load_allocation(connection, request.allocation_id)
                    if existing is not None:
                        results.append(Reserved(allocation=existing, replayed=True))
                        continue
                    try:
                        async with contextlib.nullcontext() if alone else connection.begin_nested():
                            results.append(await self._reserve_one(connection, request, now))
                    except (_ReservationAbortedError, IntegrityError) as refusal:
                        if alone:
                            raise
                        results.append(_refusal_result(request, refusal))
        except (_ReservationAbortedError, IntegrityError) as refusal:
            return [_refusal_result(requests[0], refusal)]
        return results

    async def _reserve_one(
        self, connection: AsyncConnection, request: ReservationRequest, now: datetime
    ) -> Reserved:
        await self._take_capacity(connection, request, now)
        await self._insert_allocation(connection, request, now)
        allocation = _reserved_record(request, now)
        await _write_outbox(connection, _allocation_created(allocation, request.cause, now))
        return Reserved(allocation=allocation)

    async def _take_capacity(
        self, connection: AsyncConnection, request: ReservationRequest, now: datetime
    ) -> None:
        gpu = tables.gpu.c
        # A fixed lock order (by GPU UUID) keeps multi-GPU reservations from deadlocking each other.
        for share in sorted(request.shares, key=lambda share: share.gpu_uuid):
            statement = (
                update(tables.gpu)
                .where(
                    and_(
                        gpu.uuid == share.gpu_uuid,
                        gpu.node_name == request.node,
                        gpu.phase == "Running",
                        gpu.used_tflops_milli + share.tflops_milli <= gpu.capacity_tflops_milli,
                        gpu.used_vram_bytes + share.vram_bytes <= gpu.capacity_vram_bytes,
                    )
                )
                .values(
                    used_tflops_milli=gpu.used_tflops_milli + share.tflops_milli,
                    used_vram_bytes=gpu.used_vram_bytes + share.vram_bytes,
                    version=gpu.version + 1,
                    updated_at=now,
                )
                .returning(gpu.uuid)
            )
            if (await connection.execute(statement)).first() is None:
                raise _ReservationAbortedError(await _explain_refusal(connection, request, share.gpu_uuid))

    async def _insert_allocation(
        self, connection: AsyncConnection, request: ReservationRequest, now: datetime
    ) -> None:
        rows = [
            {
                "allocation_id": request.allocation_id,
                "gpu_uuid": share.gpu_uuid,
                "state": "reserved",
                "workload_namespace": request.workload.namespace,
                "workload_name": request.workload.name,
                "workload_uid": request.workload.uid,
                "workload_owner": request.workload.workload,
                "qos": request.qos,
                "isolation": request.isolation,
                "pool_name": request.pool,
                "node_name": request.node,
                "request_tflops_milli": share.tflops_milli,
                "request_vram_bytes": share.vram_bytes,
                "limit_tflops_milli": share.effective_limit_tflops_milli,
                "limit_vram_bytes": share.effective_limit_vram_bytes,
                "created_at": now,
            }
            for share in request.shares
        ]
        # A concurrent reserve of the same allocation_id waits here on the unique index until the
        # other commits; then nothing is inserted and this transaction backs out as a replay.
        inserted = await connection.execute(
            insert(tables.allocation)
            .values(rows)
            .on_conflict_do_nothing(index_elements=["allocation_id", "gpu_uuid"])
            .returning(tables.allocation.c.gpu_uuid)
        )
        if len(inserted.all()) != len(rows):
            existing = await self.get_allocation(request.allocation_id)
            if existing is None:
                raise RuntimeError(f"allocation {request.allocation_id} conflicted but cannot be read back")
            raise _ReservationAbortedError(Reserved(allocation=existing, replayed=True))
        await _append_history(
            connection,
            request.allocation_id,
            [(share.gpu_uuid, share.tflops_milli, share.vram_bytes) for share in request.shares],
            kind="opened",
            occurred_at=now,
            cause=request.cause,
        )

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
        if not reason:
            raise LedgerInputError("reason: empty; say why the allocation ends (e.g. pod-deleted, evicted)")
        now = self._clock()
        allocation = tables.allocation.c
        gpu = tables.gpu.c
        async with self.engine.begin() as connection:
            # Only the transaction that flips the state gives capacity back: concurrent releases
            # serialise on the allocation rows and the later ones find nothing to flip.
            released = (
                await connection.execute(
                    update(tables.allocation)
                    .where(and_(allocation.allocation_id == allocation_id, allocation.state != "released"))
                    .values(state="released", released_at=now, release_reason=reason)
                    .returning(
                        allocation.gpu_uuid, allocation.request_tflops_milli, allocation.request_vram_bytes
                    )
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
                connection,
                allocation_id,
                shares,
                kind="evicted" if evicted else "released",
                occurred_at=now,
                cause=cause,
                reason=reason,
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
                ),
            )
            return True


async def _explain_refusal(
    connection: AsyncConnection, request: ReservationRequest, gpu_uuid: str
) -> ReservationResult:
    share = next(share for share in request.shares if share.gpu_uuid == gpu_uuid)
    row = (await connection.execute(select(tables.gpu).where(tables.gpu.c.uuid == gpu_uuid))).first()
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
    # VRAM lacked room (or TFLOPS was freed by a release committed since our update was refused).
    return InsufficientCapacity(
        gpu_uuid=gpu_uuid,
        resource="vram",
        requested=share.vram_bytes,
        available=row.capacity_vram_bytes - row.used_vram_bytes,
        capacity=row.capacity_vram_bytes,
    )


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


async def _write_outbox(connection: AsyncConnection, event: Event) -> None:
    await connection.execute(
        insert(tables.outbox).values(
            event_id=event.event_id,
            subject=event.routing_subject(),
            event_type=event.event_type(),
            payload=event.model_dump(mode="json"),
            occurred_at=event.occurred_at,
        )
    )


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


def _refusal_result(
    request: ReservationRequest, refusal: _ReservationAbortedError | IntegrityError
) -> ReservationResult:
    if isinstance(refusal, _ReservationAbortedError):
        return refusal.result
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
