"""What the scheduler answers a node agent, which holds no database credential. Pure.

- `node_allocations_reply`: the reply to `tf.req.scheduler.node-allocations.<node>` from the ledger's
  rows: only allocations placed on the node of the subject (open ones for a listing; the one asked for,
  in any state, when it is on that node), so an agent learns nothing of another node's.
- `release_refusal`: whether a `ReleaseAllocation` from a node may release: only an open allocation
  placed on the node of the subject. The shell releases through its normal ledger path, or logs the
  refusal and acknowledges (a repeat changes nothing).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol
from uuid import UUID

from tfcommon.events import GpuShare, WorkloadRef
from tfcommon.node_allocations import NodeAllocation, NodeAllocationsReply, NodeAllocationsRequest


class ShareRow(Protocol):
    """What a reply needs of one GPU share of a ledger allocation (`tfcommon.ledger.records.ShareRecord`)."""

    @property
    def gpu_uuid(self) -> str: ...
    @property
    def tflops_milli(self) -> int: ...
    @property
    def vram_bytes(self) -> int: ...


class AllocationRow(Protocol):
    """What these decisions need of a ledger allocation (`tfcommon.ledger.records.AllocationRecord`)."""

    @property
    def allocation_id(self) -> UUID: ...
    @property
    def workload(self) -> WorkloadRef: ...
    @property
    def pool(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def qos(self) -> str: ...
    @property
    def isolation(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def shares(self) -> Sequence[ShareRow]: ...
    @property
    def release_reason(self) -> str | None: ...


def node_allocation(record: AllocationRow) -> NodeAllocation:
    """One ledger allocation as the reply carries it."""
    return NodeAllocation(
        allocation_id=record.allocation_id,
        workload=record.workload,
        pool=record.pool,
        node=record.node,
        shares=tuple(
            GpuShare(gpu_uuid=share.gpu_uuid, tflops_milli=share.tflops_milli, vram_bytes=share.vram_bytes)
            for share in record.shares
        ),
        qos=record.qos,
        isolation=record.isolation,
        state=record.state,
    )


def node_allocations_reply(
    node: str, request: NodeAllocationsRequest, records: Iterable[AllocationRow]
) -> NodeAllocationsReply:
    """The reply for `node` (read from the request's subject) given the ledger rows the shell read: the
    open allocations or, with `request.allocation_id`, that allocation; only those placed on `node`."""
    wanted = request.allocation_id
    chosen = [
        record
        for record in records
        if record.node == node
        and (record.allocation_id == wanted if wanted is not None else record.state != "released")
    ]
    return NodeAllocationsReply(node=node, allocations=tuple(node_allocation(record) for record in chosen))


def release_refusal(node: str, allocation_id: UUID, record: AllocationRow | None) -> str | None:
    """Why the agent of `node` (the subject's node) may not release `allocation_id`, whose ledger row is
    `record`; None when it may (open and placed on `node`)."""
    if record is None:
        return f"allocation {allocation_id} is not in the ledger"
    if record.state == "released":
        return f"allocation {allocation_id} is already released ({record.release_reason})"
    if record.node != node:
        return (
            f"allocation {allocation_id} is placed on node {record.node}, not {node}; a node agent "
            "releases only its own node's allocations"
        )
    return None
