"""`tfscheduler.core.custom_status`: the pods on each GPU in TensorFusion's shapes, and when a heartbeat
alone is worth a GPUNode status write."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from uuid import UUID, uuid4

from tfcommon.events import WorkloadRef
from tfscheduler.core.custom_status import heartbeat_only_change, running_apps

GIB = 1024**3


@dataclass(frozen=True)
class Share:
    gpu_uuid: str
    tflops_milli: int = 10_000
    vram_bytes: int = GIB
    limit_tflops_milli: int = 20_000
    limit_vram_bytes: int = 2 * GIB


@dataclass(frozen=True)
class Allocation:
    workload: WorkloadRef
    shares: tuple[Share, ...]
    node: str = "n"
    pool: str = "default"
    qos: str = "medium"
    isolation: str = "soft"
    allocation_id: UUID = field(default_factory=uuid4)
    created_at: datetime = datetime(2026, 9, 1, tzinfo=UTC)


def on(gpu: str, name: str, workload: str | None = None) -> Allocation:
    return Allocation(
        WorkloadRef(namespace="ml", name=name, uid=f"uid-{name}", workload=workload), (Share(gpu),)
    )


def test_running_apps_group_the_pods_of_one_gpu_by_workload() -> None:
    allocations = [on("g", "serve-1", "serve"), on("g", "serve-0", "serve"), on("g", "lone")]

    apps = running_apps("g", allocations)

    assert [(app["name"], app["count"]) for app in apps] == [("lone", 1), ("serve", 2)]
    assert [pod["name"] for pod in apps[1]["pods"]] == ["serve-0", "serve-1"]
    assert apps[0]["pods"][0] == {
        "name": "lone",
        "namespace": "ml",
        "uid": "uid-lone",
        "requests": {"tflops": "10", "vram": "1Gi"},
        "limits": {"tflops": "20", "vram": "2Gi"},
        "qos": "medium",
        "isExternal": False,
    }


def beat(at: str, phase: str = "Running") -> dict[str, object]:
    return {"phase": phase, "hypervisorStatus": {"hypervisorState": phase, "lastHeartbeatTime": at}}


def test_a_heartbeat_alone_is_written_only_once_it_moved_far_enough() -> None:
    written = beat("2026-09-01T10:00:00Z")

    assert heartbeat_only_change(written, beat("2026-09-01T10:00:25Z"), 30)
    assert not heartbeat_only_change(written, beat("2026-09-01T10:00:30Z"), 30)
    assert not heartbeat_only_change(written, beat("2026-09-01T10:00:05Z", phase="Unknown"), 30)
    assert not heartbeat_only_change(None, written, 30)
