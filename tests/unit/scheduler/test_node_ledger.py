"""What the scheduler answers a node agent (`tfscheduler.core.node_ledger`) and the subjects it is asked on:
each agent sees and releases only its own node's allocations, and the node comes from the subject."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from tfcommon.events import (
    InvalidPayloadError,
    ReleaseAllocation,
    WorkloadRef,
    decode,
    encode,
)
from tfcommon.ledger.records import AllocationRecord, ShareRecord
from tfcommon.node_allocations import (
    NodeAllocationsRequest,
    decode_request,
    node_allocations_subject,
    node_of_subject,
)
from tfcommon.subjects import SCHEDULER_RELEASE_ALLOCATIONS, release_allocation
from tfscheduler.core.node_ledger import node_allocations_reply, release_refusal

NOW = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)
NODE = "gpu-1.rack-a.example"


def record(node: str = NODE, state: str = "committed", allocation_id: UUID | None = None) -> AllocationRecord:
    return AllocationRecord(
        allocation_id=allocation_id or uuid4(),
        workload=WorkloadRef(namespace="ml", name=f"train-{node}"),
        pool="default",
        node=node,
        qos="high",
        isolation="hard",
        state=state,  # type: ignore[arg-type]
        shares=(ShareRecord("GPU-AAAA", 100_000, 8 << 30, 200_000, 16 << 30),),
        created_at=NOW,
        committed_at=NOW,
        released_at=NOW if state == "released" else None,
        release_reason="pod deleted" if state == "released" else None,
    )


def test_a_listing_holds_only_the_open_allocations_of_the_asking_node() -> None:
    mine, reserved = record(), record(state="reserved")
    rows = [mine, reserved, record(state="released"), record(node="gpu-2"), record(node=f"{NODE}.x")]

    reply = node_allocations_reply(NODE, NodeAllocationsRequest(), rows)

    assert reply.node == NODE
    assert reply.error is None
    assert [item.allocation_id for item in reply.allocations] == [mine.allocation_id, reserved.allocation_id]
    (first, _) = reply.allocations
    assert (first.pool, first.qos, first.isolation, first.state) == ("default", "high", "hard", "committed")
    assert [(s.gpu_uuid, s.tflops_milli, s.vram_bytes) for s in first.shares] == [
        ("GPU-AAAA", 100_000, 8 << 30)
    ]


def test_one_allocation_is_answered_in_any_state_but_only_when_it_is_on_the_asking_node() -> None:
    released, elsewhere = record(state="released"), record(node="gpu-2")

    asked = node_allocations_reply(
        NODE, NodeAllocationsRequest(allocation_id=released.allocation_id), [released]
    )
    foreign = node_allocations_reply(
        NODE, NodeAllocationsRequest(allocation_id=elsewhere.allocation_id), [elsewhere]
    )

    assert [(item.allocation_id, item.state) for item in asked.allocations] == [
        (released.allocation_id, "released")
    ]
    assert foreign.allocations == ()


def test_only_an_open_allocation_on_the_subjects_node_may_be_released() -> None:
    mine = record()
    assert release_refusal(NODE, mine.allocation_id, mine) is None
    assert release_refusal(NODE, mine.allocation_id, record(state="reserved")) is None

    elsewhere = record(node="gpu-2")
    refusal = release_refusal(NODE, elsewhere.allocation_id, elsewhere)
    assert refusal is not None
    assert "placed on node gpu-2, not gpu-1.rack-a.example" in refusal

    released = record(state="released")
    assert "already released (pod deleted)" in (release_refusal(NODE, released.allocation_id, released) or "")
    unknown = uuid4()
    assert release_refusal(NODE, unknown, None) == f"allocation {unknown} is not in the ledger"


def test_a_node_name_is_one_subject_token_and_reads_back() -> None:
    subject = node_allocations_subject(NODE)
    assert subject == "tf.req.scheduler.node-allocations.gpu-1_rack-a_example"
    assert node_of_subject(subject) == NODE
    assert release_allocation(NODE) == "tf.cmd.scheduler.release-allocation.gpu-1_rack-a_example"
    assert SCHEDULER_RELEASE_ALLOCATIONS.filter_subjects == ("tf.cmd.scheduler.release-allocation.*",)


@pytest.mark.parametrize(
    "subject",
    [
        "tf.req.scheduler.node-allocations",
        "tf.req.scheduler.node-allocations.",
        "tf.req.scheduler.node-allocations.a.b",
        "tf.req.scheduler.node-allocations.*",
        "tf.req.scheduler.node-allocations.Bad_",
        "tf.req.scheduler.other.gpu-1",
    ],
)
def test_a_subject_that_names_no_single_node_is_refused(subject: str) -> None:
    assert node_of_subject(subject) is None


def test_a_request_may_be_empty_and_a_bad_one_names_the_field() -> None:
    assert decode_request(b"") == NodeAllocationsRequest()
    assert decode_request(b'{"allocation_id": null, "added_later": 1}') == NodeAllocationsRequest()
    with pytest.raises(InvalidPayloadError, match="allocation_id"):
        decode_request(b'{"allocation_id": "not-a-uuid"}')


def test_a_release_request_is_read_only_on_its_own_nodes_subject() -> None:
    command = ReleaseAllocation(
        event_id=uuid4(),
        occurred_at=NOW,
        node=NODE,
        allocation_id=uuid4(),
        reason="worker exited with code 0",
    )
    assert command.routing_subject() == release_allocation(NODE)
    assert decode(release_allocation(NODE), encode(command)) == command
    with pytest.raises(InvalidPayloadError, match="addressed to"):
        decode(release_allocation("gpu-2"), encode(command))
