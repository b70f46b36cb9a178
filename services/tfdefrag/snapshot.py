"""Read one pool's state from the ledger and the cluster into the planner core's `PoolSnapshot`.

The ledger says what is reserved where (the source of truth), turned into placement nodes and worker
requests by `tfcommon.placement.from_ledger`, the same rules the scheduler places by; the cluster adds
what only it knows: node readiness, cordon and markers, labels, taints and allocatable, GPUNode labels,
pod labels, ages and owners, disruption budgets, and pods holding a native GPU. Reads only; no decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tfcommon.cluster import Cluster, CustomResource, Pod
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import AllocationRecord
from tfcommon.placement import Taint
from tfcommon.placement.from_ledger import placed_request, placement_view
from tfcommon.pool_capacity import NO_BOUNDS, HostFacts, PoolCapacity, with_virtual_capacity

from tfdefrag.core import markers
from tfdefrag.core.planner import PoolNode, PoolSnapshot, Worker

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


async def load_pool(
    ledger: Ledger,
    cluster: Cluster,
    pool: str,
    *,
    native_gpu_resources: Sequence[str] = DEFAULT_NATIVE_GPU_RESOURCES,
    own_source: str | None = None,
    capacity: PoolCapacity = NO_BOUNDS,
) -> LoadedPool:
    """The pool as the planner sees it now. `own_source` is the node this campaign is draining: its
    `defrag-source` marker is ours, so it is not reported as "being drained" by someone else.
    `capacity` is the pool's: a node whose labels miss its nodeSelector is not in the pool (left out),
    and with an oversubscription each node gets its virtual capacity, so no move overshoots it."""
    cluster_nodes = {node.name: node for node in await cluster.list_nodes()}

    def in_pool(name: str, labels: Mapping[str, str]) -> bool:
        kube = cluster_nodes.get(name)
        return capacity.admits_node(name, {**labels, **(kube.labels if kube else {})})

    ledger_nodes = sorted(
        (node for node in await ledger.list_nodes() if node.pool == pool and in_pool(node.name, node.labels)),
        key=lambda n: n.name,
    )
    names = {node.name for node in ledger_nodes}
    gpus = await ledger.list_gpus()
    allocations = [a for a in await ledger.active_allocations() if a.pool == pool and a.node in names]
    view = placement_view(ledger_nodes, gpus, allocations)
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
    for record in ledger_nodes:
        kube = cluster_nodes.get(record.name)
        labels = {**record.labels, **(kube.labels if kube else {})}
        annotations = {**record.annotations, **(kube.annotations if kube else {})}
        if record.name == own_source:
            labels.pop(markers.DEFRAG_SOURCE, None)
        ledger_node = view.nodes[record.name]
        node = replace(
            ledger_node,
            cpu_milli=kube.allocatable_cpu_milli
            if kube and kube.allocatable_cpu_milli
            else ledger_node.cpu_milli,
            memory_bytes=(
                kube.allocatable_memory_bytes
                if kube and kube.allocatable_memory_bytes
                else ledger_node.memory_bytes
            ),
            labels={k: v for k, v in labels.items() if not k.startswith(markers.PREFIX + "defrag")},
            taints=ledger_node.taints
            + (tuple(Taint(t.key, t.value, t.effect) for t in kube.taints) if kube else ()),
        )
        node = with_virtual_capacity(
            node,
            capacity.oversubscription,
            HostFacts(memory_bytes=node.memory_bytes, disk_bytes=kube.allocatable_disk_bytes if kube else 0),
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
                request=placed_request(allocation, bound),
                uid=(bound.uid if bound is not None else allocation.workload.uid) or "",
                labels=dict(bound.labels) if bound is not None else {},
                created_at=(
                    bound.created_at if bound is not None and bound.created_at else allocation.created_at
                ),
                allocation_id=str(allocation.allocation_id),
                gang=_gang_of(bound),
            )
        )
    budgets = tuple(await cluster.list_disruption_budgets())
    snapshot = PoolSnapshot(pool=pool, nodes=tuple(pool_nodes), workers=tuple(workers), budgets=budgets)
    return LoadedPool(snapshot=snapshot, pods=pods, allocations=by_key)


GANG_ENABLED = "tensor-fusion.ai/gang-enabled"
GANG_GROUP_KEY = "tensor-fusion.ai/gang-group-key"


def _gang_of(pod: Pod | None) -> str | None:
    """The gang of a pod with `tensor-fusion.ai/gang-enabled: true`: its `gang-group-key`, else its
    namespace and controller (the scheduler's grouping); None for a pod outside any gang."""
    if pod is None or (pod.annotations.get(GANG_ENABLED) or "").strip().lower() != "true":
        return None
    owner = next((o.name for o in pod.owner_references if o.controller), pod.name)
    return (pod.annotations.get(GANG_GROUP_KEY) or "").strip() or f"{pod.namespace}/{owner}"
