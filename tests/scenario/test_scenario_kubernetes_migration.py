"""The user's story "Migrate Existing Workload" through the Kubernetes path, step by step.

Each test is one step of `seeds/migrate-existing-workload.en.txt` and asserts what the guide says the
user will see (`kubectl get pod -L tensor-fusion.ai/component`, the `gpu-ids` annotation, `kubectl get
gpu` AVAILABLE, the ledger). The steps share one cluster and run in file order; the last step bills the
whole story (`tfmetrics`), per namespace, against whole GPUs.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from k8s_scheduler_support import eventually_async, register_gpus, write_agent_objects
from scenario_kube import (
    DEVICE_PLUGIN_NODE,
    ENABLED,
    GIB,
    NATIVE_GPU,
    TF_SCHEDULER,
    Deployment,
    DeploymentController,
    KubeStack,
    gpu_ids,
    native_limit,
    taken_over,
)
from tfcommon.cluster import Pod
from tfcommon.config import TfConfig
from tfcommon.config_source import ConfigSource
from tfcommon.ledger.takeover import TakeoverGate, TakeoverLedger
from tfmetrics.billing_api import bill_from_ledger
from tfwebhook.http import AdmissionService

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

NAMESPACE = "ml-serving"
REPLICAS = 8
GPU_NODES = ("gpu-node-1", "gpu-node-2")
ISOLATION = "tensor-fusion.ai/isolation"
ENABLED_REPLICAS = "tensor-fusion.ai/enabled-replicas"
WHOLE_H100 = ("100", "80Gi")
STORY_STARTED = datetime.now(UTC)
AUTO_MIGRATION = """
dynamicConfig:
  autoMigration:
    enable: true
    scope:
      includes:
        namespaceNames:
          - ml-team-a
      excludes:
        podSelector:
          matchLabels:
            gpu-migration: skip
"""


def a_webhook(stack: KubeStack, config: ConfigSource) -> AdmissionService:
    takeovers = TakeoverGate(TakeoverLedger(stack.ledger.engine), full_ttl_s=0)
    return AdmissionService(config=config, bus=stack.bus, takeovers=takeovers)


@pytest.fixture(scope="module")
async def gpus(kube: KubeStack) -> list[str]:
    """Two GPU nodes of the default pool, four H100 each (100 TFLOPS, 80Gi), registered by their agents."""
    uuids = [uuid for node in GPU_NODES for uuid in await register_gpus(kube.ledger, node, 4)]
    for node in GPU_NODES:
        await write_agent_objects(kube.kubectl, kube.ledger, node)
    await kube.scheduler.scheduler.start()
    return [uuid.lower() for uuid in uuids]


@pytest.fixture(scope="module")
def controller(kube: KubeStack, gpus: list[str]) -> DeploymentController:
    return DeploymentController(kube, a_webhook(kube, ConfigSource(None)))


@pytest.fixture(scope="module")
def llm() -> Deployment:
    return Deployment(NAMESPACE, "llm", REPLICAS)


async def current_pods(
    kube: KubeStack, controller: DeploymentController, deployment: Deployment
) -> list[Pod]:
    replica_set = controller.current[(deployment.namespace, deployment.name)]
    return await kube.pods(deployment.namespace, {"pod-template-hash": replica_set[-10:]})


async def rolled_out(kube: KubeStack, controller: DeploymentController, deployment: Deployment) -> list[Pod]:
    """`kubectl rollout status`: the new ReplicaSet's pods all bound, the old ones gone."""
    replica_set = await controller.apply(deployment)
    pods: list[Pod] = []

    async def done() -> bool:
        nonlocal pods
        every = await kube.pods(deployment.namespace, {"app": deployment.name})
        pods = [pod for pod in every if pod.labels.get("pod-template-hash") == replica_set[-10:]]
        return len(every) == len(pods) == deployment.replicas and all(pod.node_name for pod in pods)

    await eventually_async(done, timeout_s=20, what=f"rollout of {replica_set}")
    return pods


def assert_untouched(pod: Pod) -> None:
    """A pod left to the device plugin: no COMPONENT, its `nvidia.com/gpu` limit, kube-scheduler's."""
    assert not taken_over(pod), pod.labels
    assert native_limit(pod) == "1"
    assert pod.scheduler_name == "default-scheduler"
    assert pod.node_name == DEVICE_PLUGIN_NODE
    assert not gpu_ids(pod)


async def active_in(kube: KubeStack, namespace: str) -> list[object]:
    return [a for a in await kube.ledger.active_allocations() if a.workload.namespace == namespace]


async def held_by_exactly(kube: KubeStack, pods: list[Pod]) -> None:
    """The ledger holds allocations for exactly `pods` (old pods' are released once the scheduler sees
    them deleted)."""
    wanted = sorted(pod.name for pod in pods)
    held: list[str] = []

    async def matches() -> bool:
        nonlocal held
        held = sorted(
            a.workload.name
            for a in await kube.ledger.active_allocations()
            if a.workload.namespace == pods[0].namespace
        )
        return held == wanted

    await eventually_async(matches, what=f"allocations held by exactly {wanted}")


async def test_step_1_native_gpu_pods_run_on_the_device_plugin(
    kube: KubeStack, controller: DeploymentController, llm: Deployment
) -> None:
    pods = await rolled_out(kube, controller, llm)

    assert len(pods) == REPLICAS
    for pod in pods:
        assert_untouched(pod)
    assert await active_in(kube, NAMESPACE) == []


async def test_step_2_one_replica_is_handed_over_as_a_whole_gpu(
    kube: KubeStack, controller: DeploymentController, llm: Deployment, gpus: list[str]
) -> None:
    llm.labels = {ENABLED: "true"}
    llm.annotations = {ISOLATION: "shared", ENABLED_REPLICAS: "1"}

    pods = await rolled_out(kube, controller, llm)

    [migrated] = [pod for pod in pods if taken_over(pod)]
    assert migrated.labels["tensor-fusion.ai/component"] == "worker"
    assert migrated.scheduler_name == TF_SCHEDULER
    assert native_limit(migrated) is None, "the webhook removes the nvidia.com/gpu limit"
    assert migrated.annotations[ISOLATION] == "shared"
    assert migrated.node_name in GPU_NODES
    [gpu] = gpu_ids(migrated)
    assert gpu in gpus
    for pod in pods:
        if pod is not migrated:
            assert_untouched(pod)
    await held_by_exactly(kube, [migrated])
    [allocation] = await active_in(kube, NAMESPACE)
    [share] = allocation.shares  # type: ignore[attr-defined]
    assert (share.tflops_milli, share.vram_bytes) == (100_000, 80 * GIB), "a whole GPU"


@pytest.mark.parametrize("percent", [25, 50, 100])
async def test_step_3_raising_enabled_replicas_takes_over_only_that_many(
    kube: KubeStack, controller: DeploymentController, llm: Deployment, percent: int
) -> None:
    enabled = REPLICAS * percent // 100
    llm.annotations = {**llm.annotations, ENABLED_REPLICAS: str(enabled)}

    pods = await rolled_out(kube, controller, llm)

    migrated = [pod for pod in pods if taken_over(pod)]
    assert len(migrated) == enabled
    for pod in pods:
        if pod in migrated:
            assert pod.node_name in GPU_NODES
            assert len(gpu_ids(pod)) == 1
        else:
            assert_untouched(pod)
    await held_by_exactly(kube, migrated)


async def test_step_4_every_taken_over_pod_has_gpu_ids_and_its_gpus_show_zero_available(
    kube: KubeStack, controller: DeploymentController, llm: Deployment, gpus: list[str]
) -> None:
    pods = await current_pods(kube, controller, llm)

    assigned = [gpu for pod in pods for gpu in gpu_ids(pod)]
    assert all(taken_over(pod) for pod in pods)
    assert sorted(assigned) == sorted(gpus), "each of the 8 pods holds its own whole GPU"

    async def all_zero() -> bool:
        available = await kube.gpu_available()
        return all(available.get(gpu) == ("0", "0") for gpu in assigned)

    await eventually_async(all_zero, timeout_s=10, what="assigned GPUs show zero available TFLOPS and VRAM")


async def test_step_5_shrinking_to_tflops_and_vram_lets_pods_share_a_card(
    kube: KubeStack, controller: DeploymentController, llm: Deployment
) -> None:
    llm.annotations = {
        "tensor-fusion.ai/tflops-request": "30",
        "tensor-fusion.ai/tflops-limit": "60",
        "tensor-fusion.ai/vram-request": "8Gi",
        "tensor-fusion.ai/vram-limit": "8Gi",
    }
    llm.limits = {}

    pods = await rolled_out(kube, controller, llm)

    assert all(taken_over(pod) and pod.annotations[ISOLATION] == "soft" for pod in pods)
    per_gpu = Counter(gpu for pod in pods for gpu in gpu_ids(pod))
    assert sum(per_gpu.values()) == REPLICAS
    assert max(per_gpu.values()) >= 2, f"several pods share a card: {per_gpu}"
    await held_by_exactly(kube, pods)
    allocations = await active_in(kube, NAMESPACE)
    for allocation in allocations:
        [share] = allocation.shares  # type: ignore[attr-defined]
        assert (share.tflops_milli, share.vram_bytes) == (30_000, 8 * GIB)
        assert (share.limit_tflops_milli, share.limit_vram_bytes) == (60_000, 8 * GIB)


async def test_roll_back_returns_pods_to_the_device_plugin_and_releases_their_allocations(
    kube: KubeStack, controller: DeploymentController, llm: Deployment, gpus: list[str]
) -> None:
    llm.labels, llm.annotations, llm.limits = {}, {}, {NATIVE_GPU: 1}

    pods = await rolled_out(kube, controller, llm)

    for pod in pods:
        assert_untouched(pod)

    async def released() -> bool:
        return await active_in(kube, NAMESPACE) == []

    await eventually_async(released, what="allocations of the rolled-back pods released")

    async def all_free() -> bool:
        available = await kube.gpu_available()
        return all(available.get(gpu) == WHOLE_H100 for gpu in gpus)

    await eventually_async(all_free, what="every GPU available again")


async def test_automatic_migration_converts_only_new_pods_in_scope(
    kube: KubeStack, controller: DeploymentController, tmp_path_factory: pytest.TempPathFactory
) -> None:
    in_scope = Deployment("ml-team-a", "embedder", 2)
    other_namespace = Deployment("ml-team-b", "ranker", 1)
    excluded = Deployment("ml-team-a", "batch", 1, labels={"gpu-migration": "skip"})
    opted_out = Deployment("ml-team-a", "pinned", 1, labels={ENABLED: "false"})
    workloads = (in_scope, other_namespace, excluded, opted_out)
    for deployment in workloads:
        await rolled_out(kube, controller, deployment)
    values = tmp_path_factory.mktemp("helm") / "tensor-fusion.yaml"
    values.write_text(AUTO_MIGRATION)
    controller.use_webhook(a_webhook(kube, ConfigSource(Path(values))))

    for pod in await kube.pods("ml-team-a", {"app": "embedder"}):
        assert_untouched(pod)  # existing pods are not touched

    restarted = {}
    for deployment in workloads:  # kubectl rollout restart
        deployment.annotations["kubectl.kubernetes.io/restartedAt"] = datetime.now(UTC).isoformat()
        restarted[deployment.name] = await rolled_out(kube, controller, deployment)

    for pod in restarted["embedder"]:
        assert taken_over(pod)
        assert pod.labels[ENABLED] == "true"
        assert pod.annotations[ISOLATION] == "shared"
        assert pod.node_name in GPU_NODES
        assert len(gpu_ids(pod)) == 1
    for name in ("ranker", "batch", "pinned"):
        for pod in restarted[name]:
            assert_untouched(pod)
    assert [a.workload.namespace for a in await kube.ledger.active_allocations()] == ["ml-team-a"] * 2


async def test_the_bill_shows_each_namespace_cost_and_the_savings_against_whole_gpus(kube: KubeStack) -> None:
    bill = await bill_from_ledger(
        kube.ledger,
        TfConfig(),
        {"H100": Decimal("2.49")},
        start=STORY_STARTED,
        end=datetime.now(UTC),
        group_by="namespace",
        quantum=Decimal("0.000001"),
    )

    lines = {line.key: line for line in bill.lines}
    assert sorted(lines) == ["ml-serving", "ml-team-a"], "native pods on the device plugin are not billed"
    for line in lines.values():
        assert line.cost > 0
        assert line.dedicated_cost > 0
        assert line.savings == line.dedicated_cost - line.cost
    assert lines["ml-serving"].savings > 0, "sharing cards (step 5) costs less than whole GPUs"
    assert bill.cost == sum(line.cost for line in lines.values())
    assert bill.savings == bill.dedicated_cost - bill.cost
