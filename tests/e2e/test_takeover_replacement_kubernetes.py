"""`enabled-replicas` across pod deletion and eviction, on the real API server of `tfctl up --kubernetes`.

A Deployment of three replicas asking for `nvidia.com/gpu: 1`, handed over with `isolation: shared` and
`tensor-fusion.ai/enabled-replicas: "1"`, has one pod taken over. `kubectl delete pod` on that pod makes
the ReplicaSet create a replacement at once, before the scheduler has seen the old pod gone; the
replacement must be taken over, so the workload keeps exactly one worker, never two at once. The
same holds when `kubectl drain` evicts it through the Eviction API; a pod left on the device plugin
being replaced takes nothing over. Each test has a Deployment of its own, removed afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kube_stack_up import KubeStack, create_namespace, eventually, kubectl, running_kube_stack

pytestmark = pytest.mark.e2e

NAMESPACE = "takeover"
WORKER = "worker"
COMPONENT = "tensor-fusion.ai/component"
NATIVE_GPU = "nvidia.com/gpu"
TF_SCHEDULER = "tensor-fusion-scheduler"


def deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name, "tensor-fusion.ai/enabled": "true"},
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


def workers(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [pod for pod in pods if pod["metadata"].get("labels", {}).get(COMPONENT) == WORKER]


@dataclass
class Workload:
    """One Deployment of three under `enabled-replicas: "1"` on the stack."""

    stack: KubeStack
    name: str

    def live_pods(self) -> list[dict[str, Any]]:
        """Its pods that are not terminating (what its ReplicaSet counts)."""
        pods: list[dict[str, Any]] = self.stack.kubectl_json(
            "get", "pods", "-n", NAMESPACE, "-l", f"app={self.name}"
        )["items"]
        return [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]

    def settled(self) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The one worker, bound with its `gpu-ids`, once all three pods are Running; None before."""
        pods = self.live_pods()
        if len(pods) != 3 or any(pod["status"].get("phase") != "Running" for pod in pods):
            return None
        taken_over = workers(pods)
        assert len(taken_over) <= 1, [pod["metadata"]["name"] for pod in taken_over]
        if not taken_over or "tensor-fusion.ai/gpu-ids" not in taken_over[0]["metadata"]["annotations"]:
            return None
        return taken_over[0], pods

    def wait_settled(self, what: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return eventually(f"{self.name}: {what}", self.settled, within_s=90)

    def assert_never_two_workers(self, for_s: float = 3.0) -> None:
        deadline = time.monotonic() + for_s
        while time.monotonic() < deadline:
            names = [pod["metadata"]["name"] for pod in workers(self.live_pods())]
            assert len(names) <= 1, f"two pods taken over under enabled-replicas 1: {names}"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def stack() -> Iterator[KubeStack]:
    with running_kube_stack(("--fake-gpus", "H100:4", "--fake-gpus", "H100:4")) as running:
        create_namespace(running, NAMESPACE)
        yield running


@pytest.fixture
def workload(stack: KubeStack, request: pytest.FixtureRequest) -> Iterator[Workload]:
    name = f"llm-{request.node.name.split('_')[1]}"
    stack.apply(deployment(name))
    try:
        yield Workload(stack, name)
    finally:
        stack.kubectl("delete", "deployment", name, "-n", NAMESPACE, "--wait=true")


def test_a_deleted_taken_over_pod_is_replaced_by_a_taken_over_pod(workload: Workload) -> None:
    first, pods = workload.wait_settled("three Running pods, one of them taken over")
    assert first["spec"]["schedulerName"] == TF_SCHEDULER
    assert NATIVE_GPU not in first["spec"]["containers"][0]["resources"].get("limits", {})
    for pod in pods:
        if pod is not first:
            assert pod["spec"]["containers"][0]["resources"]["limits"] == {NATIVE_GPU: "1"}

    for round_ in (1, 2):
        deleted = first["metadata"]["name"]
        workload.stack.kubectl("delete", "pod", deleted, "-n", NAMESPACE)

        replacement, pods = workload.wait_settled(f"a taken-over replacement for {deleted} (round {round_})")

        assert replacement["metadata"]["name"] != deleted
        assert deleted not in {pod["metadata"]["name"] for pod in pods}
        assert replacement["spec"]["schedulerName"] == TF_SCHEDULER
        workload.assert_never_two_workers()
        first = replacement


def test_deleting_a_pod_left_on_the_device_plugin_takes_none_over(workload: Workload) -> None:
    worker, pods = workload.wait_settled("three Running pods, one of them taken over")
    [native, *_] = [pod for pod in pods if pod is not worker]
    workload.stack.kubectl("delete", "pod", native["metadata"]["name"], "-n", NAMESPACE)

    after, pods = workload.wait_settled("a replacement for the native pod")

    assert native["metadata"]["name"] not in {pod["metadata"]["name"] for pod in pods}
    assert after["metadata"]["name"] == worker["metadata"]["name"]
    workload.assert_never_two_workers()


def test_draining_the_worker_s_node_takes_its_replacement_over_on_the_other_node(workload: Workload) -> None:
    worker, _ = workload.wait_settled("three Running pods, one of them taken over")
    node = worker["spec"]["nodeName"]

    kubectl(workload.stack.kubeconfig, "drain", node, "--ignore-daemonsets", "--timeout=60s", timeout_s=90)
    try:
        replacement, pods = workload.wait_settled(f"a taken-over replacement off the drained {node}")
        assert replacement["metadata"]["name"] != worker["metadata"]["name"]
        assert all(pod["spec"]["nodeName"] != node for pod in pods)
        workload.assert_never_two_workers()
    finally:
        workload.stack.kubectl("uncordon", node)
