"""WorkloadProfile objects on a real API server, through the webhook's watch (`tfwebhook.profiles`): an
edit is in force in `admit` within a second, timed from `kubectl patch` starting and from it returning
to `admit` answering with the new value (printed); an invalid edit keeps the last good profile; a
deleted profile is a denial naming the annotation and the namespace."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cluster_control_plane import kubectl
from tfcommon.cluster.custom_watch import watch_custom_objects
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.model import CustomResource
from tfcommon.config import TfConfig
from tfcommon.kube_local import LocalKubernetes
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.profiles import WatchedProfiles
from tfwebhook.testing import a_pod, opted_in

pytestmark = pytest.mark.integration

T = "tensor-fusion.ai/"


@pytest.fixture
async def watched(local_kubernetes: LocalKubernetes) -> AsyncIterator[tuple[WatchedProfiles, str]]:
    namespace = f"profiles-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(kubectl, local_kubernetes, "create", "namespace", namespace)
    cluster = KubernetesCluster.from_environment(kubeconfig=str(local_kubernetes.kubeconfig))
    profiles = WatchedProfiles()
    stop = asyncio.Event()
    kind = CustomResource.WORKLOAD_PROFILE
    watch = asyncio.create_task(watch_custom_objects(cluster, kind, profiles.observe, stop))
    try:
        await asyncio.wait_for(profiles.synced.wait(), timeout=10)
        yield profiles, namespace
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(watch, timeout=10)
        cluster.close()
        await asyncio.to_thread(kubectl, local_kubernetes, "delete", "namespace", namespace, "--wait=false")


def qos_of(profiles: WatchedProfiles, namespace: str) -> str:
    pod = a_pod(
        labels={f"{T}enabled": "true"}, annotations=opted_in(workload_profile="serving"), namespace=namespace
    )
    verdict = admit(pod, AdmissionContext(TfConfig(), namespace, profiles=profiles()))
    if isinstance(verdict, Denied):
        return verdict.message
    assert isinstance(verdict, Admitted)
    assert verdict.request is not None
    return verdict.request.qos


async def test_an_edit_is_in_force_at_the_next_admission(
    local_kubernetes: LocalKubernetes, watched: tuple[WatchedProfiles, str]
) -> None:
    profiles, namespace = watched
    profile: dict[str, Any] = {
        "apiVersion": "tensor-fusion.ai/v1",
        "kind": "WorkloadProfile",
        "metadata": {"name": "serving", "namespace": namespace},
        "spec": {
            "resources": {
                "requests": {"tflops": "10", "vram": "4Gi"},
                "limits": {"tflops": "10", "vram": "4Gi"},
            },
            "qos": "low",
        },
    }
    await asyncio.to_thread(
        kubectl, local_kubernetes, "apply", "--validate=strict", "-f", "-", stdin=json.dumps(profile)
    )
    deadline = time.monotonic() + 5
    while qos_of(profiles, namespace) != "low":
        assert time.monotonic() < deadline, qos_of(profiles, namespace)
        await asyncio.sleep(0.01)

    figures = []
    for qos in ("critical", "medium", "high"):
        edit = json.dumps({"spec": {"qos": qos}})
        edited = time.monotonic()
        await asyncio.to_thread(
            kubectl, local_kubernetes, "patch", "workloadprofile", "serving", "-n", namespace,
            "--type=merge", "-p", edit,
        )  # fmt: skip
        returned = time.monotonic()
        while qos_of(profiles, namespace) != qos:
            assert time.monotonic() - edited < 1.0, "the edit not in force within a second"
            await asyncio.sleep(0.001)
        done = time.monotonic()
        figures.append(
            f"{(done - edited) * 1000:.0f} ms from kubectl patch started, "
            f"{(done - returned) * 1000:.0f} ms from it returning"
        )
    print("WorkloadProfile edit -> admit: " + "; ".join(figures))

    bad = json.dumps([{"op": "add", "path": "/spec/gpuIndices", "value": [0, 0]}])
    await asyncio.to_thread(
        kubectl,
        local_kubernetes,
        "patch",
        "workloadprofile",
        "serving",
        "-n",
        namespace,
        "--type=json",
        "-p",
        bad,
    )
    await asyncio.sleep(0.5)
    assert qos_of(profiles, namespace) == "high"  # the last good version

    await asyncio.to_thread(
        kubectl, local_kubernetes, "delete", "workloadprofile", "serving", "-n", namespace
    )
    deadline = time.monotonic() + 5
    while (message := qos_of(profiles, namespace)) == "high":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    expected = f"annotation {T}workload-profile: no WorkloadProfile 'serving' in namespace '{namespace}'"
    assert message.startswith(f"{expected} (there: none)")
