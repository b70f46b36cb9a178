"""The agent's access to the ledger, through the scheduler over NATS: the agent holds no database credential.

- reads: `tf.req.scheduler.node-allocations.<node token>` (request/reply, `tfcommon.node_allocations`),
  answered by any scheduler replica with this node's allocations only. No answer within
  `REQUEST_TIMEOUT_S`, no scheduler at all, or an answer with an `error` raise `LedgerUnavailableError`.
- release: a `ReleaseAllocation` command on `tf.cmd.scheduler.release-allocation.<node token>` through
  JetStream (TF_COMMANDS), so it waits in the stream while no scheduler runs; the scheduler releases it
  if it is open and on this node. Its `event_id` is derived from the allocation, so a repeat within the
  stream's duplicate window is dropped.
The NATS user of the agent may publish both subjects for its own node only.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from uuid import UUID

import nats.errors
from tfcommon.bus import NatsEventBus
from tfcommon.events import InvalidPayloadError, ReleaseAllocation, derived_event_id
from tfcommon.node_allocations import (
    REQUEST_TIMEOUT_S,
    NodeAllocation,
    NodeAllocationsReply,
    NodeAllocationsRequest,
    decode_reply,
    node_allocations_subject,
)

from tfagent.core.usage import WorkerAllocation, WorkerShare

log = logging.getLogger("tfagent.scheduler_ledger")

RELEASE_ATTEMPTS = 5
RELEASE_FIRST_RETRY_S = 0.5


class LedgerUnavailableError(RuntimeError):
    """No scheduler answered the agent's request for allocations, or it could not read the ledger."""


class SchedulerLedger:
    """What node `node`'s agent reads from and asks of the ledger, through the scheduler."""

    def __init__(self, bus: NatsEventBus, node: str, *, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.node = node
        self._bus = bus
        self._timeout_s = timeout_s

    async def open_allocations(self) -> list[WorkerAllocation]:
        """This node's open allocations, as the agent holds them."""
        reply = await self._ask(NodeAllocationsRequest())
        return [
            worker_allocation(allocation)
            for allocation in reply.allocations
            if allocation.node == self.node and allocation.state != "released"
        ]

    async def allocation(self, allocation_id: UUID) -> NodeAllocation | None:
        """The allocation `allocation_id` in any state if it is placed on this node, else None."""
        reply = await self._ask(NodeAllocationsRequest(allocation_id=allocation_id))
        return next((item for item in reply.allocations if item.allocation_id == allocation_id), None)

    async def _ask(self, request: NodeAllocationsRequest) -> NodeAllocationsReply:
        subject = node_allocations_subject(self.node)
        try:
            answer = await self._bus.nc.request(
                subject, request.model_dump_json(exclude_none=True).encode(), timeout=self._timeout_s
            )
        except nats.errors.NoRespondersError as error:
            raise LedgerUnavailableError(
                f"no scheduler answers on {subject}; is the scheduler running?"
            ) from error
        except (TimeoutError, nats.errors.TimeoutError) as error:
            raise LedgerUnavailableError(
                f"no scheduler answered on {subject} within {self._timeout_s:g}s"
            ) from error
        except nats.errors.Error as error:
            raise LedgerUnavailableError(f"asking on {subject} failed: {error}") from error
        try:
            reply = decode_reply(answer.data)
        except InvalidPayloadError as error:
            raise LedgerUnavailableError(str(error)) from error
        if reply.error is not None:
            raise LedgerUnavailableError(f"the scheduler could not answer: {reply.error}")
        return reply

    async def release(self, allocation_id: UUID, reason: str, cause: UUID | None = None) -> bool:
        """Ask the scheduler to close `allocation_id` (a worker started by a bus command ended), retrying a
        NATS error a few times; True once the command is stored in the stream."""
        command = ReleaseAllocation(
            event_id=derived_event_id(allocation_id, ReleaseAllocation),
            occurred_at=datetime.now(UTC),
            cause=cause,
            node=self.node,
            allocation_id=allocation_id,
            reason=reason,
        )
        delay = RELEASE_FIRST_RETRY_S
        for attempt in range(1, RELEASE_ATTEMPTS + 1):
            try:
                await self._bus.publish(command)
                return True
            except (nats.errors.Error, OSError, TimeoutError) as error:
                log.warning(
                    "asking the scheduler to release %s failed (attempt %d): %s",
                    allocation_id,
                    attempt,
                    str(error) or type(error).__name__,
                    extra={"event": "command.release", "outcome": "retry"},
                )
            if attempt < RELEASE_ATTEMPTS:
                await asyncio.sleep(delay)
                delay *= 2
        log.error(
            "allocation %s not released now; the agent asks again when it next starts, or run: "
            "tfctl delete workload %s",
            allocation_id,
            allocation_id,
            extra={"event": "command.release", "outcome": "error"},
        )
        return False


def worker_allocation(allocation: NodeAllocation) -> WorkerAllocation:
    """An allocation of the reply, as the agent holds it."""
    return WorkerAllocation(
        allocation_id=allocation.allocation_id,
        workload=allocation.workload,
        pool=allocation.pool,
        shares=tuple(
            WorkerShare(share.gpu_uuid.lower(), share.tflops_milli, share.vram_bytes)
            for share in allocation.shares
        ),
        qos=allocation.qos,
        isolation=allocation.isolation,
    )
