"""Read one pool's state from the ledger and the cluster into the planner core's `PoolSnapshot`.

The ledger says what is reserved where (the source of truth); the cluster adds what only it knows:
node readiness, cordon and markers, GPUNode labels, pod labels, ages and owners, disruption budgets,
and pods holding a native GPU. Reads only; no decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tfcommon.cluster import Cluster, CustomResource, Pod
from tfcommon.ledger.records import AllocationRecord
from tfcommon.ledger.sql import SqlLedger
from tfcommon.placement import Gpu, Isolation, Node, PlacementRequest, Taint, Toleration

from tfdefrag.core import markers
from tfdefrag.core.planner import PoolNode, PoolSnapshot, Worker

GPU_MODEL_ANNOTATION = "tensor-fusion.ai/gpu-model"
DEFAULT_NATIVE_GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


@dataclass(frozen=True)
class LoadedPool:
    """The snapshot plus what the executor needs to act: pods by key and the allocations behind workers."""

    snapshot: PoolSnapshot
    pods: Mapping[str, Pod]
    allocations: Mapping[str, AllocationRecord]


def _uses_native_gpu(pod: Pod, resources: Sequence[str]) -> bool:
    return any(
        name in container.requests or name in container.limits
        for container in pod.containers
        for name in resources
    )


def _request(allocation: AllocationRecord, pod: Pod | None, pool: str) -> PlacementRequest:
    shares = allocation.shares
    models: frozenset[str] = frozenset()
    if pod is not None and pod.annotations.get(GPU_MODEL_ANNOTATION):
        models = frozenset(
            part.strip() for part in pod.annotations[GPU_MODEL_ANNOTATION].split("|") if part.strip()
        )
    isolation = Isolation(allocation.isolation)
    shared = isolation is Isolation.SHARED
    return PlacementRequest(
        name=f"{allocation.workload.namespace}/{allocation.workload.name}",
        gpu_count=len(shares),
        tflops_milli=0 if shared else max(share.tflops_milli for share in shares),
        vram_bytes=0 if shared else max(share.vram_bytes for share in shares),
        isolation=isolation,
        gpu_models=models,
        node_selector=dict(pod.node_selector) if pod is not None else {},
        tolerations=tuple(
            Toleration(key=t.key, operator=t.operator, value=t.value, effect=t.effect)
            for t in (pod.tolerations if pod is not None else ())
        ),
        pool=pool,
    )


async def load_pool(
    ledger: SqlLedger,
    cluster: Cluster,
    pool: str,
    *,
    native_gpu_resources: Sequence[str] = DEFAULT_NATIVE_GPU_RESOURCES,
    own_source: str | None = None,
) -> LoadedPool:
    """The pool as the planner sees it now. `own_source` is the node this campaign is draining: its
    `defrag-source` marker is ours, so it is not reported as "being drained" by someone else."""
    ledger_nodes = [node for node in await ledger.list_nodes() if node.pool == pool]
    names = {node.name for node in ledger_nodes}
    gpus_by_node: dict[str, list[Gpu]] = {}
    for gpu in await ledger.list_gpus():
        if gpu.node not in names:
            continue
        running = gpu.phase == "Running"
        gpus_by_node.setdefault(gpu.node, []).append(
            Gpu(
                uuid=gpu.uuid,
                index=gpu.index,
                model=gpu.model,
                tflops_milli=gpu.capacity_tflops_milli,
                vram_bytes=gpu.capacity_vram_bytes,
                vendor=gpu.vendor.lower(),
                used_tflops_milli=gpu.used_tflops_milli if running else gpu.capacity_tflops_milli,
                used_vram_bytes=gpu.used_vram_bytes if running else gpu.capacity_vram_bytes,
                numa_node=gpu.numa_node,
            )
        )
    allocations = [a for a in await ledger.active_allocations() if a.pool == pool and a.node in names]
    workers_per_gpu: dict[str, int] = {}
    for allocation in allocations:
        for share in allocation.shares:
            workers_per_gpu[share.gpu_uuid] = workers_per_gpu.get(share.gpu_uuid, 0) + 1
    cluster_nodes = {node.name: node for node in await cluster.list_nodes()}
    gpu_nodes = {obj.name: obj for obj in await cluster.list_custom_objects(CustomResource.GPU_NODE)}
    pods = {f"{pod.namespace}/{pod.name}": pod for pod in await cluster.list_pods()}
    worker_keys = {f"{a.workload.namespace}/{a.workload.name}" for a in allocations}
    native: dict[str, list[str]] = {}
    for key, pod in sorted(pods.items()):
        if (
            pod.node_name in names
            and key not in worker_keys
            and not pod.is_finished
            and _uses_native_gpu(pod, native_gpu_resources)
        ):
            native.setdefault(pod.node_name, []).append(key)
    pool_nodes: list[PoolNode] = []
    for record in sorted(ledger_nodes, key=lambda n: n.name):
        kube = cluster_nodes.get(record.name)
        labels = {**record.labels, **(kube.labels if kube else {})}
        annotations = {**record.annotations, **(kube.annotations if kube else {})}
        if record.name == own_source:
            labels.pop(markers.DEFRAG_SOURCE, None)
        gpus = tuple(
            replace(gpu, workers=workers_per_gpu.get(gpu.uuid, 0))
            for gpu in sorted(gpus_by_node.get(record.name, []), key=lambda g: g.index)
        )
        if any(gpu.index != position for position, gpu in enumerate(gpus)):
            gpus = ()
        node = Node(
            name=record.name,
            cpu_milli=kube.allocatable_cpu_milli
            if kube and kube.allocatable_cpu_milli
            else record.cpu_allocatable_milli,
            memory_bytes=(
                kube.allocatable_memory_bytes
                if kube and kube.allocatable_memory_bytes
                else record.memory_allocatable_bytes
            ),
            gpus=gpus,
            labels={k: v for k, v in labels.items() if not k.startswith(markers.PREFIX + "defrag")},
            taints=tuple(
                Taint(key=t.get("key", ""), value=t.get("value", ""), effect=t.get("effect", "NoSchedule"))
                for t in record.taints
            )
            + (tuple(Taint(t.key, t.value, t.effect) for t in kube.taints) if kube else ()),
            pool=pool,
            workers=sum(1 for a in allocations if a.node == record.name),
        )
        gpu_node = gpu_nodes.get(record.name)
        pool_nodes.append(
            PoolNode(
                node=node,
                labels=labels,
                annotations=annotations,
                gpu_node_labels=dict(gpu_node.labels) if gpu_node else {},
                ready=(kube.ready if kube and kube.conditions else record.ready),
                cordoned=record.cordoned or (kube.cordoned if kube else False),
                deleting=kube is not None and kube.deleting_since is not None,
                created_at=kube.created_at if kube and kube.created_at else None,
                native_gpu_pods=tuple(native.get(record.name, ())),
            )
        )
    workers: list[Worker] = []
    by_key: dict[str, AllocationRecord] = {}
    for allocation in sorted(allocations, key=lambda a: (a.node, a.workload.namespace, a.workload.name)):
        key = f"{allocation.workload.namespace}/{allocation.workload.name}"
        bound = pods.get(key)
        by_key[key] = allocation
        workers.append(
            Worker(
                namespace=allocation.workload.namespace,
                name=allocation.workload.name,
                node=allocation.node,
                request=_request(allocation, bound, pool),
                uid=(bound.uid if bound is not None else allocation.workload.uid) or "",
                labels=dict(bound.labels) if bound is not None else {},
                created_at=(
                    bound.created_at if bound is not None and bound.created_at else allocation.created_at
                ),
                allocation_id=str(allocation.allocation_id),
            )
        )
    budgets = tuple(await cluster.list_disruption_budgets())
    snapshot = PoolSnapshot(pool=pool, nodes=tuple(pool_nodes), workers=tuple(workers), budgets=budgets)
    return LoadedPool(snapshot=snapshot, pods=pods, allocations=by_key)
