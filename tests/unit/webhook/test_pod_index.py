"""The device-plugin pod index the webhook writes: annotation, container requests, reinvocation, dry runs."""

from __future__ import annotations

import base64
import json
from typing import Any

from tfcommon.config import TfConfig
from tfcommon.config_source import ConfigSource
from tfcommon.device_slots import POD_INDEX_ANNOTATION
from tfwebhook.core.admission import AdmissionContext, Admitted, admit, assign_pod_index
from tfwebhook.http import AdmissionService
from tfwebhook.pod_index import CyclingPodIndices
from tfwebhook.testing import a_gpu_container, a_pod, a_review, apply

ENABLED = {"tensor-fusion.ai/enabled": "true"}
SIDECAR = {"name": "log", "image": "img", "resources": {"limits": {"cpu": "1"}}}


def two_gpu_containers_and_a_sidecar(**annotations: str) -> dict[str, Any]:
    return a_pod(
        labels=ENABLED,
        annotations={"tensor-fusion.ai/isolation": "shared", **annotations},
        containers=[a_gpu_container("a"), SIDECAR, a_gpu_container("b", {"nvidia.com/gpu": 2})],
    )


def admitted(pod: dict[str, Any], pod_index: int | None) -> tuple[Admitted, dict[str, Any]]:
    verdict = admit(pod, AdmissionContext(TfConfig(), pod_index=pod_index))
    assert isinstance(verdict, Admitted), verdict
    return verdict, apply(pod, verdict.patch)


def test_the_index_is_written_and_each_injected_container_requests_its_slot() -> None:
    _, mutated = admitted(two_gpu_containers_and_a_sidecar(), pod_index=37)
    assert mutated["metadata"]["annotations"][POD_INDEX_ANNOTATION] == "37"
    a, log, b = mutated["spec"]["containers"]
    assert a["resources"]["limits"] == {"tensor-fusion.ai/index_4": "6"}
    assert b["resources"]["limits"] == {"tensor-fusion.ai/index_4": "6"}
    assert log == SIDECAR


def test_an_index_assigned_later_gives_the_same_pod_as_one_known_up_front() -> None:
    pod = two_gpu_containers_and_a_sidecar()
    waiting, _ = admitted(pod, pod_index=None)
    assert waiting.awaiting_pod_index == (0, 2)
    completed = assign_pod_index(waiting, 127)
    assert completed.awaiting_pod_index is None
    _, direct = admitted(pod, pod_index=127)
    assert apply(pod, completed.patch) == direct
    assert direct["spec"]["containers"][0]["resources"]["limits"] == {"tensor-fusion.ai/index_f": "8"}


def test_reinvocation_keeps_the_index_and_yields_an_empty_patch() -> None:
    _, mutated = admitted(two_gpu_containers_and_a_sidecar(), pod_index=5)
    again, same = admitted(mutated, pod_index=90)
    assert again.patch == []
    assert again.awaiting_pod_index is None
    assert same["metadata"]["annotations"][POD_INDEX_ANNOTATION] == "5"


def test_an_invalid_index_and_stale_slot_requests_are_replaced() -> None:
    pod = two_gpu_containers_and_a_sidecar(**{POD_INDEX_ANNOTATION: "900"})
    pod["spec"]["containers"][0]["resources"]["limits"]["tensor-fusion.ai/index_2"] = "3"
    _, mutated = admitted(pod, pod_index=8)
    assert mutated["metadata"]["annotations"][POD_INDEX_ANNOTATION] == "8"
    assert mutated["spec"]["containers"][0]["resources"]["limits"] == {"tensor-fusion.ai/index_1": "1"}


def response_patch(body: bytes) -> list[dict[str, Any]]:
    response = json.loads(body)["response"]
    assert response["allowed"] is True
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return patch


def index_in(patch: list[dict[str, Any]]) -> str:
    path = "/metadata/annotations/" + POD_INDEX_ANNOTATION.replace("/", "~1")
    (value,) = [op["value"] for op in patch if op["path"] == path]
    assert isinstance(value, str)
    return value


async def test_identical_replicas_get_distinct_indexes_and_a_dry_run_takes_none() -> None:
    service = AdmissionService(config=ConfigSource(None), pod_indices=CyclingPodIndices(start=126))
    pod = two_gpu_containers_and_a_sidecar()
    dry = response_patch((await service.review(a_review(pod, uid="d", dry_run=True)))[1])
    indexes = [
        index_in(response_patch((await service.review(a_review(pod, uid=f"u{n}")))[1])) for n in range(3)
    ]
    assert indexes == ["126", "127", "0"]
    assert index_in(dry) == "126"
