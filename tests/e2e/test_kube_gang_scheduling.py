"""Gang scheduling with TensorFusion's annotations on `tfctl up --kubernetes`, with kubectl as a user
types it (issue 16, item 5).

Two simulated nodes hold three H100s. A Deployment of 4 whose pods each take a whole card, with
`gang-enabled`, `gang-min-members: 4` and `gang-timeout: 3s`: no pod is bound (three would fit, the gang
needs four), and after the timeout each gets a `FailedScheduling` Event naming its gang and the numbers.
A second Deployment of 4 with `gang-min-members: 3` then gets three pods bound together and the fourth
told that its gang is placed without it. In a namespace whose GPUResourceQuota allows 2 workers, a gang
of 3 binds none, each pod's `FailedScheduling` Event naming the quota and the numbers; with the quota
raised to 3 all three are bound."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kube_stack_up import KubeStack, create_namespace, eventually, running_kube_stack

pytestmark = pytest.mark.e2e

NAMESPACE = "gang"
T = "tensor-fusion.ai/"
WHOLE_CARD = {
    f"{T}tflops-request": "100",
    f"{T}tflops-limit": "100",
    f"{T}vram-request": "80Gi",
    f"{T}vram-limit": "80Gi",
}


@pytest.fixture
def kube_stack() -> Iterator[KubeStack]:
    with running_kube_stack(
        ("--fake-gpus", "H100:2", "--fake-gpus", "H100:1"), TF_SCHEDULER_PENDING_RETRY_INTERVAL_S="1"
    ) as stack:
        yield stack


def gang_deployment(name: str, min_members: int, replicas: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name, f"{T}enabled": "true"},
                    "annotations": {
                        **WHOLE_CARD,
                        f"{T}gang-enabled": "true",
                        f"{T}gang-min-members": str(min_members),
                        f"{T}gang-timeout": "3s",
                    },
                },
                "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]},
            },
        },
    }


def pods_of(stack: KubeStack, app: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = stack.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"app={app}")[
        "items"
    ]
    return found


def failed_scheduling(stack: KubeStack, pod: str) -> list[str]:
    events = stack.kubectl_json(
        "get",
        "events",
        "-n",
        NAMESPACE,
        "--field-selector",
        f"reason=FailedScheduling,involvedObject.name={pod}",
    )["items"]
    return [event["message"] for event in events]


def all_pods(stack: KubeStack, app: str, count: int = 4) -> list[dict[str, Any]] | None:
    found = pods_of(stack, app)
    return found if len(found) == count else None


def told_each(stack: KubeStack, pods: list[dict[str, Any]], wanted: str) -> bool:
    """Whether every pod in `pods` has a FailedScheduling Event containing `wanted`."""
    return all(
        any(wanted in message for message in failed_scheduling(stack, pod["metadata"]["name"]))
        for pod in pods
    )


def three_cards(stack: KubeStack) -> KubeStack:
    """`stack` with the test namespace made and the agents' 3 GPUs registered."""
    create_namespace(stack, NAMESPACE)
    eventually("the agents' 3 GPUs", lambda: len(stack.kubectl_json("get", "gpu")["items"]) == 3, within_s=60)
    return stack


def replica_set_of(pod: dict[str, Any]) -> str:
    return next(owner["name"] for owner in pod["metadata"]["ownerReferences"] if owner.get("controller"))


def test_a_gang_of_four_on_three_cards_binds_none_then_a_gang_of_min_three_binds_three(
    kube_stack: KubeStack,
) -> None:
    stack = three_cards(kube_stack)

    stack.apply(gang_deployment("train", min_members=4))
    pods = eventually("the 4 pods of train", lambda: all_pods(stack, "train"))
    gang = f"{NAMESPACE}/{replica_set_of(pods[0])}"
    wanted = f"gang {gang} timed out after 3s: 3 of min 4 members fit"
    eventually(
        "a timed-out FailedScheduling Event on each member",
        lambda: told_each(stack, pods, wanted),
        within_s=60,
    )
    assert [pod["spec"].get("nodeName") for pod in pods_of(stack, "train")] == [None] * 4

    stack.apply(gang_deployment("serve", min_members=3))

    def three_bound() -> list[dict[str, Any]] | None:
        current = pods_of(stack, "serve")
        return current if len([p for p in current if p["spec"].get("nodeName")]) == 3 else None

    serve = eventually("three serve pods bound together", three_bound, within_s=60)
    bound = [pod for pod in serve if pod["spec"].get("nodeName")]
    gpu_ids = [pod["metadata"]["annotations"][f"{T}gpu-ids"] for pod in bound]
    assert len(set(gpu_ids)) == 3, "each member has a card of its own"
    left = next(pod for pod in serve if not pod["spec"].get("nodeName"))
    serve_gang = f"{NAMESPACE}/{replica_set_of(left)}"
    eventually(
        "the fourth member told its gang is placed without it",
        lambda: any(
            f"gang {serve_gang}: 3 members are placed (min 3)" in m
            for m in failed_scheduling(stack, left["metadata"]["name"])
        ),
        within_s=30,
    )
    assert [pod["spec"].get("nodeName") for pod in pods_of(stack, "train")] == [None] * 4


def test_a_gang_over_its_namespace_quota_binds_none_then_all_once_the_quota_is_raised(
    kube_stack: KubeStack,
) -> None:
    stack = three_cards(kube_stack)
    stack.apply(
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUResourceQuota",
            "metadata": {"name": "two-workers", "namespace": NAMESPACE},
            "spec": {"total": {"maxWorkers": 2}},
        }
    )
    # The scheduler writes a quota's status once it holds it: only then is the quota in force (a gang
    # created before that is placed, as with any quota the scheduler has not seen yet).
    eventually(
        "the scheduler holding the quota (its status written)",
        lambda: (
            stack.kubectl_json("get", "gpuresourcequota", "two-workers", "-n", NAMESPACE)
            .get("status", {})
            .get("used")
        ),
        within_s=60,
    )

    stack.apply(gang_deployment("train", min_members=3, replicas=3))

    pods = eventually("the 3 pods of train", lambda: all_pods(stack, "train", 3))
    gang = f"{NAMESPACE}/{replica_set_of(pods[0])}"
    wanted = (
        f"gang {gang}: GPUResourceQuota {NAMESPACE}/two-workers: total.maxWorkers would be 3 of 2 (in use 0)"
    )
    eventually(
        "a FailedScheduling Event naming the quota on each member",
        lambda: told_each(stack, pods, wanted),
        within_s=60,
    )
    assert [pod["spec"].get("nodeName") for pod in pods_of(stack, "train")] == [None] * 3

    stack.kubectl(
        "patch", "gpuresourcequota", "two-workers", "-n", NAMESPACE, "--type=merge",
        "-p", json.dumps({"spec": {"total": {"maxWorkers": 3}}}),
    )  # fmt: skip
    eventually(
        "all three members bound once the quota allows them",
        lambda: all(pod["spec"].get("nodeName") for pod in pods_of(stack, "train")) or None,
        within_s=60,
    )
