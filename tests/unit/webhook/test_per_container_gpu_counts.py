"""`tensor-fusion.ai/container-gpu-count` at admission: how many of the pod's GPUs each injected container
sees, and that the pod reserves as many GPUs as its containers see (the scheduler turns the counts into
`container-gpus`, the node agent's device plugin into each container's `NVIDIA_VISIBLE_DEVICES`). Pure
core; `docs/webhook.md` ("GPUs per container") says the rules."""

from __future__ import annotations

from typing import Any

import pytest
from tfcommon.config import parse_config
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.testing import a_gpu_container, a_pod, apply, opted_in

T = "tensor-fusion.ai/"
ENABLED = {f"{T}enabled": "true"}
AUTO = parse_config(
    "dynamicConfig: {autoMigration: {enable: true, scope: {includes: {namespaceNames: [ml-team-a]}}}}"
)


def plain(name: str) -> dict[str, Any]:
    return {"name": name, "image": "img"}


def admitted(pod: dict[str, Any]) -> tuple[int, dict[str, str]]:
    """The GPU count the pod asks the scheduler for, and the `tensor-fusion.ai/*` annotations written."""
    verdict = admit(pod, AdmissionContext(AUTO))
    assert isinstance(verdict, Admitted), verdict
    assert verdict.request is not None, verdict.reason
    annotations = apply(pod, verdict.patch)["metadata"]["annotations"]
    written = {key.removeprefix(T): value for key, value in annotations.items() if key.startswith(T)}
    assert written["gpu-count"] == str(verdict.request.gpu_count)
    return verdict.request.gpu_count, written


def test_native_limits_of_one_and_two_give_each_container_its_own_count() -> None:
    pod = a_pod(
        containers=[a_gpu_container("a", {"nvidia.com/gpu": 1}), a_gpu_container("b", {"nvidia.com/gpu": 2})]
    )
    count, written = admitted(pod)
    assert (count, written["container-gpu-count"]) == (3, '{"a":1,"b":2}')


def test_a_written_container_gpu_count_sets_the_pods_gpu_count() -> None:
    pod = a_pod(
        labels=ENABLED,
        annotations=opted_in(isolation="shared", inject_container="a,b", container_gpu_count='{"a":1,"b":2}'),
        containers=[plain("a"), plain("b")],
    )
    count, written = admitted(pod)
    assert (count, written["container-gpu-count"]) == (3, '{"a":1,"b":2}')


def test_a_written_container_gpu_count_above_the_maximum_is_denied_naming_it() -> None:
    pod = a_pod(
        labels=ENABLED,
        annotations=opted_in(isolation="shared", container_gpu_count='{"app":200}'),
    )
    verdict = admit(pod, AdmissionContext(AUTO))
    assert isinstance(verdict, Denied)
    assert f"{T}container-gpu-count" in verdict.message
    assert "128" in verdict.message


def test_a_gpu_count_above_the_native_limits_is_seen_by_the_container_not_left_unused() -> None:
    pod = a_pod(
        annotations=opted_in(gpu_count="2"),
        containers=[a_gpu_container("app", {"nvidia.com/gpu": 1}), plain("log")],
    )
    count, written = admitted(pod)
    assert (count, written["container-gpu-count"]) == (2, '{"app":2}')


def test_a_gpu_count_above_several_native_limits_is_seen_whole_by_each_container() -> None:
    pod = a_pod(
        annotations=opted_in(gpu_count="4"),
        containers=[a_gpu_container("a", {"nvidia.com/gpu": 1}), a_gpu_container("b", {"nvidia.com/gpu": 1})],
    )
    count, written = admitted(pod)
    assert (count, written["container-gpu-count"]) == (4, '{"a":4,"b":4}')


def test_a_written_split_that_leaves_gpus_unseen_is_replaced() -> None:
    pod = a_pod(
        labels=ENABLED,
        annotations=opted_in(
            isolation="shared", gpu_count="3", inject_container="a,b", container_gpu_count='{"a":1,"b":1}'
        ),
        containers=[plain("a"), plain("b")],
    )
    count, written = admitted(pod)
    assert (count, written["container-gpu-count"]) == (3, '{"a":3,"b":3}')


@pytest.mark.parametrize(
    ("annotations", "split"),
    [
        pytest.param({"gpu_count": "3"}, '{"a":1,"b":2}', id="gpu-count-equal-to-the-limits"),
        pytest.param({"gpu_count": "2"}, '{"a":1,"b":2}', id="gpu-count-below-the-limits"),
        pytest.param({"inject_container": "a,b,c"}, '{"a":1,"b":2,"c":3}', id="a-container-without-limit"),
    ],
)
def test_native_counts_are_kept_where_no_gpu_of_the_pod_goes_unseen(
    annotations: dict[str, str], split: str
) -> None:
    containers = [
        a_gpu_container("a", {"nvidia.com/gpu": 1}),
        a_gpu_container("b", {"nvidia.com/gpu": 2}),
        plain("c"),
    ]
    _, written = admitted(a_pod(annotations=opted_in(**annotations), containers=containers))
    assert written["container-gpu-count"] == split


def test_a_converted_pod_with_its_split_admitted_again_keeps_it_and_gets_an_empty_patch() -> None:
    pod = a_pod(
        annotations=opted_in(gpu_count="2"),
        containers=[a_gpu_container("app", {"nvidia.com/gpu": 1}), plain("log")],
    )
    first = admit(pod, AdmissionContext(AUTO))
    assert isinstance(first, Admitted)
    again = admit(apply(pod, first.patch), AdmissionContext(AUTO))
    assert isinstance(again, Admitted)
    assert again.patch == []
