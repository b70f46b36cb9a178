"""WorkloadProfile objects on `tfctl up --kubernetes`, with kubectl as a user types it.

The running webhook fills a pod naming a profile (annotation `tensor-fusion.ai/workload-profile`) with
the profile's resources, QoS, isolation and GPU count wherever the pod's own annotations are unset (the
pod's own win), denies a pod naming a profile its namespace does not have (the message names the
annotation and the namespace), follows an edit of the profile on the next admission (the time is
printed), and admits a pod naming TensorFusion's sample profile as it is. No service account is refused
a request on the way (the webhook's new `list`/`watch` on workloadprofiles)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_stack_up import (
    KubeStack,
    audited_requests,
    create_namespace,
    dry_run,
    eventually,
    running_kube_stack,
)

pytestmark = pytest.mark.e2e

NAMESPACE = "team-a"
T = "tensor-fusion.ai/"
SAMPLE = (
    Path(__file__).resolve().parents[1]
    / "integration"
    / "deploy"
    / "tensorfusion_samples"
    / "v1_workloadprofile.yaml"
)
PROFILE = {
    "apiVersion": "tensor-fusion.ai/v1",
    "kind": "WorkloadProfile",
    "metadata": {"name": "inference-small", "namespace": NAMESPACE},
    "spec": {
        "resources": {"requests": {"tflops": "20", "vram": "8Gi"}, "limits": {"tflops": "40", "vram": "8Gi"}},
        "qos": "low",
        "isolation": "soft",
        "gpuCount": 1,
    },
}


@pytest.fixture
def kube_stack() -> Iterator[KubeStack]:
    with running_kube_stack() as stack:
        yield stack


def pod(name: str, annotations: dict[str, str], namespace: str = NAMESPACE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {f"{T}enabled": "true"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "app", "image": "vllm"}]},
    }


def admitted_annotations(stack: KubeStack, manifest: dict[str, Any]) -> dict[str, str] | None:
    out = dry_run(stack, manifest)
    if not out.lstrip().startswith("{"):
        return None
    annotations: dict[str, str] = json.loads(out)["metadata"]["annotations"]
    return annotations


def test_the_running_webhook_fills_pods_from_their_workload_profile(kube_stack: KubeStack) -> None:
    stack = kube_stack
    create_namespace(stack, NAMESPACE)
    stack.kubectl("apply", "--validate=strict", "-f", "-", stdin=json.dumps(PROFILE))
    named = pod("small", {f"{T}workload-profile": "inference-small"})
    filled = eventually(
        "the profile in the webhook",
        lambda: (found := admitted_annotations(stack, named)) and found.get(f"{T}qos") == "low" and found,
    )
    assert filled[f"{T}tflops-request"] == "20"
    assert filled[f"{T}tflops-limit"] == "40"
    assert filled[f"{T}vram-request"] == "8Gi"
    assert filled[f"{T}isolation"] == "soft"
    assert filled[f"{T}gpu-count"] == "1"

    own = pod(
        "own", {f"{T}workload-profile": "inference-small", f"{T}qos": "high", f"{T}tflops-request": "30"}
    )
    mixed = admitted_annotations(stack, own)
    assert mixed is not None
    assert (mixed[f"{T}qos"], mixed[f"{T}tflops-request"], mixed[f"{T}tflops-limit"]) == ("high", "30", "40")

    denied = dry_run(stack, pod("missing", {f"{T}workload-profile": "inference-large"}))
    assert (
        f"annotation {T}workload-profile: no WorkloadProfile 'inference-large' in namespace '{NAMESPACE}' "
        "(there: inference-small); create it in that namespace or name one of those"
    ) in denied

    edited = time.monotonic()
    stack.kubectl(
        "patch", "workloadprofile", "inference-small", "-n", NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"resources": {"requests": {"tflops": "25"}}}}),
    )  # fmt: skip
    attempts = 0
    while (admitted_annotations(stack, named) or {}).get(f"{T}tflops-request") != "25":
        attempts += 1  # no pause: each dry run is one admission, so the figure is as fine as one
        assert time.monotonic() - edited < 5, "the edited profile not in force within 5 s"
    print(
        f"WorkloadProfile edit -> webhook admission: {(time.monotonic() - edited) * 1000:.0f} ms "
        f"({attempts} admissions still saw the old profile)"
    )

    create_namespace(stack, "tensor-fusion")
    stack.kubectl("apply", "--validate=strict", "-f", str(SAMPLE))
    sample_pod = pod(
        "sampled",
        {
            f"{T}workload-profile": "defalut-workloadprofile",
            f"{T}tflops-request": "10",
            f"{T}vram-request": "1Gi",
        },
        namespace="tensor-fusion",
    )
    sampled = eventually(
        "TensorFusion's sample profile in the webhook", lambda: admitted_annotations(stack, sample_pod)
    )
    assert sampled[f"{T}tflops-request"] == "10"

    users, denied_requests = audited_requests(stack.audit_log)
    assert "tfpool-webhook" in users
    assert denied_requests == [], "a ClusterRole lacks a verb a service uses"
