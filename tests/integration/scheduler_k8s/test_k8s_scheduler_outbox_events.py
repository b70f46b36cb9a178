"""Kubernetes mode while NATS is down (issue 20): what the scheduler commits in the ledger and the event
that announces it are one transaction (the event through the outbox), so the event reaches the bus once
NATS is back: a preempted pod's release as evicted with `tf.evt.pod.evicted`, and an adopted binding
with its `tf.evt.gpu.drift-detected`.

kmock over HTTP plays the API server (its Eviction API deletes the pod; the ReplicaSet would recreate
it), with real Postgres and a NATS server of the test's own that it stops and starts again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from uuid import uuid5

import kmock
import pytest
from cluster_apiserver import ApiServerState
from k8s_scheduler_support import (
    GIB,
    api_server,
    eventually,
    eventually_async,
    gpu_pod,
    install_once,
    register_gpus,
    start_scheduler,
)
from tfcommon.bus import NatsEventBus
from tfcommon.events import DriftDetected, PodEvicted
from tfcommon.infra import EmbeddedNats
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import relayed_events

pytestmark = pytest.mark.integration
NODE = "gpu-node-1"
BusOf = Callable[[str], contextlib.AbstractAsyncContextManager[NatsEventBus]]


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServerState, kmock.KubernetesScaffold, str]]:
    async with api_server() as (state, scaffold, url):
        install_once(scaffold, state)
        yield state, scaffold, url


def node_of(state: ApiServerState, name: str) -> str | None:
    pod = state.objects.get(("/v1/pods", "team-a", name))
    return None if pod is None else pod["spec"].get("nodeName")


async def test_a_preemption_while_nats_is_down_announces_the_eviction_once(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str],
    ledger: SqlLedger,
    own_nats: EmbeddedNats,
    own_nats_bus: BusOf,
) -> None:
    state, _scaffold, url = api
    await register_gpus(ledger, NODE, 1, vram_bytes=40 * GIB)
    async with own_nats_bus("scheduler") as bus:
        process = await start_scheduler(state, url, ledger, bus)
        try:
            process.put(gpu_pod("batch", vram="30Gi", qos="low"))
            await eventually(lambda: node_of(state, "batch") == NODE, what="low-priority pod bound")
            [victim] = await ledger.active_allocations()

            own_nats.stop()
            process.put(gpu_pod("urgent", vram="30Gi", qos="critical", priority=1_000_000))
            await eventually(lambda: node_of(state, "urgent") == NODE, timeout_s=30, what="preemptor bound")

            async def evicted_in_ledger() -> bool:
                return [e.kind for e in await ledger.history(victim.allocation_id)][-1:] == ["evicted"]

            await eventually_async(evicted_in_ledger, what="victim released as evicted")
            assert state.objects.get(("/v1/pods", "team-a", "batch")) is None
        finally:
            await process.stop()

    own_nats.start()
    async with own_nats_bus("outbox-relay") as relay_bus:
        delivered = await relayed_events(ledger, relay_bus, PodEvicted.subject)

    event_id = uuid5(victim.allocation_id, "evicted")
    assert [message_id for message_id, _event in delivered] == [str(event_id)]
    [(_message_id, event)] = delivered
    assert isinstance(event, PodEvicted)
    assert (event.allocation_id, event.node, event.by) == (victim.allocation_id, NODE, "preemption")
    assert event.workload.name == "batch"
    assert event.preemptor is not None
    assert event.preemptor.name == "urgent"


async def test_an_adoption_while_nats_is_down_announces_its_drift_once(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str],
    ledger: SqlLedger,
    own_nats: EmbeddedNats,
    own_nats_bus: BusOf,
) -> None:
    state, _scaffold, url = api
    [gpu] = await register_gpus(ledger, NODE, 1)
    stranger = gpu_pod("stranger", node=NODE, annotations={"tensor-fusion.ai/gpu-ids": gpu.upper()})
    state.put("/v1/pods", stranger)
    async with own_nats_bus("scheduler") as bus:
        own_nats.stop()
        process = await start_scheduler(state, url, ledger, bus)
        try:

            async def adopted() -> bool:
                return [a.workload.name for a in await ledger.active_allocations()] == ["stranger"]

            await eventually_async(adopted, what="bound pod adopted into the ledger")
        finally:
            await process.stop()

    own_nats.start()
    async with own_nats_bus("outbox-relay") as relay_bus:
        delivered = await relayed_events(ledger, relay_bus, DriftDetected.subject)

    [allocation] = await ledger.active_allocations()
    event_id = uuid5(allocation.allocation_id, f"binding-without-allocation/{gpu.lower()}")
    assert [message_id for message_id, _event in delivered] == [str(event_id)]
    [(_message_id, event)] = delivered
    assert isinstance(event, DriftDetected)
    assert (event.kind, event.node, event.gpu_uuid) == ("binding-without-allocation", NODE, gpu.lower())
    assert event.detail.endswith("adopted into the ledger")
