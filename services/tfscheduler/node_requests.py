"""The scheduler's side of what node agents need from the ledger (they hold no database credential).

- `serve_node_allocations`: answers `tf.req.scheduler.node-allocations.<node token>` in the queue group
  `scheduler`, on every replica (a ledger read; no leader needed). The node comes from the subject;
  a ledger that cannot be read is answered with an `error` at once, so the agent retries.
- `release_handler`: the `scheduler-release-allocations` consumer's handler for `ReleaseAllocation`
  commands; it releases through the engine (ledger, outbox, view) only what `release_refusal` allows,
  and otherwise logs and acknowledges. A ledger error is retried with the consumer's backoff.
Decisions are in `tfscheduler.core.node_ledger`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from nats.aio.msg import Msg
from sqlalchemy.exc import DBAPIError
from tfcommon.bus import NatsEventBus
from tfcommon.consumer import Handler, TransientError
from tfcommon.events import InvalidPayloadError, Message, ReleaseAllocation
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import AllocationRecord
from tfcommon.node_allocations import (
    NODE_ALLOCATIONS,
    SCHEDULER_QUEUE,
    NodeAllocationsReply,
    decode_request,
    node_of_subject,
)

from tfscheduler.core.node_ledger import node_allocations_reply, release_refusal
from tfscheduler.engine import Scheduler

log = logging.getLogger("tfscheduler.node_requests")


async def answer_node_allocations(ledger: Ledger, subject: str, data: bytes) -> NodeAllocationsReply:
    """The reply to one node-allocations request received on `subject`."""
    node = node_of_subject(subject)
    if node is None:
        return NodeAllocationsReply(
            node="", error=f"subject {subject!r} names no node; ask on {NODE_ALLOCATIONS}.<node token>"
        )
    try:
        request = decode_request(data)
    except InvalidPayloadError as error:
        return NodeAllocationsReply(node=node, error=str(error))
    try:
        records: Sequence[AllocationRecord]
        if request.allocation_id is None:
            records = await ledger.active_allocations()
        else:
            record = await ledger.get_allocation(request.allocation_id)
            records = () if record is None else (record,)
    except (DBAPIError, OSError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return NodeAllocationsReply(
            node=node, error=f"the ledger is unavailable ({first_line}); retry shortly"
        )
    return node_allocations_reply(node, request, records)


async def serve_node_allocations(bus: NatsEventBus, ledger: Ledger, stop: asyncio.Event) -> None:
    """Answer node agents' allocation requests until `stop` is set."""

    async def on_request(msg: Msg) -> None:
        try:
            reply = await answer_node_allocations(ledger, msg.subject, msg.data)
        except Exception as error:
            log.exception("node-allocations request failed", extra={"event": "node.allocations"})
            reply = NodeAllocationsReply(node="", error=f"the scheduler failed: {type(error).__name__}")
        log.info(
            "answered %s: %d allocation(s)",
            msg.subject,
            len(reply.allocations),
            extra={
                "event": "node.allocations",
                "outcome": "error" if reply.error else "answered",
                **({"error": reply.error} if reply.error else {}),
            },
        )
        if msg.reply:
            await msg.respond(reply.model_dump_json().encode())

    subscription = await bus.nc.subscribe(f"{NODE_ALLOCATIONS}.*", queue=SCHEDULER_QUEUE, cb=on_request)
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):  # the connection may be closing already
            await subscription.unsubscribe()


def release_handler(scheduler: Scheduler) -> Handler:
    """Releases the allocations node agents ask to release (`ReleaseAllocation`), when allowed."""

    async def release(message: Message) -> Sequence[Message]:
        if not isinstance(message, ReleaseAllocation):
            return ()
        try:
            record = await scheduler.ledger.get_allocation(message.allocation_id)
            refusal = release_refusal(message.node, message.allocation_id, record)
            if refusal is None:
                await scheduler.release(message.allocation_id, message.reason, cause=message.cause)
        except (DBAPIError, OSError) as error:
            raise TransientError(
                f"cannot release allocation {message.allocation_id} now: the ledger is unavailable"
            ) from error
        if refusal is not None:
            already = record is not None and record.state == "released"
            log.log(
                logging.INFO if already else logging.WARNING,
                "release-allocation from node %s not done: %s",
                message.node,
                refusal,
                extra={"event": "command.release-allocation", "outcome": "refused"},
            )
        else:
            log.info(
                "released allocation %s for node %s: %s",
                message.allocation_id,
                message.node,
                message.reason,
                extra={"event": "command.release-allocation", "outcome": "released"},
            )
        return ()

    return release
