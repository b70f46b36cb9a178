"""Pure: what Kubernetes mode reads from a webhook-annotated pod, what it writes at bind, and the
custom-resource status it computes from ledger facts (no server, no database)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import pytest
from pydantic import ValidationError
from tfcommon.cluster import ContainerResources, Pod, Toleration
from tfcommon.settings import SchedulerSettings
from tfscheduler.core.binding import PodRequestError, bind_annotations, container_gpus, pod_work
from tfscheduler.core.custom_status import desired_status

GIB = 1024**3


def _pod(annotations: dict[str, str], **fields: object) -> Pod:
    return Pod(
        namespace="team-a",
        name="trainer-0",
        uid="uid-1",
        annotations=annotations,
        scheduler_name="tensor-fusion-scheduler",
        containers=(ContainerResources("main"),),
        **fields,  # type: ignore[arg-type]
    )


def test_the_webhook_annotations_become_the_submission() -> None:
    pod = _pod(
        {
            "tensor-fusion.ai/gpupool": "training",
            "tensor-fusion.ai/tflops-request": "20",
            "tensor-fusion.ai/tflops-limit": "40",
            "tensor-fusion.ai/vram-request": "16Gi",
            "tensor-fusion.ai/vram-limit": "24Gi",
            "tensor-fusion.ai/gpu-count": "2",
            "tensor-fusion.ai/qos": "high",
            "tensor-fusion.ai/isolation": "hard",
            "tensor-fusion.ai/gpu-model": "H100",
            "tensor-fusion.ai/eviction-protection": "1h30m",
            "tensor-fusion.ai/takeover-slot": "slot-9",
        },
        priority=1000,
        tolerations=(Toleration(key="gpu", operator="Exists", effect="NoSchedule"),),
        node_selector={"zone": "a"},
        labels={"tensor-fusion.ai/workload": "trainer"},
    )

    work = pod_work(pod)

    request = work.submission.request
    assert (request.pool, request.gpu_count, request.qos, request.isolation, request.gpu_model) == (
        "training",
        2,
        "high",
        "hard",
        "H100",
    )
    assert (request.tflops_request_milli, request.tflops_limit_milli) == (20_000, 40_000)
    assert (request.vram_request_bytes, request.vram_limit_bytes) == (16 * GIB, 24 * GIB)
    assert work.submission.priority == 1000
    assert work.submission.eviction_protection_s == 5400
    assert work.submission.tolerations == ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},)
    assert work.submission.node_selector == {"zone": "a"}
    assert work.submission.workload.uid == "uid-1"
    assert work.submission.workload.workload == "trainer"
    assert work.takeover_slot == "slot-9"


def test_a_request_defaults_to_its_limit_and_gpu_indices_set_the_count() -> None:
    work = pod_work(_pod({"tensor-fusion.ai/tflops-limit": "10", "tensor-fusion.ai/gpu-indices": "0,3,5"}))

    assert work.submission.request.tflops_request_milli == 10_000
    assert work.submission.request.gpu_count == 3
    assert work.gpu_indices == (0, 3, 5)


@pytest.mark.parametrize(
    ("annotations", "named", "fix"),
    [
        ({"tensor-fusion.ai/vram-request": "lots"}, "tensor-fusion.ai/vram-request", "16Gi"),
        ({"tensor-fusion.ai/gpu-count": "0"}, "tensor-fusion.ai/gpu-count", "1..128"),
        ({"tensor-fusion.ai/qos": "urgent"}, "tensor-fusion.ai/qos", "critical"),
        ({"tensor-fusion.ai/eviction-protection": "soon"}, "tensor-fusion.ai/eviction-protection", "30m"),
        ({"tensor-fusion.ai/compute-percent-request": "150"}, "compute-percent-request", "0..100"),
        (
            {"tensor-fusion.ai/tflops-request": "20", "tensor-fusion.ai/tflops-limit": "10"},
            "tensor-fusion.ai/tflops-limit",
            "limit >= the request",
        ),
    ],
)
def test_a_bad_annotation_is_refused_naming_it_and_the_fix(
    annotations: dict[str, str], named: str, fix: str
) -> None:
    with pytest.raises(PodRequestError) as refused:
        pod_work(_pod(annotations))

    assert named in str(refused.value)
    assert fix in str(refused.value)


def test_bind_annotations_list_lower_case_uuids_and_split_them_over_containers() -> None:
    pod = _pod({"tensor-fusion.ai/container-gpu-count": '{"a":1,"b":2}'})

    written = bind_annotations(pod, ["GPU-AAA", "GPU-BBB", "GPU-CCC"])

    assert written["tensor-fusion.ai/gpu-ids"] == "gpu-aaa,gpu-bbb,gpu-ccc"
    assert json.loads(written["tensor-fusion.ai/container-gpus"] or "") == {
        "a": ["gpu-aaa"],
        "b": ["gpu-bbb", "gpu-ccc"],
    }
    assert container_gpus(_pod({}), ["GPU-X"]) == {"main": ["gpu-x"]}


@dataclass(frozen=True)
class _Gpu:
    uuid: str
    node: str
    index: int
    model: str = "H100"
    vendor: str = "NVIDIA"
    capacity_tflops_milli: int = 100_000
    capacity_vram_bytes: int = 80 * GIB
    used_tflops_milli: int = 0
    used_vram_bytes: int = 0
    phase: str = "Running"
    numa_node: int | None = 0


@dataclass(frozen=True)
class _Node:
    name: str
    pool: str = "default"
    labels: dict[str, str] | None = None
    taints: tuple[dict[str, str], ...] = ()
    annotations: dict[str, str] | None = None
    cpu_allocatable_milli: int = 0
    memory_allocatable_bytes: int = 0
    cordoned: bool = False
    ready: bool = True
    last_heartbeat_at: datetime | None = None


def test_available_is_capacity_minus_requests_per_gpu_node_and_pool() -> None:
    gpus = [
        _Gpu("GPU-A", "n1", 0, used_tflops_milli=30_500, used_vram_bytes=20 * GIB),
        _Gpu("gpu-b", "n1", 1),
        _Gpu("gpu-c", "n2", 0, used_vram_bytes=80 * GIB),
    ]

    desired = desired_status([_Node("n1"), _Node("n2", ready=False)], gpus)  # type: ignore[list-item]

    gpu_a = desired.gpus["gpu-a"]
    assert gpu_a["capacity"] == {"tflops": "100", "vram": "80Gi"}
    assert gpu_a["available"] == {"tflops": "69500m", "vram": "60Gi"}
    assert (gpu_a["uuid"], gpu_a["index"], gpu_a["gpuModel"], gpu_a["phase"]) == (
        "gpu-a",
        0,
        "H100",
        "Running",
    )
    assert gpu_a["nodeSelector"] == {"kubernetes.io/hostname": "n1"}
    n1 = desired.nodes["n1"]
    assert (n1["totalTFlops"], n1["availableTFlops"], n1["availableVRAM"], n1["totalGPUs"]) == (
        "200",
        "169500m",
        "140Gi",
        2,
    )
    assert n1["managedGPUDeviceIDs"] == ["gpu-a", "gpu-b"]
    assert desired.nodes["n2"]["phase"] == "Unknown"
    assert n1["hypervisorStatus"] == {"hypervisorState": "Running"}
    assert desired.nodes["n2"]["hypervisorStatus"] == {"hypervisorState": "Unknown"}
    pool = desired.pools["default"]
    assert (pool["totalNodes"], pool["readyNodes"], pool["notReadyNodes"], pool["totalGPUs"]) == (2, 1, 1, 3)
    assert (pool["totalVRAM"], pool["availableVRAM"]) == ("240Gi", "140Gi")


def test_kubernetes_mode_is_turned_on_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_SCHEDULER_MODE", "kubernetes")
    monkeypatch.setenv("TF_SCHEDULER_STATUS_DEBOUNCE_S", "0.3")

    settings = SchedulerSettings().kubernetes

    assert (settings.mode, settings.status_debounce_s, settings.scheduler_name) == (
        "kubernetes",
        0.3,
        "tensor-fusion-scheduler",
    )
    monkeypatch.setenv("TF_SCHEDULER_MODE", "k8s")
    with pytest.raises(ValidationError) as refused:
        SchedulerSettings()
    assert "mode" in str(refused.value)
    assert "'local' or 'kubernetes'" in str(refused.value)
