"""What each submission batch reads from the ledger, however fresh the scheduler's view (real Postgres, NATS).

A batch reads the defrag holds itself: a hold the defrag planner (another process) reserved after the
scheduler last read the ledger still goes to its replacement. A batch marks its workloads placed in the
reservations' own transaction: once `submit` says placed, the stored workload says so too.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from scheduler_builders import GIB, a_submission, register_named_node
from tfcommon.bus import NatsEventBus
from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import HoldFor, ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.engine import Scheduler

pytestmark = pytest.mark.integration


async def test_a_hold_reserved_after_the_last_read_goes_to_the_replacement(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_named_node(ledger, "gpu-node-1", 2)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=timedelta(hours=1))
    await scheduler.start()
    first = await scheduler.submit(a_submission(tflops_milli=10_000))
    assert first.state == "placed", "a first batch read the holds: none then"
    gpu = sorted(g.uuid for g in await ledger.list_gpus())[1]
    hold_id = uuid4()
    held = await ledger.reserve_hold(
        ReservationRequest(
            allocation_id=hold_id,
            workload=WorkloadRef(namespace="tfpool-defrag", name="hold-team-a-web-abc", uid=str(hold_id)),
            pool="default",
            node="gpu-node-1",
            shares=(ShareRequest(gpu_uuid=gpu, tflops_milli=30_000, vram_bytes=20 * GIB),),
        ),
        HoldFor(
            pool="default",
            namespace="team-a",
            name="web-abc",
            owner_uid=None,
            expires_at=datetime.now(UTC) + timedelta(minutes=10),
        ),
    )
    assert isinstance(held, Reserved)

    replacement = await scheduler.submit(
        a_submission(name="web-abc", tflops_milli=30_000, vram_bytes=20 * GIB)
    )

    assert (replacement.state, replacement.gpu_uuids) == ("placed", (gpu,))
    hold = await ledger.get_allocation(hold_id)
    assert hold is not None
    assert (hold.state, hold.release_reason) == ("released", "defrag hold claimed by team-a/web-abc")
    assert await ledger.active_holds() == []


async def test_a_placed_submission_is_stored_as_placed(ledger: SqlLedger, bus: NatsEventBus) -> None:
    await register_named_node(ledger, "gpu-node-1", 1)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=timedelta(hours=1))
    await scheduler.start()

    statuses = [await scheduler.submit(a_submission()) for _ in range(3)]

    assert [status.state for status in statuses] == ["placed"] * 3
    stored = await scheduler.store.by_ids([status.id for status in statuses])
    assert {workload.state for workload in stored.values()} == {"placed"}
    assert await scheduler.store.pending() == []
