"""GPUPool objects as the pools of `tfctl up --kubernetes`, with kubectl as a user types it.

The running webhook admits pods into the pool a GPUPool object marks default and with its default QoS;
an edit to the object changes the next pod's QoS without a restart, measured from `kubectl patch`
returning to a server-side dry run of a pod carrying the new QoS. The scheduler writes the pool's
`SchedulerSpecValid` and `UnsupportedFields` conditions, refuses an unknown placement mode with an Event
and keeps the last good one; GPUNodes read with TensorFusion's custom columns
(`.status.hypervisorStatus.hypervisorState`, `...hypervisorVersion`); no service account is refused a
request on the way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kube_stack_up import KubeStack, audited_requests, create_namespace, eventually, running_kube_stack

pytestmark = pytest.mark.e2e

NAMESPACE = "team"
POOL = "pooled"


@pytest.fixture
def kube_stack() -> Iterator[KubeStack]:
    with running_kube_stack() as stack:
        yield stack


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"tensor-fusion.ai/enabled": "true"},
            "annotations": {
                "tensor-fusion.ai/tflops-request": "10",
                "tensor-fusion.ai/tflops-limit": "20",
                "tensor-fusion.ai/vram-request": "4Gi",
                "tensor-fusion.ai/vram-limit": "8Gi",
            },
        },
        "spec": {"containers": [{"name": "app", "image": "vllm"}]},
    }


def admitted(stack: KubeStack, name: str) -> dict[str, str]:
    """The annotations of `name` as the webhook would admit it now (server-side dry run)."""
    out = stack.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(pod(name)))
    annotations: dict[str, str] = json.loads(out)["metadata"].get("annotations", {})
    return annotations


def condition(stack: KubeStack, kind: str) -> dict[str, Any] | None:
    status = stack.kubectl_json("get", "gpupool", POOL).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == kind), None)


def test_the_running_services_follow_gpupool_edits(kube_stack: KubeStack) -> None:
    stack = kube_stack
    create_namespace(stack, NAMESPACE)
    stack.apply(
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUPool",
            "metadata": {"name": POOL, "annotations": {"tensor-fusion.ai/is-default-pool": "true"}},
            "spec": {
                "qosConfig": {"defaultQoS": "low"},
                "placement": {"mode": "CompactFirst"},
                "componentConfig": {"hypervisor": {"image": "tensorfusion/tensor-fusion-hypervisor:latest"}},
            },
        }
    )
    first = eventually(
        "a pod admitted into the GPUPool object's pool",
        lambda: (a := admitted(stack, "first")).get("tensor-fusion.ai/gpupool") == POOL and a,
    )
    assert first["tensor-fusion.ai/qos"] == "low"

    stack.kubectl(
        "patch", "gpupool", POOL, "--type=merge", "-p", '{"spec":{"qosConfig":{"defaultQoS":"high"}}}'
    )
    edited = time.monotonic()
    eventually(
        "the new default QoS", lambda: admitted(stack, "second")["tensor-fusion.ai/qos"] == "high", within_s=2
    )
    print(f"GPUPool edit -> webhook admits with the new QoS: {(time.monotonic() - edited) * 1000:.0f} ms")

    valid = eventually("SchedulerSpecValid", lambda: condition(stack, "SchedulerSpecValid"))
    assert valid["status"] == "True"
    unsupported = eventually("UnsupportedFields", lambda: condition(stack, "UnsupportedFields"))
    assert unsupported["status"] == "True"
    assert "spec.componentConfig" in unsupported["message"]

    stack.kubectl("patch", "gpupool", POOL, "--type=merge", "-p", '{"spec":{"placement":{"mode":"Nowhere"}}}')
    refused = eventually(
        "SchedulerSpecValid False",
        lambda: (c := condition(stack, "SchedulerSpecValid")) is not None and c["status"] == "False" and c,
    )
    assert "spec.placement.mode: unknown policy 'Nowhere'" in refused["message"]
    events = eventually(
        "the InvalidPoolSpec Event",
        lambda: stack.kubectl_json(
            "get",
            "events",
            "-n",
            "default",
            f"--field-selector=involvedObject.name={POOL},reason=InvalidPoolSpec",
        )["items"],
    )
    assert events[0]["source"]["component"] == "scheduler"

    state = ".status.hypervisorStatus.hypervisorState"
    version = ".status.hypervisorStatus.hypervisorVersion"

    def agents_reported() -> list[list[str]]:
        out = stack.kubectl("get", "gpunodes", "-o", f"custom-columns=STATE:{state},VERSION:{version}")
        rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
        return rows if len(rows) == 2 and all(row == ["Running", "0.1.0"] for row in rows) else []

    eventually("both GPUNodes with TensorFusion's hypervisorStatus", agents_reported)

    users, denied = audited_requests(stack.audit_log)
    assert {"tfpool-webhook", "tfpool-scheduler", "tfpool-defrag-planner", "tfpool-metrics"} <= users, users
    assert denied == [], "a ClusterRole lacks a verb a service uses"
