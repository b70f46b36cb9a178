"""`enabled-replicas` across pod deletion, on the real API server of `tfctl up --kubernetes`.

A Deployment of three replicas asking for `nvidia.com/gpu: 1`, handed over with `isolation: shared` and
`tensor-fusion.ai/enabled-replicas: "1"`, has one pod taken over. `kubectl delete pod` on that pod makes
the ReplicaSet create a replacement at once, before the scheduler has seen the old pod gone; the
replacement must be taken over, so the workload keeps exactly one worker, never two at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kube_stack_up import KubeStack, create_namespace, eventually, running_kube_stack

pytestmark = pytest.mark.e2e

NAMESPACE = "takeover"
WORKER = "worker"
COMPONENT = "tensor-fusion.ai/component"
NATIVE_GPU = "nvidia.com/gpu"
DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "llm", "namespace": NAMESPACE},
    "spec": {
        "replicas": 3,
        "selector": {"matchLabels": {"app": "llm"}},
        "template": {
            "metadata": {
                "labels": {"app": "llm", "tensor-fusion.ai/enabled": "true"},
                "annotations": {
                    "tensor-fusion.ai/isolation": "shared",
                    "tensor-fusion.ai/enabled-replicas": "1",
                },
            },
            "spec": {
                "containers": [{"name": "app", "image": "vllm", "resources": {"limits": {NATIVE_GPU: 1}}}]
            },
        },
    },
}


@pytest.fixture(scope="module")
def stack() -> Iterator[KubeStack]:
    with running_kube_stack(("--fake-gpus", "H100:4", "--fake-gpus", "H100:4")) as running:
        create_namespace(running, NAMESPACE)
        yield running


def live_pods(stack: KubeStack) -> list[dict[str, Any]]:
    """The workload's pods that are not terminating (what its ReplicaSet counts)."""
    pods: list[dict[str, Any]] = stack.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", "app=llm")["items"]
    return [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]


def workers(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [pod for pod in pods if pod["metadata"].get("labels", {}).get(COMPONENT) == WORKER]


def settled(stack: KubeStack) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The one worker, bound with its `gpu-ids`, once all three pods are Running; None before."""
    pods = live_pods(stack)
    if len(pods) != 3 or any(pod["status"].get("phase") != "Running" for pod in pods):
        return None
    taken_over = workers(pods)
    assert len(taken_over) <= 1, [pod["metadata"]["name"] for pod in taken_over]
    if not taken_over or "tensor-fusion.ai/gpu-ids" not in taken_over[0]["metadata"]["annotations"]:
        return None
    return taken_over[0], pods


def assert_never_two_workers(stack: KubeStack, for_s: float) -> None:
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        names = [pod["metadata"]["name"] for pod in workers(live_pods(stack))]
        assert len(names) <= 1, f"two pods taken over under enabled-replicas 1: {names}"
        time.sleep(0.5)


def test_a_deleted_taken_over_pod_is_replaced_by_a_taken_over_pod(stack: KubeStack) -> None:
    stack.apply(DEPLOYMENT)
    first, pods = eventually(
        "three Running pods, one of them taken over", lambda: settled(stack), within_s=90
    )
    assert first["spec"]["schedulerName"] == "tensor-fusion-scheduler"
    assert NATIVE_GPU not in first["spec"]["containers"][0]["resources"].get("limits", {})
    for pod in pods:
        if pod is not first:
            assert pod["spec"]["containers"][0]["resources"]["limits"] == {NATIVE_GPU: "1"}

    for round_ in range(2):
        deleted = first["metadata"]["name"]
        stack.kubectl("delete", "pod", deleted, "-n", NAMESPACE)

        replacement, pods = eventually(
            f"a taken-over replacement for {deleted} (round {round_ + 1})",
            lambda: settled(stack),
            within_s=60,
        )
        assert replacement["metadata"]["name"] != deleted
        assert deleted not in {pod["metadata"]["name"] for pod in pods}
        assert replacement["spec"]["schedulerName"] == "tensor-fusion-scheduler"
        assert_never_two_workers(stack, for_s=3)
        first = replacement


def test_deleting_a_pod_left_on_the_device_plugin_takes_none_over(stack: KubeStack) -> None:
    stack.apply(DEPLOYMENT)
    worker, pods = eventually("the workload settled", lambda: settled(stack), within_s=60)
    [native, *_] = [pod for pod in pods if pod is not worker]
    stack.kubectl("delete", "pod", native["metadata"]["name"], "-n", NAMESPACE)

    after, pods = eventually("a replacement for the native pod", lambda: settled(stack), within_s=60)

    assert after["metadata"]["name"] == worker["metadata"]["name"]
    assert len(workers(pods)) == 1
    assert_never_two_workers(stack, for_s=3)
