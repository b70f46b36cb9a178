"""Admission under a namespace's GPUResourceQuota (`AdmissionContext.quota`): `single.defaultRequests`
and `defaultLimits` fill the zero requests of a pod that names none, and a pod over a `single` maximum is
denied with the limit named. Uses TensorFusion's sample `development-namespace` quota."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from tfcommon.config import TfConfig
from tfcommon.quota import NamespaceQuota, parse_quota
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.testing import a_pod, apply, opted_in

SAMPLES = (
    Path(__file__).resolve().parents[2] / "integration/deploy/tensorfusion_samples/v1_gpuresourcequota.yaml"
)
DEV = "development-namespace"
T = "tensor-fusion.ai/"


def sample_quota() -> NamespaceQuota:
    documents = list(yaml.safe_load_all(SAMPLES.read_text()))
    return parse_quota(next(d for d in documents if d["metadata"]["namespace"] == DEV))


def decide(annotations: dict[str, str], quota: NamespaceQuota | None) -> Admitted | Denied:
    pod = a_pod(labels={f"{T}enabled": "true"}, annotations=annotations, namespace=DEV)
    return admit(pod, AdmissionContext(TfConfig(), DEV, quota=quota))


def annotations_after(annotations: dict[str, str], quota: NamespaceQuota | None) -> dict[str, Any]:
    verdict = decide(annotations, quota)
    assert isinstance(verdict, Admitted), verdict
    pod = a_pod(labels={f"{T}enabled": "true"}, annotations=annotations, namespace=DEV)
    result: dict[str, Any] = apply(pod, verdict.patch)["metadata"]["annotations"]
    return result


def test_a_pod_naming_no_requests_gets_the_quota_defaults_instead_of_a_denial() -> None:
    assert isinstance(decide(opted_in(isolation="soft"), None), Denied)  # every GPU request is zero
    annotations = annotations_after(opted_in(isolation="soft"), sample_quota())
    assert annotations[f"{T}tflops-request"] == "250m"
    assert annotations[f"{T}vram-request"] == "512Mi"
    assert annotations[f"{T}tflops-limit"] == "500m"
    assert annotations[f"{T}vram-limit"] == "1Gi"


def test_the_pod_own_values_win_over_the_defaults() -> None:
    own = opted_in(tflops_request="10", tflops_limit="20", vram_request="4Gi", vram_limit="8Gi")
    annotations = annotations_after(own, sample_quota())
    assert (annotations[f"{T}tflops-request"], annotations[f"{T}vram-limit"]) == ("10", "8Gi")


def test_a_shared_whole_gpu_pod_gets_no_defaults() -> None:
    annotations = annotations_after(opted_in(isolation="shared"), sample_quota())
    assert f"{T}tflops-request" not in annotations


def test_a_pod_over_a_single_maximum_is_denied_naming_the_limit() -> None:
    verdict = decide(opted_in(tflops_request="60", vram_request="4Gi"), sample_quota())
    assert isinstance(verdict, Denied)
    assert verdict.message == (
        f"GPUResourceQuota {DEV}/{DEV}: single.maxRequests.tflops is 50 per workload, asked 60; "
        "ask for at most that, or raise the quota"
    )
    too_many = decide(opted_in(tflops_request="1", vram_request="1Gi", gpu_count="3"), sample_quota())
    assert isinstance(too_many, Denied)
    assert "single.maxGPUCount is 2 per workload, asked 3" in too_many.message
