"""A workload evicted by hand (the local Eviction API, `tfctl delete workload` of a pod with a controller)
is recreated on other GPUs than the ones it left, even with no cordon, whenever any fit (issue #18,
item 5); only when nothing else fits does it go back. Real Postgres and NATS."""

from __future__ import annotations

from datetime import timedelta

import pytest
from scheduler_builders import GIB, a_submission, register_named_node
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.engine import Scheduler

pytestmark = pytest.mark.integration
LONG = timedelta(hours=1)


async def started(ledger: SqlLedger, bus: NatsEventBus, **gpus_per_node: int) -> Scheduler:
    """A scheduler over nodes of one-80-GiB-GPU cards, `node_a=2` naming node-a with two of them."""
    for node, gpus in gpus_per_node.items():
        await register_named_node(ledger, node.replace("_", "-"), gpus)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    return scheduler


async def test_the_replacement_of_an_evicted_workload_lands_on_another_gpu_without_a_cordon(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    scheduler = await started(ledger, bus, node_a=1, node_b=1)
    placed = await scheduler.submit(a_submission(name="serve", vram_bytes=16 * GIB))
    assert placed.state == "placed"

    replacement = await scheduler.evict(placed.id, "deleted by hand")

    assert replacement is not None
    assert replacement.state == "placed"
    assert replacement.node != placed.node
    assert set(replacement.gpu_uuids).isdisjoint(placed.gpu_uuids)


async def test_another_gpu_of_the_same_node_will_do(ledger: SqlLedger, bus: NatsEventBus) -> None:
    scheduler = await started(ledger, bus, node_a=2)
    placed = await scheduler.submit(a_submission(name="serve", vram_bytes=16 * GIB))

    replacement = await scheduler.evict(placed.id, "deleted by hand")

    assert replacement is not None
    assert replacement.state == "placed"
    assert replacement.node == placed.node
    assert set(replacement.gpu_uuids).isdisjoint(placed.gpu_uuids)


async def test_the_replacement_goes_back_to_its_gpu_when_no_other_fits(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    scheduler = await started(ledger, bus, node_a=1, node_b=1)
    placed = await scheduler.submit(a_submission(name="serve", vram_bytes=40 * GIB))
    wall = await scheduler.submit(a_submission(name="wall", vram_bytes=60 * GIB))
    assert wall.state == "placed"
    assert wall.node != placed.node

    replacement = await scheduler.evict(placed.id, "deleted by hand")

    assert replacement is not None
    assert replacement.state == "placed"
    assert replacement.gpu_uuids == placed.gpu_uuids
