"""Autoscaling recommendations on hand-computed cases: percentiles, the bound per QoS, too few samples,
limits, floors, the expected saving, and the usage window that feeds them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tfcommon.events import GpuUsageReported, WorkerUsage
from tfcommon.recommendations import Recommendation
from tfmetrics.core.billing import PriceBook, QosPrice
from tfmetrics.core.recommendations import (
    Card,
    CurrentResources,
    RecommendationPolicy,
    RecommendationPolicyError,
    UsagePoint,
    current_resources,
    hourly_saving,
    percentile,
    recommend,
)
from tfmetrics.core.series import GpuState, WorkerShare
from tfmetrics.recommender import UsageWindow

MIB = 1024**2
GIB = 1024**3
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
POLICY = RecommendationPolicy()
# 100 samples: i TFLOPS and i x 100 MiB for i = 1..100.
SAMPLES = [UsagePoint(tflops_milli=i * 1000, vram_bytes=i * 100 * MIB) for i in range(1, 101)]


def holding(qos: str) -> CurrentResources:
    return CurrentResources(
        pool="training",
        qos=qos,
        gpu_count=1,
        request_tflops_milli=20_000,
        limit_tflops_milli=40_000,
        request_vram_bytes=4 * GIB,
        limit_vram_bytes=8 * GIB,
    )


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5, 1, 4, 2, 3], 50) == 3
    assert percentile([5, 1, 4, 2, 3], 90) == 5
    assert percentile([5, 1, 4, 2, 3], 1) == 1
    assert percentile([7], 95) == 7
    with pytest.raises(ValueError, match="values: empty"):
        percentile([], 50)


@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=200), st.integers(1, 100))
def test_a_percentile_is_one_of_the_samples_and_grows_with_the_percent(
    values: list[int], percent: int
) -> None:
    value = percentile(values, percent)
    assert value in values
    assert value <= percentile(values, min(100, percent + 1))


@pytest.mark.parametrize(
    ("qos", "tflops", "vram_mib"),
    [
        # p50 = 50 TFLOPS / 5000 MiB, p90 = 90 / 9000, p95 = 95 / 9500; each plus 15%.
        pytest.param("low", 57_500, 5750, id="low gets the lower bound"),
        pytest.param("medium", 57_500, 5750, id="medium gets the lower bound"),
        pytest.param("high", 103_500, 10350, id="high gets the target"),
        pytest.param("critical", 109_250, 10925, id="critical gets the upper bound"),
    ],
)
def test_the_request_follows_the_qos_and_the_limit_keeps_the_ratio(
    qos: str, tflops: int, vram_mib: int
) -> None:
    result = recommend("team-a/trainer", SAMPLES, holding(qos), POLICY, NOW, DAY)
    assert result.sufficient
    assert (result.request_tflops_milli, result.limit_tflops_milli) == (tflops, 2 * tflops)
    assert (result.request_vram_bytes, result.limit_vram_bytes) == (vram_mib * MIB, 2 * vram_mib * MIB)
    assert (result.current_request_tflops_milli, result.current_limit_vram_bytes) == (20_000, 8 * GIB)
    assert result.sample_count == 100
    assert result.computed_at == NOW
    assert f"{qos} QoS gets the" in result.reason
    assert "100 samples in the last 1d plus 15%" in result.reason


def test_too_few_samples_keep_the_current_values_and_say_so() -> None:
    result = recommend("team-a/trainer", SAMPLES[:29], holding("high"), POLICY, NOW, DAY)
    assert not result.sufficient
    assert (result.request_tflops_milli, result.limit_tflops_milli) == (20_000, 40_000)
    assert (result.request_vram_bytes, result.limit_vram_bytes) == (4 * GIB, 8 * GIB)
    assert result.reason == "too few samples: 29 in the last 1d, 30 needed; keeping the current values"


def test_an_idle_workload_gets_the_floors_not_zero() -> None:
    idle = [UsagePoint(0, 0)] * 40
    result = recommend("team-a/idle", idle, holding("low"), POLICY, NOW, DAY)
    assert (result.request_tflops_milli, result.request_vram_bytes) == (1000, 256 * MIB)
    assert (result.limit_tflops_milli, result.limit_vram_bytes) == (2000, 512 * MIB)


def test_a_workload_without_a_tflops_request_gets_the_upper_bound_as_limit() -> None:
    vram_only = CurrentResources("training", "low", 1, 0, 0, 4 * GIB, 4 * GIB)
    result = recommend("team-a/shared", SAMPLES, vram_only, POLICY, NOW, DAY)
    assert (result.request_tflops_milli, result.limit_tflops_milli) == (57_500, 109_250)
    assert (result.request_vram_bytes, result.limit_vram_bytes) == (5750 * MIB, 5750 * MIB)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"min_samples": 0}, "min_samples: 0; give 1 or more"),
        ({"lower_percentile": 95, "target_percentile": 90}, "percentiles: need 1 <= lower <= target"),
        ({"upper_percentile": 101}, "percentiles: need 1 <= lower <= target <= upper <= 100"),
        ({"margin_percent": -1}, "margin_percent: -1; give 0 or more"),
    ],
)
def test_inconsistent_policies_are_refused_naming_the_setting(settings: dict[str, int], message: str) -> None:
    with pytest.raises(RecommendationPolicyError, match=message.replace("(", r"\(")):
        RecommendationPolicy(**settings)


def test_the_expected_saving_is_the_hourly_price_difference_over_all_gpus() -> None:
    book = PriceBook(prices={"medium": QosPrice(Decimal("0.01"), Decimal("0.02"), Decimal("0.5"))})
    recommendation = Recommendation(
        workload_key="team-a/trainer",
        pool="training",
        qos="medium",
        gpu_count=2,
        request_tflops_milli=10_000,
        limit_tflops_milli=20_000,
        request_vram_bytes=2 * GIB,
        limit_vram_bytes=4 * GIB,
        current_request_tflops_milli=20_000,
        current_limit_tflops_milli=40_000,
        current_request_vram_bytes=4 * GIB,
        current_limit_vram_bytes=8 * GIB,
        sample_count=100,
        sufficient=True,
        reason="",
        computed_at=NOW,
    )
    # Per GPU now: 20 x 0.01 + 4 x 0.02 + (20 x 0.01 + 4 x 0.02) x 0.5 = 0.42; recommended: 0.21.
    assert hourly_saving(recommendation, book) == Decimal("0.420000")


H100 = Card("H100", tflops_milli=989_400, vram_bytes=80 * GIB)


@pytest.mark.parametrize("qos", ["low", "high", "critical"])
def test_a_workload_filling_its_card_is_never_recommended_more_than_the_card(qos: str) -> None:
    full_card = [UsagePoint(989_400, 80 * GIB)] * 40
    on_h100 = CurrentResources("training", qos, 1, 500_000, 989_400, 40 * GIB, 80 * GIB, card=H100)

    result = recommend("team-a/trainer", full_card, on_h100, POLICY, NOW, DAY)

    # Uncapped: 989.4 x 1.15 = 1137.81 TFLOPS and 92 GiB, limits twice that.
    assert (result.request_tflops_milli, result.limit_tflops_milli) == (989_400, 989_400)
    assert (result.request_vram_bytes, result.limit_vram_bytes) == (80 * GIB, 80 * GIB)
    assert result.reason.endswith("; capped at the H100 it runs on (989.4 TFLOPS, 80 GiB)")


def test_only_what_exceeds_the_card_is_capped() -> None:
    on_h100 = CurrentResources("training", "high", 1, 20_000, 40_000, 4 * GIB, 80 * GIB, card=H100)

    result = recommend("team-a/trainer", SAMPLES, on_h100, POLICY, NOW, DAY)

    # VRAM: p90 = 9000 MiB + 15% = 10350 MiB; the 20x limit ratio would ask for 202 GiB.
    assert (result.request_tflops_milli, result.limit_tflops_milli) == (103_500, 207_000)
    assert (result.request_vram_bytes, result.limit_vram_bytes) == (10350 * MIB, 80 * GIB)
    assert "(TFLOPS 103.5, VRAM 10.11 GiB)" in result.reason
    assert "capped at the H100" in result.reason


def test_a_recommendation_within_the_card_says_nothing_of_it() -> None:
    within = CurrentResources("training", "high", 1, 20_000, 40_000, 4 * GIB, 8 * GIB, card=H100)

    result = recommend("team-a/trainer", SAMPLES, within, POLICY, NOW, DAY)

    assert result.limit_vram_bytes == 2 * 10350 * MIB
    assert "capped" not in result.reason


def test_current_resources_group_the_active_shares_by_workload() -> None:
    def share(allocation: str, pod: str, gpu: str, qos: str = "medium") -> WorkerShare:
        return WorkerShare(
            allocation, "team-a", pod, "trainer", qos, "training", gpu, 10_000, GIB, 20_000, 2 * GIB
        )

    current = current_resources(
        [
            share("a1", "trainer-0", "g0"),
            share("a1", "trainer-0", "g1"),
            share("a2", "trainer-1", "g2", "high"),
        ]
    )
    assert current == {
        "team-a/trainer": CurrentResources("training", "high", 2, 10_000, 20_000, GIB, 2 * GIB),
    }


def test_current_resources_know_the_smallest_card_each_workload_runs_on() -> None:
    def gpu(uuid: str, model: str, tflops: int, vram_gib: int) -> GpuState:
        return GpuState(uuid, "node-a", 0, model, "Running", tflops, vram_gib * GIB, 0, 0)

    def share(workload: str, gpu: str) -> WorkerShare:
        return WorkerShare(
            "a-" + gpu, "team-a", f"{workload}-0", workload, "low", "training", gpu, 1, 1, 1, 1
        )

    current = current_resources(
        [share("mixed", "g0"), share("mixed", "g1"), share("unknown", "g9")],
        [gpu("g0", "H100", 989_400, 80), gpu("g1", "A100-40G", 312_000, 40)],
    )

    assert current["team-a/mixed"].card == Card("A100-40G/H100", 312_000, 40 * GIB)
    assert current["team-a/unknown"].card is None


def a_report(node: str, at: datetime, *workers: tuple[str, int]) -> GpuUsageReported:
    return GpuUsageReported(
        event_id=uuid.uuid4(),
        occurred_at=at,
        node=node,
        pool="training",
        sampled_at=at,
        interval_ms=60_000,
        workers=tuple(
            WorkerUsage(
                uuid="gpu-0",
                namespace="team-a",
                pod_name=f"{workload}-0",
                workload=workload,
                worker=f"{workload}-0",
                compute_percentage=1.0,
                compute_tflops_milli=tflops,
                memory_bytes=GIB,
                memory_percentage=1.0,
            )
            for workload, tflops in workers
        ),
    )


def test_the_usage_window_keeps_recent_samples_per_workload_and_ignores_redeliveries() -> None:
    window = UsageWindow(timedelta(minutes=10))
    for minute in range(15):
        window.add(
            a_report("node-a", NOW + timedelta(minutes=minute), ("trainer", minute * 1000), ("server", 7))
        )
    window.add(a_report("node-a", NOW + timedelta(minutes=14), ("trainer", 999_999)))
    now = NOW + timedelta(minutes=14)
    assert [point.tflops_milli for point in window.samples("team-a/trainer", now)] == [
        minute * 1000 for minute in range(5, 15)
    ]
    assert len(window.samples("team-a/server", now)) == 10
    assert window.samples("team-a/unknown", now) == []
