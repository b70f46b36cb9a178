"""`tensor-fusion.ai/autoscale: "true"`: the webhook's pure core admits new pods of a workload with its
stored recommendation, per `autoscale-target`, and keeps the pod's values (saying why) otherwise."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from tfcommon.config import parse_config
from tfcommon.recommendations import Recommendation
from tfwebhook.core.admission import AdmissionContext, Admitted, admit
from tfwebhook.testing import a_pod, apply, opted_in

GIB = 1024**3
T = "tensor-fusion.ai/"
KEY = "ml-team-a/trainer"
CONFIG = parse_config(
    """
gpuPools:
  - name: training
    isDefault: true
    specTemplate: {qosConfig: {defaultQoS: low}}
"""
)
COMPUTED_AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def a_recommendation(*, qos: str = "low", sufficient: bool = True) -> Recommendation:
    return Recommendation(
        workload_key=KEY,
        pool="training",
        qos=qos,
        gpu_count=1,
        request_tflops_milli=10_000 if sufficient else 20_000,
        limit_tflops_milli=20_000 if sufficient else 40_000,
        request_vram_bytes=(2 if sufficient else 4) * GIB,
        limit_vram_bytes=(4 if sufficient else 8) * GIB,
        current_request_tflops_milli=20_000,
        current_limit_tflops_milli=40_000,
        current_request_vram_bytes=4 * GIB,
        current_limit_vram_bytes=8 * GIB,
        sample_count=1440 if sufficient else 12,
        sufficient=sufficient,
        reason=""
        if sufficient
        else "too few samples: 12 in the last 1d, 30 needed; keeping the current values",
        computed_at=COMPUTED_AT,
    )


def a_sized_pod(**annotations: str) -> dict[str, Any]:
    sizes = {"tflops_request": "20", "tflops_limit": "40", "vram_request": "4Gi", "vram_limit": "8Gi"}
    return a_pod(labels={f"{T}enabled": "true"}, annotations=opted_in(**{**sizes, **annotations}))


def admitted(pod: dict[str, Any], *recommendations: Recommendation) -> tuple[Admitted, dict[str, str]]:
    context = AdmissionContext(CONFIG, recommendations={item.workload_key: item for item in recommendations})
    verdict = admit(pod, context)
    assert isinstance(verdict, Admitted), verdict
    annotations = apply(pod, verdict.patch)["metadata"]["annotations"]
    return verdict, {key.removeprefix(T): value for key, value in annotations.items() if key.startswith(T)}


def sizes(annotations: dict[str, str]) -> tuple[str, str, str, str]:
    return (
        annotations["tflops-request"],
        annotations["tflops-limit"],
        annotations["vram-request"],
        annotations["vram-limit"],
    )


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        pytest.param({}, ("10", "20", "2Gi", "4Gi"), id="default target all"),
        pytest.param({"autoscale_target": "all"}, ("10", "20", "2Gi", "4Gi"), id="all"),
        pytest.param({"autoscale_target": "compute"}, ("10", "20", "4Gi", "8Gi"), id="compute only"),
        pytest.param({"autoscale_target": "vram"}, ("20", "40", "2Gi", "4Gi"), id="vram only"),
    ],
)
def test_a_new_pod_gets_the_recommendation_for_its_target(
    target: dict[str, str], expected: tuple[str, str, str, str]
) -> None:
    verdict, annotations = admitted(a_sized_pod(autoscale="true", **target), a_recommendation())
    assert sizes(annotations) == expected
    assert verdict.request is not None
    assert verdict.request.tflops_request_milli == int(float(expected[0]) * 1000)
    assert annotations["autoscale-source"].startswith(
        "recommendation of 2026-12-02T12:00:00+00:00 on 1440 samples applied: "
    )


def test_without_autoscale_the_recommendation_is_ignored() -> None:
    _, annotations = admitted(a_sized_pod(), a_recommendation())
    assert sizes(annotations) == ("20", "40", "4Gi", "8Gi")
    assert "autoscale-source" not in annotations


@pytest.mark.parametrize(
    ("recommendations", "note"),
    [
        pytest.param(
            (), "no recommendation for ml-team-a/trainer yet; keeping the pod's values", id="none yet"
        ),
        pytest.param(
            (a_recommendation(sufficient=False),),
            "too few samples: 12 in the last 1d, 30 needed; keeping the current values (ml-team-a/trainer)",
            id="too few samples",
        ),
        pytest.param(
            (a_recommendation(qos="critical"),),
            "the recommendation for ml-team-a/trainer was computed for QoS critical, the pod asks for low; "
            "keeping the pod's values until it is recomputed",
            id="another QoS",
        ),
    ],
)
def test_a_pod_keeps_its_values_and_says_why(recommendations: tuple[Recommendation, ...], note: str) -> None:
    _, annotations = admitted(a_sized_pod(autoscale="true"), *recommendations)
    assert sizes(annotations) == ("20", "40", "4Gi", "8Gi")
    assert annotations["autoscale-source"] == note


def test_compute_sized_as_a_percent_keeps_it_and_takes_the_vram() -> None:
    pod = a_pod(
        labels={f"{T}enabled": "true"},
        annotations=opted_in(
            autoscale="true",
            qos="low",
            compute_percent_request="50",
            compute_percent_limit="50",
            vram_request="4Gi",
        ),
    )
    _, annotations = admitted(pod, a_recommendation())
    assert (annotations["compute-percent-request"], annotations["vram-request"]) == ("50", "2Gi")
    assert "tflops-request" not in annotations
    assert annotations["autoscale-source"].endswith(
        "compute is sized as a percent of the card, so it is kept"
    )


def test_admitting_the_mutated_pod_again_changes_nothing() -> None:
    pod = a_sized_pod(autoscale="true")
    verdict, _ = admitted(pod, a_recommendation())
    again, _ = admitted(apply(pod, verdict.patch), a_recommendation())
    assert again.patch == []
