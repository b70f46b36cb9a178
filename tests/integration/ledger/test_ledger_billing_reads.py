"""`held_shares()`: each GPU share's held interval from the allocation history, as billing reads it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from tfcommon.events import WorkloadRef
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import HeldShare, ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus

pytestmark = pytest.mark.integration

T0 = datetime(2031, 3, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def test_held_shares_are_the_intervals_that_overlap_the_period_by_opening(ledger: SqlLedger) -> None:
    clock = Clock()
    timed: Ledger = SqlLedger(ledger.engine, clock=clock)
    node, (first_gpu, second_gpu) = await a_node_with_gpus(ledger, gpus=2)

    async def reserve_at(
        at: timedelta, name: str, gpus: list[str], *, eviction_protection_s: int | None = None
    ) -> ReservationRequest:
        clock.now = T0 + at
        request = ReservationRequest(
            allocation_id=uuid4(),
            workload=WorkloadRef(namespace="team-b", name=name, uid=f"uid-{name}", workload=f"{name}-set"),
            pool="default",
            node=node,
            shares=tuple(
                ShareRequest(gpu, 10_000, 4 * GIB, limit_tflops_milli=20_000, limit_vram_bytes=8 * GIB)
                for gpu in gpus
            ),
            qos="high",
            eviction_protection_s=eviction_protection_s,
        )
        assert isinstance(await timed.reserve(request), Reserved)
        return request

    async def release_at(at: timedelta, request: ReservationRequest, *, evicted: bool = False) -> None:
        clock.now = T0 + at
        assert await timed.release(request.allocation_id, "pod-deleted", evicted=evicted)

    before = await reserve_at(-timedelta(hours=2), "before", [first_gpu])
    await release_at(-timedelta(hours=1), before)
    both = await reserve_at(timedelta(hours=1), "both", [first_gpu, second_gpu], eviction_protection_s=600)
    evicted = await reserve_at(timedelta(hours=2), "evicted", [first_gpu])
    await release_at(timedelta(hours=3), both)
    held = await reserve_at(timedelta(hours=4), "held", [second_gpu])
    await release_at(timedelta(hours=5), evicted, evicted=True)

    shares = await timed.held_shares(T0, T0 + timedelta(hours=4))

    assert [(share.workload.name, share.gpu_uuid) for share in shares[:2]] in (
        [("both", first_gpu), ("both", second_gpu)],
        [("both", second_gpu), ("both", first_gpu)],
    )
    assert [share.workload.name for share in shares[2:]] == ["evicted"]
    assert shares[0] == HeldShare(
        allocation_id=both.allocation_id,
        gpu_uuid=shares[0].gpu_uuid,
        workload=WorkloadRef(namespace="team-b", name="both", uid="uid-both", workload="both-set"),
        qos="high",
        pool="default",
        gpu_model="H100",
        request_tflops_milli=10_000,
        request_vram_bytes=4 * GIB,
        limit_tflops_milli=20_000,
        limit_vram_bytes=8 * GIB,
        eviction_protection_s=600,
        start=T0 + timedelta(hours=1),
        end=T0 + timedelta(hours=3),
    )
    assert (shares[2].start, shares[2].end, shares[2].eviction_protection_s) == (
        T0 + timedelta(hours=2),
        T0 + timedelta(hours=5),
        None,
    )

    later = await timed.held_shares(T0 + timedelta(hours=4), T0 + timedelta(hours=6))

    assert [(share.allocation_id, share.start, share.end) for share in later] == [
        (evicted.allocation_id, T0 + timedelta(hours=2), T0 + timedelta(hours=5)),
        (held.allocation_id, T0 + timedelta(hours=4), None),
    ]
    assert await timed.held_shares(T0 + timedelta(hours=7), T0 + timedelta(hours=8)) == [
        share for share in later if share.end is None
    ]
