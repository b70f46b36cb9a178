"""Whether the agent may act on a `StartWorker` command: the ledger's allocation must be open, on this
node and hold the GPUs the command names.

Pure: the shell asks the scheduler for the allocation (it answers with this node's allocations only, so
one placed elsewhere arrives as None) and hands in what it found; this module returns the refusal in
words an operator can act on, or None. It starts no process and reads nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID


@dataclass(frozen=True)
class LedgerAllocation:
    """What the ledger holds for the allocation a command names."""

    allocation_id: UUID
    state: str
    node: str
    gpu_uuids: tuple[str, ...]


def start_refusal(
    allocation_id: UUID,
    gpu_uuids: Iterable[str],
    allocation: LedgerAllocation | None,
    node: str,
) -> str | None:
    """Why a worker for `allocation_id` on `gpu_uuids` must not start on `node`; None when it may.

    A released allocation refuses every start, so a redelivered command for a worker that already ran
    and ended starts nothing.
    """
    if allocation is None:
        return (
            f"allocation_id: {allocation_id} is not in the ledger for node {node} (the scheduler answers "
            "each agent with its own node's allocations only); reserve it first (POST /api/v1/workloads "
            "on the scheduler) and send its id on tf.cmd.node-agent.start-worker.<the node it is placed on>"
        )
    if allocation.state == "released":
        return f"allocation_id: {allocation_id} is already released; its worker ran or it was closed"
    if allocation.node != node:
        return (
            f"allocation_id: {allocation_id} is placed on node {allocation.node}, not {node}; "
            f"publish the command on tf.cmd.node-agent.start-worker.{allocation.node}"
        )
    held = {uuid.lower() for uuid in allocation.gpu_uuids}
    foreign = sorted(uuid for uuid in gpu_uuids if uuid.lower() not in held)
    if foreign:
        return (
            f"gpu_uuids: {', '.join(foreign)} not held by allocation {allocation_id}; "
            f"send its GPUs: {', '.join(sorted(held))}"
        )
    return None
