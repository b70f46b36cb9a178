"""The seam between the webhook and the node agent's device plugin: the devices alone name the pod.

Pods are admitted through the webhook's decision path (`AdmissionService.review`, which gives each pod
its index), bound as the scheduler would (`tensor-fusion.ai/gpu-ids`), and then every injected
container's request is resolved by the agent's device-plugin core from exactly the devices the kubelet
hands out for it: `count` of the devices advertised by the plugin of the requested resource.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from tfagent.core.deviceplugin import AnsweredContainers, advertised_device_ids, grant_container
from tfcommon.cluster.manifests import pod_from_manifest
from tfcommon.cluster.model import Pod
from tfcommon.config_source import ConfigSource
from tfcommon.device_slots import RESOURCE_PREFIX, SLOTS_PER_RESOURCE
from tfwebhook.http import AdmissionService
from tfwebhook.pod_index import CyclingPodIndices
from tfwebhook.testing import a_gpu_container, a_pod, a_review, apply

SIDECAR = {"name": "log", "image": "img"}


def replica(number: int) -> dict[str, Any]:
    """A pod with a GPU container and a sidecar; the first one has a second GPU container."""
    helpers = [a_gpu_container("helper")] if number == 0 else []
    pod = a_pod(
        name=f"llm-{number}",
        labels={"tensor-fusion.ai/enabled": "true"},
        annotations={"tensor-fusion.ai/isolation": "shared"},
        containers=[a_gpu_container("main"), SIDECAR, *helpers],
    )
    pod["metadata"]["uid"] = f"uid-{number}"
    return pod


async def admit_through_webhook(service: AdmissionService, pod: dict[str, Any]) -> dict[str, Any]:
    status, body = await service.review(a_review(pod, uid=f"req-{pod['metadata']['uid']}"))
    assert status == 200
    response = json.loads(body)["response"]
    assert response["allowed"] is True
    return apply(pod, json.loads(base64.b64decode(response["patch"])))


def bound(admitted: dict[str, Any], gpu: str) -> Pod:
    admitted["metadata"]["annotations"]["tensor-fusion.ai/gpu-ids"] = gpu
    return pod_from_manifest(admitted)


def kubelet_devices(container: dict[str, Any], taken: set[str]) -> tuple[int, list[str]]:
    """What the kubelet hands a container: its one index resource, `count` devices not yet handed out."""
    limits = container["resources"]["limits"]
    (resource_name,) = [name for name in limits if name.startswith(RESOURCE_PREFIX)]
    resource = int(resource_name.removeprefix(RESOURCE_PREFIX), 16)
    free = [device for device in advertised_device_ids(resource) if device not in taken]
    devices = free[: int(limits[resource_name])]
    assert len(devices) == int(limits[resource_name]), f"the node has too few {resource_name} devices"
    taken.update(devices)
    return resource, devices


@pytest.mark.parametrize("start", [0, 5, 120])
async def test_every_container_is_resolved_to_its_own_pod_from_its_devices_alone(start: int) -> None:
    """Pods starting together on one node, including the index counter wrapping past 127."""
    service = AdmissionService(config=ConfigSource(None), pod_indices=CyclingPodIndices(start=start))
    starting = SLOTS_PER_RESOURCE + 1
    admitted = [await admit_through_webhook(service, replica(number)) for number in range(starting)]
    pods = [bound(manifest, f"gpu-{number:04d}") for number, manifest in enumerate(admitted)]
    assert len({pod.annotations["tensor-fusion.ai/index"] for pod in pods}) == starting

    answered = AnsweredContainers()
    taken: set[str] = set()
    for number, manifest in reversed(list(enumerate(admitted))):
        main, sidecar, *helpers = manifest["spec"]["containers"]
        assert sidecar == SIDECAR
        for container in (main, *helpers):
            resource, devices = kubelet_devices(container, taken)
            grant = grant_container(resource, devices, pods, answered, capacity_milli={})
            assert (grant.pod_uid, grant.container) == (f"uid-{number}", container["name"])
            assert grant.gpu_uuids == (f"gpu-{number:04d}",)
            assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": f"GPU-{number:04d}"}
