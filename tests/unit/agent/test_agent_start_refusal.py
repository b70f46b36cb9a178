"""Which `StartWorker` commands the agent refuses, and that each refusal names the field and the fix."""

from __future__ import annotations

from uuid import uuid4

from tfagent.core.commands import LedgerAllocation, start_refusal

NODE = "node-a"
GPUS = ("gpu-aaaa", "gpu-bbbb")


def allocation(state: str = "committed", node: str = NODE) -> LedgerAllocation:
    return LedgerAllocation(uuid4(), state, node, GPUS)


def test_an_open_allocation_on_this_node_with_its_gpus_may_start_in_any_case() -> None:
    held = allocation()
    assert start_refusal(held.allocation_id, ("GPU-AAAA",), held, NODE) is None
    assert start_refusal(held.allocation_id, GPUS, allocation("reserved"), NODE) is None


def test_an_unknown_allocation_is_refused_with_how_to_reserve_one() -> None:
    refusal = start_refusal(uuid4(), GPUS, None, NODE)
    assert refusal is not None
    assert refusal.startswith("allocation_id:")
    assert "POST /api/v1/workloads" in refusal


def test_a_released_allocation_starts_nothing_so_a_redelivery_is_harmless() -> None:
    released = allocation("released")
    refusal = start_refusal(released.allocation_id, GPUS, released, NODE)
    assert refusal is not None
    assert "already released" in refusal


def test_an_allocation_of_another_node_names_the_right_subject() -> None:
    elsewhere = allocation(node="node-b")
    refusal = start_refusal(elsewhere.allocation_id, GPUS, elsewhere, NODE)
    assert refusal is not None
    assert "tf.cmd.node-agent.start-worker.node-b" in refusal


def test_gpus_the_allocation_does_not_hold_are_named_with_the_ones_it_holds() -> None:
    held = allocation()
    refusal = start_refusal(held.allocation_id, ("gpu-aaaa", "gpu-cccc"), held, NODE)
    assert refusal is not None
    assert refusal.startswith("gpu_uuids: gpu-cccc")
    assert "gpu-aaaa, gpu-bbbb" in refusal
