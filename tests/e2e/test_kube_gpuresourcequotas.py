"""TensorFusion's sample GPUResourceQuota on `tfctl up --kubernetes`, with kubectl as a user types it.

The running webhook denies a pod over the sample's `single.maxRequests` naming the limit, fills the
defaults into a pod that names no requests, and follows an edit of the maximum. The sample (as it is)
bounds `development-namespace`; an edit to `maxWorkers: 1` is followed by the
running scheduler: the first pod is bound, the second stays Pending with a `FailedScheduling` Event naming
the quota and the numbers, the quota's `status.used` counts the bound pod, `AlertThresholdReached` turns
True with its Warning Event, and deleting the first pod lets the second in. No service account is refused
a request on the way (the scheduler's new `watch` on gpuresourcequotas)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_stack_up import KubeStack, audited_requests, create_namespace, eventually, running_kube_stack

pytestmark = pytest.mark.e2e

NAMESPACE = "development-namespace"
SAMPLES = (
    Path(__file__).resolve().parents[1]
    / "integration"
    / "deploy"
    / "tensorfusion_samples"
    / "v1_gpuresourcequota.yaml"
)


@pytest.fixture
def kube_stack() -> Iterator[KubeStack]:
    with running_kube_stack() as stack:
        yield stack


ASKED = {
    "tensor-fusion.ai/tflops-request": "10",
    "tensor-fusion.ai/tflops-limit": "20",
    "tensor-fusion.ai/vram-request": "4Gi",
    "tensor-fusion.ai/vram-limit": "8Gi",
}


def pod(name: str, annotations: dict[str, str] = ASKED) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"tensor-fusion.ai/enabled": "true"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "app", "image": "vllm"}]},
    }


def apply_samples(stack: KubeStack) -> None:
    """TensorFusion's sample quotas, as they are, into the namespaces they name."""
    for namespace in ("production-namespace", NAMESPACE, "research-namespace"):
        create_namespace(stack, namespace)
    stack.kubectl("apply", "--validate=strict", "-f", str(SAMPLES))


def dry_run(stack: KubeStack, manifest: dict[str, Any]) -> str:
    """A server-side dry run of creating the pod: its JSON when admitted, kubectl's error when denied."""
    return stack.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(manifest), check=False
    )


def test_the_running_webhook_applies_the_sample_quota_single_limits_and_defaults(
    kube_stack: KubeStack,
) -> None:
    stack = kube_stack
    apply_samples(stack)
    over = pod(
        "over", {**ASKED, "tensor-fusion.ai/tflops-request": "60", "tensor-fusion.ai/tflops-limit": "60"}
    )
    denied = eventually(
        "the webhook's denial", lambda: "maxRequests" in (out := dry_run(stack, over)) and out
    )
    assert (
        f"GPUResourceQuota {NAMESPACE}/{NAMESPACE}: single.maxRequests.tflops is 50 per workload, asked 60; "
        "ask for at most that, or raise the quota"
    ) in denied
    defaulted = json.loads(dry_run(stack, pod("defaulted", {"tensor-fusion.ai/isolation": "soft"})))
    annotations = defaulted["metadata"]["annotations"]
    assert annotations["tensor-fusion.ai/tflops-request"] == "250m"
    assert annotations["tensor-fusion.ai/vram-limit"] == "1Gi"
    edited = time.monotonic()
    stack.kubectl(
        "patch", "gpuresourcequota", NAMESPACE, "-n", NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"single": {"maxRequests": {"tflops": "80"}}}}),
    )  # fmt: skip
    eventually("the edited maximum", lambda: "maxRequests" not in dry_run(stack, over), within_s=5)
    print(f"GPUResourceQuota edit -> webhook admission: {(time.monotonic() - edited) * 1000:.0f} ms")
    users, denied_requests = audited_requests(stack.audit_log)
    assert "tfpool-webhook" in users
    assert denied_requests == [], "a ClusterRole lacks a verb a service uses"


def quota_status(stack: KubeStack) -> dict[str, Any]:
    status: dict[str, Any] = stack.kubectl_json("get", "gpuresourcequota", NAMESPACE, "-n", NAMESPACE).get(
        "status", {}
    )
    return status


def events(stack: KubeStack, reason: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = stack.kubectl_json(
        "get", "events", "-n", NAMESPACE, "--field-selector", f"reason={reason}"
    )["items"]
    return found


def test_the_running_scheduler_enforces_the_sample_quota(kube_stack: KubeStack) -> None:
    stack = kube_stack
    apply_samples(stack)
    eventually("the quota's status", lambda: quota_status(stack).get("used"))
    edited = time.monotonic()
    stack.kubectl(
        "patch", "gpuresourcequota", NAMESPACE, "-n", NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"total": {"maxWorkers": 1}}}),
    )  # fmt: skip
    eventually(
        "availablePercent.workers from the edited bound",
        lambda: quota_status(stack).get("availablePercent", {}).get("workers") == "100" or None,
    )
    print(
        f"GPUResourceQuota edit -> status on the running stack: {(time.monotonic() - edited) * 1000:.0f} ms"
    )

    stack.apply(pod("first"))
    eventually(
        "the first pod bound",
        lambda: stack.kubectl_json("get", "pod", "first", "-n", NAMESPACE)["spec"].get("nodeName"),
    )
    stack.apply(pod("second"))
    held = eventually("the FailedScheduling Event", lambda: events(stack, "FailedScheduling"))
    message = held[0]["message"]
    assert f"GPUResourceQuota {NAMESPACE}/{NAMESPACE}: total.maxWorkers would be 2 of 1 (in use 1)" in message
    second = stack.kubectl_json("get", "pod", "second", "-n", NAMESPACE)
    assert second["status"]["phase"] == "Pending"
    assert not second["spec"].get("nodeName")
    assert quota_status(stack)["used"]["workers"] == 1
    assert quota_status(stack)["used"]["requests"]["tflops"] == "10"
    eventually(
        "AlertThresholdReached",
        lambda: (
            any(
                c["type"] == "AlertThresholdReached" and c["status"] == "True"
                for c in quota_status(stack).get("conditions", [])
            )
            or None
        ),
    )
    alerts = eventually("the alert Event", lambda: events(stack, "QuotaAlertThresholdReached"))
    assert alerts[0]["type"] == "Warning"

    stack.kubectl("delete", "pod", "first", "-n", NAMESPACE, "--grace-period=0", "--force")
    eventually(
        "the second pod bound once the first is gone",
        lambda: stack.kubectl_json("get", "pod", "second", "-n", NAMESPACE)["spec"].get("nodeName"),
        within_s=60,
    )
    users, denied = audited_requests(stack.audit_log)
    assert "tfpool-scheduler" in users
    assert denied == [], "a ClusterRole lacks a verb a service uses"
