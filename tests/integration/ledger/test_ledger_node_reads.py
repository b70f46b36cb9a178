"""The scheduler's node reads from the ledger: every node's state for the per-second re-check
(`SqlLedger.node_states`) and one node with its GPUs for a node rebuild (`SqlLedger.node_inventory`)."""

from __future__ import annotations

from uuid import uuid4

import pytest
from tfcommon.ledger.records import DEFRAG_SOURCE_MARKER, GpuSpec, NodeSpec, NodeState
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB

pytestmark = pytest.mark.integration


def a_gpu(node: str, index: int) -> GpuSpec:
    return GpuSpec(
        uuid=f"gpu-{uuid4()}",
        node=node,
        index=index,
        model="H100",
        vendor="NVIDIA",
        capacity_tflops_milli=989_000,
        capacity_vram_bytes=80 * GIB,
    )


async def test_node_states_give_every_node_its_flags_heartbeat_and_drain_marker_by_name(
    ledger: SqlLedger,
) -> None:
    prefix = f"states-{uuid4().hex[:8]}"
    plain, cordoned, labelled, annotated, silent = (
        f"{prefix}-{suffix}" for suffix in ("a-plain", "b-cordoned", "c-labelled", "d-annotated", "e-silent")
    )
    for name in (silent, annotated, labelled, cordoned, plain):
        annotations = {DEFRAG_SOURCE_MARKER: "campaign"} if name == annotated else {}
        await ledger.upsert_node(
            NodeSpec(name=name, pool="default", annotations=annotations, ready=name != silent)
        )
    await ledger.set_node_cordoned(cordoned, True)
    await ledger.set_node_label(labelled, DEFRAG_SOURCE_MARKER, "campaign")
    await ledger.record_heartbeat(plain)

    states = [state for state in await ledger.node_states() if state.name.startswith(prefix)]

    assert [state.name for state in states] == [plain, cordoned, labelled, annotated, silent]
    by_name = {state.name: state for state in states}
    assert by_name[plain].last_heartbeat_at is not None
    assert by_name[plain]._replace(last_heartbeat_at=None) == NodeState(
        plain, "default", cordoned=False, ready=True, last_heartbeat_at=None, draining=False
    )
    assert by_name[cordoned] == NodeState(cordoned, "default", True, True, None, False)
    assert by_name[labelled] == NodeState(labelled, "default", False, True, None, True)
    assert by_name[annotated] == NodeState(annotated, "default", False, True, None, True)
    assert by_name[silent] == NodeState(silent, "default", False, False, None, False)


async def test_node_inventory_reads_the_node_with_its_gpus_by_index(ledger: SqlLedger) -> None:
    name = f"inventory-{uuid4().hex[:8]}"
    await ledger.upsert_node(
        NodeSpec(name=name, pool="default", labels={"zone": "a"}, memory_allocatable_bytes=GIB)
    )
    gpus = [a_gpu(name, index) for index in (2, 0, 1)]
    for gpu in gpus:
        await ledger.upsert_gpu(gpu)

    inventory = await ledger.node_inventory(name)

    assert inventory is not None
    node, read = inventory
    assert (node.name, node.pool, node.labels, node.memory_allocatable_bytes) == (
        name,
        "default",
        {"zone": "a"},
        GIB,
    )
    assert [(gpu.index, gpu.uuid, gpu.node) for gpu in read] == [
        (gpu.index, gpu.uuid, name) for gpu in sorted(gpus, key=lambda gpu: gpu.index)
    ]
    assert await ledger.node_inventory(f"{name}-gone") is None
