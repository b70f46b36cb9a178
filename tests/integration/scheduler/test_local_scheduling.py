"""The scheduler in local mode against real Postgres and NATS JetStream: placement, restart, quotas,
preemption and release (two racing schedulers: `test_scheduler_two_processes.py`)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest
import sqlalchemy as sa
from nats.aio.msg import Msg
from scheduler_builders import (
    GIB,
    a_submission,
    assert_history_never_over_capacity,
    register_named_node,
    register_nodes,
)
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.core.quota import NamespaceQuota
from tfscheduler.engine import Scheduler
from tfscheduler.submission import Submission, WorkloadStatus

pytestmark = pytest.mark.integration
LONG = timedelta(hours=1)


async def _submit_all(
    scheduler: Scheduler, submissions: list[Submission], parallel: int = 8
) -> list[WorkloadStatus]:
    gate = asyncio.Semaphore(parallel)

    async def one(submission: Submission) -> WorkloadStatus:
        async with gate:
            return await scheduler.submit(submission)

    return list(await asyncio.gather(*(one(s) for s in submissions)))


async def _collect(bus: NatsEventBus, subject: str) -> tuple[list[dict[str, Any]], Any]:
    received: list[dict[str, Any]] = []

    async def keep(msg: Msg) -> None:
        received.append(json.loads(msg.data))

    subscription = await bus.nc.subscribe(subject, cb=keep)
    return received, subscription


async def _eventually(check: object, timeout_s: float = 10.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.02)


async def test_a_restarted_scheduler_continues_a_burst_from_the_ledger(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_nodes(ledger, nodes=2, gpus=2)  # 4 GPUs x 10 pods of 10 TFLOPS = 40
    pods = [a_submission() for _ in range(50)]
    first = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await first.start()
    before = await _submit_all(first, pods[:25])
    assert all(s.state == "placed" for s in before)
    # A new process: state comes only from the ledger. It resubmits the whole burst (redelivery).
    restarted = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await restarted.start()
    after = await _submit_all(restarted, pods)
    assert sum(s.state == "placed" for s in after) == 40
    assert {s.id for s in before} <= {s.id for s in after if s.state == "placed"}
    pending = [s for s in after if s.state == "pending"]
    assert len(pending) == 10
    assert all(s.reason and s.reason.startswith("0/2 nodes fit: 2 insufficient TFLOPS") for s in pending)
    assert len(await ledger.active_allocations()) == 40
    await assert_history_never_over_capacity(ledger)


async def test_unschedulable_workload_is_announced_with_the_placement_summary(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_nodes(ledger, nodes=2, gpus=1, vram_bytes=16 * GIB)
    received, subscription = await _collect(bus, "tf.evt.workload.unschedulable")
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    status = await scheduler.submit(a_submission(vram_bytes=40 * GIB))
    assert status.state == "pending"
    assert status.reason is not None
    assert status.reason.startswith("0/2 nodes fit: 2 insufficient VRAM")
    relay = OutboxRelay(ledger, bus)  # the verdict's event is in the outbox, committed with it
    while await relay.publish_pending():
        pass
    await _eventually(lambda: any(event["summary"] == status.reason for event in received))
    await subscription.unsubscribe()


async def test_never_places_on_cordoned_silent_or_draining_nodes(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    cordoned, draining, silent = await register_nodes(ledger, nodes=3, gpus=1)
    await ledger.set_node_cordoned(cordoned, True)
    from tfcommon.ledger.records import NodeSpec

    await ledger.upsert_node(
        NodeSpec(name=draining, pool="default", annotations={"tensor-fusion.ai/defrag-source": "true"})
    )
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=timedelta(seconds=30))
    await scheduler.start()
    scheduler.heartbeat_timeout = timedelta(microseconds=1)  # now every heartbeat is too old
    await scheduler.recheck_nodes()
    status = await scheduler.submit(a_submission())
    assert status.state == "pending"
    assert status.reason is not None
    assert "1 node cordoned" in status.reason
    assert "1 node agent heartbeats stopped" in status.reason
    assert "1 node being drained by the defrag planner" in status.reason
    assert silent in scheduler.blocked


@pytest.mark.parametrize("section", ["labels", "annotations"])
async def test_a_node_marked_for_draining_after_start_is_blocked_at_the_next_check_and_freed_after(
    ledger: SqlLedger, bus: NatsEventBus, section: str
) -> None:
    (node,) = await register_nodes(ledger, nodes=1, gpus=1)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    marker = sa.text(f"UPDATE node SET {section} = {section} || :marker WHERE name = :node")
    async with ledger.engine.begin() as connection:
        await connection.execute(
            marker, {"marker": '{"tensor-fusion.ai/defrag-source": "true"}', "node": node}
        )
    await scheduler.recheck_nodes()
    assert scheduler.blocked.get(node, "").startswith("node being drained by the defrag planner")
    assert (await scheduler.submit(a_submission())).state == "pending"

    unmark = sa.text(
        f"UPDATE node SET {section} = {section} - 'tensor-fusion.ai/defrag-source' WHERE name = :node"
    )
    async with ledger.engine.begin() as connection:
        await connection.execute(unmark, {"node": node})
    await scheduler.recheck_nodes()
    assert node not in scheduler.blocked
    assert (await scheduler.submit(a_submission())).state == "placed"


async def test_namespace_quota_keeps_a_pod_pending_until_usage_falls(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_nodes(ledger, nodes=1, gpus=4)
    quota = NamespaceQuota(namespace="team-a", total_requests_tflops_milli=25_000)
    scheduler = Scheduler(ledger, bus, quotas={"team-a": quota}, heartbeat_timeout=LONG)
    await scheduler.start()
    first = await scheduler.submit(a_submission(tflops_milli=20_000))
    assert first.state == "placed"
    waiting = await scheduler.submit(a_submission(tflops_milli=10_000))
    assert waiting.state == "pending"
    assert waiting.reason == (
        "GPUResourceQuota team-a/team-a: total.requests.tflops would be 30 of 25 (in use 20); "
        "waiting for the namespace's usage to fall"
    )
    other_namespace = await scheduler.submit(a_submission(namespace="team-b", tflops_milli=10_000))
    assert other_namespace.state == "placed"
    assert await scheduler.release(first.id, "workload-ended")
    assert await scheduler.retry_pending() == 1


async def test_a_workload_deleted_while_the_queue_is_retried_gets_no_allocation(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_nodes(ledger, nodes=1, gpus=4)
    quota = NamespaceQuota(namespace="team-a", total_requests_tflops_milli=25_000)
    scheduler = Scheduler(ledger, bus, quotas={"team-a": quota}, heartbeat_timeout=LONG)
    await scheduler.start()
    first = await scheduler.submit(a_submission(tflops_milli=20_000))
    waiting = await scheduler.submit(a_submission(tflops_milli=10_000))
    assert waiting.state == "pending"
    assert await scheduler.release(first.id, "workload-ended")
    async with scheduler._lock:  # a placement in progress: the deletion and the retry queue behind it
        deletion = asyncio.create_task(scheduler.release(waiting.id, "workload-deleted"))
        retry = asyncio.create_task(scheduler.retry_pending())
        deadline = time.monotonic() + 10
        while len(scheduler._lock._waiters or ()) < 2:  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the release and the retry never queued on the lock"
            await asyncio.sleep(0.01)
    assert not await deletion  # it held no allocation yet
    assert await retry == 0
    assert await ledger.get_allocation(waiting.id) is None
    status = await scheduler.status(waiting.id)
    assert status is not None
    assert status.state == "ended"


async def test_the_default_policy_learns_the_workload_mix_and_keeps_whole_gpus_free(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    suffix = uuid4().hex[:6]
    busy, empty = f"n1-{suffix}", f"n0-{suffix}"  # the empty node comes first in name order
    await register_named_node(ledger, busy)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    half = await scheduler.submit(a_submission(tflops_milli=50_000, vram_bytes=40 * GIB))
    assert (half.state, half.node) == ("placed", busy)
    whole = [await scheduler.submit(a_submission(tflops_milli=100_000)) for _ in range(2)]
    assert [status.state for status in whole] == ["pending", "pending"]
    await register_named_node(ledger, empty)
    await scheduler.node_changed(empty)
    await scheduler.relearned()
    second_half = await scheduler.submit(a_submission(tflops_milli=50_000, vram_bytes=40 * GIB))
    assert (second_half.state, second_half.node) == ("placed", busy)  # first-fit would split `empty`
    assert await scheduler.retry_pending() == 1  # so a whole-GPU workload still fits


async def test_quota_single_maximum_refuses_with_the_reason(ledger: SqlLedger, bus: NatsEventBus) -> None:
    await register_nodes(ledger, nodes=1, gpus=4)
    quota = NamespaceQuota(namespace="team-a", max_gpu_count=2)
    scheduler = Scheduler(ledger, bus, quotas={"team-a": quota}, heartbeat_timeout=LONG)
    await scheduler.start()
    status = await scheduler.submit(a_submission(gpu_count=3))
    assert status.state == "refused"
    assert status.reason == "GPUResourceQuota team-a/team-a: single.maxGPUCount is 2 per workload, asked 3"


async def test_preemption_evicts_the_lowest_qos_then_youngest_for_a_higher_priority_pod(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_nodes(ledger, nodes=1, gpus=1)
    evicted, subscription = await _collect(bus, "tf.evt.pod.evicted")
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    medium = await scheduler.submit(a_submission(tflops_milli=40_000, qos="medium", name="medium"))
    low_old = await scheduler.submit(a_submission(tflops_milli=30_000, qos="low", name="low-old"))
    low_young = await scheduler.submit(a_submission(tflops_milli=30_000, qos="low", name="low-young"))
    assert {medium.state, low_old.state, low_young.state} == {"placed"}
    equal = await scheduler.submit(a_submission(tflops_milli=30_000, qos="low", name="equal"))
    assert equal.state == "pending"
    assert equal.reason is not None
    assert "preemption: not possible" in equal.reason or "no workload of lower priority" in equal.reason
    critical = await scheduler.submit(a_submission(tflops_milli=30_000, qos="critical", name="critical"))
    assert critical.state == "placed"
    assert (await scheduler.status(low_young.id)).state == "evicted"  # type: ignore[union-attr]
    assert (await scheduler.status(low_old.id)).state == "placed"  # type: ignore[union-attr]
    assert (await scheduler.status(medium.id)).state == "placed"  # type: ignore[union-attr]
    history = await ledger.history(low_young.id)
    assert [entry.kind for entry in history] == ["opened", "committed", "evicted"]
    relay = OutboxRelay(ledger, bus)  # the eviction's event is in the outbox, committed with it
    while await relay.publish_pending():
        pass
    await _eventually(lambda: [event["workload"]["name"] for event in evicted] == ["low-young"])
    assert evicted[0]["preemptor"]["name"] == "critical"
    await subscription.unsubscribe()


async def test_preemption_never_evicts_inside_the_eviction_protection_window(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_nodes(ledger, nodes=1, gpus=1)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    protected = await scheduler.submit(
        a_submission(tflops_milli=80_000, qos="low", eviction_protection_s=3600)
    )
    assert protected.state == "placed"
    high = await scheduler.submit(a_submission(tflops_milli=50_000, qos="high"))
    assert high.state == "pending"
    assert high.reason is not None
    assert high.reason.endswith(
        "preemption: not possible: lower-priority workloads 1 inside their eviction-protection window"
    )


async def test_release_happens_exactly_once_under_redelivery(
    database_url: str, ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_nodes(ledger, nodes=1, gpus=1)
    released_events, subscription = await _collect(bus, "tf.evt.allocation.released")
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    placed = await scheduler.submit(a_submission())
    outcomes = await asyncio.gather(*(scheduler.release(placed.id, "workload-ended") for _ in range(5)))
    assert sorted(outcomes) == [False, False, False, False, True]
    assert not await scheduler.release(placed.id, "workload-ended")
    relay = OutboxRelay(ledger, bus)
    while await relay.publish_pending():
        pass
    assert await relay.publish_pending() == 0
    # The outbox row may be republished after a crash; JetStream drops the repeat by its message id.
    await _eventually(lambda: len(released_events) >= 1)
    assert [event["allocation_id"] for event in released_events] == [str(placed.id)]
    assert [entry.kind for entry in await ledger.history(placed.id)] == ["opened", "committed", "released"]
    gpu = (await ledger.list_gpus())[0]
    assert gpu.used_tflops_milli == 0
    await subscription.unsubscribe()
