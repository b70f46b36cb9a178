"""Gang placement in the engine (issue 16, item 5), real Postgres and NATS: the members of a gang are
reserved together in one ledger transaction or not at all; none is placed before min-members can be;
after the timeout the waiting members are told so, with the gang and the numbers. In a quota namespace
the gang is checked whole against the quota's totals in its transaction (none reserved when over it,
the quota named), and each member against `single`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
import sqlalchemy as sa
from scheduler_builders import GIB, a_submission, register_named_node
from tfcommon.bus import NatsEventBus
from tfcommon.events import WorkloadRef, WorkloadUnschedulable
from tfcommon.ledger import tables
from tfcommon.ledger.records import InsufficientCapacity, ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.core.quota import NamespaceQuota, usage_of_shares
from tfscheduler.engine import Scheduler
from tfscheduler.submission import Gang, Submission

pytestmark = pytest.mark.integration
LONG = timedelta(hours=1)
CARD = 80 * GIB
"""The builders' cards hold 80 GiB: a member asking that much takes a whole card."""


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


async def started(
    ledger: SqlLedger, bus: NatsEventBus, cards: int, clock: Callable[[], datetime]
) -> Scheduler:
    for n in range(cards):
        await register_named_node(ledger, f"node-{n}-{uuid4().hex[:6]}", 1)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG, clock=clock)
    await scheduler.start()
    return scheduler


async def unschedulable_events(ledger: SqlLedger) -> int:
    async with ledger.engine.connect() as connection:
        count = await connection.scalar(
            sa.select(sa.func.count())
            .select_from(tables.outbox)
            .where(tables.outbox.c.subject == WorkloadUnschedulable.subject)
        )
    return int(count or 0)


def member(n: int, *, min_members: int, timeout_s: int = 0, key: str = "team-a/train") -> Submission:
    plain = a_submission(name=f"train-{n}", vram_bytes=CARD)
    return plain.model_copy(
        update={"gang": Gang(group_key=key, min_members=min_members, timeout_s=timeout_s)}
    )


async def test_a_gang_of_four_on_three_cards_reserves_none_and_times_out_naming_the_gang(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    clock = Clock()
    scheduler = await started(ledger, bus, cards=3, clock=clock)

    statuses = [await scheduler.submit(member(n, min_members=4, timeout_s=30)) for n in range(4)]

    assert [status.state for status in statuses] == ["pending"] * 4
    assert await ledger.active_allocations() == []
    assert statuses[-1].reason is not None
    assert "3 of min 4 members fit" in statuses[-1].reason
    assert "gang team-a/train is waiting (up to 30s)" in statuses[-1].reason

    clock.now += timedelta(seconds=31)
    await scheduler.retry_pending()

    for status in statuses:
        current = await scheduler.status(status.id)
        assert current is not None
        assert current.state == "pending"
        assert current.reason is not None
        assert current.reason.startswith("gang team-a/train timed out after 30s: 3 of min 4 members fit")
    assert await ledger.active_allocations() == []
    timed_out = await unschedulable_events(ledger)

    again = await scheduler.submit(member(0, min_members=4, timeout_s=30))  # Kubernetes mode's retry

    assert again.state == "pending"
    assert await unschedulable_events(ledger) == timed_out + 1, (
        "only the resubmitted member is announced again"
    )


async def test_no_member_is_placed_before_min_members_exist_then_all_together(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    scheduler = await started(ledger, bus, cards=4, clock=Clock())

    first = [await scheduler.submit(member(n, min_members=3)) for n in range(2)]

    assert [status.state for status in first] == ["pending", "pending"]
    assert first[-1].reason is not None
    assert "2 of min 3 members exist" in first[-1].reason
    assert await ledger.active_allocations() == []

    third = await scheduler.submit(member(2, min_members=3))

    assert third.state == "placed"
    placed = {allocation.allocation_id for allocation in await ledger.active_allocations()}
    assert placed == {first[0].id, first[1].id, third.id}
    for status in first:
        current = await scheduler.status(status.id)
        assert current is not None
        assert current.state == "placed"
    history = [entry for entry in await ledger.history() if entry.kind == "opened"]
    assert len({entry.occurred_at for entry in history}) == 1, "the gang is reserved in one transaction"


async def test_min_members_three_places_three_of_four_and_the_fourth_waits(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    scheduler = await started(ledger, bus, cards=3, clock=Clock())

    statuses = [await scheduler.submit(member(n, min_members=3)) for n in range(4)]

    current = [await scheduler.status(status.id) for status in statuses]
    assert sorted(status.state for status in current if status) == ["pending", "placed", "placed", "placed"]
    assert len(await ledger.active_allocations()) == 3
    left = next(status for status in current if status and status.state == "pending")
    assert left.reason is not None
    assert "gang team-a/train: 3 members are placed (min 3); this one does not fit now" in left.reason


async def test_a_ledger_refusal_mid_gang_leaves_nothing_reserved(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    scheduler = await started(ledger, bus, cards=4, clock=Clock())
    for n in range(3):
        assert (await scheduler.submit(member(n, min_members=4))).state == "pending"
    # Another writer fills one card behind the scheduler's view: its placement of the gang still has
    # four cards free, and the ledger refuses the member that lands on the taken one.
    gpu = (await ledger.list_gpus())[-1]
    outsider = ReservationRequest(
        allocation_id=uuid4(),
        workload=WorkloadRef(namespace="other", name="outsider", uid=str(uuid4())),
        pool="default",
        node=gpu.node,
        shares=(ShareRequest(gpu_uuid=gpu.uuid, tflops_milli=10_000, vram_bytes=CARD),),
    )
    taken = await ledger.reserve(outsider, commit=True)
    assert not isinstance(taken, InsufficientCapacity)

    fourth = await scheduler.submit(member(3, min_members=4))

    assert fourth.state == "pending"
    active = await ledger.active_allocations()
    assert [allocation.allocation_id for allocation in active] == [outsider.allocation_id]
    assert fourth.reason is not None
    assert "gang team-a/train" in fourth.reason


async def test_preemption_never_evicts_a_gang_member(ledger: SqlLedger, bus: NatsEventBus) -> None:
    scheduler = await started(ledger, bus, cards=2, clock=Clock())
    gang = [await scheduler.submit(member(n, min_members=2)) for n in range(2)]
    assert [status.state for status in gang] == ["pending", "placed"]

    urgent = await scheduler.submit(a_submission(name="urgent", vram_bytes=CARD, priority=1_000_000))

    assert urgent.state == "pending"
    active = {allocation.allocation_id for allocation in await ledger.active_allocations()}
    assert active == {status.id for status in gang}


async def test_a_gang_over_its_namespace_quota_reserves_none_and_places_whole_once_it_is_raised(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    scheduler = await started(ledger, bus, cards=3, clock=Clock())
    scheduler.quotas = {"team-a": NamespaceQuota(namespace="team-a", max_workers=2)}

    statuses = [await scheduler.submit(member(n, min_members=3)) for n in range(3)]

    assert [status.state for status in statuses] == ["pending"] * 3
    assert await ledger.active_allocations() == []
    for status in statuses:
        current = await scheduler.status(status.id)
        assert current is not None
        assert current.reason is not None
        assert (
            "gang team-a/train: GPUResourceQuota team-a/team-a: total.maxWorkers would be 3 of 2 (in use 0)"
            in current.reason
        ), current.reason
    assert await unschedulable_events(ledger) >= 1

    scheduler.quotas = {"team-a": NamespaceQuota(namespace="team-a", max_workers=3)}
    assert await scheduler.retry_pending() == 3

    placed = {allocation.allocation_id for allocation in await ledger.active_allocations()}
    assert placed == {status.id for status in statuses}
    history = [entry for entry in await ledger.history() if entry.kind == "opened"]
    assert len({entry.occurred_at for entry in history}) == 1, "the gang is reserved in one transaction"
    used = usage_of_shares(await ledger.namespace_shares(["team-a"]))["team-a"]  # what the status shows
    assert used.workers == 3
    assert used.requests_vram_bytes == 3 * CARD


async def test_a_gang_member_over_the_quotas_single_limit_is_refused_and_none_is_reserved(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    scheduler = await started(ledger, bus, cards=3, clock=Clock())
    scheduler.quotas = {"team-a": NamespaceQuota(namespace="team-a", max_request_vram_bytes=40 * GIB)}

    statuses = [await scheduler.submit(member(n, min_members=3)) for n in range(3)]

    assert await ledger.active_allocations() == []
    for status in statuses:
        current = await scheduler.status(status.id)
        assert current is not None
        assert current.state != "placed"
        assert current.reason is not None
        assert "GPUResourceQuota team-a/team-a: single.maxRequests.vram is 40Gi per workload, asked 80Gi" in (
            current.reason
        ), current.reason
