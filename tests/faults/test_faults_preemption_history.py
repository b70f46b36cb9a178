"""The history checker catches issue 20's defect on a real run: a preemption while NATS is down.

The scheduler runs on real Postgres and a NATS server of the test's own, which is stopped while a
`critical` workload preempts a `low` one, then started again for the outbox relay. What the run left
(the ledger's `allocation_history`, every message in `TF_EVENTS`, the pending workloads and states)
is read as the fault campaign reads it (`tfctl.faults.read_history`, `read_stream_events`) and
checked with `tfctl.history_check.history_figures`.

With the eviction path from before the fix (`engine.py` at 578a873^: the release committed, then
`tf.evt.pod.evicted` published straight to NATS, then the replacement queued), injected through the
engine's `_evict` seam by a subclass this test owns, the checker counts the preempted workload
`lost` twice (no event on the bus, never recreated); with today's engine it counts nothing lost and
one preemption.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4, uuid5

import pytest
from tfcommon import pod_spec, subjects
from tfcommon.bus import NatsEventBus
from tfcommon.events import GpuRequest, PodEvicted, QosLevel, WorkloadRef
from tfcommon.infra import EmbeddedNats
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.records import GpuSpec, NodeSpec
from tfcommon.ledger.sql import SqlLedger
from tfctl.fault_checks import Operation, WorkloadKey
from tfctl.faults import read_history, read_stream_events
from tfctl.history_check import BillPeriod, HistoryFigures, history_figures
from tfscheduler.core.lifecycle import Transition
from tfscheduler.core.preemption import Candidate
from tfscheduler.core.view import allocation_id_for
from tfscheduler.engine import Scheduler
from tfscheduler.submission import Submission, WorkloadStatus

pytestmark = pytest.mark.integration
GIB = 1024**3
BusOf = Callable[[str], contextlib.AbstractAsyncContextManager[NatsEventBus]]


class PublishThenQueue(Scheduler):
    """The scheduler with the local eviction of before the fix: each step its own commit, the event
    published directly, the replacement queued last (so a failed publish loses it)."""

    async def _evict(self, victim: Candidate, preemptor: WorkloadRef) -> None:
        allocation_id = UUID(str(victim.allocation_id))
        reason = f"preempted by {preemptor.namespace}/{preemptor.name}"
        if await self.ledger.release(allocation_id, reason, evicted=True):
            self.view.release(victim.holding)
        self.active.drop(allocation_id)
        now = self.clock()
        await self.store.transition(allocation_id, Transition.EVICT, reason, now)
        await self.bus.publish(
            PodEvicted(
                event_id=uuid5(allocation_id, "evicted"),
                occurred_at=now,
                workload=victim.workload,
                node=victim.node,
                pool="default",
                by="preemption",
                reason=reason,
                allocation_id=allocation_id,
                preemptor=preemptor,
            )
        )
        stored = await self.store.get(allocation_id)
        if stored is not None:
            old = stored.submission.workload
            workload = old.model_copy(update={"uid": str(uuid5(allocation_id, "replacement"))})
            replacement = stored.submission.model_copy(update={"workload": workload})
            await self.store.insert(allocation_id_for(workload), replacement, now)


@pytest.fixture
async def ledger(migrated_database_url: str) -> AsyncIterator[SqlLedger]:
    sql_ledger = SqlLedger.create(migrated_database_url, pool_size=5)
    try:
        await sql_ledger.upsert_node(NodeSpec(name="node-a", pool="default"))
        await sql_ledger.record_heartbeat("node-a")
        await sql_ledger.upsert_gpu(
            GpuSpec(f"gpu-{uuid4()}", "node-a", 0, "H100", "NVIDIA", 100_000, 80 * GIB)
        )
        yield sql_ledger
    finally:
        await sql_ledger.close()


def a_submission(name: str, qos: QosLevel, tflops_milli: int) -> Submission:
    return Submission(
        workload=WorkloadRef(namespace="team-a", name=name, uid=str(uuid4())),
        request=GpuRequest(
            pool="default",
            tflops_request_milli=tflops_milli,
            tflops_limit_milli=tflops_milli,
            vram_request_bytes=8 * GIB,
            vram_limit_bytes=8 * GIB,
            qos=qos,
        ),
        priority=pod_spec.priority_of(qos),
    )


def key_of(submission: Submission) -> WorkloadKey:
    workload = submission.workload
    return (workload.namespace, workload.name, workload.uid or "")


def recorded(submission: Submission, answer: WorkloadStatus | BaseException) -> Operation:
    """The campaign's record of one submission: acknowledged with the scheduler's answer, or unknown."""
    if isinstance(answer, BaseException):
        return Operation("submit", key_of(submission), "unknown", 0.0, 1.0, detail=type(answer).__name__)
    return Operation(
        "submit", key_of(submission), "ok", 0.0, 1.0, allocation_id=answer.id, state=answer.state
    )


async def preempt_while_nats_is_down(
    engine: type[Scheduler], ledger: SqlLedger, own_nats: EmbeddedNats, own_nats_bus: BusOf
) -> HistoryFigures:
    """Place a `low` workload, stop NATS, submit a `critical` one that must preempt it, drop the
    scheduler's connection (what it had not sent is gone, as in a crash), start NATS, relay the
    outbox, then check the history."""
    start = datetime.now(UTC)
    victim, preemptor = a_submission("batch", "low", 80_000), a_submission("urgent", "critical", 50_000)
    async with own_nats_bus("scheduler") as bus:
        scheduler = engine(ledger, bus, heartbeat_timeout=timedelta(hours=1))
        await scheduler.start()
        placed = await scheduler.submit(victim)
        assert placed.state == "placed"
        own_nats.stop()
        [answer] = await asyncio.gather(scheduler.submit(preemptor), return_exceptions=True)
        pending = {
            (s.submission.workload.namespace, s.submission.workload.name): s.reason
            for s in await scheduler.store.pending()
        }
        states: dict[WorkloadKey, str | None] = {}
        for submission in (victim, preemptor):
            status = await scheduler.status(allocation_id_for(submission.workload))
            states[key_of(submission)] = None if status is None else status.state
    own_nats.start()
    async with own_nats_bus("outbox-relay") as relay_bus:
        relay = OutboxRelay(ledger, relay_bus)
        while await relay.publish_pending():
            pass
        events = []
        for subject in (subjects.ALLOCATION_CREATED, subjects.ALLOCATION_RELEASED, subjects.POD_EVICTED):
            events += await read_stream_events(relay_bus.js, subject)
    history = await read_history(ledger.engine)
    bodies: dict[WorkloadKey, dict[str, Any]] = {
        key_of(submission): submission.model_dump(mode="json") for submission in (victim, preemptor)
    }
    return history_figures(
        [recorded(victim, placed), recorded(preemptor, answer)],
        bodies,
        history,
        events,
        pending,
        BillPeriod(start, datetime.now(UTC), Decimal("0.000001"), Decimal(0)),
        final_states=states,
    )


async def test_the_checker_counts_the_preempted_workload_lost_on_the_eviction_path_before_the_fix(
    ledger: SqlLedger, own_nats: EmbeddedNats, own_nats_bus: BusOf
) -> None:
    figures = await preempt_while_nats_is_down(PublishThenQueue, ledger, own_nats, own_nats_bus)

    lost = figures.examples.get("lost", [])
    assert figures.lost == 2, lost
    assert any(
        "batch" in line and "without its event on the bus (tf.evt.pod.evicted)" in line for line in lost
    )
    assert any("batch" in line and "never recreated" in line for line in lost)
    assert (figures.evictions, figures.preemptions) == (1, 1)


async def test_the_checker_finds_nothing_lost_after_a_preemption_with_todays_engine(
    ledger: SqlLedger, own_nats: EmbeddedNats, own_nats_bus: BusOf
) -> None:
    figures = await preempt_while_nats_is_down(Scheduler, ledger, own_nats, own_nats_bus)

    assert (figures.lost, figures.doubled, figures.phantom) == (0, 0, 0), figures.examples
    assert (figures.evictions, figures.preemptions) == (1, 1)
    assert figures.acknowledged_operations == 2, "the preemptor's submission succeeds with NATS down"
