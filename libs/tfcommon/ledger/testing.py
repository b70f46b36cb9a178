"""Builders for tests that use the ledger: register a node with GPUs, describe a reservation, and read
what the outbox relay delivers to JetStream.

Every call uses fresh, unique names, so tests sharing one database do not collide. Test support only:
no service imports this module.
"""

from __future__ import annotations

from uuid import uuid4

import sqlalchemy as sa
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from tfcommon import subjects
from tfcommon.bus import MSG_ID_HEADER, NatsEventBus
from tfcommon.events import Message, WorkloadRef, decode
from tfcommon.ledger import tables
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger

GIB = 1024**3


async def a_node_with_gpus(
    ledger: SqlLedger,
    *,
    gpus: int = 1,
    tflops_milli: int = 100_000,
    vram_bytes: int = 80 * GIB,
    pool: str = "default",
) -> tuple[str, list[str]]:
    """Register a node (unique name) with `gpus` GPUs of the given capacity; returns its name and UUIDs."""
    node = f"node-{uuid4().hex[:8]}"
    await ledger.upsert_node(NodeSpec(name=node, pool=pool))
    uuids = [f"gpu-{uuid4()}" for _ in range(gpus)]
    for index, gpu_uuid in enumerate(uuids):
        await ledger.upsert_gpu(
            GpuSpec(
                uuid=gpu_uuid,
                node=node,
                index=index,
                model="H100",
                vendor="NVIDIA",
                capacity_tflops_milli=tflops_milli,
                capacity_vram_bytes=vram_bytes,
            )
        )
    return node, uuids


def a_reservation(
    node: str,
    shares: dict[str, tuple[int, int]],
    *,
    pool: str = "default",
    name: str | None = None,
) -> ReservationRequest:
    """A reservation of `shares` (GPU UUID -> (milli-TFLOPS, bytes)) for a fresh workload."""
    workload_name = name or f"pod-{uuid4().hex[:8]}"
    return ReservationRequest(
        allocation_id=uuid4(),
        workload=WorkloadRef(namespace="team-a", name=workload_name, uid=str(uuid4()), workload="trainer"),
        pool=pool,
        node=node,
        shares=tuple(
            ShareRequest(gpu_uuid=gpu_uuid, tflops_milli=tflops, vram_bytes=vram)
            for gpu_uuid, (tflops, vram) in shares.items()
        ),
        qos="medium",
        isolation="soft",
        cause=uuid4(),
    )


async def relayed_events(ledger: SqlLedger, bus: NatsEventBus, subject: str) -> list[tuple[str, Message]]:
    """Publish the whole outbox with the relay, twice over (every row marked unpublished again in
    between, as after a relay that crashed between publishing and marking), then return each message on
    `subject` in the events stream as a fresh consumer sees it: its `Nats-Msg-Id` and the decoded event."""
    relay = OutboxRelay(ledger, bus)
    while await relay.publish_pending():
        pass
    async with ledger.engine.begin() as connection:
        await connection.execute(sa.update(tables.outbox).values(published_at=None))
    while await relay.publish_pending():
        pass
    subscription = await bus.js.pull_subscribe(
        subject,
        stream=subjects.EVENTS.name,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
    )
    found: list[tuple[str, Message]] = []
    try:
        remaining = (await subscription.consumer_info()).num_pending or 0
        while remaining > 0:
            batch = await subscription.fetch(batch=remaining, timeout=10)
            remaining -= len(batch)
            found += [
                ((message.headers or {}).get(MSG_ID_HEADER, ""), decode(message.subject, message.data))
                for message in batch
            ]
    finally:
        await subscription.unsubscribe()
    return found
