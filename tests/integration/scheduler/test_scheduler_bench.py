"""`tfctl bench scheduler` at a tiny size, every way in: in-process, through the service's HTTP API and
through its NATS consumer, on real Postgres and JetStream. Every placement it counts was announced, and
the baseline makes the same reservations in the batch sizes the scheduler's transactions had."""

from __future__ import annotations

import pytest
from tfcommon.placement import PlacementRequest
from tfctl.bench_servers import scratch_database
from tfscheduler.bench import SchedulerRun, default_runs, run_scheduler_benchmark

pytestmark = pytest.mark.integration

SHAPES = [
    PlacementRequest(name="share", gpu_count=1, gpu_share=460),
    PlacementRequest(name="whole", gpu_count=1, gpu_share=1000),
    PlacementRequest(name="pair", gpu_count=2, gpu_share=1000),
    PlacementRequest(name="too-wide", gpu_count=16, gpu_share=1000),  # no node of 8 GPUs holds it
]


def test_each_way_in_places_every_pod_and_is_compared_with_reserve_many_in_its_batch_sizes(
    postgres_server_url: str, nats_url: str
) -> None:
    runs = [SchedulerRun("in-process", 20, mixed_shapes=False), *default_runs([20], ["http", "nats"])]

    result = run_scheduler_benchmark(
        runs,
        scratch_database=lambda: scratch_database(postgres_server_url, "test_bench_scheduler"),
        nats_url=nats_url,
        shapes=SHAPES,
        gpus_per_node=8,
        pods=40,
        concurrency=8,
        offered_rate=100.0,
        offered_pods=20,
    )

    assert [(run["via"], run["mixed_shapes"]) for run in result["runs"]] == [
        ("in-process", False),
        ("http", True),
        ("nats", True),
    ]
    for run in result["runs"]:
        burst, offered, baseline = run["burst"], run["offered"], run["baseline_reserve_many"]
        assert (burst["placed"], burst["pending"]) == (40, 0)
        assert (offered["placed"], offered["pending"]) == (20, 0)
        assert 0 < burst["p50_ms"] <= burst["p99_ms"] <= burst["max_ms"]
        assert 0 < offered["p50_ms"] <= offered["p99_ms"]
        assert baseline["reservations"] == 40
        if run["via"] != "nats":  # over NATS the burst's pods are all in flight as soon as published
            assert baseline["batch_size_max"] <= 8  # no batch held more than the pods in flight
        assert run["ratio"] == pytest.approx(
            burst["placements_per_second"] / baseline["reservations_per_second"], abs=0.001
        )
    assert result["runs"][0]["shapes"] == 1
    assert result["runs"][1]["shapes"] == 3  # the shape no node holds is left out
    tail = result["runs"][0]["tail"]
    assert tail["batches"]["count"] >= 1
    assert {"gc_pause_max_ms", "loop_lag_p99_ms", "relay_passes"} <= set(tail)
    rebuild = result["runs"][0]["rebuild"]
    assert rebuild["rounds"] == 3
    assert set(rebuild) == {
        "rounds",
        "threads_seconds",
        "threads_loop_stall_max_ms",
        "in_loop_seconds",
        "in_loop_loop_stall_max_ms",
    }
    assert rebuild["threads_seconds"] > 0
    assert rebuild["in_loop_seconds"] > 0
    assert "rebuild" not in result["runs"][1]  # measured in process only
