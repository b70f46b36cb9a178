"""A GPU pod's request, read from the `tensor-fusion.ai/*` annotations the admission webhook wrote.

Pure. The scheduler reads a pending pod with it to place the pod; the defrag planner reads a running pod
with it to size the same pod the same way when it plans a move. Reads `gpupool` (annotation, else
label), `gpu-count`, `gpu-indices`, `tflops-request`/`-limit`, `vram-request`/`-limit`,
`compute-percent-request`/`-limit`, `gpu-model`, `qos` and `isolation`. An annotation that cannot be read
raises `PodRequestError`, whose message names the annotation and a valid value. The keys, the vocabulary
and the value parsers are the pod contract's (`tfcommon.pod_spec`), shared with the webhook and the
device plugin, so a value one stop refuses every stop refuses. `gpu_request_annotations` writes a request
back as those annotations (the local scheduler API lists its workloads so, for the defrag planner).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from tfcommon.cluster.model import Pod
from tfcommon.events import GpuRequest, IsolationMode, QosLevel
from tfcommon.pod_spec import (
    DEFAULT_ISOLATION,
    DEFAULT_QOS,
    GPU_COUNT,
    GPU_INDICES,
    GPU_MODEL,
    GPUPOOL,
    ISOLATION,
    ISOLATION_MODES,
    MAX_GPU_COUNT,
    PERCENT_LIMIT,
    PERCENT_REQUEST,
    PREFIX,
    QOS,
    QOS_LEVELS,
    TFLOPS_LIMIT,
    TFLOPS_REQUEST,
    VRAM_LIMIT,
    VRAM_REQUEST,
    PodRequestError,
    parse_percent,
)
from tfcommon.quantities import QuantityError, format_bytes, format_milli, parse_bytes, parse_milli

__all__ = [
    "MAX_GPU_COUNT",
    "PREFIX",
    "GpuLimits",
    "PodRequestError",
    "gpu_indices_of",
    "gpu_limits_of",
    "gpu_request_annotations",
    "gpu_request_of",
]


def gpu_indices_of(pod: Pod) -> tuple[int, ...]:
    """The device indices the pod pins (`gpu-indices`), empty when it pins none."""
    raw = pod.annotations.get(GPU_INDICES)
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


def gpu_request_of(pod: Pod, *, default_pool: str = "default") -> GpuRequest:
    """What the pod asks for, per GPU: a limit without its request is the request too, a percent limit
    without a percent request is the percent request; raises `PodRequestError`."""
    annotations = pod.annotations
    indices = gpu_indices_of(pod)
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
    return GpuRequest(
        pool=annotations.get(GPUPOOL) or pod.labels.get(GPUPOOL) or default_pool,
        gpu_count=count,
        tflops_request_milli=tflops_request,
        tflops_limit_milli=tflops_limit,
        vram_request_bytes=vram_request,
        vram_limit_bytes=vram_limit,
        compute_percent_request=percent_request,
        compute_percent_limit=percent_limit,
        gpu_model=annotations.get(GPU_MODEL) or None,
        qos=cast(QosLevel, _choice(annotations, QOS, QOS_LEVELS, DEFAULT_QOS)),
        isolation=cast(IsolationMode, _choice(annotations, ISOLATION, ISOLATION_MODES, DEFAULT_ISOLATION)),
    )


@dataclass(frozen=True)
class GpuLimits:
    """What the limiter holds each of a pod's GPUs to, from its limit annotations; None: not annotated."""

    tflops_limit_milli: int | None
    vram_limit_bytes: int | None
    compute_percent_limit: int | None


def gpu_limits_of(pod: Pod) -> GpuLimits:
    """The pod's `tflops-limit`, `vram-limit` and `compute-percent-limit` as the webhook wrote them (the
    device plugin's limit variables); raises `PodRequestError` as `gpu_request_of` does."""
    annotations = pod.annotations
    return GpuLimits(
        tflops_limit_milli=_quantity(annotations, TFLOPS_LIMIT, parse_milli, "20"),
        vram_limit_bytes=_quantity(annotations, VRAM_LIMIT, parse_bytes, "16Gi"),
        compute_percent_limit=_percent(annotations, PERCENT_LIMIT),
    )


def gpu_request_annotations(request: GpuRequest) -> dict[str, str]:
    """`request` written back as the annotations `gpu_request_of` reads it from (canonical text), so that
    `gpu_request_of` of a pod carrying them returns `request`. A compute-percent request is written as
    `compute-percent-request` (and `-limit` when the request has one) and no TFLOPS."""
    annotations = {
        GPUPOOL: request.pool,
        GPU_COUNT: str(request.gpu_count),
        VRAM_REQUEST: format_bytes(request.vram_request_bytes),
        VRAM_LIMIT: format_bytes(request.vram_limit_bytes),
        QOS: request.qos,
        ISOLATION: request.isolation,
    }
    if request.compute_percent_request is not None:
        annotations[PERCENT_REQUEST] = str(request.compute_percent_request)
        if request.compute_percent_limit is not None:
            annotations[PERCENT_LIMIT] = str(request.compute_percent_limit)
    else:
        annotations[TFLOPS_REQUEST] = format_milli(request.tflops_request_milli)
        annotations[TFLOPS_LIMIT] = format_milli(request.tflops_limit_milli)
    if request.gpu_model:
        annotations[GPU_MODEL] = request.gpu_model
    return annotations


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


def _pair(
    annotations: Mapping[str, str],
    request_key: str,
    limit_key: str,
    parse: Callable[[str], int],
    example: str,
) -> tuple[int, int]:
    request = _quantity(annotations, request_key, parse, example)
    limit = _quantity(annotations, limit_key, parse, example)
    request = request if request is not None else (limit or 0)
    limit = limit if limit is not None else request
    if limit < request:
        raise PodRequestError(f"annotation {limit_key}: below {request_key}; set the limit >= the request")
    return request, limit


def _quantity(
    annotations: Mapping[str, str], key: str, parse: Callable[[str], int], example: str
) -> int | None:
    raw = annotations.get(key)
    if raw is None or not raw.strip():
        return None
    try:
        return int(parse(raw))
    except (QuantityError, ValueError) as error:
        raise PodRequestError(
            f"annotation {key}: {raw!r} is not a quantity ({error}); e.g. {example}"
        ) from None


def _percent(annotations: Mapping[str, str], key: str) -> int | None:
    raw = annotations.get(key)
    if raw is None or not raw.strip():
        return None
    return parse_percent(key, raw)


def _choice(annotations: Mapping[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    raw = annotations.get(key)
    if raw is None or not raw.strip():
        return default
    if raw not in allowed:
        raise PodRequestError(f"annotation {key}: {raw!r} is not one of {', '.join(allowed)}")
    return raw
