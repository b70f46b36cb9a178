"""Kubernetes mode across failures, over HTTP against kmock with real Postgres and NATS JetStream: a
`410 Gone` mid-run, a restart (pods deleted, created and bound while the scheduler was down), preemption
through the Eviction API with a disruption budget, and the GPU/GPUNode/GPUPool status writer."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

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
    write_agent_objects,
)
from nats.aio.msg import Msg
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.sql import SqlLedger

pytestmark = pytest.mark.integration
GPUS = "tensor-fusion.ai/v1/gpus"
GPU_NODES = "tensor-fusion.ai/v1/gpunodes"
GPU_POOLS = "tensor-fusion.ai/v1/gpupools"


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServerState, kmock.KubernetesScaffold, str]]:
    async with api_server() as (state, scaffold, url):
        install_once(scaffold, state)
        yield state, scaffold, url


def _node_of(state: ApiServerState, name: str) -> str | None:
    pod = state.objects.get(("/v1/pods", "team-a", name))
    return None if pod is None else pod["spec"].get("nodeName")


async def _active_names(ledger: SqlLedger) -> set[str]:
    return {a.workload.name for a in await ledger.active_allocations()}


async def _active_names_are(ledger: SqlLedger, names: set[str]) -> bool:
    return await _active_names(ledger) == names


async def test_a_410_gone_mid_run_neither_misses_nor_double_places_a_pod(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str], ledger: SqlLedger, bus: NatsEventBus
) -> None:
    state, _scaffold, url = api
    await register_gpus(ledger, "gpu-node-1", 2)
    process = await start_scheduler(state, url, ledger, bus)
    try:
        process.put(gpu_pod("before"))
        await eventually(lambda: _node_of(state, "before") == "gpu-node-1", what="first pod bound")

        state.stall_watches()
        process.delete("before")
        process.put(gpu_pod("during"))
        state.compact()
        state.break_watches()

        await eventually(
            lambda: _node_of(state, "during") == "gpu-node-1", what="pod created in the gap bound"
        )
        await eventually_async(
            lambda: _active_names_are(ledger, {"during"}), what="only the pod created in the gap holds GPUs"
        )
        assert len(await ledger.active_allocations()) == 1
    finally:
        await process.stop()


async def test_a_restart_releases_gone_pods_places_new_ones_and_adopts_unknown_bindings(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str], ledger: SqlLedger, bus: NatsEventBus
) -> None:
    state, _scaffold, url = api
    uuids = await register_gpus(ledger, "gpu-node-1", 2)
    first = await start_scheduler(state, url, ledger, bus)
    first.put(gpu_pod("kept"))
    first.put(gpu_pod("gone"))
    await eventually(lambda: _node_of(state, "kept") and _node_of(state, "gone"), what="both bound")
    kept_before = await ledger.active_allocations()
    await first.stop()

    state.delete("/v1/pods", "team-a", "gone")
    state.put("/v1/pods", gpu_pod("new"))
    stranger = gpu_pod(
        "stranger",
        tflops="5",
        vram="4Gi",
        node="gpu-node-1",
        annotations={"tensor-fusion.ai/gpu-ids": uuids[1].upper()},
    )
    state.put("/v1/pods", stranger)
    drift: list[dict[str, Any]] = []

    async def keep(msg: Msg) -> None:
        drift.append(json.loads(msg.data))

    subscription = await bus.nc.subscribe("tf.evt.gpu.drift-detected", cb=keep)
    second = await start_scheduler(state, url, ledger, bus)
    try:
        await eventually(lambda: _node_of(state, "new") == "gpu-node-1", what="new pod bound")
        await eventually_async(
            lambda: _active_names_are(ledger, {"kept", "new", "stranger"}), what="ledger reconciled"
        )
        kept_after = [a for a in await ledger.active_allocations() if a.workload.name == "kept"]
        assert [a.allocation_id for a in kept_after] == [
            a.allocation_id for a in kept_before if a.workload.name == "kept"
        ]
        [adopted] = [a for a in await ledger.active_allocations() if a.workload.name == "stranger"]
        assert [(s.gpu_uuid, s.tflops_milli, s.vram_bytes) for s in adopted.shares] == [
            (uuids[1], 5_000, 4 * GIB)
        ]
        relay = OutboxRelay(ledger, bus)  # the adoption's drift events commit with it, in the outbox
        while await relay.publish_pending():
            pass
        await eventually(lambda: drift, what="drift event")
        assert drift[0]["kind"] == "binding-without-allocation"
        assert drift[0]["gpu_uuid"] == uuids[1]
        assert drift[0]["workload"]["name"] == "stranger"
        [gone] = [a for a in kept_before if a.workload.name == "gone"]
        record = await ledger.get_allocation(gone.allocation_id)
        assert record is not None
        assert record.release_reason == "pod gone while the scheduler was down"
        released = [e for e in await ledger.history() if e.kind == "released"]
        assert {e.allocation_id for e in released} == {gone.allocation_id}
    finally:
        await subscription.unsubscribe()
        await second.stop()


async def test_preemption_respects_a_disruption_budget_then_evicts_through_the_api(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str], ledger: SqlLedger, bus: NatsEventBus
) -> None:
    state, scaffold, url = api
    await register_gpus(ledger, "gpu-node-1", 1, vram_bytes=40 * GIB)
    process = await start_scheduler(state, url, ledger, bus)
    try:
        process.put(gpu_pod("batch", vram="30Gi", qos="low", labels={"app": "batch"}))
        await eventually(lambda: _node_of(state, "batch") == "gpu-node-1", what="low-priority pod bound")
        budget = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "batch-pdb", "namespace": "team-a"},
            "spec": {"selector": {"matchLabels": {"app": "batch"}}, "minAvailable": 1},
            "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1},
        }
        state.put("policy/v1/poddisruptionbudgets", budget)

        process.put(gpu_pod("urgent", vram="30Gi", qos="critical", priority=1_000_000))

        await eventually(lambda: _condition_message(state, "urgent"), what="preemptor reported waiting")
        assert _evictions(scaffold) >= 1
        assert _node_of(state, "batch") == "gpu-node-1"
        assert await _active_names(ledger) == {"batch"}

        budget["status"] = {"disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1}
        state.put("policy/v1/poddisruptionbudgets", budget)

        await eventually(lambda: _node_of(state, "urgent") == "gpu-node-1", what="preemptor bound")
        assert state.objects.get(("/v1/pods", "team-a", "batch")) is None
        assert await _active_names(ledger) == {"urgent"}
        evicted = [e for e in await ledger.history() if e.kind == "evicted"]
        assert len(evicted) == 1
    finally:
        await process.stop()


def _evictions(scaffold: kmock.KubernetesScaffold) -> int:
    return sum(1 for request in scaffold if request.url.path.endswith("/batch/eviction"))


def _condition_message(state: ApiServerState, name: str) -> str | None:
    pod = state.objects.get(("/v1/pods", "team-a", name))
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c["message"] for c in conditions if c["type"] == "PodScheduled"), None)


async def test_gpu_node_and_pool_status_follow_the_ledger_within_a_second(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str], ledger: SqlLedger, bus: NatsEventBus
) -> None:
    state, _scaffold, url = api
    [uuid] = await register_gpus(ledger, "gpu-node-1", 1)
    state.put(
        GPU_POOLS,
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUPool",
            "metadata": {"name": "default"},
            "spec": {"defaultUsingLocalGPU": True},
            "status": {"lastDefragTime": "2026-01-01T00:00:00Z"},
        },
    )
    [unannounced] = await register_gpus(ledger, "gpu-node-2", 1)
    process = await start_scheduler(state, url, ledger, bus)
    try:
        await write_agent_objects(process.cluster, ledger, "gpu-node-1")  # the node agent's part
        await eventually(
            lambda: (state.objects.get((GPUS, None, uuid)) or {}).get("status", {}).get("available"),
            what="GPU available written by the scheduler",
        )
        gpu = state.objects[(GPUS, None, uuid)]
        assert gpu["status"]["capacity"] == {"tflops": "100", "vram": "80Gi"}
        assert gpu["status"]["available"] == {"tflops": "100", "vram": "80Gi"}
        assert (gpu["status"]["uuid"], gpu["status"]["index"], gpu["status"]["gpuModel"]) == (uuid, 0, "H100")
        assert gpu["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-node-1"
        assert gpu["status"]["model"] == "NVIDIA H100", "the agent's fields are not overwritten"
        assert (GPUS, None, unannounced) not in state.objects, "GPU objects are the node agent's to create"
        assert (GPU_NODES, None, "gpu-node-2") not in state.objects

        process.put(gpu_pod("trainer", tflops="30", vram="20Gi"))
        await eventually(lambda: _node_of(state, "trainer"), what="pod bound")
        bound_at = time.monotonic()

        await eventually(
            lambda: (
                state.objects[(GPUS, None, uuid)]["status"]["available"] == {"tflops": "70", "vram": "60Gi"}
            ),
            timeout_s=1.0,
            what="GPU available updated",
        )
        await eventually(
            lambda: (
                (state.objects.get((GPU_NODES, None, "gpu-node-1")) or {})
                .get("status", {})
                .get("availableVRAM")
                == "60Gi"
            ),
            timeout_s=1.0 - (time.monotonic() - bound_at),
            what="GPUNode available updated",
        )
        node_status = state.objects[(GPU_NODES, None, "gpu-node-1")]["status"]
        assert (node_status["totalTFlops"], node_status["managedGPUDeviceIDs"]) == ("100", [uuid])
        assert node_status["phase"] == "Running"
        await eventually(  # the writer patches GPUs, GPUNodes and GPUPools concurrently: any may land last
            lambda: state.objects[(GPU_POOLS, None, "default")]["status"].get("availableTFlops") != "200",
            timeout_s=1.0 - (time.monotonic() - bound_at),
            what="GPUPool available updated",
        )
        pool = state.objects[(GPU_POOLS, None, "default")]["status"]
        assert (pool["availableTFlops"], pool["totalNodes"], pool["readyNodes"]) == ("170", 2, 2)
        assert pool["lastDefragTime"] == "2026-01-01T00:00:00Z"
    finally:
        await process.stop()
