"""The scheduler's pure core: view building, quotas, preemption victims and unschedulable reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from uuid import uuid4

import pytest
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.placement import ClusterView, Gpu, Node, Placement, Rejection, place, policy
from tfscheduler.core.preemption import Candidate, NoPreemption, PreemptionPlan, Priority, plan_preemption
from tfscheduler.core.quota import (
    NamespaceQuota,
    QuotaError,
    Usage,
    check_single,
    check_total,
    demand_of,
    parse_quota,
    with_defaults,
)
from tfscheduler.core.reports import unschedulable_summary
from tfscheduler.core.view import allocation_id_for, build_snapshot, placement_request

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
GIB = 1024**3


@dataclass(frozen=True)
class NodeRow:
    name: str
    pool: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cpu_allocatable_milli: int = 0
    memory_allocatable_bytes: int = 0
    cordoned: bool = False
    ready: bool = True
    last_heartbeat_at: datetime | None = NOW


@dataclass(frozen=True)
class GpuRow:
    uuid: str
    node: str
    index: int
    model: str = "H100"
    vendor: str = "NVIDIA"
    capacity_tflops_milli: int = 100_000
    capacity_vram_bytes: int = 80 * GIB
    used_tflops_milli: int = 0
    used_vram_bytes: int = 0
    phase: str = "Running"
    numa_node: int | None = None


def a_request(
    tflops: int = 10_000, vram: int = 8 * GIB, count: int = 1, percent: int | None = None
) -> GpuRequest:
    return GpuRequest(
        pool="default",
        gpu_count=count,
        tflops_request_milli=tflops,
        tflops_limit_milli=tflops,
        vram_request_bytes=vram,
        vram_limit_bytes=vram,
        compute_percent_request=percent,
    )


def test_view_blocks_cordoned_draining_silent_and_not_ready_nodes() -> None:
    nodes = [
        NodeRow("ok"),
        NodeRow("cordoned", cordoned=True),
        NodeRow("draining", annotations={"tensor-fusion.ai/defrag-source": "true"}),
        NodeRow("silent", last_heartbeat_at=NOW - timedelta(minutes=5)),
        NodeRow("never", last_heartbeat_at=None),
        NodeRow("down", ready=False),
    ]
    gpus = [GpuRow(f"gpu-{n.name}", n.name, 0) for n in nodes]
    snapshot = build_snapshot(nodes, gpus, [], NOW)
    assert snapshot.blocked == {
        "cordoned": "node cordoned",
        "draining": "node being drained by the defrag planner (tensor-fusion.ai/defrag-source)",
        "silent": "node agent heartbeats stopped",
        "never": "node agent heartbeats stopped",
        "down": "node agent reports not ready",
    }
    outcome = place(placement_request("p", a_request()), snapshot.nodes.values(), policy("tfpool"))
    assert isinstance(outcome, Placement)
    assert outcome.node == "ok"


def test_view_takes_reservations_from_the_ledger_and_hides_gpus_that_are_not_running() -> None:
    gpus = [GpuRow("gpu-a", "n", 0, used_tflops_milli=95_000), GpuRow("gpu-b", "n", 1, phase="Unknown")]
    snapshot = build_snapshot([NodeRow("n")], gpus, [], NOW)
    outcome = place(placement_request("p", a_request()), snapshot.nodes.values(), policy("tfpool"))
    assert isinstance(outcome, Rejection)
    assert outcome.summary() == "0/1 nodes fit: 1 insufficient TFLOPS"


def test_allocation_id_is_one_per_workload_incarnation() -> None:
    ref = WorkloadRef(namespace="a", name="p", uid="1")
    assert allocation_id_for(ref) == allocation_id_for(WorkloadRef(namespace="a", name="p", uid="1"))
    assert allocation_id_for(ref) != allocation_id_for(WorkloadRef(namespace="a", name="p", uid="2"))


def test_total_quota_counts_exact_milli_tflops_and_compute_percent() -> None:
    quota = NamespaceQuota("team-a", total_requests_tflops_milli=60_500)
    node = Node("n", 0, 0, gpus=(Gpu("g", 0, "H100", 100_500, 80 * GIB),))
    request = a_request(tflops=0, percent=60)
    placement = place(placement_request("p", request), [node], policy("tfpool"))
    assert isinstance(placement, Placement)
    demand = demand_of(placement, request)
    assert demand.requests_tflops_milli == 60_000  # 60 % of 100.5 TFLOPS, whole TFLOPS as TensorFusion
    assert check_total(quota, Usage(requests_tflops_milli=500), demand) is None
    refusal = check_total(quota, Usage(requests_tflops_milli=501, workers=1), demand)
    assert refusal is not None
    assert refusal.retryable
    assert refusal.reason.startswith(
        "GPUResourceQuota team-a/team-a: total.requests.tflops would be 60501m of 60500m (in use 501m)"
    )


def test_a_compute_percent_limit_counts_exactly_towards_total_limits_compute() -> None:
    quota = NamespaceQuota("team-a", total_limits_compute=Fraction(100))
    node = Node("n", 0, 0, gpus=(Gpu("g", 0, "H100", 100_500, 80 * GIB),))
    request = a_request(tflops=0, percent=20).model_copy(update={"compute_percent_limit": 60})
    placement = place(placement_request("p", request), [node], policy("tfpool"))
    assert isinstance(placement, Placement)
    assert placement.limit_tflops_milli == (60_300,)  # 60 % of 100.5 TFLOPS, to the milli-TFLOPS
    demand = demand_of(placement, request, [100_500])
    assert (demand.requests_compute, demand.limits_compute) == (Fraction(20_000, 1005), Fraction(60))
    assert check_total(quota, Usage(limits_compute=Fraction(40)), demand) is None
    refusal = check_total(quota, Usage(limits_compute=Fraction(81, 2)), demand)
    assert refusal is not None
    assert "total.limits.compute would be 100.5 of 100 (in use 40.5)" in refusal.reason


def test_compute_maxima_and_defaults_of_single() -> None:
    quota = parse_quota(
        {
            "kind": "GPUResourceQuota",
            "metadata": {"name": "q", "namespace": "team-a"},
            "spec": {
                "single": {
                    "maxLimits": {"compute": "50"},
                    "defaultRequests": {"compute": "10"},
                    "defaultLimits": {"compute": "30"},
                }
            },
        }
    )
    assert (quota.max_limit_compute, quota.default_request_compute, quota.default_limit_compute) == (
        Fraction(50),
        10,
        30,
    )
    filled = with_defaults(quota, a_request(tflops=0, vram=GIB))
    assert (filled.compute_percent_request, filled.compute_percent_limit) == (10, 30)
    assert filled.tflops_request_milli == 0
    over = check_single(
        quota, a_request(tflops=0, percent=20).model_copy(update={"compute_percent_limit": 55})
    )
    assert over is not None
    assert over.reason == "GPUResourceQuota team-a/q: single.maxLimits.compute is 50% per workload, asked 55%"
    assert check_single(quota, a_request(tflops=0, percent=50)) is None  # no limit: the request, 50
    assert check_single(quota, a_request(tflops=90_000)) is None  # a TFLOPS limit is not a percent
    with pytest.raises(
        QuotaError, match=r"spec\.single\.defaultLimits\.compute: '12\.5'; a default is a whole"
    ):
        parse_quota(
            {
                "kind": "GPUResourceQuota",
                "metadata": {"namespace": "a"},
                "spec": {"single": {"defaultLimits": {"compute": "12.5"}}},
            }
        )


def test_a_max_gpu_count_or_max_workers_of_zero_is_a_quota_that_admits_no_gpu_workload() -> None:
    quota = parse_quota(
        {
            "kind": "GPUResourceQuota",
            "metadata": {"name": "closed", "namespace": "team-a"},
            "spec": {"total": {"maxWorkers": -1}, "single": {"maxGPUCount": 0}},
        }
    )
    single = check_single(quota, a_request())
    assert single is not None
    assert single.reason == "GPUResourceQuota team-a/closed: single.maxGPUCount is 0 per workload, asked 1"
    total = check_total(quota, Usage(), Usage(workers=1))
    assert total is not None
    assert "total.maxWorkers would be 1 of -1" in total.reason


def test_worker_count_and_single_maxima() -> None:
    quota = NamespaceQuota("team-a", max_workers=1, max_request_vram_bytes=16 * GIB)
    refusal = check_total(quota, Usage(workers=1), Usage(workers=1))
    assert refusal is not None
    assert "total.maxWorkers would be 2 of 1" in refusal.reason
    single = check_single(quota, a_request(vram=20 * GIB))
    assert single is not None
    assert not single.retryable
    assert (
        single.reason
        == "GPUResourceQuota team-a/team-a: single.maxRequests.vram is 16Gi per workload, asked 20Gi"
    )


def test_quota_manifest_parses_exactly_and_names_bad_fields() -> None:
    quota = parse_quota(
        {
            "kind": "GPUResourceQuota",
            "metadata": {"name": "q", "namespace": "team-a"},
            "spec": {
                "total": {"requests": {"tflops": "100.5", "vram": "80Gi"}, "maxWorkers": 10},
                "single": {"maxGPUCount": 2, "defaultRequests": {"tflops": "5"}},
            },
        }
    )
    assert quota.total_requests_tflops_milli == 100_500
    assert quota.total_requests_vram_bytes == 80 * GIB
    assert quota.max_workers == 10
    assert quota.max_gpu_count == 2
    assert quota.default_request_tflops_milli == 5_000
    with pytest.raises(QuotaError, match=r"spec\.total\.requests\.vram"):
        parse_quota(
            {
                "kind": "GPUResourceQuota",
                "metadata": {"namespace": "a"},
                "spec": {"total": {"requests": {"vram": "lots"}}},
            }
        )
    with pytest.raises(QuotaError, match=r"metadata\.namespace"):
        parse_quota({"kind": "GPUResourceQuota", "metadata": {}})


def _running(view: ClusterView, name: str, tflops: int, qos: str, age_min: int, **extra: object) -> Candidate:
    request = placement_request(name, a_request(tflops=tflops))
    placement = place(request, view, policy("tfpool"))
    assert isinstance(placement, Placement)
    view.apply(placement)
    return Candidate(
        allocation_id=uuid4(),
        workload=WorkloadRef(namespace="a", name=name),
        priority=Priority.of(0, qos),
        created_at=NOW - timedelta(minutes=age_min),
        holding=placement,
        **extra,  # type: ignore[arg-type]
    )


def test_preemption_takes_lowest_qos_then_youngest_and_only_what_is_needed() -> None:
    view = ClusterView([Node("n", 0, 0, gpus=(Gpu("g", 0, "H100", 100_000, 80 * GIB),))])
    medium = _running(view, "medium", 40_000, "medium", 30)
    low_old = _running(view, "low-old", 30_000, "low", 20)
    low_young = _running(view, "low-young", 30_000, "low", 10)
    request = placement_request("critical", a_request(tflops=30_000))
    plan = plan_preemption(
        request, Priority.of(0, "critical"), view.nodes, [medium, low_old, low_young], policy("tfpool"), NOW
    )
    assert isinstance(plan, PreemptionPlan)
    assert [victim.workload.name for victim in plan.victims] == ["low-young"]


def test_preemption_never_for_equal_priority_nor_protected_nor_budget_blocked() -> None:
    view = ClusterView([Node("n", 0, 0, gpus=(Gpu("g", 0, "H100", 100_000, 80 * GIB),))])
    protected = _running(view, "protected", 50_000, "low", 1, protected_until=NOW + timedelta(minutes=5))
    budget = _running(view, "budget", 50_000, "low", 1, disruption_allowed=False)
    request = placement_request("p", a_request(tflops=50_000))
    profile = policy("tfpool")
    equal = plan_preemption(request, Priority.of(0, "low"), view.nodes, [protected, budget], profile, NOW)
    assert equal == NoPreemption("preemption: no workload of lower priority to evict")
    higher = plan_preemption(request, Priority.of(0, "high"), view.nodes, [protected, budget], profile, NOW)
    assert higher == NoPreemption(
        "preemption: not possible: lower-priority workloads 1 inside their eviction-protection window; "
        "1 whose disruption budget allows no disruption"
    )


def test_priority_class_value_outranks_qos() -> None:
    assert Priority.of(10_000, "low") > Priority.of(0, "critical")
    assert (
        Priority.of(0, "critical") > Priority.of(0, "high") > Priority.of(0, "medium") > Priority.of(0, "low")
    )


def test_unschedulable_summary_names_the_real_cause_of_blocked_nodes() -> None:
    rejection = Rejection("p", 4, (("node cordoned", 3), ("insufficient VRAM", 1)), "tfpool")
    blocked = {
        "a": "node agent heartbeats stopped",
        "b": "node agent heartbeats stopped",
        "c": "node cordoned",
    }
    summary = unschedulable_summary(rejection, blocked, quota_reason=None, preemption_reason="preemption: x")
    assert summary == (
        "0/4 nodes fit: 2 node agent heartbeats stopped, 1 insufficient VRAM, 1 node cordoned; preemption: x"
    )
