"""`make bench`'s webhook benchmark runs end to end and reports both servers in one document."""

from __future__ import annotations

import pytest
from tfwebhook.bench import run_admission_benchmark

pytestmark = pytest.mark.integration


def test_the_benchmark_measures_the_webhook_and_the_bare_endpoint() -> None:
    report = run_admission_benchmark(requests=40, concurrency=(2,), rounds=3)
    for server in ("webhook", "bare"):
        measured = report[server]["c2"]
        assert measured["requests_per_s"] > 0
        assert 0 < measured["p50_ms"] <= measured["p99_ms"]
    assert report["ratio"]["c2"] > 0
    assert sorted(report["ratio_per_round"]["c2"])[1] == report["ratio"]["c2"]
    assert set(report["goal"]) == {"ratio_at_least", "p99_ms_at_10_below", "met"}
    assert report["core_us_per_review"]["uncached"] > 0
