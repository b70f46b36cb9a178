"""What each submission batch reads from the ledger, however fresh the scheduler's view (real Postgres, NATS).

A batch reads the defrag holds itself: a hold the defrag planner (another process) reserved after the
scheduler last read the ledger still goes to its replacement. A batch marks its workloads placed in the
reservations' own transaction: once `submit` says placed, the stored workload says so too.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
import sqlalchemy as sa
from scheduler_builders import GIB, a_submission, register_named_node
from tfcommon.bus import NatsEventBus
from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import HoldFor, ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.core.view import allocation_id_for
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


async def test_a_batch_the_ledger_abandons_is_recorded_and_placed_in_two_steps(
    ledger: SqlLedger, bus: NatsEventBus, caplog: pytest.LogCaptureFixture
) -> None:
    """The one-transaction path gives up when Postgres aborts it (here a deadlock, injected once by a
    trigger); the batch is then recorded and reserved as two transactions, nothing lost or doubled."""
    await register_named_node(ledger, "gpu-node-abandon", 2)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=timedelta(hours=1))
    await scheduler.start()
    submissions = [a_submission(tflops_milli=10_000) for _ in range(4)]
    target = allocation_id_for(submissions[2].workload)
    async with ledger.engine.begin() as connection:
        for statement in (
            "CREATE SEQUENCE abandon_once",
            f"""CREATE FUNCTION abandon_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.allocation_id = '{target}' THEN
                    IF nextval('abandon_once') = 1 THEN
                        RAISE EXCEPTION 'injected deadlock' USING ERRCODE = '40P01';
                    END IF;
                END IF;
                RETURN NEW;
            END $$""",
            "CREATE TRIGGER abandon_once BEFORE INSERT ON allocation "
            "FOR EACH ROW EXECUTE FUNCTION abandon_once()",
        ):
            await connection.execute(sa.text(statement))
    try:
        with caplog.at_level(logging.INFO, logger="tfscheduler"):
            statuses = await asyncio.gather(*(scheduler.submit(submission) for submission in submissions))
        async with ledger.engine.connect() as connection:
            target_inserts = await connection.scalar(sa.text("SELECT last_value FROM abandon_once"))
    finally:
        async with ledger.engine.begin() as connection:
            await connection.execute(sa.text("DROP TRIGGER abandon_once ON allocation"))
            await connection.execute(sa.text("DROP FUNCTION abandon_once()"))
            await connection.execute(sa.text("DROP SEQUENCE abandon_once"))

    assert target_inserts == 2, "the injected deadlock aborted the first try, the second went through"
    assert "one-transaction batch abandoned; placing in two steps" in caplog.messages
    assert [status.state for status in statuses] == ["placed"] * 4
    ids = [status.id for status in statuses]
    assert len(set(ids)) == 4
    active = [a for a in await ledger.active_allocations() if a.allocation_id in ids]
    assert sorted(a.allocation_id for a in active) == sorted(ids), "one allocation per workload"
    stored = await scheduler.store.by_ids(ids)
    assert {workload.state for workload in stored.values()} == {"placed"}
    assert scheduler.learned_submissions == 4, "the abandoned try's submissions were counted once"
    used = [gpu.used_tflops_milli for gpu in await ledger.list_gpus() if gpu.node == "gpu-node-abandon"]
    assert sum(used) == 40_000, "each workload's capacity taken once"


async def test_a_defrag_hold_is_never_preempted(ledger: SqlLedger, bus: NatsEventBus) -> None:
    """A hold keeps capacity for a pod in flight and has no pod of its own to evict: a critical
    workload that fits nowhere else waits rather than take it."""
    await register_named_node(ledger, "gpu-node-held", 1)
    [gpu] = [g.uuid for g in await ledger.list_gpus() if g.node == "gpu-node-held"]
    hold_id = uuid4()
    held = await ledger.reserve_hold(
        ReservationRequest(
            allocation_id=hold_id,
            workload=WorkloadRef(namespace="tfpool-defrag", name="hold-team-b-job", uid=str(hold_id)),
            pool="default",
            node="gpu-node-held",
            shares=(ShareRequest(gpu_uuid=gpu, tflops_milli=100_000, vram_bytes=80 * GIB),),
            qos="low",
        ),
        HoldFor(
            pool="default",
            namespace="team-b",
            name="job",
            owner_uid=None,
            expires_at=datetime.now(UTC) + timedelta(minutes=10),
        ),
    )
    assert isinstance(held, Reserved)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=timedelta(hours=1))
    await scheduler.start()

    urgent = await scheduler.submit(a_submission(tflops_milli=50_000, vram_bytes=8 * GIB, qos="critical"))

    assert urgent.state == "pending"
    hold = await ledger.get_allocation(hold_id)
    assert hold is not None
    assert hold.state != "released"
