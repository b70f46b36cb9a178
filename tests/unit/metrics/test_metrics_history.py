"""The dashboard's history: pool samples from a snapshot, and the columns and campaign marks the page
draws its time series from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tfmetrics.core.dashboard import CampaignSummary
from tfmetrics.core.history import PoolSample, history_view, pool_samples
from tfmetrics.core.series import ClusterSnapshot, GpuState, NodeState, WorkerShare

GIB = 1024**3
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def a_sample(pool: str, minutes_ago: int, allocated_tflops: int = 25_000) -> PoolSample:
    return PoolSample(
        pool=pool,
        sampled_at=NOW - minutes_ago * MINUTE,
        gpu_count=2,
        whole_idle_gpus=1,
        capacity_tflops_milli=200_000,
        allocated_tflops_milli=allocated_tflops,
        capacity_vram_bytes=160 * GIB,
        allocated_vram_bytes=40 * GIB,
        stranded_tflops_milli=10_000,
        stranded_vram_bytes=8 * GIB,
        fragmentation_rate=0.123456,
    )


def a_campaign(pool: str, started: datetime, minutes: int | None) -> CampaignSummary:
    return CampaignSummary(
        pool=pool,
        trigger="cron",
        running=minutes is None,
        started_at=started,
        finished_at=None if minutes is None else started + minutes * MINUTE,
        deadline_at=None,
        outcome=None if minutes is None else "completed",
        current_node=None,
        nodes_drained=2,
        nodes_failed=0,
        nodes_skipped=0,
        pods_evicted=5,
        stranded_pods=0,
    )


def test_a_snapshot_gives_one_sample_per_pool_with_the_prometheus_figures() -> None:
    snapshot = ClusterSnapshot(
        now=NOW,
        nodes=(NodeState("n1", "training", True, NOW), NodeState("n2", "inference", True, NOW)),
        gpus=(
            GpuState("g1", "n1", 0, "H100", "Running", 100_000, 80 * GIB, 50_000, 70 * GIB),
            GpuState("g2", "n1", 1, "H100", "Running", 100_000, 80 * GIB, 0, 0),
            GpuState("g3", "n2", 0, "H100", "Running", 100_000, 80 * GIB, 0, 0),
        ),
        shares=(
            WorkerShare(
                "a1",
                "team-a",
                "p0",
                "trainer",
                "medium",
                "training",
                "g1",
                50_000,
                70 * GIB,
                50_000,
                70 * GIB,
            ),
        ),
    )
    inference, training = pool_samples(snapshot)
    assert (inference.pool, inference.allocated_tflops_milli, inference.whole_idle_gpus) == (
        "inference",
        0,
        1,
    )
    assert training.sampled_at == NOW
    assert (training.gpu_count, training.whole_idle_gpus) == (2, 1)
    assert (training.capacity_tflops_milli, training.allocated_tflops_milli) == (200_000, 50_000)
    assert (training.capacity_vram_bytes, training.allocated_vram_bytes) == (160 * GIB, 70 * GIB)
    # g1 has 50 TFLOPS but only 10 GiB free: at its 100:80 proportion 12.5 TFLOPS are usable.
    assert (training.stranded_tflops_milli, training.stranded_vram_bytes) == (37_500, 0)
    assert 0 < training.fragmentation_rate < 1


def test_the_history_is_columns_per_pool_oldest_first_within_the_window() -> None:
    samples = [
        a_sample("training", 5, 50_000),
        a_sample("training", 90),
        a_sample("training", 10),
        a_sample("a", 1),
    ]
    view = history_view(samples, [], start=NOW - timedelta(hours=1), end=NOW, interval=timedelta(seconds=30))
    assert view["windowStart"] == (NOW - timedelta(hours=1)).isoformat()
    assert view["windowEnd"] == NOW.isoformat()
    assert view["intervalS"] == 30
    assert [pool["name"] for pool in view["pools"]] == ["a", "training"]
    training = view["pools"][1]
    assert training["t"] == [
        round((NOW - 10 * MINUTE).timestamp() * 1000),
        round((NOW - 5 * MINUTE).timestamp() * 1000),
    ]
    assert training["allocatedTflopsPercent"] == [12.5, 25.0]
    assert training["allocatedVramPercent"] == [25.0, 25.0]
    assert training["strandedTflops"] == [10.0, 10.0]
    assert training["strandedTflopsPercent"] == [5.0, 5.0]
    assert training["strandedVramGiB"] == [8.0, 8.0]
    assert training["strandedVramPercent"] == [5.0, 5.0]
    assert training["fragmentationRate"] == [0.1235, 0.1235]
    assert training["gpuCount"] == [2, 2]
    assert training["wholeIdleGpus"] == [1, 1]


def test_the_campaigns_marked_are_those_that_overlap_the_window() -> None:
    start = NOW - timedelta(hours=24)
    campaigns = [
        a_campaign("training", NOW - timedelta(hours=3), 25),
        a_campaign("training", start - timedelta(minutes=10), 20),
        a_campaign("training", start - timedelta(hours=2), 30),
        a_campaign("inference", NOW - timedelta(minutes=5), None),
    ]
    view = history_view([], campaigns, start=start, end=NOW, interval=timedelta(seconds=30))
    assert view["pools"] == []
    marks = view["campaigns"]
    assert [(mark["pool"], mark["startedAt"]) for mark in marks] == [
        ("training", (start - timedelta(minutes=10)).isoformat()),
        ("training", (NOW - timedelta(hours=3)).isoformat()),
        ("inference", (NOW - timedelta(minutes=5)).isoformat()),
    ]
    assert marks[1] == {
        "pool": "training",
        "trigger": "cron",
        "running": False,
        "startedAt": (NOW - timedelta(hours=3)).isoformat(),
        "finishedAt": (NOW - timedelta(hours=3) + 25 * MINUTE).isoformat(),
        "outcome": "completed",
        "nodesDrained": 2,
        "podsEvicted": 5,
    }
    assert marks[2]["running"] is True
    assert marks[2]["finishedAt"] is None
