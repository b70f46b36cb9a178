"""Kubernetes mode over HTTP against a stateful API server (kmock), with real Postgres and NATS JetStream:
place, annotate and bind; unschedulable reporting; release exactly once; bind failure roll-back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from cluster_apiserver import ApiServerState
from k8s_scheduler_support import (
    GIB,
    Running,
    api_server,
    eventually,
    eventually_async,
    gpu_pod,
    install_once,
    register_gpus,
    start_scheduler,
)
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.takeover import TakeoverLedger

pytestmark = pytest.mark.integration


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServerState, kmock.KubernetesScaffold, str]]:
    async with api_server() as server:
        yield server


@pytest.fixture
async def running(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str], ledger: SqlLedger, bus: NatsEventBus
) -> AsyncIterator[Running]:
    state, scaffold, url = api
    install_once(scaffold, state)
    process = await start_scheduler(state, url, ledger, bus)
    yield process
    await process.stop()


def _annotations(pod: dict[str, Any] | None) -> dict[str, str]:
    assert pod is not None
    return dict(pod["metadata"].get("annotations") or {})


def _node_of(running: Running, name: str) -> str | None:
    pod = running.pod(name)
    return None if pod is None else pod["spec"].get("nodeName")


def _condition(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    assert pod is not None
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled"), None)


def _events_for(running: Running, name: str) -> list[dict[str, Any]]:
    return [
        obj
        for (resource, _, _), obj in running.state.objects.items()
        if resource == "/v1/events" and obj["involvedObject"]["name"] == name
    ]


async def test_a_pending_pod_is_placed_annotated_with_its_gpus_and_bound(
    running: Running, ledger: SqlLedger
) -> None:
    uuids = await register_gpus(ledger, "gpu-node-1", 2)
    await running.scheduler.start()

    running.put(gpu_pod("trainer", tflops="30", vram="20Gi", gpu_count=2))

    await eventually(lambda: _node_of(running, "trainer") == "gpu-node-1", what="pod bound")
    annotations = _annotations(running.pod("trainer"))
    assert sorted(annotations["tensor-fusion.ai/gpu-ids"].split(",")) == sorted(u.lower() for u in uuids)
    assert json.loads(annotations["tensor-fusion.ai/container-gpus"]) == {
        "main": annotations["tensor-fusion.ai/gpu-ids"].split(",")
    }
    [allocation] = await ledger.active_allocations()
    assert allocation.workload.name == "trainer"
    assert {s.gpu_uuid for s in allocation.shares} == set(uuids)
    assert {(s.tflops_milli, s.vram_bytes) for s in allocation.shares} == {(30_000, 20 * GIB)}


async def test_an_unschedulable_pod_gets_the_condition_and_an_event_then_is_placed_when_room_frees(
    running: Running, ledger: SqlLedger
) -> None:
    await register_gpus(ledger, "gpu-node-1", 1, vram_bytes=40 * GIB)
    await running.scheduler.start()
    running.put(gpu_pod("first", vram="30Gi"))
    await eventually(lambda: _node_of(running, "first") == "gpu-node-1", what="first pod bound")

    running.put(gpu_pod("second", vram="30Gi"))

    await eventually(lambda: _condition(running.pod("second")) is not None, what="PodScheduled condition")
    condition = _condition(running.pod("second"))
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert "0/1" in condition["message"]
    assert "VRAM" in condition["message"]
    await eventually(lambda: _events_for(running, "second"), what="FailedScheduling event")
    [event] = _events_for(running, "second")
    assert event["reason"] == "FailedScheduling"
    assert event["message"] == condition["message"]

    running.delete("first")

    await eventually(lambda: _node_of(running, "second") == "gpu-node-1", what="second pod bound")
    [allocation] = await ledger.active_allocations()
    assert allocation.workload.name == "second"


async def test_a_bad_annotation_is_reported_on_the_pod_naming_the_annotation(
    running: Running, ledger: SqlLedger
) -> None:
    await register_gpus(ledger, "gpu-node-1", 1)
    await running.scheduler.start()

    running.put(gpu_pod("typo", vram="lots"))

    await eventually(lambda: _condition(running.pod("typo")) is not None, what="PodScheduled condition")
    condition = _condition(running.pod("typo"))
    assert condition is not None
    assert "annotation tensor-fusion.ai/vram-request" in condition["message"]
    assert "16Gi" in condition["message"]
    assert await ledger.active_allocations() == []


async def test_a_deleted_pod_is_released_exactly_once_and_frees_its_takeover_slot(
    running: Running, ledger: SqlLedger
) -> None:
    await register_gpus(ledger, "gpu-node-1", 1)
    await running.scheduler.start()
    takeover = TakeoverLedger(ledger.engine)
    assert await takeover.claim("slot-1", "team-a/trainer", 2)
    pod = gpu_pod("trainer", annotations={"tensor-fusion.ai/takeover-slot": "slot-1"})
    running.put(pod)
    await eventually(lambda: _node_of(running, "trainer") == "gpu-node-1", what="pod bound")
    [allocation] = await ledger.active_allocations()

    running.delete("trainer")

    await eventually_async(lambda: _released(ledger, allocation.allocation_id), what="allocation released")
    await eventually_async(lambda: _slot_free(takeover), what="takeover slot released")
    # A redelivered deletion (the same pod again) changes nothing more.
    released_again = await running.mode.release(_pod_of(pod, allocation.workload.uid), "pod deleted")
    assert released_again is False
    history = await ledger.history(allocation.allocation_id)
    assert [entry.kind for entry in history].count("released") == 1


async def test_a_finished_pod_is_released(running: Running, ledger: SqlLedger) -> None:
    await register_gpus(ledger, "gpu-node-1", 1)
    await running.scheduler.start()
    running.put(gpu_pod("job"))
    await eventually(lambda: _node_of(running, "job") == "gpu-node-1", what="pod bound")
    [allocation] = await ledger.active_allocations()

    finished = running.pod("job")
    assert finished is not None
    finished["status"] = {"phase": "Succeeded"}
    running.put(finished)

    await eventually_async(lambda: _released(ledger, allocation.allocation_id), what="released")
    record = await ledger.get_allocation(allocation.allocation_id)
    assert record is not None
    assert record.release_reason == "pod succeeded"


async def test_a_refused_binding_rolls_the_reservation_back(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str], ledger: SqlLedger, bus: NatsEventBus
) -> None:
    state, scaffold, url = api
    scaffold["post /api/v1/namespaces/team-a/pods/doomed/binding"] << kmock.KubernetesError(
        status=409, reason="Conflict", message="Precondition failed: UID in precondition"
    )
    install_once(scaffold, state)
    await register_gpus(ledger, "gpu-node-1", 1)
    process = await start_scheduler(state, url, ledger, bus)
    try:
        process.put(gpu_pod("doomed"))

        await eventually_async(lambda: _has_released_allocation(ledger), what="reservation rolled back")
        assert await ledger.active_allocations() == []
        [record] = list(await _all_allocations(ledger))
        assert record.release_reason is not None
        assert "binding to gpu-node-1 failed" in record.release_reason
        assert _node_of(process, "doomed") is None
    finally:
        await process.stop()


def _pod_of(manifest: dict[str, Any], uid: str | None) -> Any:
    from tfcommon.cluster.manifests import pod_from_manifest

    stamped = json.loads(json.dumps(manifest))
    stamped["metadata"]["uid"] = uid
    return pod_from_manifest(stamped)


async def _released(ledger: SqlLedger, allocation_id: Any) -> bool:
    record = await ledger.get_allocation(allocation_id)
    return record is not None and record.state == "released"


async def _slot_free(takeover: TakeoverLedger) -> bool:
    return await takeover.held("team-a/trainer") == 0


async def _all_allocations(ledger: SqlLedger) -> list[Any]:
    ids = {entry.allocation_id for entry in await ledger.history()}
    records = [await ledger.get_allocation(i) for i in ids]
    return [r for r in records if r is not None]


async def _has_released_allocation(ledger: SqlLedger) -> bool:
    return any(r.state == "released" for r in await _all_allocations(ledger))
