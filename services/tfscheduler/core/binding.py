"""Kubernetes mode, pure part: a pod's annotations to a `Submission`, and the annotations written at bind.

Reads what the admission webhook wrote (`tensor-fusion.ai/gpupool`, `gpu-count`, `gpu-indices`,
`tflops-*`, `vram-*`, `compute-percent-*`, `qos`, `isolation`, `gpu-model`, `eviction-protection`,
`takeover-slot`, `container-gpu-count`, `inject-container`) and writes `gpu-ids` (lower-case GPU UUIDs,
comma separated) and `container-gpus` (JSON: container name to its GPU UUIDs). No I/O, no clock.
Bad annotations raise `PodRequestError`, whose message names the annotation and a valid value. The
request annotations themselves are read by `tfcommon.pod_request`, which the defrag planner shares; the
keys and the `eviction-protection` parser are the pod contract's (`tfcommon.pod_spec`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tfcommon.cluster.model import Pod
from tfcommon.events import WorkloadRef
from tfcommon.pod_request import PodRequestError, gpu_indices_of, gpu_request_of
from tfcommon.pod_spec import (
    CONTAINER_GPU_COUNT,
    CONTAINER_GPUS,
    EVICTION_PROTECTION,
    GPU_IDS,
    INJECT_CONTAINER,
    TAKEOVER_SLOT,
    parse_duration_s,
)
from tfcommon.pod_spec import WORKLOAD as WORKLOAD_LABEL

from tfscheduler.core.gang import gang_of
from tfscheduler.submission import Submission

__all__ = [
    "TAKEOVER_SLOT",
    "PodRequestError",
    "PodWork",
    "bind_annotations",
    "container_gpus",
    "gpu_ids_of",
    "pod_work",
    "workload_of",
]


@dataclass(frozen=True)
class PodWork:
    """What the scheduler places for one pod, plus what it must release with it."""

    submission: Submission
    takeover_slot: str | None
    gpu_indices: tuple[int, ...]


def workload_of(pod: Pod) -> WorkloadRef:
    """The workload reference of `pod`: its uid makes each incarnation a distinct workload."""
    owner = pod.labels.get(WORKLOAD_LABEL) or next(
        (o.name for o in pod.owner_references if o.controller), None
    )
    return WorkloadRef(namespace=pod.namespace, name=pod.name, uid=pod.uid or None, workload=owner)


def pod_work(pod: Pod, *, default_pool: str = "default") -> PodWork:
    """The submission for a pending pod from the webhook's annotations; raises `PodRequestError`."""
    indices = gpu_indices_of(pod)
    request = gpu_request_of(pod, default_pool=default_pool)
    submission = Submission(
        workload=workload_of(pod),
        request=request,
        priority=pod.priority or 0,
        eviction_protection_s=parse_duration_s(pod.annotations.get(EVICTION_PROTECTION)),
        tolerations=tuple(
            {
                key: value
                for key, value in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                )
                if value
            }
            for t in pod.tolerations
        ),
        node_selector=dict(pod.node_selector),
        gang=gang_of(pod),
    )
    return PodWork(submission, pod.annotations.get(TAKEOVER_SLOT) or None, indices)


def gpu_ids_of(pod: Pod) -> tuple[str, ...]:
    """The GPU UUIDs a bound pod holds according to its `gpu-ids` annotation (lower case)."""
    raw = pod.annotations.get(GPU_IDS) or ""
    return tuple(part.strip().lower() for part in raw.split(",") if part.strip())


def container_gpus(pod: Pod, gpu_uuids: Sequence[str]) -> dict[str, list[str]]:
    """Which of `gpu_uuids` each GPU container gets: `container-gpu-count` (container to count) in
    order, wrapping around when the counts ask for more GPUs than were allocated."""
    uuids = [uuid.lower() for uuid in gpu_uuids]
    if not uuids:
        return {}
    counts = _container_counts(pod, len(uuids))
    assigned: dict[str, list[str]] = {}
    start = 0
    for name, wanted in counts.items():
        take = min(wanted, len(uuids))
        assigned[name] = [uuids[(start + i) % len(uuids)] for i in range(take)]
        start += take
    return assigned


def bind_annotations(pod: Pod, gpu_uuids: Sequence[str]) -> dict[str, str | None]:
    """The annotations the scheduler writes before the Binding: `gpu-ids` and `container-gpus`."""
    return {
        GPU_IDS: ",".join(uuid.lower() for uuid in gpu_uuids),
        CONTAINER_GPUS: json.dumps(container_gpus(pod, gpu_uuids), separators=(",", ":"), sort_keys=True),
    }


def _container_counts(pod: Pod, allocated: int) -> dict[str, int]:
    raw = pod.annotations.get(CONTAINER_GPU_COUNT)
    if raw:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and all(
            isinstance(k, str) and type(v) is int and v > 0 for k, v in parsed.items()
        ):
            return {str(k): int(v) for k, v in parsed.items()}
    injected = [name.strip() for name in (pod.annotations.get(INJECT_CONTAINER) or "").split(",")]
    names = [name for name in injected if name] or [c.name for c in pod.containers[:1]]
    return dict.fromkeys(names, allocated)
