"""Series and fragmentation KPIs from a snapshot of the ledger and the agents' latest usage.

Pure: a `ClusterSnapshot` (plain data, `now` included) in, `Sample`s out. Names follow TensorFusion's
measurements (`tf_gpu_metrics.capacity_tflops` becomes `tf_gpu_capacity_tflops`, and so on); TFLOPS
are whole TFLOPS (milli / 1000), VRAM in bytes, percents 0-100. The fragmentation KPIs per pool, which
no peer exports, use the placement library's FGD measure.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from tfcommon.placement import FragmentationReport, Gpu, Node, TargetWorkload, WorkloadClass
from tfcommon.placement import cluster_fragmentation as fgd_fragmentation

WHOLE_GPU_SHARE = 1000
Labels = tuple[tuple[str, str], ...]

SERIES: dict[str, str] = {
    "tf_gpu_capacity_tflops": "GPU capacity, dense FP16 TFLOPS",
    "tf_gpu_allocated_tflops": "TFLOPS reserved on the GPU (requests)",
    "tf_gpu_available_tflops": "TFLOPS still free on the GPU",
    "tf_gpu_allocated_tflops_percent": "percent of the GPU's TFLOPS reserved",
    "tf_gpu_capacity_vram_bytes": "GPU VRAM capacity",
    "tf_gpu_allocated_vram_bytes": "VRAM reserved on the GPU (requests)",
    "tf_gpu_available_vram_bytes": "VRAM still free on the GPU",
    "tf_gpu_allocated_vram_percent": "percent of the GPU's VRAM reserved",
    "tf_gpu_usage_compute_tflops": "TFLOPS in use, from the node agent",
    "tf_gpu_usage_compute_percentage": "percent of the GPU's compute in use, from the node agent",
    "tf_gpu_usage_memory_bytes": "VRAM in use, from the node agent",
    "tf_gpu_usage_memory_percentage": "percent of the GPU's VRAM in use, from the node agent",
    "tf_gpu_usage_temperature": "GPU temperature, degrees Celsius",
    "tf_gpu_usage_power_usage": "GPU power draw, watts",
    "tf_node_allocated_tflops": "TFLOPS reserved on the node's GPUs",
    "tf_node_allocated_tflops_percent": "percent of the node's TFLOPS reserved",
    "tf_node_allocated_vram_bytes": "VRAM reserved on the node's GPUs",
    "tf_node_allocated_vram_percent": "percent of the node's VRAM reserved",
    "tf_node_gpu_count": "GPUs on the node",
    "tf_node_ready": "1 when the node is ready",
    "tf_node_heartbeat_age_seconds": "seconds since the node agent's last heartbeat",
    "tf_pool_allocated_tflops": "TFLOPS reserved in the pool",
    "tf_pool_allocated_tflops_percent": "percent of the pool's TFLOPS reserved",
    "tf_pool_allocated_vram_bytes": "VRAM reserved in the pool",
    "tf_pool_allocated_vram_percent": "percent of the pool's VRAM reserved",
    "tf_pool_limited_tflops": "sum of the TFLOPS limits in the pool",
    "tf_pool_limited_vram_bytes": "sum of the VRAM limits in the pool",
    "tf_pool_gpu_count": "GPUs in the pool",
    "tf_pool_whole_idle_gpus": "GPUs in the pool with nothing reserved on them",
    "tf_pool_largest_fit_tflops": "largest TFLOPS request one GPU of the pool could still take",
    "tf_pool_largest_fit_vram_bytes": "largest VRAM request one GPU of the pool could still take",
    "tf_pool_largest_fit_gpu_share": "largest balanced share (0-1 of a GPU) one GPU of the pool could take",
    "tf_pool_stranded_tflops": "free TFLOPS unusable because their GPU's VRAM is the tighter resource",
    "tf_pool_stranded_vram_bytes": "free VRAM unusable because its GPU's TFLOPS are the tighter resource",
    "tf_pool_fragmentation_rate": "FGD fragmentation: share of idle GPU capacity the running mix cannot use",
    "tf_worker_tflops_request": "TFLOPS requested per GPU by the worker",
    "tf_worker_tflops_limit": "TFLOPS limit per GPU of the worker",
    "tf_worker_vram_bytes_request": "VRAM requested per GPU by the worker",
    "tf_worker_vram_bytes_limit": "VRAM limit per GPU of the worker",
    "tf_worker_gpu_count": "GPUs held by the worker",
    "tf_worker_usage_compute_tflops": "TFLOPS the worker uses on a GPU, from the node agent",
    "tf_worker_usage_compute_percentage": "percent of the GPU's compute the worker uses",
    "tf_worker_usage_memory_bytes": "VRAM the worker uses on a GPU",
    "tf_system_workers": "workers holding GPUs",
    "tf_system_nodes": "GPU nodes known to the ledger",
}


@dataclass(frozen=True)
class NodeState:
    """A node as the ledger has it; `cordoned` and `do_not_disrupt` are the operator's flags."""

    name: str
    pool: str
    ready: bool
    last_heartbeat_at: datetime | None
    cordoned: bool = False
    do_not_disrupt: bool = False


@dataclass(frozen=True)
class GpuState:
    """A GPU and what the ledger has reserved on it (requests)."""

    uuid: str
    node: str
    index: int
    model: str
    phase: str
    capacity_tflops_milli: int
    capacity_vram_bytes: int
    used_tflops_milli: int
    used_vram_bytes: int


@dataclass(frozen=True)
class WorkerShare:
    """One active allocation's share of one GPU."""

    allocation_id: str
    namespace: str
    pod: str
    workload: str
    qos: str
    pool: str
    gpu_uuid: str
    request_tflops_milli: int
    request_vram_bytes: int
    limit_tflops_milli: int
    limit_vram_bytes: int


@dataclass(frozen=True)
class GpuUsageSample:
    uuid: str
    node: str
    pool: str
    compute_tflops_milli: int
    compute_percentage: float
    memory_bytes: int
    memory_percentage: float
    temperature: int
    power_usage: int


@dataclass(frozen=True)
class WorkerUsageSample:
    uuid: str
    node: str
    pool: str
    namespace: str
    pod: str
    workload: str
    worker: str
    compute_tflops_milli: int
    compute_percentage: float
    memory_bytes: int


@dataclass(frozen=True)
class ClusterSnapshot:
    now: datetime
    nodes: tuple[NodeState, ...]
    gpus: tuple[GpuState, ...]
    shares: tuple[WorkerShare, ...] = ()
    gpu_usage: tuple[GpuUsageSample, ...] = ()
    worker_usage: tuple[WorkerUsageSample, ...] = ()


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float


@dataclass(frozen=True)
class PoolKpis:
    """A pool's fragmentation KPIs. TFLOPS in milli-TFLOPS, VRAM in bytes, share in thousandths."""

    pool: str
    gpu_count: int
    whole_idle_gpus: int
    largest_fit_tflops_milli: int
    largest_fit_vram_bytes: int
    largest_fit_share: int
    stranded_tflops_milli: int
    stranded_vram_bytes: int
    fragmentation_rate: float
    allocated_tflops_milli: int = 0
    capacity_tflops_milli: int = 0
    allocated_vram_bytes: int = 0
    capacity_vram_bytes: int = 0


DEFAULT_TARGET = TargetWorkload(
    tuple((WorkloadClass(0, 1, share), 1 / 3) for share in (250, 500, WHOLE_GPU_SHARE))
)
"""The workload mix fragmentation is measured against while nothing is allocated: a quarter, a half
and a whole GPU, equally likely."""


def _percent(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def _tflops(milli: int) -> float:
    return milli / 1000


def balanced_share(gpu: GpuState) -> int:
    """Thousandths of the GPU still free in both TFLOPS and VRAM (the smaller of the two)."""
    if gpu.capacity_tflops_milli <= 0 or gpu.capacity_vram_bytes <= 0:
        return 0
    return min(
        (gpu.capacity_tflops_milli - gpu.used_tflops_milli) * WHOLE_GPU_SHARE // gpu.capacity_tflops_milli,
        (gpu.capacity_vram_bytes - gpu.used_vram_bytes) * WHOLE_GPU_SHARE // gpu.capacity_vram_bytes,
    )


def stranded(gpu: GpuState) -> tuple[int, int]:
    """(milli-TFLOPS, bytes) free on the GPU beyond what its scarcer free resource lets anyone use,
    assuming requests in the GPU's own TFLOPS:VRAM proportion."""
    free_tflops = gpu.capacity_tflops_milli - gpu.used_tflops_milli
    free_vram = gpu.capacity_vram_bytes - gpu.used_vram_bytes
    if gpu.capacity_tflops_milli <= 0 or gpu.capacity_vram_bytes <= 0:
        return 0, 0
    if free_tflops * gpu.capacity_vram_bytes > free_vram * gpu.capacity_tflops_milli:
        usable = free_vram * gpu.capacity_tflops_milli // gpu.capacity_vram_bytes
        return free_tflops - usable, 0
    usable = free_tflops * gpu.capacity_vram_bytes // gpu.capacity_tflops_milli
    return 0, free_vram - usable


def target_workload(shares: Iterable[WorkerShare], gpus: Sequence[GpuState]) -> TargetWorkload:
    """The running mix as FGD task classes (GPU count and the per-GPU share each asks for)."""
    capacity = {gpu.uuid: gpu for gpu in gpus}
    per_allocation: dict[str, list[int]] = defaultdict(list)
    for share in shares:
        gpu = capacity.get(share.gpu_uuid)
        if gpu is None or gpu.capacity_tflops_milli <= 0 or gpu.capacity_vram_bytes <= 0:
            continue
        demand = max(
            -(-share.request_tflops_milli * WHOLE_GPU_SHARE // gpu.capacity_tflops_milli),
            -(-share.request_vram_bytes * WHOLE_GPU_SHARE // gpu.capacity_vram_bytes),
        )
        per_allocation[share.allocation_id].append(min(demand, WHOLE_GPU_SHARE))
    classes = Counter(WorkloadClass(0, len(demands), max(demands)) for demands in per_allocation.values())
    total = sum(classes.values())
    if total == 0:
        return DEFAULT_TARGET
    ordered = sorted(classes.items(), key=lambda item: (-item[1], item[0].gpu_count, item[0].gpu_share))
    return TargetWorkload(tuple((workload_class, count / total) for workload_class, count in ordered))


def _placement_nodes(snapshot: ClusterSnapshot, pool: str) -> list[Node]:
    by_node: dict[str, list[GpuState]] = defaultdict(list)
    pool_of = {node.name: node.pool for node in snapshot.nodes}
    for gpu in snapshot.gpus:
        if pool_of.get(gpu.node) == pool:
            by_node[gpu.node].append(gpu)
    nodes = []
    for name, gpus in sorted(by_node.items()):
        ordered = sorted(gpus, key=lambda gpu: gpu.index)
        nodes.append(
            Node(
                name=name,
                cpu_milli=0,
                memory_bytes=0,
                pool=pool,
                gpus=tuple(
                    Gpu(
                        uuid=gpu.uuid,
                        index=position,
                        model=gpu.model,
                        tflops_milli=gpu.capacity_tflops_milli,
                        vram_bytes=gpu.capacity_vram_bytes,
                        used_tflops_milli=gpu.used_tflops_milli,
                        used_vram_bytes=gpu.used_vram_bytes,
                    )
                    for position, gpu in enumerate(ordered)
                ),
            )
        )
    return nodes


def pool_kpis(snapshot: ClusterSnapshot) -> list[PoolKpis]:
    """Fragmentation KPIs for every pool that has nodes, ordered by pool name."""
    pool_of = {node.name: node.pool for node in snapshot.nodes}
    result = []
    for pool in sorted(set(pool_of.values())):
        gpus = [gpu for gpu in snapshot.gpus if pool_of.get(gpu.node) == pool and gpu.phase == "Running"]
        pool_shares = [share for share in snapshot.shares if share.pool == pool]
        report: FragmentationReport = fgd_fragmentation(
            _placement_nodes(snapshot, pool), target_workload(pool_shares, gpus)
        )
        stranded_pairs = [stranded(gpu) for gpu in gpus]
        result.append(
            PoolKpis(
                pool=pool,
                gpu_count=len(gpus),
                whole_idle_gpus=sum(
                    1 for gpu in gpus if gpu.used_tflops_milli == 0 and gpu.used_vram_bytes == 0
                ),
                largest_fit_tflops_milli=max(
                    (gpu.capacity_tflops_milli - gpu.used_tflops_milli for gpu in gpus), default=0
                ),
                largest_fit_vram_bytes=max(
                    (gpu.capacity_vram_bytes - gpu.used_vram_bytes for gpu in gpus), default=0
                ),
                largest_fit_share=max((balanced_share(gpu) for gpu in gpus), default=0),
                stranded_tflops_milli=sum(pair[0] for pair in stranded_pairs),
                stranded_vram_bytes=sum(pair[1] for pair in stranded_pairs),
                fragmentation_rate=report.rate,
                allocated_tflops_milli=sum(gpu.used_tflops_milli for gpu in gpus),
                capacity_tflops_milli=sum(gpu.capacity_tflops_milli for gpu in gpus),
                allocated_vram_bytes=sum(gpu.used_vram_bytes for gpu in gpus),
                capacity_vram_bytes=sum(gpu.capacity_vram_bytes for gpu in gpus),
            )
        )
    return result


def _labels(**values: str) -> Labels:
    return tuple(values.items())


def snapshot_samples(snapshot: ClusterSnapshot) -> list[Sample]:
    """Every series value for the snapshot (see `SERIES` for the names)."""
    samples: list[Sample] = []

    def add(name: str, labels: Labels, value: float) -> None:
        samples.append(Sample(name, labels, float(value)))

    pool_of = {node.name: node.pool for node in snapshot.nodes}
    for gpu in snapshot.gpus:
        pool = pool_of.get(gpu.node, "")
        labels = _labels(gpu=gpu.uuid, node=gpu.node, pool=pool, gpu_model=gpu.model, phase=gpu.phase)
        free_tflops = gpu.capacity_tflops_milli - gpu.used_tflops_milli
        free_vram = gpu.capacity_vram_bytes - gpu.used_vram_bytes
        add("tf_gpu_capacity_tflops", labels, _tflops(gpu.capacity_tflops_milli))
        add("tf_gpu_allocated_tflops", labels, _tflops(gpu.used_tflops_milli))
        add("tf_gpu_available_tflops", labels, _tflops(free_tflops))
        add(
            "tf_gpu_allocated_tflops_percent",
            labels,
            _percent(gpu.used_tflops_milli, gpu.capacity_tflops_milli),
        )
        add("tf_gpu_capacity_vram_bytes", labels, gpu.capacity_vram_bytes)
        add("tf_gpu_allocated_vram_bytes", labels, gpu.used_vram_bytes)
        add("tf_gpu_available_vram_bytes", labels, free_vram)
        add("tf_gpu_allocated_vram_percent", labels, _percent(gpu.used_vram_bytes, gpu.capacity_vram_bytes))
    for node in snapshot.nodes:
        node_gpus = [gpu for gpu in snapshot.gpus if gpu.node == node.name]
        labels = _labels(node=node.name, pool=node.pool)
        used_tflops = sum(gpu.used_tflops_milli for gpu in node_gpus)
        used_vram = sum(gpu.used_vram_bytes for gpu in node_gpus)
        add("tf_node_allocated_tflops", labels, _tflops(used_tflops))
        add(
            "tf_node_allocated_tflops_percent",
            labels,
            _percent(used_tflops, sum(gpu.capacity_tflops_milli for gpu in node_gpus)),
        )
        add("tf_node_allocated_vram_bytes", labels, used_vram)
        add(
            "tf_node_allocated_vram_percent",
            labels,
            _percent(used_vram, sum(gpu.capacity_vram_bytes for gpu in node_gpus)),
        )
        add("tf_node_gpu_count", labels, len(node_gpus))
        add("tf_node_ready", labels, 1 if node.ready else 0)
        if node.last_heartbeat_at is not None:
            age = (snapshot.now - node.last_heartbeat_at).total_seconds()
            add("tf_node_heartbeat_age_seconds", labels, max(age, 0.0))
    limits: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    for share in snapshot.shares:
        tflops, vram = limits[share.pool]
        limits[share.pool] = (tflops + share.limit_tflops_milli, vram + share.limit_vram_bytes)
    for kpis in pool_kpis(snapshot):
        labels = _labels(pool=kpis.pool)
        add("tf_pool_allocated_tflops", labels, _tflops(kpis.allocated_tflops_milli))
        add(
            "tf_pool_allocated_tflops_percent",
            labels,
            _percent(kpis.allocated_tflops_milli, kpis.capacity_tflops_milli),
        )
        add("tf_pool_allocated_vram_bytes", labels, kpis.allocated_vram_bytes)
        add(
            "tf_pool_allocated_vram_percent",
            labels,
            _percent(kpis.allocated_vram_bytes, kpis.capacity_vram_bytes),
        )
        add("tf_pool_limited_tflops", labels, _tflops(limits[kpis.pool][0]))
        add("tf_pool_limited_vram_bytes", labels, limits[kpis.pool][1])
        add("tf_pool_gpu_count", labels, kpis.gpu_count)
        add("tf_pool_whole_idle_gpus", labels, kpis.whole_idle_gpus)
        add("tf_pool_largest_fit_tflops", labels, _tflops(kpis.largest_fit_tflops_milli))
        add("tf_pool_largest_fit_vram_bytes", labels, kpis.largest_fit_vram_bytes)
        add("tf_pool_largest_fit_gpu_share", labels, kpis.largest_fit_share / WHOLE_GPU_SHARE)
        add("tf_pool_stranded_tflops", labels, _tflops(kpis.stranded_tflops_milli))
        add("tf_pool_stranded_vram_bytes", labels, kpis.stranded_vram_bytes)
        add("tf_pool_fragmentation_rate", labels, kpis.fragmentation_rate)
    workers: dict[tuple[str, str, str, str, str], list[WorkerShare]] = defaultdict(list)
    for share in snapshot.shares:
        workers[(share.namespace, share.pool, share.qos, share.pod, share.workload)].append(share)
    for (namespace, pool, qos, pod, workload), held in sorted(workers.items()):
        labels = _labels(namespace=namespace, pool=pool, qos=qos, worker=pod, workload=workload)
        first = held[0]
        add("tf_worker_tflops_request", labels, _tflops(first.request_tflops_milli))
        add("tf_worker_tflops_limit", labels, _tflops(first.limit_tflops_milli))
        add("tf_worker_vram_bytes_request", labels, first.request_vram_bytes)
        add("tf_worker_vram_bytes_limit", labels, first.limit_vram_bytes)
        add("tf_worker_gpu_count", labels, len({share.gpu_uuid for share in held}))
    for usage in snapshot.gpu_usage:
        labels = _labels(uuid=usage.uuid, node=usage.node, pool=usage.pool)
        add("tf_gpu_usage_compute_tflops", labels, _tflops(usage.compute_tflops_milli))
        add("tf_gpu_usage_compute_percentage", labels, usage.compute_percentage)
        add("tf_gpu_usage_memory_bytes", labels, usage.memory_bytes)
        add("tf_gpu_usage_memory_percentage", labels, usage.memory_percentage)
        add("tf_gpu_usage_temperature", labels, usage.temperature)
        add("tf_gpu_usage_power_usage", labels, usage.power_usage)
    for worker in snapshot.worker_usage:
        labels = _labels(
            uuid=worker.uuid,
            node=worker.node,
            pool=worker.pool,
            namespace=worker.namespace,
            pod_name=worker.pod,
            workload=worker.workload,
            worker=worker.worker,
        )
        add("tf_worker_usage_compute_tflops", labels, _tflops(worker.compute_tflops_milli))
        add("tf_worker_usage_compute_percentage", labels, worker.compute_percentage)
        add("tf_worker_usage_memory_bytes", labels, worker.memory_bytes)
    add("tf_system_workers", (), len(workers))
    add("tf_system_nodes", (), len(snapshot.nodes))
    return samples
