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


def compute_quota(**single: Any) -> NamespaceQuota:
    return parse_quota(
        {
            "kind": "GPUResourceQuota",
            "metadata": {"name": "compute", "namespace": DEV},
            "spec": {"single": single},
        }
    )


def test_a_pod_naming_no_compute_gets_the_compute_percent_defaults() -> None:
    quota = compute_quota(
        defaultRequests={"compute": "10", "vram": "1Gi"}, defaultLimits={"compute": "40", "vram": "2Gi"}
    )
    annotations = annotations_after(opted_in(isolation="soft"), quota)
    assert annotations[f"{T}compute-percent-request"] == "10"
    assert annotations[f"{T}compute-percent-limit"] == "40"
    assert f"{T}tflops-request" not in annotations
    own_request = annotations_after(opted_in(compute_percent_request="20", vram_request="1Gi"), quota)
    assert own_request[f"{T}compute-percent-limit"] == "20"  # the pod's limit is its request, as for TFLOPS


def test_a_tflops_default_wins_and_compute_defaults_never_mix_into_a_tflops_pod() -> None:
    quota = compute_quota(
        defaultRequests={"tflops": "1", "compute": "10"}, defaultLimits={"tflops": "2", "compute": "40"}
    )
    annotations = annotations_after(opted_in(isolation="soft", vram_request="1Gi"), quota)
    assert (annotations[f"{T}tflops-request"], annotations[f"{T}tflops-limit"]) == ("1", "2")
    assert f"{T}compute-percent-limit" not in annotations
    percent = annotations_after(opted_in(compute_percent_request="30", vram_request="1Gi"), quota)
    assert f"{T}tflops-limit" not in percent


def test_a_pod_over_the_compute_limit_maximum_is_denied_naming_it() -> None:
    quota = compute_quota(maxLimits={"compute": "50"})
    verdict = decide(
        opted_in(compute_percent_request="20", compute_percent_limit="60", vram_request="1Gi"), quota
    )
    assert isinstance(verdict, Denied)
    assert verdict.message == (
        f"GPUResourceQuota {DEV}/compute: single.maxLimits.compute is 50% per workload, asked 60%; "
        "ask for at most that, or raise the quota"
    )
    within = opted_in(compute_percent_request="20", compute_percent_limit="50", vram_request="1Gi")
    assert isinstance(decide(within, quota), Admitted)
    defaulted_over = compute_quota(maxLimits={"compute": "30"}, defaultLimits={"compute": "40"})
    verdict = decide(opted_in(compute_percent_request="20", vram_request="1Gi"), defaulted_over)
    assert isinstance(verdict, Admitted), "the pod's own limit (its request) is not the default"
