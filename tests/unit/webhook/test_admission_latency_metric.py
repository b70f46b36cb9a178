"""`POST /mutate-v1-pod`, served ahead of the middleware, still records its latency in
`tf_http_request_duration_seconds` (route `/mutate-v1-pod`, service `webhook`): the
TfpoolWebhookLatencyNearTimeout alert reads that histogram."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tfcommon.config_source import ConfigSource
from tfcommon.telemetry import setup_telemetry
from tfwebhook.http import MUTATE_PATH, AdmissionEndpoint, AdmissionService
from tfwebhook.testing import a_pod, a_review


def admission_count(status: str) -> float:
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        if family.name != "tf_http_request_duration_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "tf_http_request_duration_seconds_count"
                and labels.get("route") == MUTATE_PATH
                and labels.get("service") == "webhook"
                and labels.get("method") == "POST"
                and labels.get("status") == status
            ):
                return sample.value
    return 0.0


def call(endpoint: AdmissionEndpoint, body: bytes) -> int:
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": MUTATE_PATH}
    asyncio.run(endpoint(scope, receive, send))  # type: ignore[arg-type]
    return int(sent[0]["status"])


def test_each_admission_review_is_counted_in_the_latency_histogram() -> None:
    setup_telemetry("webhook")
    endpoint = AdmissionEndpoint(AdmissionService(config=ConfigSource(None)))
    allowed_before, malformed_before = admission_count("200"), admission_count("400")

    assert call(endpoint, a_review(a_pod())) == 200
    assert call(endpoint, a_review(a_pod(), uid="req-2")) == 200
    assert call(endpoint, b"not json") == 400

    assert admission_count("200") == allowed_before + 2
    assert admission_count("400") == malformed_before + 1


def test_the_histogram_has_second_buckets_up_to_past_the_webhook_timeout() -> None:
    setup_telemetry("webhook")
    call(AdmissionEndpoint(AdmissionService(config=ConfigSource(None))), b"not json")
    bounds = {
        float(sample.labels["le"])
        for family in text_string_to_metric_families(generate_latest(REGISTRY).decode())
        if family.name == "tf_http_request_duration_seconds"
        for sample in family.samples
        if sample.name.endswith("_bucket") and sample.labels.get("route") == MUTATE_PATH
    }
    # 80 % of the 5 s timeout (the alert's threshold) is a bucket bound, and so is the timeout.
    assert {0.005, 0.1, 1.0, 3.0, 4.0, 5.0} <= bounds
