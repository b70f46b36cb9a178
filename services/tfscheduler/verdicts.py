"""What the placing rooms record for a workload besides the view: its verdict, and its reservation.

`Verdicts` records a workload that is not placed: kept pending with its reason (`wait`, `wait_many`)
or refused for good (`refuse`), in the workload store and, in the same ledger transaction, its
`tf.evt.workload.unschedulable` in the outbox (a pending one is announced when the caller asks or its
reason changed). A workload another scheduler placed or ended meanwhile is not moved: its status is
then what the ledger and the store hold (`status_of`). `reservation_for` words a placement as the
ledger's `ReservationRequest`; `placed_status` and `stored_status` are the statuses placing answers.
Used by `tfscheduler.placing` and `tfscheduler.gang_placing`, with the view room's lock held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from uuid import UUID, uuid4

from tfcommon.events import GpuRequest, WorkloadUnschedulable
from tfcommon.ledger.records import AllocationRecord, ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.placement import Placement, Rejection

from tfscheduler.core.lifecycle import Transition, target
from tfscheduler.core.reports import unschedulable_event
from tfscheduler.submission import Submission, WorkloadStatus
from tfscheduler.workloads import StoredWorkload, WorkloadStore

Entry = tuple[StoredWorkload, UUID | None]
"""A workload to place: its stored row and the event that caused its submission, if any."""

Waiting = tuple[StoredWorkload, UUID | None, str, Rejection | None]
"""A workload to keep pending: its stored row, the cause of its submission, the reason, and the
placement core's rejection when there is one (it details the event)."""


class Verdicts:
    """Records the verdicts of one scheduler's placing that are not placements, and reads statuses."""

    def __init__(self, ledger: SqlLedger, store: WorkloadStore, clock: Callable[[], datetime]) -> None:
        self.ledger = ledger
        self.store = store
        self.clock = clock

    async def refuse(self, stored: StoredWorkload, reason: str, cause: UUID | None) -> WorkloadStatus:
        """Refuse the workload for good with `reason`, announced."""
        async with self.ledger.transaction() as transaction:
            moved = await self.store.transition(
                stored.allocation_id,
                Transition.REFUSE,
                reason,
                self.clock(),
                connection=transaction.connection,
            )
            if moved:
                await transaction.announce(self._unschedulable(stored, reason, None, cause))
        if not moved:
            return await self.status_of(stored.allocation_id)
        return stored_status(replace(stored, state=target(Transition.REFUSE), reason=reason))

    async def wait(
        self,
        stored: StoredWorkload,
        reason: str,
        rejection: Rejection | None,
        cause: UUID | None,
        announce: bool,
    ) -> WorkloadStatus:
        """Keep the workload pending with `reason`, announced when `announce` or the reason changed."""
        existing = await self.ledger.get_allocation(stored.allocation_id)
        if existing is not None:
            # Another scheduler placed (or ended) this workload meanwhile; report what the ledger holds.
            return await self.status_of(stored.allocation_id)
        async with self.ledger.transaction() as transaction:
            moved = await self.store.transition(
                stored.allocation_id, Transition.WAIT, reason, self.clock(), connection=transaction.connection
            )
            if moved and (announce or stored.reason != reason):
                await transaction.announce(self._unschedulable(stored, reason, rejection, cause))
        if not moved:
            return await self.status_of(stored.allocation_id)
        return stored_status(replace(stored, state=target(Transition.WAIT), reason=reason))

    async def wait_many(self, waiting: list[Waiting], announce: bool) -> dict[UUID, WorkloadStatus]:
        """`wait` for many workloads with a few statements: keep them pending with their reasons."""
        if not waiting:
            return {}
        statuses: dict[UUID, WorkloadStatus] = {}
        existing = await self.ledger.get_allocations([stored.allocation_id for stored, *_rest in waiting])
        reasons = {
            stored.allocation_id: reason
            for stored, _cause, reason, _rejection in waiting
            if stored.allocation_id not in existing
        }
        async with self.ledger.transaction() as transaction:
            kept = await self.store.keep_pending(reasons, self.clock(), connection=transaction.connection)
            await transaction.announce(
                *(
                    self._unschedulable(stored, reason, rejection, cause)
                    for stored, cause, reason, rejection in waiting
                    if stored.allocation_id in kept and (announce or stored.reason != reason)
                )
            )
        for stored, _cause, reason, _rejection in waiting:
            if stored.allocation_id not in kept:
                # Another scheduler placed (or ended) it meanwhile: report what the ledger holds.
                statuses[stored.allocation_id] = await self.status_of(stored.allocation_id)
                continue
            statuses[stored.allocation_id] = stored_status(
                replace(stored, state=target(Transition.WAIT), reason=reason)
            )
        return statuses

    async def status_of(self, allocation_id: UUID) -> WorkloadStatus:
        """The stored workload's status; a placed one with its node and GPUs from the ledger."""
        stored = await self.store.get(allocation_id)
        assert stored is not None
        if stored.state == "placed":
            record = await self.ledger.get_allocation(allocation_id)
            if record is not None:
                return placed_status(record)
        return stored_status(stored)

    def _unschedulable(
        self, stored: StoredWorkload, reason: str, rejection: Rejection | None, cause: UUID | None
    ) -> WorkloadUnschedulable:
        """The verdict's `tf.evt.workload.unschedulable` (one event per attempt), for the outbox in the
        transaction that records the verdict."""
        return unschedulable_event(
            stored.submission.workload,
            stored.submission.request.pool,
            reason,
            rejection,
            attempt=uuid4(),
            now=self.clock(),
            cause=cause,
        )


def placed_status(record: AllocationRecord) -> WorkloadStatus:
    """The status of a workload placed as `record` says: its node and GPUs."""
    return WorkloadStatus(
        id=record.allocation_id,
        workload=record.workload,
        state=target(Transition.PLACE),
        node=record.node,
        gpu_uuids=tuple(share.gpu_uuid for share in record.shares),
    )


def stored_status(stored: StoredWorkload) -> WorkloadStatus:
    """The status the workload store holds: its state and reason."""
    return WorkloadStatus(
        id=stored.allocation_id, workload=stored.submission.workload, state=stored.state, reason=stored.reason
    )


def reservation_for(
    allocation_id: UUID,
    submission: Submission,
    gpu_request: GpuRequest,
    outcome: Placement,
    cause: UUID | None,
) -> ReservationRequest:
    """What the ledger is asked to reserve for `outcome`: each GPU's share, its limits no lower than
    the request's or the share itself."""
    return ReservationRequest(
        allocation_id=allocation_id,
        workload=submission.workload,
        pool=submission.request.pool,
        node=outcome.node,
        shares=tuple(
            ShareRequest(
                gpu_uuid=gpu_uuid,
                tflops_milli=tflops,
                vram_bytes=vram,
                limit_tflops_milli=max(gpu_request.tflops_limit_milli, tflops, limit_tflops),
                limit_vram_bytes=max(gpu_request.vram_limit_bytes, vram, limit_vram),
            )
            for gpu_uuid, tflops, vram, limit_tflops, limit_vram in zip(
                outcome.gpu_uuids,
                outcome.tflops_milli,
                outcome.vram_bytes,
                outcome.limit_tflops_milli or outcome.tflops_milli,
                outcome.limit_vram_bytes or outcome.vram_bytes,
                strict=True,
            )
        ),
        qos=submission.request.qos,
        isolation=submission.request.isolation,
        cause=cause,
        eviction_protection_s=submission.eviction_protection_s or None,
    )
