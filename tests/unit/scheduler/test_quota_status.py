"""The quota core's compute-percent counting, usage from ledger shares, the alert threshold and the
`status` a GPUResourceQuota object gets (`tfscheduler.core.quota`)."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from uuid import UUID, uuid4

import pytest
from tfcommon.ledger.records import NamespaceShare
from tfscheduler.core.quota import (
    NamespaceQuota,
    QuotaError,
    Usage,
    alert_reached,
    check_total,
    format_percent,
    parse_quota,
    quota_status,
    usage_of_shares,
)

GIB = 1024**3
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def share(namespace: str, allocation: UUID, tflops: int, capacity: int = 300_000) -> NamespaceShare:
    return NamespaceShare(namespace, allocation, tflops, GIB, tflops * 2, 2 * GIB, capacity)


def test_compute_percent_is_the_exact_share_of_each_gpu_and_workers_count_allocations() -> None:
    two_gpus = uuid4()
    shares = [share("a", two_gpus, 100_000), share("a", two_gpus, 100_000), share("a", uuid4(), 50_000)]
    used = usage_of_shares([*shares, share("b", uuid4(), 1_000)])["a"]
    assert used.workers == 2
    assert used.requests_tflops_milli == 250_000
    assert used.requests_compute == Fraction(250, 3)  # a third, a third and a sixth of 300 TFLOPS GPUs
    assert used.limits_compute == Fraction(500, 3)
    assert format_percent(used.requests_compute) == "83.33"


def test_a_compute_bound_refuses_exactly_at_the_fraction() -> None:
    quota = NamespaceQuota("a", name="q", total_requests_compute=Fraction(100))
    used = Usage(requests_compute=Fraction(200, 3), workers=1)
    assert check_total(quota, used, Usage(requests_compute=Fraction(100, 3), workers=1)) is None
    refusal = check_total(quota, used, Usage(requests_compute=Fraction(101, 3), workers=1))
    assert refusal is not None
    assert refusal.reason.startswith("GPUResourceQuota a/q: total.requests.compute would be 100.33 of 100")


def test_status_reports_usage_free_share_and_the_alert_threshold() -> None:
    quota = NamespaceQuota(
        "a", name="q", total_requests_tflops_milli=100_000, max_workers=4, alert_threshold_percent=75
    )
    below = quota_status(quota, Usage(requests_tflops_milli=50_000, requests_vram_bytes=GIB, workers=2), NOW)
    assert below["used"] == {
        "requests": {"tflops": "50", "vram": "1Gi", "compute": "0"},
        "limits": {"tflops": "0", "vram": "0", "compute": "0"},
        "workers": 2,
    }
    assert below["availablePercent"] == {"requests.tflops": "50", "workers": "50"}
    assert [(c["type"], c["status"]) for c in below["conditions"]] == [
        ("Ready", "True"),
        ("AlertThresholdReached", "False"),
    ]
    at = Usage(requests_tflops_milli=50_000, workers=3)
    assert alert_reached(quota, at)
    alert = quota_status(quota, at, NOW)["conditions"][1]
    assert alert["status"] == "True"
    assert alert["message"] == "workers at 75% of its bound (alert at 75%)"


def test_compute_bounds_parse_as_percent_and_name_the_field() -> None:
    manifest = {
        "kind": "GPUResourceQuota",
        "metadata": {"name": "q", "namespace": "a"},
        "spec": {"total": {"requests": {"compute": "150.5"}}, "single": {"maxRequests": {"compute": "40"}}},
    }
    quota = parse_quota(manifest)
    assert (quota.name, quota.total_requests_compute, quota.max_request_compute) == (
        "q",
        Fraction(301, 2),
        Fraction(40),
    )
    manifest["spec"] = {"total": {"limits": {"compute": "most"}}}
    with pytest.raises(QuotaError, match=r"spec\.total\.limits\.compute: .*percent of one GPU"):
        parse_quota(manifest)
