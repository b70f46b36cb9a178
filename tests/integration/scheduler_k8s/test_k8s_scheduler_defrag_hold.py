"""Kubernetes mode over HTTP (kmock), real Postgres and NATS JetStream: the replacement a ReplicaSet
creates for a pod the defrag planner evicted (a new name, the same owner uid) is placed into the
capacity hold kept for it, while a pod without that owner that arrives first waits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from k8s_scheduler_support import (
    GIB,
    Running,
    api_server,
    eventually,
    gpu_pod,
    install_once,
    register_gpus,
    start_scheduler,
)
from tfcommon.bus import NatsEventBus
from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import HoldFor, ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger

pytestmark = pytest.mark.integration

OWNER_UID = "7d1c4c1e-rs-web"


@pytest.fixture
async def running(ledger: SqlLedger, bus: NatsEventBus) -> AsyncIterator[Running]:
    async with api_server() as (state, scaffold, url):
        install_once(scaffold, state)
        process = await start_scheduler(state, url, ledger, bus)
        yield process
        await process.stop()


def owned_by_web(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "web-5d9f",
            "uid": OWNER_UID,
            "controller": True,
        }
    ]
    return manifest


def _pod_gpu(running: Running, name: str) -> tuple[str | None, str | None]:
    pod = running.pod(name)
    if pod is None:
        return None, None
    return pod["spec"].get("nodeName"), (pod["metadata"].get("annotations") or {}).get(
        "tensor-fusion.ai/gpu-ids"
    )


async def test_a_replicaset_replacement_claims_the_hold_kept_for_the_evicted_pod(
    running: Running, ledger: SqlLedger
) -> None:
    [gpu] = await register_gpus(ledger, "gpu-node-1", 1)
    await running.scheduler.start()
    # Written by another process (the defrag planner) after the scheduler read the ledger: a pod of
    # the node holds 70 TFLOPS, and 30 TFLOPS are held for the replacement of the evicted `web-abc`.
    await ledger.reserve(
        ReservationRequest(
            allocation_id=uuid4(),
            workload=WorkloadRef(namespace="team-a", name="filler", uid=str(uuid4())),
            pool="default",
            node="gpu-node-1",
            shares=(ShareRequest(gpu_uuid=gpu, tflops_milli=70_000, vram_bytes=40 * GIB),),
        )
    )
    hold_id = uuid4()
    await ledger.reserve_hold(
        ReservationRequest(
            allocation_id=hold_id,
            workload=WorkloadRef(namespace="tfpool-defrag", name="hold-team-a-web-abc", uid=str(hold_id)),
            pool="default",
            node="gpu-node-1",
            shares=(ShareRequest(gpu_uuid=gpu, tflops_milli=30_000, vram_bytes=20 * GIB),),
        ),
        HoldFor(
            pool="default",
            namespace="team-a",
            name="web-abc",
            owner_uid=OWNER_UID,
            expires_at=datetime.now(UTC) + timedelta(minutes=10),
        ),
    )

    running.put(gpu_pod("intruder", tflops="30", vram="20Gi"))
    await eventually(lambda: _unschedulable(running, "intruder"), what="intruder reported unschedulable")
    running.put(owned_by_web(gpu_pod("web-xyz", tflops="30", vram="20Gi")))

    await eventually(lambda: _pod_gpu(running, "web-xyz") == ("gpu-node-1", gpu), what="replacement bound")
    assert _pod_gpu(running, "intruder") == (None, None)
    hold = await ledger.get_allocation(hold_id)
    assert hold is not None
    assert (hold.state, hold.release_reason) == ("released", "defrag hold claimed by team-a/web-xyz")
    assert await ledger.active_holds() == []


def _unschedulable(running: Running, name: str) -> bool:
    pod = running.pod(name) or {}
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)
