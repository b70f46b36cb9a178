"""An eviction is one committed fact (issue 20): the victim released as evicted, its state, its replacement
and `tf.evt.pod.evicted` (through the ledger outbox) commit together or not at all; and a verdict with
its `tf.evt.workload.unschedulable`, so that a bus outage fails no submission.

Real Postgres and a NATS server of the test's own, stopped while the scheduler preempts or evicts (every
publish then fails, as during a bus outage or a partition) and started again with its JetStream store,
after which the outbox relay delivers the eviction event: once, with its deterministic id.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar
from uuid import UUID, uuid5

import pytest
import sqlalchemy as sa
from scheduler_builders import GIB, a_submission, register_nodes
from sqlalchemy.exc import DBAPIError
from tfcommon.bus import NatsEventBus
from tfcommon.events import Message, PodEvicted, WorkloadUnschedulable
from tfcommon.infra import EmbeddedNats
from tfcommon.ledger import tables
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import relayed_events
from tfscheduler.engine import Scheduler
from tfscheduler.submission import WorkloadStatus
from tfscheduler.workloads import StoredWorkload

pytestmark = pytest.mark.integration
LONG = timedelta(hours=1)
BusOf = Callable[[str], contextlib.AbstractAsyncContextManager[NatsEventBus]]
M = TypeVar("M", bound=Message)


async def scheduler_on(ledger: SqlLedger, bus: NatsEventBus) -> Scheduler:
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    return scheduler


async def relayed(ledger: SqlLedger, bus_of: BusOf, message_type: type[M]) -> list[tuple[str, M]]:
    """Each `message_type` event in the stream, with its message id, once the relay has published the
    outbox (NATS started again)."""
    async with bus_of("outbox-relay") as bus:
        found = await relayed_events(ledger, bus, message_type.subject)
    return [(message_id, event) for message_id, event in found if isinstance(event, message_type)]


async def replacement_of(scheduler: Scheduler, victim: WorkloadStatus) -> StoredWorkload | None:
    """The workload recreated for the evicted `victim`: same name, a new uid, pending or placed."""
    found = await scheduler.store.live_by_name(victim.workload.namespace, victim.workload.name)
    return None if found is None or found.allocation_id == victim.id else found


async def outbox_evictions(ledger: SqlLedger) -> list[UUID]:
    async with ledger.engine.connect() as connection:
        rows = await connection.execute(
            sa.select(tables.outbox.c.event_id).where(tables.outbox.c.subject == PodEvicted.subject)
        )
        return [event_id for (event_id,) in rows]


async def test_a_preemption_while_nats_is_down_recreates_the_victim_and_announces_it_once(
    ledger: SqlLedger, own_nats: EmbeddedNats, own_nats_bus: BusOf
) -> None:
    await register_nodes(ledger, nodes=1, gpus=1)
    async with own_nats_bus("scheduler") as bus:
        scheduler = await scheduler_on(ledger, bus)
        victim = await scheduler.submit(a_submission(tflops_milli=80_000, qos="low", name="batch"))
        assert victim.state == "placed"

        own_nats.stop()
        [preempting] = await asyncio.gather(
            scheduler.submit(a_submission(tflops_milli=50_000, qos="critical", name="urgent")),
            return_exceptions=True,
        )

        evicted = await scheduler.status(victim.id)
        assert evicted is not None
        assert evicted.state == "evicted"
        replacement = await replacement_of(scheduler, victim)
        assert replacement is not None, "the evicted workload vanished: no replacement was recorded"
        assert replacement.state in ("pending", "placed")
        assert replacement.submission.workload.uid != victim.workload.uid
        assert isinstance(preempting, WorkloadStatus), f"the preemptor's submission failed: {preempting!r}"
        assert preempting.state == "placed"
        assert [entry.kind for entry in await ledger.history(victim.id)] == ["opened", "committed", "evicted"]

        own_nats.start()
        delivered = await relayed(ledger, own_nats_bus, PodEvicted)

    event_id = uuid5(victim.id, "evicted")
    assert [(message_id, event.event_id) for message_id, event in delivered] == [(str(event_id), event_id)]
    [(_message_id, event)] = delivered
    assert (event.allocation_id, event.workload, event.by) == (victim.id, victim.workload, "preemption")
    assert event.preemptor is not None
    assert event.preemptor.name == "urgent"
    assert event.reason == "preempted by team-a/urgent"


async def test_the_eviction_api_while_nats_is_down_recreates_the_workload_and_announces_it_once(
    ledger: SqlLedger, own_nats: EmbeddedNats, own_nats_bus: BusOf
) -> None:
    await register_nodes(ledger, nodes=1, gpus=1)
    async with own_nats_bus("scheduler") as bus:
        scheduler = await scheduler_on(ledger, bus)
        placed = await scheduler.submit(a_submission(name="serve"))
        assert placed.state == "placed"

        own_nats.stop()
        [answer] = await asyncio.gather(
            scheduler.evict(placed.id, "node maintenance", by="drain"), return_exceptions=True
        )

        assert not isinstance(answer, BaseException), f"the eviction failed: {answer!r}"
        assert answer is not None
        assert answer.state == "placed", "the replacement is placed again at once"
        evicted = await scheduler.status(placed.id)
        assert evicted is not None
        assert evicted.state == "evicted"
        replacement = await replacement_of(scheduler, placed)
        assert replacement is not None
        assert replacement.allocation_id == answer.id
        again = await scheduler.evict(placed.id, "node maintenance", by="drain")
        assert again is not None
        assert again.id == answer.id, "evicting twice yields the same replacement"

        own_nats.start()
        delivered = await relayed(ledger, own_nats_bus, PodEvicted)

    event_id = uuid5(placed.id, "evicted")
    assert [(message_id, event.by, event.reason) for message_id, event in delivered] == [
        (str(event_id), "drain", "node maintenance")
    ]


async def test_an_eviction_whose_transaction_fails_changes_nothing(
    ledger: SqlLedger, own_nats_bus: BusOf
) -> None:
    """Postgres refuses the replacement's row mid-transaction: the victim stays placed with its capacity,
    no eviction is recorded or announced; once the refusal is gone the same preemption succeeds."""
    await register_nodes(ledger, nodes=1, gpus=1)
    async with own_nats_bus("scheduler") as bus:
        scheduler = await scheduler_on(ledger, bus)
        victim = await scheduler.submit(a_submission(tflops_milli=80_000, qos="low", name="batch"))
        assert victim.state == "placed"
        async with ledger.engine.begin() as connection:
            await connection.execute(
                sa.text(
                    "CREATE FUNCTION refuse_replacement() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'injected: the replacement row is refused'; END $$"
                )
            )
            await connection.execute(
                sa.text(
                    "CREATE TRIGGER refuse_replacement BEFORE INSERT ON scheduler_workload FOR EACH ROW "
                    "WHEN (NEW.name = 'batch') EXECUTE FUNCTION refuse_replacement()"
                )
            )

        with pytest.raises(DBAPIError, match="injected: the replacement row is refused"):
            await scheduler.submit(a_submission(tflops_milli=50_000, qos="critical", name="urgent"))

        kept = await ledger.get_allocation(victim.id)
        assert kept is not None
        assert kept.state == "committed"
        assert [entry.kind for entry in await ledger.history(victim.id)] == ["opened", "committed"]
        [gpu] = await ledger.list_gpus()
        assert gpu.used_tflops_milli == 80_000
        stored = await scheduler.status(victim.id)
        assert stored is not None
        assert stored.state == "placed"
        assert await replacement_of(scheduler, victim) is None
        assert await outbox_evictions(ledger) == []
        assert victim.id in scheduler.active, "the scheduler's memory still holds the victim"

        async with ledger.engine.begin() as connection:
            await connection.execute(sa.text("DROP TRIGGER refuse_replacement ON scheduler_workload"))
        retried = await scheduler.submit(a_submission(tflops_milli=50_000, qos="critical", name="urgent"))
        assert retried.state == "placed"
        evicted = await scheduler.status(victim.id)
        assert evicted is not None
        assert evicted.state == "evicted"
        assert await replacement_of(scheduler, victim) is not None
        assert await outbox_evictions(ledger) == [uuid5(victim.id, "evicted")]


async def test_a_batch_answered_while_nats_is_down_gets_its_verdicts_and_announces_them_once(
    ledger: SqlLedger, own_nats: EmbeddedNats, own_nats_bus: BusOf
) -> None:
    await register_nodes(ledger, nodes=1, gpus=1, vram_bytes=16 * GIB)
    async with own_nats_bus("scheduler") as bus:
        scheduler = await scheduler_on(ledger, bus)
        own_nats.stop()
        submissions = [a_submission(vram_bytes=4 * GIB, name=f"fits-{n}") for n in range(3)]
        submissions.append(a_submission(vram_bytes=8 * GIB, name="waits"))  # 12 of 16 GiB are taken
        answers = await asyncio.gather(*(scheduler.submit(s) for s in submissions), return_exceptions=True)

        failed = [answer for answer in answers if not isinstance(answer, WorkloadStatus)]
        assert failed == [], "no submission fails because the bus is down"
        assert [answer.state for answer in answers if isinstance(answer, WorkloadStatus)] == [
            "placed",
            "placed",
            "placed",
            "pending",
        ]
        own_nats.start()
        verdicts = [event for _id, event in await relayed(ledger, own_nats_bus, WorkloadUnschedulable)]

    assert [(event.workload.name, event.summary) for event in verdicts] == [
        ("waits", answers[3].reason)  # type: ignore[union-attr]
    ], "the verdict is announced once"
