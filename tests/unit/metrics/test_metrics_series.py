"""Series and fragmentation KPIs computed from a ledger snapshot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from tfmetrics.core.series import (
    SERIES,
    ClusterSnapshot,
    GpuState,
    NodeState,
    WorkerShare,
    pool_kpis,
    snapshot_samples,
)

GIB = 1024**3
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def a_gpu(uuid: str, index: int, used_tflops: int = 0, used_vram: int = 0, node: str = "n1") -> GpuState:
    return GpuState(uuid, node, index, "H100", "Running", 100_000, 80 * GIB, used_tflops, used_vram)


def a_share(gpu: str, tflops: int, vram: int, allocation: str = "a1") -> WorkerShare:
    return WorkerShare(
        allocation, "team-a", "pod-0", "trainer", "medium", "training", gpu, tflops, vram, tflops, vram
    )


SNAPSHOT = ClusterSnapshot(
    now=NOW,
    nodes=(NodeState("n1", "training", True, NOW - timedelta(seconds=12)),),
    gpus=(a_gpu("gpu-1", 0, 50_000, 70 * GIB), a_gpu("gpu-2", 1)),
    shares=(a_share("gpu-1", 50_000, 70 * GIB),),
)


def test_a_pool_reports_idle_gpus_the_largest_fit_and_stranded_capacity() -> None:
    [kpis] = pool_kpis(SNAPSHOT)
    assert (kpis.pool, kpis.gpu_count, kpis.whole_idle_gpus) == ("training", 2, 1)
    assert (kpis.largest_fit_tflops_milli, kpis.largest_fit_vram_bytes, kpis.largest_fit_share) == (
        100_000,
        80 * GIB,
        1000,
    )
    # gpu-1 has 50 TFLOPS but only 10 GiB free: at its 100:80 proportion 12.5 TFLOPS are usable.
    assert (kpis.stranded_tflops_milli, kpis.stranded_vram_bytes) == (37_500, 0)


def test_fragmentation_rate_is_the_share_of_idle_capacity_the_running_mix_cannot_use() -> None:
    [kpis] = pool_kpis(SNAPSHOT)
    # The running mix is one class: one GPU at 875 thousandths. Free shares are 125 and 1000:
    # the 125 on gpu-1 cannot host it, so the fragment is 125 of 1125 idle.
    assert kpis.fragmentation_rate == pytest.approx(125 / 1125)


def test_an_empty_pool_is_measured_against_the_default_mix_and_has_no_fragmentation() -> None:
    snapshot = ClusterSnapshot(now=NOW, nodes=SNAPSHOT.nodes, gpus=(a_gpu("gpu-1", 0), a_gpu("gpu-2", 1)))
    [kpis] = pool_kpis(snapshot)
    assert (kpis.whole_idle_gpus, kpis.fragmentation_rate, kpis.stranded_tflops_milli) == (2, 0.0, 0)


def test_samples_follow_tensorfusion_measurement_names() -> None:
    samples = {(sample.name, sample.labels): sample.value for sample in snapshot_samples(SNAPSHOT)}
    gpu_labels = (
        ("gpu", "gpu-1"),
        ("node", "n1"),
        ("pool", "training"),
        ("gpu_model", "H100"),
        ("phase", "Running"),
    )
    assert samples[("tf_gpu_allocated_tflops", gpu_labels)] == 50.0
    assert samples[("tf_gpu_available_vram_bytes", gpu_labels)] == 10 * GIB
    assert samples[("tf_gpu_allocated_tflops_percent", gpu_labels)] == 50.0
    assert samples[("tf_pool_allocated_tflops_percent", (("pool", "training"),))] == 25.0
    assert samples[("tf_node_heartbeat_age_seconds", (("node", "n1"), ("pool", "training")))] == 12.0
    worker = (
        ("namespace", "team-a"),
        ("pool", "training"),
        ("qos", "medium"),
        ("worker", "pod-0"),
        ("workload", "trainer"),
    )
    assert samples[("tf_worker_tflops_request", worker)] == 50.0
    assert {name for name, _ in samples} <= set(SERIES)
