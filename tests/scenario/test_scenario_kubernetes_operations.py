"""Moving workloads without live migration (`seeds/gpu-live-migration.en.txt`), through the Kubernetes path.

A defrag night: the campaign executor drains the lightly used nodes one pod at a time through the
Eviction API while the ReplicaSet controller recreates each pod and the scheduler (Kubernetes mode)
places the replacement; a node whose GPUNode is labelled `do-not-disrupt` and a node whose pod has no
PodDisruptionBudget are left alone. Then node maintenance by hand: cordon, delete the pod, the
replacement appears on a different node, uncordon.

"Yesterday's" layout is built by deploying while only one node accepts new work (the others cordoned
in the ledger), so each workload lands where the story needs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from k8s_scheduler_support import eventually_async, register_gpus, write_agent_objects
from scenario_kube import (
    ENABLED,
    NATIVE_GPU,
    Deployment,
    DeploymentController,
    KubeStack,
    gpu_ids,
    replica_sets_running,
    taken_over,
)
from tfcommon.cluster import CustomResource, Pod
from tfcommon.config_source import ConfigSource
from tfcommon.ledger.takeover import TakeoverGate, TakeoverLedger
from tfdefrag.campaign import CampaignDeps, CampaignExecutor, ExecutorSettings
from tfdefrag.core.config import DefragConfig
from tfdefrag.store import CampaignStore
from tfwebhook.http import AdmissionService

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NAMESPACE = "ml-inference"
NODES = ("dense-1", "frag-1", "frag-2", "protected-1", "solo-1")
NODE_RESOURCE = "/v1/nodes"
GPU_NODE_RESOURCE = "tensor-fusion.ai/v1/gpunodes"
BUDGETS = "policy/v1/poddisruptionbudgets"
DO_NOT_DISRUPT = "tensor-fusion.ai/do-not-disrupt"
SHARED = {"tensor-fusion.ai/isolation": "shared"}
FRACTION = {
    "tensor-fusion.ai/tflops-request": "30",
    "tensor-fusion.ai/tflops-limit": "30",
    "tensor-fusion.ai/vram-request": "8Gi",
    "tensor-fusion.ai/vram-limit": "8Gi",
}


@dataclass
class Night:
    controller: DeploymentController
    trainer: Deployment
    chat: Deployment
    solo: Deployment


def node_manifest(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def budget(app: str) -> dict[str, object]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "namespace": NAMESPACE},
        "spec": {"selector": {"matchLabels": {"app": app}}, "maxUnavailable": 1},
        "status": {"disruptionsAllowed": 5, "currentHealthy": 3, "desiredHealthy": 2},
    }


async def only_accepting(kube: KubeStack, node: str | None) -> None:
    """Cordon every node in the ledger except `node` (None: uncordon all) and let the scheduler see it."""
    for name in NODES:
        await kube.ledger.set_node_cordoned(name, node is not None and name != node)
    await kube.scheduler.scheduler.recheck_nodes()


async def pods_of(kube: KubeStack, app: str) -> list[Pod]:
    return await kube.pods(NAMESPACE, {"app": app})


async def all_bound(kube: KubeStack, deployment: Deployment) -> list[Pod]:
    pods: list[Pod] = []

    async def done() -> bool:
        nonlocal pods
        pods = await pods_of(kube, deployment.name)
        return len(pods) == deployment.replicas and all(pod.node_name for pod in pods)

    await eventually_async(done, timeout_s=20, what=f"{deployment.name} bound")
    return pods


async def deploy_on(kube: KubeStack, night: Night, deployment: Deployment, node: str, replicas: int) -> None:
    await only_accepting(kube, node)
    deployment.replicas = replicas
    await night.controller.apply(deployment)
    await all_bound(kube, deployment)


async def allocations_on(kube: KubeStack, node: str) -> list[str]:
    return sorted(a.workload.name for a in await kube.ledger.active_allocations() if a.node == node)


async def cordon(kube: KubeStack, name: str, cordoned: bool) -> None:
    """`kubectl cordon` / `uncordon`, then wait until the ledger (`tfctl get nodes`) shows it."""
    node = kube.state.objects[(NODE_RESOURCE, None, name)]
    node["spec"]["unschedulable"] = cordoned
    kube.state.put(NODE_RESOURCE, node)

    async def shown() -> bool:
        return any(n.name == name and n.cordoned == cordoned for n in await kube.ledger.list_nodes())

    await eventually_async(shown, what=f"{name} cordoned={cordoned} in the ledger")


@pytest.fixture(scope="module")
async def night(kube: KubeStack) -> Night:
    """dense-1: 3 of 4 GPUs (trainer); frag-1, frag-2, protected-1: one chat pod each (30 TFLOPS);
    solo-1: one pod without a PodDisruptionBudget. All pods have run for longer than maxDuration."""
    for name in NODES:
        await register_gpus(kube.ledger, name, 4)
        await write_agent_objects(kube.kubectl, kube.ledger, name)
        kube.state.put(NODE_RESOURCE, node_manifest(name))
        await kube.scheduler.scheduler.node_changed(name)
    webhook = AdmissionService(
        config=ConfigSource(None),
        takeovers=TakeoverGate(TakeoverLedger(kube.ledger.engine), full_ttl_s=0),
        bus=kube.bus,
    )
    enabled = {ENABLED: "true"}
    whole = {NATIVE_GPU: 1}
    prepared = Night(
        DeploymentController(kube, webhook),
        Deployment(NAMESPACE, "trainer", 3, labels=enabled, annotations=dict(SHARED), limits=whole),
        Deployment(NAMESPACE, "chat", 1, labels=enabled, annotations=dict(FRACTION), limits={}),
        Deployment(NAMESPACE, "solo", 1, labels=enabled, annotations=dict(FRACTION), limits={}),
    )
    await deploy_on(kube, prepared, prepared.trainer, "dense-1", 3)
    for replicas, node in enumerate(("frag-1", "frag-2", "protected-1"), start=1):
        await deploy_on(kube, prepared, prepared.chat, node, replicas)
    await deploy_on(kube, prepared, prepared.solo, "solo-1", 1)
    await only_accepting(kube, None)
    for app in ("trainer", "chat"):
        kube.state.put(BUDGETS, budget(app))

    async def gpu_node_listed() -> bool:
        return await kube.kubectl.get_custom_object(CustomResource.GPU_NODE, "protected-1") is not None

    await eventually_async(gpu_node_listed, what="GPUNode protected-1 written by its node agent")
    gpu_node = kube.state.objects[(GPU_NODE_RESOURCE, None, "protected-1")]
    gpu_node["metadata"].setdefault("labels", {})[DO_NOT_DISRUPT] = "true"  # kubectl label gpunode
    kube.state.put(GPU_NODE_RESOURCE, gpu_node)
    return prepared


async def test_yesterday_left_lightly_used_nodes(kube: KubeStack, night: Night) -> None:
    assert len(await allocations_on(kube, "dense-1")) == 3
    for node in ("frag-1", "frag-2", "protected-1", "solo-1"):
        assert len(await allocations_on(kube, node)) == 1


async def test_a_defrag_night_drains_fragmented_nodes_one_pod_at_a_time(
    kube: KubeStack, night: Night
) -> None:
    before = {pod.name: pod.node_name for pod in await pods_of(kube, "chat") + await pods_of(kube, "solo")}
    on_protected = [name for name, node in before.items() if node == "protected-1"]
    on_solo = [name for name, node in before.items() if node == "solo-1"]
    executor = CampaignExecutor(
        CampaignDeps(
            cluster=kube.kubectl,
            ledger=kube.ledger,
            store=CampaignStore(kube.ledger.engine),
            publish=kube.bus.publish,
            clock=lambda: datetime.now(UTC),
            settings=ExecutorSettings(replacement_timeout=timedelta(seconds=20), poll_interval_s=0.05),
        )
    )

    async with replica_sets_running(night.controller) as history:
        result = await executor.run("default", DefragConfig(enabled=True, timezone="UTC"), trigger="manual")
        await all_bound(kube, night.chat)

    campaign = result.campaign
    assert sorted(campaign.drained_nodes) == ["frag-1", "frag-2"]
    assert (campaign.pods_evicted, campaign.stranded_pods) == (2, 0)
    assert dict(campaign.failed_nodes) == {}
    assert "do-not-disrupt" in campaign.skipped_nodes["protected-1"]
    assert "PodDisruptionBudget" in campaign.skipped_nodes["solo-1"]
    moves = [
        entry for entry in history.seen if entry[0] == "deleted" or entry[1] in history.replacements.values()
    ]
    assert [kind for kind, _, _ in moves] == ["deleted", "bound", "deleted", "bound"], "one pod at a time"
    for kind, key, node in moves:
        if kind == "bound":
            assert node not in ("frag-1", "frag-2"), f"{key} placed on a drained node"
    assert await allocations_on(kube, "frag-1") == []
    assert await allocations_on(kube, "frag-2") == []
    after = {pod.name: pod.node_name for pod in await pods_of(kube, "chat") + await pods_of(kube, "solo")}
    for name in on_protected + on_solo:
        assert after[name] == before[name], "pods on skipped nodes stay where they are"


async def test_node_maintenance_cordon_delete_the_pod_and_it_moves_then_uncordon(
    kube: KubeStack, night: Night
) -> None:
    [victim, *_] = [pod for pod in await pods_of(kube, "trainer") if pod.node_name == "dense-1"]
    await cordon(kube, "dense-1", True)

    async with replica_sets_running(night.controller) as history:
        kube.delete_pod(NAMESPACE, victim.name)  # kubectl delete pod
        pods = await all_bound(kube, night.trainer)

    key = f"{NAMESPACE}/{victim.name}"
    replacement = next(pod for pod in pods if f"{NAMESPACE}/{pod.name}" == history.replacements[key])
    assert taken_over(replacement)
    assert replacement.node_name != "dense-1", "the replacement appears on a different node"
    assert len(gpu_ids(replacement)) == 1
    assert victim.name not in await allocations_on(kube, "dense-1")

    await cordon(kube, "dense-1", False)
    remaining = [pod.name for pod in await pods_of(kube, "trainer") if pod.node_name == "dense-1"]
    assert len(remaining) == 2, "the node's other pods were not disturbed"
