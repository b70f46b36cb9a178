"""Kubernetes mode, pure part: a pod's annotations to a `Submission`, and the annotations written at bind.

Reads what the admission webhook wrote (`tensor-fusion.ai/gpupool`, `gpu-count`, `gpu-indices`,
`tflops-*`, `vram-*`, `compute-percent-*`, `qos`, `isolation`, `gpu-model`, `eviction-protection`,
`takeover-slot`, `container-gpu-count`, `inject-container`) and writes `gpu-ids` (lower-case GPU UUIDs,
comma separated) and `container-gpus` (JSON: container name to its GPU UUIDs). No I/O, no clock.
Bad annotations raise `PodRequestError`, whose message names the annotation and a valid value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast, get_args

from tfcommon.cluster.model import Pod
from tfcommon.events import GpuRequest, IsolationMode, QosLevel, WorkloadRef
from tfcommon.quantities import QuantityError, parse_bytes, parse_milli

from tfscheduler.submission import Submission

PREFIX = "tensor-fusion.ai/"
GPUPOOL = PREFIX + "gpupool"
GPU_COUNT = PREFIX + "gpu-count"
GPU_INDICES = PREFIX + "gpu-indices"
GPU_MODEL = PREFIX + "gpu-model"
TFLOPS_REQUEST = PREFIX + "tflops-request"
TFLOPS_LIMIT = PREFIX + "tflops-limit"
VRAM_REQUEST = PREFIX + "vram-request"
VRAM_LIMIT = PREFIX + "vram-limit"
PERCENT_REQUEST = PREFIX + "compute-percent-request"
PERCENT_LIMIT = PREFIX + "compute-percent-limit"
QOS = PREFIX + "qos"
ISOLATION = PREFIX + "isolation"
EVICTION_PROTECTION = PREFIX + "eviction-protection"
TAKEOVER_SLOT = PREFIX + "takeover-slot"
CONTAINER_GPU_COUNT = PREFIX + "container-gpu-count"
INJECT_CONTAINER = PREFIX + "inject-container"
WORKLOAD_LABEL = PREFIX + "workload"
GPU_IDS = PREFIX + "gpu-ids"
CONTAINER_GPUS = PREFIX + "container-gpus"

MAX_GPU_COUNT = 128
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


class PodRequestError(ValueError):
    """A pod's `tensor-fusion.ai/*` annotation cannot be read; the message names it and the fix."""


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
    annotations = pod.annotations
    indices = _indices(annotations.get(GPU_INDICES))
    count = len(indices) if indices else _count(annotations.get(GPU_COUNT))
    tflops_request, tflops_limit = _pair(annotations, TFLOPS_REQUEST, TFLOPS_LIMIT, parse_milli, "20")
    vram_request, vram_limit = _pair(annotations, VRAM_REQUEST, VRAM_LIMIT, parse_bytes, "16Gi")
    percent_request = _percent(annotations, PERCENT_REQUEST)
    percent_limit = _percent(annotations, PERCENT_LIMIT)
    if percent_request is None:
        percent_request = percent_limit
    if percent_request is not None and (tflops_request or tflops_limit):
        raise PodRequestError(
            f"annotations {PERCENT_REQUEST} and {TFLOPS_REQUEST}: give compute as TFLOPS or as percent, "
            "not both"
        )
    request = GpuRequest(
        pool=annotations.get(GPUPOOL) or pod.labels.get(GPUPOOL) or default_pool,
        gpu_count=count,
        tflops_request_milli=tflops_request,
        tflops_limit_milli=tflops_limit,
        vram_request_bytes=vram_request,
        vram_limit_bytes=vram_limit,
        compute_percent_request=percent_request,
        gpu_model=annotations.get(GPU_MODEL) or None,
        qos=cast(QosLevel, _choice(annotations, QOS, get_args(QosLevel), "medium")),
        isolation=cast(IsolationMode, _choice(annotations, ISOLATION, get_args(IsolationMode), "soft")),
    )
    submission = Submission(
        workload=workload_of(pod),
        request=request,
        priority=pod.priority or 0,
        eviction_protection_s=_duration_s(annotations.get(EVICTION_PROTECTION)),
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
    )
    return PodWork(submission, annotations.get(TAKEOVER_SLOT) or None, indices)


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


def _count(raw: str | None) -> int:
    if raw is None or not raw.strip():
        return 1
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_GPU_COUNT:
        raise PodRequestError(f"annotation {GPU_COUNT}: {raw!r} is not a GPU count; use 1..{MAX_GPU_COUNT}")
    return count


def _indices(raw: str | None) -> tuple[int, ...]:
    if raw is None or not raw.strip():
        return ()
    try:
        indices = tuple(int(part) for part in raw.split(",") if part.strip())
    except ValueError:
        indices = (-1,)
    if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise PodRequestError(
            f"annotation {GPU_INDICES}: {raw!r} is not a list of device indices; use distinct "
            "indices >= 0, e.g. 0,1"
        )
    return indices


def _pair(
    annotations: Mapping[str, str],
    request_key: str,
    limit_key: str,
    parse: Callable[[str], int],
    example: str,
) -> tuple[int, int]:
    values: list[int | None] = []
    for key in (request_key, limit_key):
        raw = annotations.get(key)
        if raw is None or not raw.strip():
            values.append(None)
            continue
        try:
            values.append(int(parse(raw)))
        except (QuantityError, ValueError) as error:
            raise PodRequestError(
                f"annotation {key}: {raw!r} is not a quantity ({error}); e.g. {example}"
            ) from None
    request, limit = values
    request = request if request is not None else (limit or 0)
    limit = limit if limit is not None else request
    if limit < request:
        raise PodRequestError(f"annotation {limit_key}: below {request_key}; set the limit >= the request")
    return request, limit


def _percent(annotations: Mapping[str, str], key: str) -> int | None:
    raw = annotations.get(key)
    if raw is None or not raw.strip():
        return None
    try:
        value = int(raw.strip().rstrip("%"))
    except ValueError:
        value = -1
    if not 0 <= value <= 100:
        raise PodRequestError(f"annotation {key}: {raw!r} is not a percent of a GPU; use 0..100, e.g. 50")
    return value


def _choice(annotations: Mapping[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    raw = annotations.get(key)
    if raw is None or not raw.strip():
        return default
    if raw not in allowed:
        raise PodRequestError(f"annotation {key}: {raw!r} is not one of {', '.join(allowed)}")
    return raw


def _duration_s(raw: str | None) -> int:
    """A Go duration (`30m`, `1h30m`, `90s`) in whole seconds; empty means none."""
    if raw is None or not raw.strip():
        return 0
    text = raw.strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise PodRequestError(
            f"annotation {EVICTION_PROTECTION}: {raw!r} is not a duration; use Go syntax, e.g. 30m or 1h30m"
        )
    return int(sum(float(number) * _DURATION_SECONDS[unit] for number, unit in parts))
