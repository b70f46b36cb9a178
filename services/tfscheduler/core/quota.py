"""Namespace GPU quotas with `GPUResourceQuota` semantics, counted in exact integers.

Pure. A quota is keyed by namespace. `spec.single` limits one workload (per-GPU maxima, GPU count)
and a violation never resolves by waiting; `spec.total` bounds the namespace's sum of requests,
limits and workers, and a workload over it waits until usage falls. Unlike TensorFusion, TFLOPS are
counted in milli-TFLOPS (no rounding) and compute-percent requests count the TFLOPS they reserve.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from tfcommon.events import GpuRequest
from tfcommon.placement import Placement
from tfcommon.quantities import QuantityError, format_bytes, format_milli, parse_bytes, parse_milli

from tfscheduler.core.view import AllocationFacts

DEFAULT_MAX_WORKERS = 32_768
DEFAULT_ALERT_THRESHOLD_PERCENT = 95


class QuotaError(ValueError):
    """A GPUResourceQuota manifest that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class Usage:
    """Requests, limits and workers: a namespace's usage, or one workload's demand."""

    requests_tflops_milli: int = 0
    requests_vram_bytes: int = 0
    limits_tflops_milli: int = 0
    limits_vram_bytes: int = 0
    workers: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.requests_tflops_milli + other.requests_tflops_milli,
            self.requests_vram_bytes + other.requests_vram_bytes,
            self.limits_tflops_milli + other.limits_tflops_milli,
            self.limits_vram_bytes + other.limits_vram_bytes,
            self.workers + other.workers,
        )


@dataclass(frozen=True)
class NamespaceQuota:
    """One namespace's `GPUResourceQuota`. `None` means no bound. Per-workload maxima are per GPU."""

    namespace: str
    total_requests_tflops_milli: int | None = None
    total_requests_vram_bytes: int | None = None
    total_limits_tflops_milli: int | None = None
    total_limits_vram_bytes: int | None = None
    max_workers: int = DEFAULT_MAX_WORKERS
    max_request_tflops_milli: int | None = None
    max_request_vram_bytes: int | None = None
    max_limit_tflops_milli: int | None = None
    max_limit_vram_bytes: int | None = None
    max_gpu_count: int | None = None
    default_request_tflops_milli: int | None = None
    default_request_vram_bytes: int | None = None
    default_limit_tflops_milli: int | None = None
    default_limit_vram_bytes: int | None = None
    alert_threshold_percent: int = DEFAULT_ALERT_THRESHOLD_PERCENT


@dataclass(frozen=True)
class QuotaRefusal:
    """Why a workload does not fit its namespace's quota; `retryable` False: it never will as asked."""

    reason: str
    retryable: bool


def with_defaults(quota: NamespaceQuota | None, request: GpuRequest) -> GpuRequest:
    """`request` with the quota's defaults filled into its zero fields (what the webhook does)."""
    if quota is None:
        return request
    changes: dict[str, int] = {}
    percent = request.compute_percent_request is not None
    if not percent and request.tflops_request_milli == 0 and quota.default_request_tflops_milli:
        changes["tflops_request_milli"] = quota.default_request_tflops_milli
    if request.vram_request_bytes == 0 and quota.default_request_vram_bytes:
        changes["vram_request_bytes"] = quota.default_request_vram_bytes
    if request.tflops_limit_milli == 0 and quota.default_limit_tflops_milli:
        changes["tflops_limit_milli"] = quota.default_limit_tflops_milli
    if request.vram_limit_bytes == 0 and quota.default_limit_vram_bytes:
        changes["vram_limit_bytes"] = quota.default_limit_vram_bytes
    return request.model_copy(update=changes) if changes else request


def check_single(quota: NamespaceQuota | None, request: GpuRequest) -> QuotaRefusal | None:
    """Per-workload maxima (`spec.single`); a refusal here is final (`retryable=False`)."""
    if quota is None:
        return None
    checks = (
        ("maxGPUCount", request.gpu_count, quota.max_gpu_count, str),
        ("maxRequests.tflops", request.tflops_request_milli, quota.max_request_tflops_milli, format_milli),
        ("maxRequests.vram", request.vram_request_bytes, quota.max_request_vram_bytes, format_bytes),
        ("maxLimits.tflops", request.tflops_limit_milli, quota.max_limit_tflops_milli, format_milli),
        ("maxLimits.vram", request.vram_limit_bytes, quota.max_limit_vram_bytes, format_bytes),
    )
    for name, asked, bound, show in checks:
        if bound is not None and asked > bound:
            return QuotaRefusal(
                f"quota {quota.namespace}: single.{name} is {show(bound)} per workload, asked {show(asked)}",
                retryable=False,
            )
    return None


def demand_of(placement: Placement, request: GpuRequest) -> Usage:
    """What a placed workload adds to its namespace: the reserved requests (compute percent included,
    as the TFLOPS it reserves) and the limits (never below the request) on every chosen GPU."""
    return Usage(
        requests_tflops_milli=sum(placement.tflops_milli),
        requests_vram_bytes=sum(placement.vram_bytes),
        limits_tflops_milli=sum(max(request.tflops_limit_milli, t) for t in placement.tflops_milli),
        limits_vram_bytes=sum(max(request.vram_limit_bytes, v) for v in placement.vram_bytes),
        workers=1,
    )


def usage_by_namespace(allocations: Iterable[AllocationFacts]) -> dict[str, Usage]:
    """Each namespace's usage from its active allocations (one worker per allocation)."""
    usage: dict[str, Usage] = {}
    for allocation in allocations:
        namespace = allocation.workload.namespace
        usage[namespace] = usage.get(namespace, Usage()) + Usage(
            requests_tflops_milli=sum(share.tflops_milli for share in allocation.shares),
            requests_vram_bytes=sum(share.vram_bytes for share in allocation.shares),
            limits_tflops_milli=sum(share.limit_tflops_milli for share in allocation.shares),
            limits_vram_bytes=sum(share.limit_vram_bytes for share in allocation.shares),
            workers=1,
        )
    return usage


def check_total(quota: NamespaceQuota | None, used: Usage, demand: Usage) -> QuotaRefusal | None:
    """Namespace totals (`spec.total`): a refusal waits until usage falls (`retryable=True`)."""
    if quota is None:
        return None
    after = used + demand
    checks = (
        ("requests.tflops", after.requests_tflops_milli, quota.total_requests_tflops_milli, format_milli,
         used.requests_tflops_milli),
        ("requests.vram", after.requests_vram_bytes, quota.total_requests_vram_bytes, format_bytes,
         used.requests_vram_bytes),
        ("limits.tflops", after.limits_tflops_milli, quota.total_limits_tflops_milli, format_milli,
         used.limits_tflops_milli),
        ("limits.vram", after.limits_vram_bytes, quota.total_limits_vram_bytes, format_bytes,
         used.limits_vram_bytes),
        ("maxWorkers", after.workers, quota.max_workers, str, used.workers),
    )  # fmt: skip
    for name, total, bound, show, before in checks:
        if bound is not None and total > bound:
            return QuotaRefusal(
                f"quota {quota.namespace}: total.{name} would be {show(total)} of {show(bound)} "
                f"(in use {show(before)}); waiting for the namespace's usage to fall",
                retryable=True,
            )
    return None


def remaining_after_release(used: Usage, released: Iterable[Usage]) -> Usage:
    """`used` minus what the given workloads hold (preemption checks quota as if victims were gone)."""
    total = used
    for item in released:
        total = Usage(
            total.requests_tflops_milli - item.requests_tflops_milli,
            total.requests_vram_bytes - item.requests_vram_bytes,
            total.limits_tflops_milli - item.limits_tflops_milli,
            total.limits_vram_bytes - item.limits_vram_bytes,
            total.workers - item.workers,
        )
    return total


def _quantity(section: Mapping[str, Any], key: str, path: str, parse: Any) -> int | None:
    value = section.get(key)
    if value is None:
        return None
    try:
        parsed: int = parse(str(value))
    except QuantityError as error:
        raise QuotaError(f"{path}.{key}: {error}") from error
    return parsed


def _section(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key) or {}
    if not isinstance(value, Mapping):
        raise QuotaError(f"{path}.{key}: must be a mapping, e.g. {key}: {{tflops: '100', vram: 80Gi}}")
    return value


def _whole(value: Any, path: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise QuotaError(f"{path}: {value!r}; use a whole number >= {minimum}")
    return value


def parse_quota(manifest: Mapping[str, Any]) -> NamespaceQuota:
    """A `GPUResourceQuota` manifest (tensor-fusion.ai/v1) as a `NamespaceQuota`; raises `QuotaError`."""
    if manifest.get("kind") != "GPUResourceQuota":
        raise QuotaError(f"kind: {manifest.get('kind')!r}; a quota manifest has kind: GPUResourceQuota")
    metadata = manifest.get("metadata") or {}
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    if not namespace or not isinstance(namespace, str):
        raise QuotaError("metadata.namespace: missing; a GPUResourceQuota applies to its namespace")
    spec = _section(manifest, "spec", "")
    total = _section(spec, "total", "spec")
    single = _section(spec, "single", "spec")
    requests = _section(total, "requests", "spec.total")
    limits = _section(total, "limits", "spec.total")
    max_requests = _section(single, "maxRequests", "spec.single")
    max_limits = _section(single, "maxLimits", "spec.single")
    default_requests = _section(single, "defaultRequests", "spec.single")
    default_limits = _section(single, "defaultLimits", "spec.single")
    quota = NamespaceQuota(
        namespace=namespace,
        total_requests_tflops_milli=_quantity(requests, "tflops", "spec.total.requests", parse_milli),
        total_requests_vram_bytes=_quantity(requests, "vram", "spec.total.requests", parse_bytes),
        total_limits_tflops_milli=_quantity(limits, "tflops", "spec.total.limits", parse_milli),
        total_limits_vram_bytes=_quantity(limits, "vram", "spec.total.limits", parse_bytes),
        max_request_tflops_milli=_quantity(max_requests, "tflops", "spec.single.maxRequests", parse_milli),
        max_request_vram_bytes=_quantity(max_requests, "vram", "spec.single.maxRequests", parse_bytes),
        max_limit_tflops_milli=_quantity(max_limits, "tflops", "spec.single.maxLimits", parse_milli),
        max_limit_vram_bytes=_quantity(max_limits, "vram", "spec.single.maxLimits", parse_bytes),
        default_request_tflops_milli=_quantity(
            default_requests, "tflops", "spec.single.defaultRequests", parse_milli
        ),
        default_request_vram_bytes=_quantity(
            default_requests, "vram", "spec.single.defaultRequests", parse_bytes
        ),
        default_limit_tflops_milli=_quantity(
            default_limits, "tflops", "spec.single.defaultLimits", parse_milli
        ),
        default_limit_vram_bytes=_quantity(default_limits, "vram", "spec.single.defaultLimits", parse_bytes),
    )
    if "maxWorkers" in total:
        quota = replace(quota, max_workers=_whole(total["maxWorkers"], "spec.total.maxWorkers", 0))
    if "alertThresholdPercent" in total:
        threshold = _whole(total["alertThresholdPercent"], "spec.total.alertThresholdPercent", 0)
        quota = replace(quota, alert_threshold_percent=threshold)
    if "maxGPUCount" in single:
        quota = replace(quota, max_gpu_count=_whole(single["maxGPUCount"], "spec.single.maxGPUCount", 1))
    return quota
