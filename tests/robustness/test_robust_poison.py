"""Poison messages on every subject a service consumes, against the running services on real NATS
JetStream: each malformed message is terminated once (never redelivered) and logged, the service stays
ready, and the valid message published right after it is still processed: nothing is lost."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.js import JetStreamContext
from robust_stack import RunningStack
from tfcommon import subjects
from tfcommon.subjects import ConsumerSpec

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "contract" / "fixtures" / "v1"
SETTLE_TIMEOUT_S = 20.0
POISONS: dict[str, bytes] = {
    "not JSON": b"{not json",
    "empty": b"",
    "JSON null": b"null",
    "JSON array": b"[1, 2, 3]",
    "invalid UTF-8": b'{"event_id": "\xff\xfe"}',
    "deeply nested": b"[" * 20_000 + b"]" * 20_000,
    "oversized": json.dumps({"event_id": "x" * 900_000}).encode(),
}


def valid_payload(subject: str, node: str | None = None) -> bytes:
    """The versioned contract fixture for `subject`, with a fresh event id (and `node`, for commands)."""
    document: dict[str, Any] = json.loads((FIXTURES / f"{subject}.json").read_text())
    document["event_id"] = str(uuid.uuid4())
    if node is not None and "node" in document:
        document["node"] = node
    return json.dumps(document).encode()


def wrong_types(payload: bytes) -> bytes:
    """`payload` with every field given a value of the wrong type."""
    document = json.loads(payload)
    return json.dumps(
        {key: [] if isinstance(value, str) else "lots" for key, value in document.items()}
    ).encode()


def outcomes(caplog: pytest.LogCaptureFixture, durable: str) -> list[tuple[str, str | None]]:
    return [
        (getattr(record, "outcome", ""), getattr(record, "event_id", None))
        for record in caplog.records
        if record.name == "tfcommon.consumer" and getattr(record, "consumer", None) == durable
    ]


async def settled(js: JetStreamContext, spec: ConsumerSpec, last_sequence: int) -> Any:
    """Wait until the consumer has settled every message it holds, `last_sequence` included."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        info = await js.consumer_info(spec.stream, spec.durable)
        done = info.num_pending == 0 and info.num_ack_pending == 0
        if done and info.ack_floor.stream_seq >= last_sequence:
            return info
        if time.monotonic() > deadline:
            pytest.fail(
                f"{spec.durable} did not settle message {last_sequence} within {SETTLE_TIMEOUT_S}s: {info}"
            )
        await asyncio.sleep(0.05)


async def publish_poison_then_valid(
    js: JetStreamContext,
    spec: ConsumerSpec,
    caplog: pytest.LogCaptureFixture,
    poisons: Sequence[tuple[str, bytes]],
    valid: tuple[str, bytes],
) -> None:
    for subject, payload in poisons:
        await js.publish(subject, payload)
    valid_subject, valid_data = valid
    last = (await js.publish(valid_subject, valid_data)).seq

    info = await settled(js, spec, last)

    assert info.num_redelivered == 0
    seen = outcomes(caplog, spec.durable)
    assert [outcome for outcome, _ in seen].count("terminated") == len(poisons), seen
    assert ("acked", json.loads(valid_data)["event_id"]) in seen


def all_poisons(subject: str, valid: bytes) -> list[tuple[str, bytes]]:
    return [(subject, payload) for payload in (*POISONS.values(), wrong_types(valid))]


SERVICE_CONSUMERS: list[tuple[str, ConsumerSpec, str]] = [
    ("scheduler", subjects.SCHEDULER_SCHEDULE_WORKLOAD, subjects.WORKLOAD_SUBMITTED),
    ("scheduler", subjects.SCHEDULER_TRACK_NODES, subjects.NODE_REGISTERED),
    ("scheduler", subjects.SCHEDULER_TRACK_NODES, subjects.GPU_DISAPPEARED),
    ("metrics", subjects.METRICS_RECORD_USAGE, subjects.GPU_USAGE_REPORTED),
    ("metrics", subjects.METRICS_COUNT_EVENTS, subjects.POD_EVICTED),
    ("defrag-planner", subjects.DEFRAG_START_CAMPAIGN, subjects.START_DEFRAG_CAMPAIGN),
]


@pytest.fixture
async def jetstream(stack: RunningStack) -> Any:
    connection = await nats.connect(stack.nats_url)
    try:
        yield connection.jetstream()
    finally:
        await connection.drain()


@pytest.mark.parametrize(
    ("service", "spec", "subject"),
    SERVICE_CONSUMERS,
    ids=[f"{spec.durable}:{subject}" for _, spec, subject in SERVICE_CONSUMERS],
)
async def test_a_service_terminates_poison_and_still_processes_the_next_message(
    stack: RunningStack,
    jetstream: JetStreamContext,
    caplog: pytest.LogCaptureFixture,
    service: str,
    spec: ConsumerSpec,
    subject: str,
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    valid = valid_payload(subject)

    await publish_poison_then_valid(jetstream, spec, caplog, all_poisons(subject, valid), (subject, valid))

    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{stack.urls[service]}/readyz")).status_code == 200


async def test_the_node_agent_terminates_poison_allocations_and_unknown_commands(
    stack: RunningStack, jetstream: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    spec = subjects.node_agent_track_allocations(stack.agent_node)
    valid = valid_payload(subjects.ALLOCATION_RELEASED, stack.agent_node)

    await publish_poison_then_valid(
        jetstream,
        spec,
        caplog,
        all_poisons(subjects.ALLOCATION_CREATED, valid_payload(subjects.ALLOCATION_CREATED)),
        (subjects.ALLOCATION_RELEASED, valid),
    )

    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{stack.urls['node-agent']}/readyz")).status_code == 200


async def test_the_node_agent_terminates_poison_commands_and_still_runs_the_next_one(
    stack: RunningStack, jetstream: JetStreamContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    node = stack.agent_node
    spec = subjects.node_agent_run_commands(node)
    subject = f"{subjects.STOP_WORKER}.{node}"
    valid = valid_payload(subjects.STOP_WORKER, node)
    unknown_command = f"tf.cmd.node-agent.reboot.{node}"
    poisons = [
        (f"{subjects.START_WORKER}.{node}", POISONS["not JSON"]),
        (f"{subjects.DISCOVER_GPUS}.{node}", POISONS["JSON array"]),
        (unknown_command, POISONS["not JSON"]),
        (unknown_command, valid),  # a valid payload on a subject no command has
        (f"{subjects.STOP_WORKER}.{node}", valid_payload(subjects.STOP_WORKER, "another-node")),
        *all_poisons(subject, valid),
    ]

    await publish_poison_then_valid(jetstream, spec, caplog, poisons, (subject, valid))

    async with httpx.AsyncClient(timeout=5) as client:
        assert (await client.get(f"{stack.urls['node-agent']}/readyz")).status_code == 200
