"""Registering pools, nodes and GPUs in the ledger (what the node agent does), and reading them back."""

from __future__ import annotations

from uuid import uuid4

import pytest
from tfcommon.ledger.records import GpuSpec, LedgerInputError, NodeSpec, Reserved
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation

pytestmark = pytest.mark.integration


def an_h100(uuid: str, node: str, **changes: object) -> GpuSpec:
    fields: dict[str, object] = {
        "uuid": uuid,
        "node": node,
        "index": 0,
        "model": "H100",
        "vendor": "NVIDIA",
        "capacity_tflops_milli": 989_000,
        "capacity_vram_bytes": 80 * GIB,
        "numa_node": 0,
    }
    fields.update(changes)
    return GpuSpec(**fields)  # type: ignore[arg-type]


async def test_registering_a_node_creates_its_pool_and_updates_in_place(ledger: SqlLedger) -> None:
    name, pool = f"node-{uuid4().hex[:8]}", f"pool-{uuid4().hex[:8]}"
    await ledger.upsert_node(
        NodeSpec(name=name, pool=pool, labels={"zone": "a"}, memory_allocatable_bytes=GIB)
    )
    assert await ledger.set_node_cordoned(name, True)

    await ledger.upsert_node(
        NodeSpec(name=name, pool=pool, labels={"zone": "b"}, taints=({"key": "gpu", "effect": "NoSchedule"},))
    )
    assert await ledger.record_heartbeat(name)

    node = next(node for node in await ledger.list_nodes() if node.name == name)
    assert (node.pool, node.labels, node.cordoned, node.ready) == (pool, {"zone": "b"}, True, True)
    assert node.taints == [{"key": "gpu", "effect": "NoSchedule"}]
    assert node.memory_allocatable_bytes == 0
    assert node.last_heartbeat_at is not None
    assert pool in {known.name for known in await ledger.list_pools()}


async def test_calls_on_an_unknown_node_or_gpu_say_so(ledger: SqlLedger) -> None:
    assert await ledger.record_heartbeat("no-such-node") is False
    assert await ledger.set_node_cordoned("no-such-node", True) is False
    assert await ledger.set_gpu_phase("gpu-none", "Unknown") is False
    assert await ledger.get_gpu("gpu-none") is None


async def test_rediscovering_a_gpu_keeps_what_is_reserved_on_it(ledger: SqlLedger) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger, tflops_milli=989_000)
    assert isinstance(await ledger.reserve(a_reservation(node, {gpu: (100_000, 10 * GIB)})), Reserved)
    before = await ledger.get_gpu(gpu)

    await ledger.upsert_gpu(an_h100(gpu, node, phase="Running"))

    after = await ledger.get_gpu(gpu)
    assert before is not None
    assert after is not None
    assert (after.used_tflops_milli, after.used_vram_bytes) == (100_000, 10 * GIB)
    assert (after.capacity_tflops_milli, after.numa_node) == (989_000, 0)
    assert after.version > before.version
    assert gpu in {listed.uuid for listed in await ledger.list_gpus()}


async def test_gpu_registration_errors_name_the_field_to_fix(ledger: SqlLedger) -> None:
    node, (gpu,) = await a_node_with_gpus(ledger)
    assert isinstance(await ledger.reserve(a_reservation(node, {gpu: (50_000, 40 * GIB)})), Reserved)

    with pytest.raises(LedgerInputError, match=r"gpu\.node: node 'no-such-node' is not registered"):
        await ledger.upsert_gpu(an_h100(f"gpu-{uuid4()}", "no-such-node"))
    with pytest.raises(
        LedgerInputError, match=r"gpu\.capacity: GPU .* would have less capacity than is reserved"
    ):
        await ledger.upsert_gpu(an_h100(gpu, node, capacity_vram_bytes=20 * GIB))
    with pytest.raises(LedgerInputError, match=r"gpu\.index: node '.*' already has another GPU at index 0"):
        await ledger.upsert_gpu(an_h100(f"gpu-{uuid4()}", node, index=0))


async def test_placement_facts_read_in_one_snapshot_are_what_the_single_reads_return(
    ledger: SqlLedger,
) -> None:
    kept, kept_gpus = await a_node_with_gpus(ledger, gpus=3)
    other, other_gpus = await a_node_with_gpus(ledger, gpus=1)
    placed = await ledger.reserve(a_reservation(kept, {kept_gpus[1]: (20_000, 4 * GIB)}))
    freed = await ledger.reserve(a_reservation(other, {other_gpus[0]: (50_000, 8 * GIB)}))
    assert isinstance(placed, Reserved)
    assert isinstance(freed, Reserved)
    assert await ledger.release(freed.allocation.allocation_id, "completed")

    facts = await ledger.placement_facts()

    assert facts.nodes == await ledger.list_nodes()
    assert facts.gpus == await ledger.list_gpus()
    assert facts.allocations == await ledger.active_allocations()
    active = {a.allocation_id for a in facts.allocations}
    assert placed.allocation.allocation_id in active
    assert freed.allocation.allocation_id not in active
    assert {gpu.uuid for gpu in facts.gpus} >= {*kept_gpus, *other_gpus}
