"""Usage rows with TensorFusion's field names, attribution of processes to workers, and drift."""

from __future__ import annotations

from uuid import uuid4

from builders import a_gpu, a_share, an_allocation
from tfagent.core.usage import (
    DriftKind,
    GpuSample,
    ProcessSample,
    UsageSample,
    build_node_usage,
    detect_drift,
    drift_started,
    owners_by_pod_uid,
    pod_uid_from_cgroup,
)
from tfcommon.gpu_models import GIB


def a_gpu_sample(uuid: str = "gpu-aaaa", utilization: int = 40, used_gib: int = 20) -> GpuSample:
    return GpuSample(uuid, utilization, used_gib * GIB, 65, 350_500, 2048, 512)


def test_gpu_rows_use_tensorfusion_field_names_and_units() -> None:
    gpu = a_gpu("gpu-aaaa", tflops_milli=1_000_000, vram_gib=80)

    usage = build_node_usage([gpu], UsageSample((a_gpu_sample(utilization=40, used_gib=20),), ()), [], {})

    (row,) = usage.gpus
    assert row.model_dump() == {
        "uuid": "gpu-aaaa",
        "compute_percentage": 40.0,
        "compute_tflops_milli": 400_000,
        "memory_bytes": 20 * GIB,
        "memory_percentage": 25.0,
        "temperature": 65,
        "power_usage": 350,
        "rx": 2048,
        "tx": 512,
    }


def test_worker_rows_sum_their_processes_and_compare_memory_with_the_vram_limit() -> None:
    gpu = a_gpu("gpu-aaaa", tflops_milli=1_000_000)
    allocation = an_allocation(a_share("gpu-aaaa", vram_gib=10, limit_gib=16), name="train-0")
    processes = (
        ProcessSample("gpu-aaaa", 11, 4 * GIB, 30),
        ProcessSample("gpu-aaaa", 12, 4 * GIB, None),
        ProcessSample("gpu-aaaa", 99, 8 * GIB, 50),
    )
    owners = {11: allocation.allocation_id, 12: allocation.allocation_id}

    usage = build_node_usage([gpu], UsageSample((a_gpu_sample(),), processes), [allocation], owners)

    (row,) = usage.workers
    assert (row.uuid, row.namespace, row.pod_name, row.workload, row.worker) == (
        "gpu-aaaa",
        "ml",
        "train-0",
        "train",
        "train-0",
    )
    assert row.allocation_id == allocation.allocation_id
    assert (row.memory_bytes, row.memory_percentage) == (8 * GIB, 50.0)
    assert (row.compute_percentage, row.compute_tflops_milli) == (30.0, 300_000)


def test_an_allocation_without_running_processes_reports_zero() -> None:
    allocation = an_allocation(a_share("gpu-aaaa"))

    usage = build_node_usage([a_gpu("gpu-aaaa")], UsageSample((a_gpu_sample(),), ()), [allocation], {})

    assert [(row.memory_bytes, row.compute_percentage) for row in usage.workers] == [(0, 0.0)]


def test_a_process_nobody_allocated_is_drift() -> None:
    allocation = an_allocation(a_share("gpu-aaaa"))

    (drift,) = detect_drift([ProcessSample("gpu-aaaa", 777, 3 * GIB)], [allocation], {})

    assert (drift.kind, drift.pid, drift.gpu_uuid, drift.used_bytes) == (
        DriftKind.PROCESS_WITHOUT_ALLOCATION,
        777,
        "gpu-aaaa",
        3 * GIB,
    )
    assert "777" in drift.detail
    assert "no allocation" in drift.detail


def test_a_workload_process_on_a_gpu_it_does_not_hold_is_drift() -> None:
    allocation = an_allocation(a_share("gpu-aaaa"))

    (drift,) = detect_drift([ProcessSample("gpu-bbbb", 5, GIB)], [allocation], {5: allocation.allocation_id})

    assert (drift.kind, drift.gpu_uuid, drift.allocation) == (
        DriftKind.PROCESS_WITHOUT_ALLOCATION,
        "gpu-bbbb",
        allocation,
    )


def test_a_workload_over_its_vram_limit_is_drift_and_at_the_limit_is_not() -> None:
    over = an_allocation(a_share("gpu-aaaa", vram_gib=4, limit_gib=8), name="greedy")
    exact = an_allocation(a_share("gpu-aaaa", vram_gib=8), name="careful")
    processes = [
        ProcessSample("gpu-aaaa", 1, 5 * GIB),
        ProcessSample("gpu-aaaa", 2, 4 * GIB),
        ProcessSample("gpu-aaaa", 3, 8 * GIB),
    ]
    owners = {1: over.allocation_id, 2: over.allocation_id, 3: exact.allocation_id}

    (drift,) = detect_drift(processes, [over, exact], owners)

    assert (drift.kind, drift.allocation, drift.used_bytes, drift.limit_bytes) == (
        DriftKind.VRAM_OVER_LIMIT,
        over,
        9 * GIB,
        8 * GIB,
    )
    assert "ml/greedy" in drift.detail


def test_drift_is_reported_once_when_it_starts() -> None:
    first_round = detect_drift([ProcessSample("gpu-aaaa", 777, GIB)], [], {})
    second_round = detect_drift(
        [ProcessSample("gpu-aaaa", 777, 2 * GIB), ProcessSample("gpu-aaaa", 778, GIB)], [], {}
    )

    started = drift_started({drift.key for drift in first_round}, second_round)

    assert [drift.pid for drift in started] == [778]


def test_pod_uid_is_read_from_both_cgroup_drivers() -> None:
    cgroupfs = "0::/kubepods/burstable/pod1a2b3c4d-0000-4000-8000-123456789abc/0f3e9c\n"
    systemd = (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        "kubepods-burstable-pod1a2b3c4d_0000_4000_8000_123456789abc.slice/cri-containerd-0f3e.scope\n"
    )

    assert pod_uid_from_cgroup(cgroupfs) == "1a2b3c4d-0000-4000-8000-123456789abc"
    assert pod_uid_from_cgroup(systemd) == "1a2b3c4d-0000-4000-8000-123456789abc"
    assert pod_uid_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None


def test_processes_map_to_allocations_through_their_pod_uid() -> None:
    allocation = an_allocation(a_share())
    assert allocation.workload.uid is not None

    owners = owners_by_pod_uid({10: allocation.workload.uid, 11: str(uuid4())}, [allocation])

    assert owners == {10: allocation.allocation_id}
