"""A GPUPool's `capacityConfig.maxResources`, `capacityConfig.oversubscription` and
`nodeManagerConfig.nodeSelector`, read by the scheduler through its GPUPool watch from a real API server,
placing with a real Postgres ledger and NATS: each bounds placement, and an edit of the object (or of a
Node's labels) takes effect within 2 seconds without a restart. The times from `kubectl` returning to
the effect are printed (`docs/tensorfusion-compatibility.md` quotes them)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.config_source import ConfigSource
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.kube_local import LocalKubernetes
from tfcommon.ledger.records import GpuSpec, NodeSpec
from tfcommon.ledger.sql import SqlLedger
from tfcommon.pool_source import ClusterPoolSource, follow_gpu_pools
from tfscheduler.engine import Scheduler, placement_problems
from tfscheduler.kubernetes_mode import KubernetesMode
from tfscheduler.status_writer import StatusWriter
from tfscheduler.submission import Submission, WorkloadStatus

pytestmark = pytest.mark.integration
GIB = 1024**3
LONG = timedelta(hours=1)
WITHIN_S = 2.0
MEMBER = "tfpool-test/pool-member"


def kubectl(control_plane: LocalKubernetes, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


@dataclass
class Pool:
    control_plane: LocalKubernetes
    scheduler: Scheduler
    cluster: KubernetesCluster
    name: str

    def patch(self, spec: dict[str, Any]) -> float:
        """Merge `spec` into the GPUPool; returns when kubectl returned (monotonic)."""
        body = json.dumps({"spec": spec})
        kubectl(
            self.control_plane, "patch", "gpupool.tensor-fusion.ai", self.name, "--type=merge", "-p", body
        )
        return time.monotonic()

    async def submit(
        self,
        tflops: int,
        *,
        limit_tflops: int | None = None,
        vram_gib: int = 8,
        limit_vram_gib: int | None = None,
    ) -> WorkloadStatus:
        request = GpuRequest(
            pool=self.name,
            tflops_request_milli=tflops * 1000,
            tflops_limit_milli=(limit_tflops or tflops) * 1000,
            vram_request_bytes=vram_gib * GIB,
            vram_limit_bytes=(limit_vram_gib or vram_gib) * GIB,
        )
        workload = WorkloadRef(namespace="team-a", name=f"pod-{uuid.uuid4().hex[:8]}", uid=str(uuid.uuid4()))
        return await self.scheduler.submit(Submission(workload=workload, request=request))

    async def placed_within(self, status: WorkloadStatus, since: float, what: str) -> WorkloadStatus:
        """Retry the pending workloads (as the running scheduler does when a bound changes) until this
        one is placed; prints and checks the time since `since`."""
        deadline = since + WITHIN_S
        while True:
            await self.scheduler.retry_pending()
            current = await self.scheduler.status(status.id)
            assert current is not None
            if current.state == "placed":
                print(f"{what}: {(time.monotonic() - since) * 1000:.0f} ms")
                return current
            assert time.monotonic() < deadline, f"{what}: still {current.state} ({current.reason})"
            await asyncio.sleep(0.02)


async def until(check: Callable[[], bool], *, since: float, what: str) -> None:
    while not check():
        assert time.monotonic() - since < WITHIN_S, f"{what} not seen within {WITHIN_S}s"
        await asyncio.sleep(0.005)
    print(f"{what}: {(time.monotonic() - since) * 1000:.0f} ms")


def node_manifest(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


async def register(ledger: SqlLedger, node: str, pool: str, *, tflops: int = 100, vram_gib: int = 80) -> None:
    await ledger.upsert_node(NodeSpec(name=node, pool=pool))
    await ledger.record_heartbeat(node)
    await ledger.upsert_gpu(
        GpuSpec(
            uuid=f"gpu-{uuid.uuid4()}",
            node=node,
            index=0,
            model="H100",
            vendor="NVIDIA",
            capacity_tflops_milli=tflops * 1000,
            capacity_vram_bytes=vram_gib * GIB,
        )
    )


@contextlib.asynccontextmanager
async def pool_scheduler(
    control_plane: LocalKubernetes,
    ledger: SqlLedger,
    bus: NatsEventBus,
    tmp_path: Path,
    *,
    spec: dict[str, Any],
    nodes: dict[str, dict[str, str]],
    memory: str = "0",
) -> AsyncIterator[Pool]:
    """A GPUPool with `spec`, Node objects with these labels (and allocatable memory) registered in it
    with one 100-TFLOPS 80Gi GPU each, and a scheduler reading pools and nodes as in Kubernetes mode."""
    name = f"pool-{uuid.uuid4().hex[:8]}"
    manifest = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": spec,
    }
    kubectl(control_plane, "apply", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(manifest))
    for node, labels in nodes.items():
        kubectl(control_plane, "create", "-f", "-", stdin=json.dumps(node_manifest(node, labels)))
        status = {"status": {"allocatable": {"memory": memory, "ephemeral-storage": "0"}}}
        kubectl(
            control_plane,
            "patch",
            "node",
            node,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(status),
        )
        await register(ledger, node, name)
    (tmp_path / "config.yaml").write_text("")
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    source = ClusterPoolSource(
        ConfigSource(tmp_path / "config.yaml"), service="scheduler", checks=[placement_problems]
    )
    source.listeners.append(partial(setattr, scheduler, "config"))  # as services/tfscheduler/app.py wires it
    cluster = KubernetesCluster.from_environment(kubeconfig=str(control_plane.kubeconfig), watch_timeout_s=5)
    mode = KubernetesMode(scheduler, cluster)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(follow_gpu_pools(source, cluster, stop)),
        asyncio.create_task(mode.follow_cordons(stop, interval_s=0.5)),  # the service's poll interval
    ]
    try:
        await asyncio.wait_for(source.synced.wait(), timeout=10)
        for _ in range(1000):
            if source.current().pool(name) is not None and scheduler.hosts is not None:
                break
            await asyncio.sleep(0.01)
        await scheduler.start()
        yield Pool(control_plane, scheduler, cluster, name)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        cluster.close()
        kubectl(control_plane, "delete", "gpupool.tensor-fusion.ai", name, "--wait=false")
        for node in nodes:
            kubectl(control_plane, "delete", "node", node, "--wait=false")


async def test_only_nodes_matching_the_pools_node_selector_are_in_it(
    local_kubernetes: LocalKubernetes, ledger: SqlLedger, bus: NatsEventBus, tmp_path: Path
) -> None:
    inside, outside = f"in-{uuid.uuid4().hex[:6]}", f"out-{uuid.uuid4().hex[:6]}"
    selector = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": MEMBER, "operator": "In", "values": ["yes"]}]}]
    }
    spec = {"nodeManagerConfig": {"nodeSelector": selector}}
    nodes = {inside: {MEMBER: "yes"}, outside: {}}
    async with pool_scheduler(local_kubernetes, ledger, bus, tmp_path, spec=spec, nodes=nodes) as pool:
        first = await pool.submit(60)
        assert (first.state, first.node) == ("placed", inside)
        second = await pool.submit(60)
        assert second.state == "pending"
        assert second.reason is not None
        assert (
            f"1 not in GPUPool {pool.name} (node labels miss its spec.nodeManagerConfig.nodeSelector)"
            in second.reason
        )
        writer = StatusWriter(
            ledger,
            pool.cluster,
            in_pool=lambda node, name: pool.scheduler.pool_membership(node, name) is None,
        )
        await writer.sync()
        stored = json.loads(
            kubectl(local_kubernetes, "get", "gpupool.tensor-fusion.ai", pool.name, "-o", "json")
        )
        assert (stored["status"]["totalNodes"], stored["status"]["totalTFlops"]) == (1, "100")

        labelled = time.monotonic()
        kubectl(local_kubernetes, "label", "node", outside, f"{MEMBER}=yes")
        placed = await pool.placed_within(second, labelled, "Node label -> in the pool, pending pod placed")
        assert placed.node == outside

        edited = pool.patch(
            {
                "nodeManagerConfig": {
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [outside]}]}
                        ]
                    }
                }
            }
        )
        await until(lambda: inside in pool.scheduler.blocked, since=edited, what="GPUPool nodeSelector edit")
        third = await pool.submit(30)
        assert (third.state, third.node) == ("placed", outside)
        fourth = await pool.submit(30)  # 40 TFLOPS are free on the node that left the pool
        assert fourth.state == "pending"
        assert fourth.reason is not None
        assert f"1 not in GPUPool {pool.name}" in fourth.reason


async def test_the_pool_never_reserves_above_its_max_resources(
    local_kubernetes: LocalKubernetes, ledger: SqlLedger, bus: NatsEventBus, tmp_path: Path
) -> None:
    spec = {"capacityConfig": {"maxResources": {"tflops": "100", "vram": "20Gi"}}}
    nodes: dict[str, dict[str, str]] = {f"a-{uuid.uuid4().hex[:6]}": {}, f"b-{uuid.uuid4().hex[:6]}": {}}
    async with pool_scheduler(local_kubernetes, ledger, bus, tmp_path, spec=spec, nodes=nodes) as pool:
        assert (await pool.submit(60)).state == "placed"
        held = await pool.submit(60)  # a second node has room; the pool's maximum has not
        assert held.state == "pending"
        assert held.reason == (
            f"GPUPool {pool.name}: spec.capacityConfig.maxResources.tflops would be 120 of 100 (in use 60); "
            "waiting for the pool's usage to fall, or raise the maximum"
        )
        over_vram = await pool.submit(1, vram_gib=13)
        assert over_vram.reason is not None
        assert "spec.capacityConfig.maxResources.vram would be 21Gi of 20Gi (in use 8Gi)" in over_vram.reason

        edited = pool.patch({"capacityConfig": {"maxResources": {"tflops": "150"}}})
        await pool.placed_within(held, edited, "GPUPool maxResources edit -> pending pod placed")
        assert (await pool.submit(40)).state == "pending", "120 of 150 in use: 40 more is over"


async def test_limits_on_a_node_add_up_to_the_pools_oversubscription(
    local_kubernetes: LocalKubernetes, ledger: SqlLedger, bus: NatsEventBus, tmp_path: Path
) -> None:
    node = f"o-{uuid.uuid4().hex[:6]}"
    spec = {
        "capacityConfig": {
            "oversubscription": {
                "tflopsOversellRatio": 200,
                "vramExpandToHostMem": 50,
                "vramExpandToHostDisk": 0,
            }
        }
    }
    async with pool_scheduler(
        local_kubernetes, ledger, bus, tmp_path, spec=spec, nodes={node: {}}, memory="64Gi"
    ) as pool:
        # One 100-TFLOPS card: requests stay within 100, limits within 200 (virtual), VRAM limits within
        # 80Gi + half the node's 64Gi of allocatable memory = 112Gi.
        assert (await pool.submit(20, limit_tflops=90)).state == "placed"
        assert (await pool.submit(20, limit_tflops=90)).state == "placed"
        third = await pool.submit(10, limit_tflops=30)
        assert third.state == "pending"
        assert third.reason is not None
        assert "1 limits over the pool's oversubscription" in third.reason

        edited = pool.patch({"capacityConfig": {"oversubscription": {"tflopsOversellRatio": 300}}})
        await pool.placed_within(third, edited, "GPUPool oversubscription edit -> pending pod placed")
        big = await pool.submit(1, limit_tflops=1, vram_gib=1, limit_vram_gib=86)  # 24Gi of limits held
        assert big.state == "placed", big.reason
        assert (await pool.submit(1, limit_tflops=1, vram_gib=1, limit_vram_gib=3)).state == "pending"
