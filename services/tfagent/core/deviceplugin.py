"""Device-plugin decisions: which pod and container an `Allocate` call is for, and what the container gets.

Pure: the shell hands in the pods on this node and what it already answered; this module decodes the
pod index from the device request (`tfcommon.device_slots`), picks the container, and builds the
container's environment: `NVIDIA_VISIBLE_DEVICES` with exactly the GPUs the scheduler chose, plus the
limit variables of the pod's isolation mode. The limits are read by the pod contract
(`tfcommon.pod_request.gpu_limits_of`, with `tfcommon.pod_spec`'s parsers), so a value the webhook and
the scheduler refuse is refused here with the same message. Refusals carry a message the kubelet shows
on the pod.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tfcommon.cluster.model import Pod
from tfcommon.device_slots import (
    POD_INDEX_ANNOTATION,
    index_resource_name,
    pod_index_from_annotation,
    pod_index_of,
)
from tfcommon.pod_request import GpuLimits, PodRequestError, gpu_limits_of
from tfcommon.pod_spec import CONTAINER_GPUS as CONTAINER_GPUS_ANNOTATION
from tfcommon.pod_spec import DEFAULT_ISOLATION
from tfcommon.pod_spec import GPU_IDS as GPU_IDS_ANNOTATION
from tfcommon.pod_spec import ISOLATION as ISOLATION_ANNOTATION

# Every container of every pod in one block of 8 pod indexes may hold 1..8 devices of the same resource
# at once (36 per container layout), so the pool must be large: 1024 covers 28 injected containers per pod.
DEVICES_PER_RESOURCE = 1024
MIB = 1024**2


class AllocationRefusedError(ValueError):
    """The kubelet's request cannot be answered; the message names the pod index and the fix."""


@dataclass(frozen=True)
class LimiterLibrary:
    """A limiter library installed by the operator (e.g. HAMi-core's libvgpu.so), preloaded for soft/hard."""

    host_path: str
    container_path: str = "/usr/local/tfpool/libvgpu.so"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerGrant:
    """What one container gets: its GPUs, its environment and mounts; `pod_uid`/`container` say whose."""

    pod_uid: str
    container: str
    gpu_uuids: tuple[str, ...]
    envs: Mapping[str, str]
    mounts: tuple[Mount, ...] = ()


@dataclass
class AnsweredContainers:
    """Which container each answered device set went to, per pod, so a retried `Allocate` is idempotent."""

    by_pod: dict[str, dict[frozenset[str], str]] = field(default_factory=dict)

    def record(self, grant: ContainerGrant, device_ids: Sequence[str]) -> None:
        self.by_pod.setdefault(grant.pod_uid, {})[frozenset(device_ids)] = grant.container

    def forget_pods_except(self, live_pod_uids: set[str]) -> None:
        for uid in set(self.by_pod) - live_pod_uids:
            del self.by_pod[uid]


def advertised_device_ids(resource: int) -> tuple[str, ...]:
    """The virtual devices the plugin of index resource `resource` offers the kubelet."""
    return tuple(f"index-{resource:x}-{number:04d}" for number in range(DEVICES_PER_RESOURCE))


def nvidia_visible_devices(gpu_uuids: Sequence[str]) -> str:
    """NVML's spelling of the UUIDs (`GPU-` prefix, lower-case hex), comma-separated."""
    return ",".join(f"GPU-{uuid[4:]}" if uuid.lower().startswith("gpu-") else uuid for uuid in gpu_uuids)


def _requesting_containers(pod: Pod, resource_name: str) -> list[str]:
    return [c.name for c in pod.containers if resource_name in c.limits or resource_name in c.requests]


def _container_gpus(pod: Pod, container: str) -> tuple[str, ...]:
    pod_gpus = tuple(
        u.strip().lower() for u in pod.annotations.get(GPU_IDS_ANNOTATION, "").split(",") if u.strip()
    )
    raw = pod.annotations.get(CONTAINER_GPUS_ANNOTATION)
    if raw is None:
        return pod_gpus
    try:
        per_container = json.loads(raw)
    except ValueError as error:
        raise AllocationRefusedError(
            f"pod {pod.namespace}/{pod.name}: {CONTAINER_GPUS_ANNOTATION} is not JSON ({error}); write "
            '{"<container>": ["gpu-..."]}'
        ) from error
    chosen = per_container.get(container) if isinstance(per_container, dict) else None
    if chosen is None:
        return pod_gpus
    gpus = tuple(str(uuid).lower() for uuid in chosen)
    if not set(gpus) <= set(pod_gpus):
        raise AllocationRefusedError(
            f"pod {pod.namespace}/{pod.name}: {CONTAINER_GPUS_ANNOTATION} gives container {container} GPUs "
            f"that are not in {GPU_IDS_ANNOTATION}"
        )
    return gpus


def _sm_percent(limits: GpuLimits, gpu_uuids: Sequence[str], capacity_milli: Mapping[str, int]) -> int | None:
    if limits.compute_percent_limit is not None:
        return max(1, limits.compute_percent_limit)
    if limits.tflops_limit_milli is None:
        return None
    capacities = [capacity_milli[uuid] for uuid in gpu_uuids if uuid in capacity_milli]
    if not capacities:
        return None
    return min(100, max(1, math.ceil(limits.tflops_limit_milli * 100 / min(capacities))))


def container_envs(
    pod: Pod, gpu_uuids: Sequence[str], capacity_milli: Mapping[str, int], limiter: LimiterLibrary | None
) -> tuple[dict[str, str], tuple[Mount, ...]]:
    """`NVIDIA_VISIBLE_DEVICES`, plus for `soft`/`hard` isolation the limit variables (and the preloaded
    limiter library when the operator installed one); `shared` gets whole cards and no limits."""
    envs = {"NVIDIA_VISIBLE_DEVICES": nvidia_visible_devices(gpu_uuids)}
    isolation = pod.annotations.get(ISOLATION_ANNOTATION, DEFAULT_ISOLATION)
    if isolation not in ("soft", "hard"):
        return envs, ()
    try:
        limits = gpu_limits_of(pod)
    except PodRequestError as error:
        raise AllocationRefusedError(f"pod {pod.namespace}/{pod.name}: {error}") from error
    vram_bytes = limits.vram_limit_bytes
    sm_percent = _sm_percent(limits, gpu_uuids, capacity_milli)
    if vram_bytes is not None:
        envs["TF_GPU_MEMORY_LIMIT"] = str(vram_bytes)
        envs["TF_CUDA_MEMORY_LIMIT"] = str(vram_bytes // MIB)
        envs["CUDA_DEVICE_MEMORY_LIMIT"] = f"{vram_bytes // MIB}m"
    if sm_percent is not None:
        envs["TF_CUDA_SM_PERCENT_LIMIT"] = str(sm_percent)
        envs["CUDA_DEVICE_SM_LIMIT"] = str(sm_percent)
    if limiter is None:
        return envs, ()
    envs["LD_PRELOAD"] = limiter.container_path
    return envs, (Mount(limiter.container_path, limiter.host_path),)


def grant_container(
    resource: int,
    device_ids: Sequence[str],
    pods: Sequence[Pod],
    answered: AnsweredContainers,
    capacity_milli: Mapping[str, int],
    limiter: LimiterLibrary | None = None,
) -> ContainerGrant:
    """Decide one container of an `Allocate` call: decode the pod index, find the one pod starting with
    it on this node, pick its next container asking for this resource (the same one again for a retried
    device set), and build what that container gets."""
    pod_index = pod_index_of(resource, len(device_ids))
    resource_name = index_resource_name(resource)
    candidates = [
        (pod, container)
        for pod in pods
        if pod_index_from_annotation(pod.annotations.get(POD_INDEX_ANNOTATION)) == pod_index
        and not pod.is_finished
        and pod.deleting_since is None
        and (container := _open_container(pod, resource_name, device_ids, answered)) is not None
    ]
    if not candidates:
        raise AllocationRefusedError(
            f"no starting pod on this node has {POD_INDEX_ANNOTATION}={pod_index} and a container asking for "
            f"{resource_name}; the pod must be admitted by the tfpool webhook"
        )
    if len(candidates) > 1:
        names = ", ".join(sorted(f"{p.namespace}/{p.name}" for p, _ in candidates))
        raise AllocationRefusedError(
            f"pods {names} share {POD_INDEX_ANNOTATION}={pod_index} on this node; delete one so it is "
            "admitted again with a fresh index"
        )
    ((pod, container),) = candidates
    if not pod.annotations.get(GPU_IDS_ANNOTATION):
        raise AllocationRefusedError(
            f"pod {pod.namespace}/{pod.name} has no {GPU_IDS_ANNOTATION} yet; the tfpool scheduler writes it "
            "when it binds the pod"
        )
    gpus = _container_gpus(pod, container)
    envs, mounts = container_envs(pod, gpus, capacity_milli, limiter)
    grant = ContainerGrant(pod.uid, container, gpus, envs, mounts)
    answered.record(grant, device_ids)
    return grant


def _open_container(
    pod: Pod, resource_name: str, device_ids: Sequence[str], answered: AnsweredContainers
) -> str | None:
    done = answered.by_pod.get(pod.uid, {})
    retried = done.get(frozenset(device_ids))
    if retried is not None:
        return retried
    taken = set(done.values())
    return next((name for name in _requesting_containers(pod, resource_name) if name not in taken), None)
