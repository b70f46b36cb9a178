"""Admission of a pod naming a WorkloadProfile (annotation `tensor-fusion.ai/workload-profile`): the
profile's resources, QoS, isolation and GPU count fill every key the pod's own annotations leave unset,
the pod's own win, and an unknown or invalid profile is a denial naming the annotation and the
namespace. Includes TensorFusion's sample profile (`isLocalGPU: true` only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from tfcommon.config import TfConfig
from tfcommon.quota import NamespaceQuota
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.core.profile import (
    ProfileError,
    WorkloadProfile,
    parse_profile,
    profile_key,
    profiles_in_force,
)
from tfwebhook.http import VerdictCache
from tfwebhook.testing import a_pod, apply, opted_in

SAMPLE = (
    Path(__file__).resolve().parents[2] / "integration/deploy/tensorfusion_samples/v1_workloadprofile.yaml"
)
NS = "team-a"
T = "tensor-fusion.ai/"
SPEC: dict[str, Any] = {
    "resources": {"requests": {"tflops": "20", "vram": "8Gi"}, "limits": {"tflops": "40", "vram": "16Gi"}},
    "qos": "low",
    "isolation": "hard",
    "gpuCount": 2,
}


def profiles(spec: dict[str, Any] = SPEC, name: str = "small") -> dict[str, WorkloadProfile]:
    return {profile_key(NS, name): parse_profile(NS, name, spec)}


def decide(
    annotations: dict[str, str], known: dict[str, WorkloadProfile], quota: NamespaceQuota | None = None
) -> Admitted | Denied:
    pod = a_pod(labels={f"{T}enabled": "true"}, annotations=annotations, namespace=NS)
    return admit(pod, AdmissionContext(TfConfig(), NS, quota=quota, profiles=known))


def admitted(annotations: dict[str, str], known: dict[str, WorkloadProfile]) -> dict[str, str]:
    verdict = decide(annotations, known)
    assert isinstance(verdict, Admitted), verdict
    pod = a_pod(labels={f"{T}enabled": "true"}, annotations=annotations, namespace=NS)
    result: dict[str, str] = apply(pod, verdict.patch)["metadata"]["annotations"]
    return result


def test_a_pod_naming_only_the_profile_gets_its_resources_qos_isolation_and_gpu_count() -> None:
    verdict = decide(opted_in(workload_profile="small"), profiles())
    assert isinstance(verdict, Admitted), verdict
    assert verdict.request is not None
    assert (verdict.request.tflops_request_milli, verdict.request.tflops_limit_milli) == (20_000, 40_000)
    assert (verdict.request.vram_request_bytes, verdict.request.vram_limit_bytes) == (8 * 2**30, 16 * 2**30)
    assert (verdict.request.qos, verdict.request.isolation, verdict.request.gpu_count) == ("low", "hard", 2)
    annotations = admitted(opted_in(workload_profile="small"), profiles())
    assert annotations[f"{T}tflops-request"] == "20"
    assert annotations[f"{T}vram-limit"] == "16Gi"
    assert annotations[f"{T}gpu-count"] == "2"
    assert annotations[f"{T}workload-profile"] == "small"


def test_the_pod_own_annotations_win_key_by_key() -> None:
    own = opted_in(workload_profile="small", tflops_request="30", qos="high", gpu_count="1")
    verdict = decide(own, profiles())
    assert isinstance(verdict, Admitted), verdict
    assert verdict.request is not None
    assert (verdict.request.tflops_request_milli, verdict.request.tflops_limit_milli) == (30_000, 40_000)
    assert (verdict.request.qos, verdict.request.gpu_count, verdict.request.isolation) == ("high", 1, "hard")


def test_a_pod_naming_compute_in_percent_takes_none_of_the_profile_tflops() -> None:
    verdict = decide(opted_in(workload_profile="small", compute_percent_request="50"), profiles())
    assert isinstance(verdict, Admitted), verdict
    assert verdict.request is not None
    assert verdict.request.compute_percent_request == 50
    assert verdict.request.tflops_request_milli == 0
    assert verdict.request.vram_request_bytes == 8 * 2**30


def test_a_profile_in_percent_fills_compute_percent_and_gpu_indices_count() -> None:
    spec = {"resources": {"requests": {"tflops": "0", "compute": "25", "vram": "4Gi"},
                          "limits": {"tflops": "0", "compute": "50", "vram": "4Gi"}},
            "gpuIndices": [0, 1, 2]}  # fmt: skip
    verdict = decide(opted_in(workload_profile="p"), profiles(spec, "p"))
    assert isinstance(verdict, Admitted), verdict
    assert verdict.request is not None
    assert (verdict.request.compute_percent_request, verdict.request.gpu_count) == (25, 3)
    own_count = decide(opted_in(workload_profile="p", gpu_count="1"), profiles(spec, "p"))
    assert isinstance(own_count, Admitted)
    assert own_count.request is not None
    assert own_count.request.gpu_count == 1  # the pod's gpu-count: the profile's indices do not apply


def test_an_unknown_profile_is_denied_naming_the_annotation_and_the_namespace() -> None:
    verdict = decide(opted_in(workload_profile="large"), profiles())
    assert isinstance(verdict, Denied)
    assert verdict.code == 400
    assert verdict.message == (
        f"annotation {T}workload-profile: no WorkloadProfile 'large' in namespace 'team-a' (there: small); "
        "create it in that namespace or name one of those"
    )
    elsewhere = {profile_key("team-b", "large"): parse_profile("team-b", "large", SPEC)}
    assert isinstance(decide(opted_in(workload_profile="large"), elsewhere), Denied)


def test_an_invalid_profile_keeps_its_last_good_version_or_denies_with_its_problem() -> None:
    bad = {
        **SPEC,
        "resources": {"requests": {"tflops": "lots", "vram": "8Gi"}, "limits": SPEC["resources"]["limits"]},
    }
    objects = {profile_key(NS, "small"): (NS, "small", bad)}
    kept, problems = profiles_in_force(objects, profiles())
    assert kept == profiles()
    assert "spec.resources.requests.tflops" in problems[profile_key(NS, "small")]
    fresh, _ = profiles_in_force(objects, {})
    verdict = decide(opted_in(workload_profile="small"), fresh)
    assert isinstance(verdict, Denied)
    assert verdict.message.startswith(
        f"annotation {T}workload-profile: WorkloadProfile team-a/small is invalid: "
    )
    assert "spec.resources.requests.tflops: 'lots'" in verdict.message


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"qos": "gold"}, "spec.qos"),
        ({"isolation": "full"}, "spec.isolation"),
        ({"gpuCount": 200}, "spec.gpuCount"),
        ({"gpuIndices": [0, 0]}, "spec.gpuIndices"),
        ({"resources": {"requests": {"tflops": "1", "vram": "1Gi", "compute": "12.5"}}}, "requests.compute"),
    ],
)
def test_a_bad_profile_field_is_named(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        parse_profile(NS, "p", spec)


def test_tensorfusion_sample_profile_fills_nothing_and_the_quota_defaults_still_apply() -> None:
    sample = yaml.safe_load(SAMPLE.read_text())
    meta = sample["metadata"]
    parsed = parse_profile(meta["namespace"], meta["name"], sample["spec"])
    assert parsed.annotations == {}  # isLocalGPU is the pod's or the pool's, as in TensorFusion
    quota = NamespaceQuota(NS, default_request_tflops_milli=5_000, default_request_vram_bytes=2**30)
    known = profiles({"qos": "critical"}, "q")
    verdict = decide(opted_in(workload_profile="q", isolation="soft"), known, quota)
    assert isinstance(verdict, Admitted), verdict
    assert verdict.request is not None
    assert (verdict.request.qos, verdict.request.tflops_request_milli) == ("critical", 5_000)


def test_a_pod_without_the_annotation_is_decided_as_before() -> None:
    plain = opted_in(tflops_request="10", vram_request="1Gi")
    assert decide(plain, profiles()) == decide(plain, {})


def test_the_verdict_cache_follows_a_changed_profile() -> None:
    cache = VerdictCache(8)
    config = TfConfig()
    pod = a_pod(labels={f"{T}enabled": "true"}, annotations=opted_in(workload_profile="small"), namespace=NS)
    first = cache.decide(pod, AdmissionContext(config, NS, profiles=profiles()))
    assert cache.decide(pod, AdmissionContext(config, NS, profiles=profiles())) is first
    assert isinstance(first, Admitted)
    assert first.request is not None
    edited = profiles({**SPEC, "qos": "critical"})
    second = cache.decide(pod, AdmissionContext(config, NS, profiles=edited))
    assert isinstance(second, Admitted)
    assert second.request is not None
    assert (first.request.qos, second.request.qos) == ("low", "critical")
