"""The periodic rebuild of the scheduler's view (`Scheduler.start`) holds no lock while it reads the
ledger and builds the view: submissions and releases go on meanwhile, and what they changed is kept
when the rebuilt view is installed. Real Postgres and NATS; the ledger's snapshot read is held at a
gate (after reading) so that placing and releasing happen between the read and the install.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from scheduler_builders import a_submission, register_nodes
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.records import PlacementFacts
from tfcommon.ledger.sql import SqlLedger
from tfcommon.placement import Node
from tfscheduler.engine import Scheduler

pytestmark = pytest.mark.integration
LONG = timedelta(hours=1)


class GatedLedger(SqlLedger):
    """The real ledger, whose snapshot read for a rebuild returns only once `gate` is set."""

    def __init__(self, ledger: SqlLedger) -> None:
        super().__init__(ledger.engine)
        self.gate = asyncio.Event()
        self.gate.set()
        self.read = asyncio.Event()

    async def placement_facts(self) -> PlacementFacts:
        facts = await super().placement_facts()
        self.read.set()
        await self.gate.wait()
        return facts


def reserved(node: Node) -> list[tuple[str, int, int, int]]:
    return [(gpu.uuid, gpu.used_tflops_milli, gpu.used_vram_bytes, gpu.workers) for gpu in node.gpus]


async def test_placing_and_releasing_go_on_during_a_rebuild_and_the_rebuilt_view_keeps_them(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await register_nodes(ledger, nodes=3, gpus=2)
    gated = GatedLedger(ledger)
    scheduler = Scheduler(gated, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    before = [await scheduler.submit(a_submission(name=f"before-{n}")) for n in range(4)]
    assert all(status.state == "placed" for status in before)

    gated.gate.clear()
    gated.read.clear()
    rebuild = asyncio.create_task(scheduler.start())
    await asyncio.wait_for(gated.read.wait(), 30)
    during = [
        await asyncio.wait_for(scheduler.submit(a_submission(name=f"during-{n}")), 10) for n in range(3)
    ]
    assert all(status.state == "placed" for status in during), "placing waited for the rebuild"
    assert await asyncio.wait_for(scheduler.release(before[0].id, "completed"), 10)
    gated.gate.set()
    await asyncio.wait_for(rebuild, 30)

    expected_active = {status.id for status in [*before[1:], *during]}
    assert set(scheduler.active) == expected_active
    fresh = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await fresh.start()
    assert set(fresh.active) == expected_active
    assert {name: reserved(node) for name, node in scheduler.view.nodes.items()} == {
        name: reserved(node) for name, node in fresh.view.nodes.items()
    }, "the installed view differs from the ledger"
