"""`make bench`'s webhook benchmark runs end to end: the shortcut path (one cached review) and the path users
hit (the webhook service on a real ledger and JetStream, distinct pods) against the bare endpoint, with
every varied admission's `PodAdmitted` stored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tfcommon.placement import PlacementRequest
from tfctl.bench_servers import scratch_database
from tfwebhook.bench import VariedLoad, run_admission_benchmark, varied_review
from tfwebhook.core.review import parse_review

pytestmark = pytest.mark.integration

SHAPES = [
    PlacementRequest(name="half", cpu_milli=6000, memory_bytes=12 << 30, gpu_count=1, gpu_share=460),
    PlacementRequest(name="whole", cpu_milli=12000, memory_bytes=24 << 30, gpu_count=1, gpu_share=1000),
    PlacementRequest(name="eight", cpu_milli=64000, memory_bytes=256 << 30, gpu_count=8, gpu_share=1000),
]


@pytest.fixture
def database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "test_webhook_bench") as url:
        yield url


def test_the_benchmark_measures_both_paths_against_the_bare_endpoint(
    database_url: str, nats_url: str
) -> None:
    report = run_admission_benchmark(
        requests=40, concurrency=(2,), rounds=3, varied=VariedLoad(database_url, nats_url, SHAPES)
    )

    for server in ("cached", "varied", "bare"):
        measured = report[server]["c2"]
        assert measured["requests_per_s"] > 0
        assert 0 < measured["p50_ms"] <= measured["p99_ms"]
    for path in ("cached", "varied"):
        ratio = report[f"{path}_ratio"]["c2"]
        assert ratio == pytest.approx(
            report[path]["c2"]["requests_per_s"] / report[path]["c2"]["bare_requests_per_s"], abs=0.001
        )
        assert sorted(report["ratio_per_round"][path]["c2"])[1] == ratio
    warm_up = 2 * 5
    assert report["events"] == {
        "varied_admissions": 3 * (warm_up + 40),
        "pod_admitted_stored": 3 * (warm_up + 40),
    }
    assert set(report["goal"]) == {
        "cached_ratio_at_least",
        "varied_ratio_at_least",
        "p99_ms_at_10_below",
        "met",
    }
    assert report["core_us_per_review"]["uncached"] > 0


def test_varied_reviews_are_distinct_pods_of_their_shape_with_their_own_owner_and_uid() -> None:
    first, second = (parse_review(varied_review(SHAPES[2], serial, "run1")) for serial in (7, 8))

    assert first.uid != second.uid
    assert first.pod is not None
    assert second.pod is not None
    metadata = first.pod["metadata"]
    assert metadata["annotations"]["tensor-fusion.ai/gpu-count"] == "8"
    assert metadata["annotations"]["tensor-fusion.ai/compute-percent-request"] == "100"
    owners = [pod["metadata"]["ownerReferences"][0] for pod in (first.pod, second.pod)]
    assert owners[0]["name"] != owners[1]["name"]
    assert owners[0]["uid"] != owners[1]["uid"]
    assert first.pod["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "64000m",
        "memory": "262144Mi",
    }
