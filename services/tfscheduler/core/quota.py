"""Namespace GPU quotas with `GPUResourceQuota` semantics, counted in exact integers.

Pure. A quota is keyed by namespace. `spec.single` limits one workload (per-GPU maxima, GPU count)
and a violation never resolves by waiting; `spec.total` bounds the namespace's sum of requests,
limits and workers, and a workload over it waits until usage falls. Unlike TensorFusion, TFLOPS are
counted in milli-TFLOPS (no rounding) and compute-percent requests count the TFLOPS they reserve. The
compute-percent bounds (`requests.compute`, `limits.compute`, in percent of one GPU) count each share as
the exact fraction of its GPU's TFLOPS it reserves (or may use): a share of 25 of 100 TFLOPS is 25.

`quota_status` is the object's `status` (used, availablePercent, conditions `Ready` and
`AlertThresholdReached`) for a namespace's usage; `alert_percent` says how close the fullest bounded
dimension is to its bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from fractions import Fraction
from typing import Any, Protocol

from tfcommon.events import GpuRequest
from tfcommon.placement import Placement
from tfcommon.quantities import QuantityError, format_bytes, format_milli, parse_bytes, parse_milli

from tfscheduler.core.view import AllocationFacts

DEFAULT_MAX_WORKERS = 32_768
DEFAULT_ALERT_THRESHOLD_PERCENT = 95


class ShareFacts(Protocol):
    """One GPU share of an active allocation, with its GPU's TFLOPS (the ledger's `NamespaceShare`)."""

    @property
    def namespace(self) -> str: ...
    @property
    def allocation_id(self) -> object: ...
    @property
    def tflops_milli(self) -> int: ...
    @property
    def vram_bytes(self) -> int: ...
    @property
    def limit_tflops_milli(self) -> int: ...
    @property
    def limit_vram_bytes(self) -> int: ...
    @property
    def capacity_tflops_milli(self) -> int: ...


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
    requests_compute: Fraction = Fraction(0)
    """Percent of one GPU's compute, summed over shares (a whole GPU is 100)."""
    limits_compute: Fraction = Fraction(0)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.requests_tflops_milli + other.requests_tflops_milli,
            self.requests_vram_bytes + other.requests_vram_bytes,
            self.limits_tflops_milli + other.limits_tflops_milli,
            self.limits_vram_bytes + other.limits_vram_bytes,
            self.workers + other.workers,
            self.requests_compute + other.requests_compute,
            self.limits_compute + other.limits_compute,
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
    total_requests_compute: Fraction | None = None
    total_limits_compute: Fraction | None = None
    max_request_compute: Fraction | None = None
    """Per GPU, in percent; checked against a request made in percent (`compute-percent-request`)."""
    max_gpu_count: int | None = None
    default_request_tflops_milli: int | None = None
    default_request_vram_bytes: int | None = None
    default_limit_tflops_milli: int | None = None
    default_limit_vram_bytes: int | None = None
    alert_threshold_percent: int = DEFAULT_ALERT_THRESHOLD_PERCENT
    name: str = ""
    """The GPUResourceQuota object's name ("" for a quota built in code)."""

    @property
    def label(self) -> str:
        """How refusals and events name the quota: `GPUResourceQuota <namespace>/<name>`."""
        return f"GPUResourceQuota {self.namespace}/{self.name or self.namespace}"


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
                f"{quota.label}: single.{name} is {show(bound)} per workload, asked {show(asked)}",
                retryable=False,
            )
    percent = request.compute_percent_request
    if quota.max_request_compute is not None and percent is not None and percent > quota.max_request_compute:
        return QuotaRefusal(
            f"{quota.label}: single.maxRequests.compute is {format_percent(quota.max_request_compute)}% "
            f"per workload, asked {percent}%",
            retryable=False,
        )
    return None


def demand_of(placement: Placement, request: GpuRequest, capacities: Iterable[int] = ()) -> Usage:
    """What a placed workload adds to its namespace: the reserved requests (compute percent included,
    as the TFLOPS it reserves) and the limits (never below the request) on every chosen GPU; with the
    chosen GPUs' TFLOPS `capacities` (in placement order), the compute percent too."""
    limits = [max(request.tflops_limit_milli, t) for t in placement.tflops_milli]
    sized = list(capacities)
    return Usage(
        requests_tflops_milli=sum(placement.tflops_milli),
        requests_vram_bytes=sum(placement.vram_bytes),
        limits_tflops_milli=sum(limits),
        limits_vram_bytes=sum(max(request.vram_limit_bytes, v) for v in placement.vram_bytes),
        workers=1,
        requests_compute=sum(map(_percent, placement.tflops_milli, sized), Fraction(0)),
        limits_compute=sum(map(_percent, limits, sized), Fraction(0)),
    )


def _percent(tflops_milli: int, capacity_tflops_milli: int) -> Fraction:
    return Fraction(100 * tflops_milli, capacity_tflops_milli) if capacity_tflops_milli else Fraction(0)


def usage_of_shares(shares: Iterable[ShareFacts]) -> dict[str, Usage]:
    """Each namespace's usage from the ledger's active shares (one worker per allocation)."""
    usage: dict[str, Usage] = {}
    workers: dict[str, set[object]] = {}
    for share in shares:
        seen = workers.setdefault(share.namespace, set())
        usage[share.namespace] = usage.get(share.namespace, Usage()) + Usage(
            requests_tflops_milli=share.tflops_milli,
            requests_vram_bytes=share.vram_bytes,
            limits_tflops_milli=share.limit_tflops_milli,
            limits_vram_bytes=share.limit_vram_bytes,
            workers=0 if share.allocation_id in seen else 1,
            requests_compute=_percent(share.tflops_milli, share.capacity_tflops_milli),
            limits_compute=_percent(share.limit_tflops_milli, share.capacity_tflops_milli),
        )
        seen.add(share.allocation_id)
    return usage


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


def _dimensions(quota: NamespaceQuota, usage: Usage) -> list[tuple[str, Any, Any, Any]]:
    """(name, used, bound, how to show it) for each dimension of `spec.total`."""
    return [
        ("requests.tflops", usage.requests_tflops_milli, quota.total_requests_tflops_milli, format_milli),
        ("requests.vram", usage.requests_vram_bytes, quota.total_requests_vram_bytes, format_bytes),
        ("requests.compute", usage.requests_compute, quota.total_requests_compute, format_percent),
        ("limits.tflops", usage.limits_tflops_milli, quota.total_limits_tflops_milli, format_milli),
        ("limits.vram", usage.limits_vram_bytes, quota.total_limits_vram_bytes, format_bytes),
        ("limits.compute", usage.limits_compute, quota.total_limits_compute, format_percent),
        ("workers", usage.workers, quota.max_workers, str),
    ]


def check_total(quota: NamespaceQuota | None, used: Usage, demand: Usage) -> QuotaRefusal | None:
    """Namespace totals (`spec.total`): a refusal waits until usage falls (`retryable=True`)."""
    if quota is None:
        return None
    before = _dimensions(quota, used)
    for (name, total, bound, show), (_name, in_use, _bound, _show) in zip(
        _dimensions(quota, used + demand), before, strict=True
    ):
        if bound is not None and total > bound:
            name = "maxWorkers" if name == "workers" else name
            return QuotaRefusal(
                f"{quota.label}: total.{name} would be {show(total)} of {show(bound)} "
                f"(in use {show(in_use)}); waiting for the namespace's usage to fall",
                retryable=True,
            )
    return None


def format_percent(value: Fraction | int) -> str:
    """A percent as a Kubernetes quantity: exact when whole, else to two decimals (`12.5`, `33.33`)."""
    fraction = Fraction(value)
    if fraction.denominator == 1:
        return str(fraction.numerator)
    return f"{float(fraction):.2f}".rstrip("0").rstrip(".")


def _percent_of(in_use: int | Fraction, bound: int | Fraction) -> Fraction:
    return Fraction(100) if bound == 0 else 100 * Fraction(in_use) / Fraction(bound)


def alert_percent(quota: NamespaceQuota, used: Usage) -> tuple[Fraction, str] | None:
    """The fullest bounded dimension as (percent of its bound in use, its name); None when nothing is
    bounded. A bound of 0 counts as full."""
    fullest: tuple[Fraction, str] | None = None
    for name, in_use, bound, _show in _dimensions(quota, used):
        if bound is None:
            continue
        percent = _percent_of(in_use, bound)
        if fullest is None or percent > fullest[0]:
            fullest = (percent, name)
    return fullest


def alert_reached(quota: NamespaceQuota, used: Usage) -> bool:
    """Whether usage is at or above `alertThresholdPercent` of a bound."""
    fullest = alert_percent(quota, used)
    return fullest is not None and fullest[0] >= quota.alert_threshold_percent


def _condition(kind: str, status: bool, reason: str, message: str, now: datetime) -> dict[str, str]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def quota_status(quota: NamespaceQuota, used: Usage, now: datetime) -> dict[str, Any]:
    """The GPUResourceQuota's `status` for `used` (its `conditions` hold only `Ready` and
    `AlertThresholdReached`; the caller merges them with the object's other conditions)."""
    available: dict[str, str] = {}
    for name, in_use, bound, _show in _dimensions(quota, used):
        if bound is not None:
            available[name] = format_percent(max(Fraction(0), 100 - _percent_of(in_use, bound)))
    fullest = alert_percent(quota, used)
    reached = alert_reached(quota, used)
    message = (
        f"{fullest[1]} at {format_percent(fullest[0])}% of its bound "
        f"(alert at {quota.alert_threshold_percent}%)"
        if fullest is not None
        else "no bound set"
    )
    return {
        "used": {
            "requests": {
                "tflops": format_milli(used.requests_tflops_milli),
                "vram": format_bytes(used.requests_vram_bytes),
                "compute": format_percent(used.requests_compute),
            },
            "limits": {
                "tflops": format_milli(used.limits_tflops_milli),
                "vram": format_bytes(used.limits_vram_bytes),
                "compute": format_percent(used.limits_compute),
            },
            "workers": used.workers,
        },
        "availablePercent": available,
        "conditions": [
            _condition("Ready", True, "QuotaEnforced", "enforced by the tfpool scheduler", now),
            _condition(
                "AlertThresholdReached",
                reached,
                "AboveThreshold" if reached else "BelowThreshold",
                message,
                now,
            ),
        ],
        "lastUpdateTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


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
            total.requests_compute - item.requests_compute,
            total.limits_compute - item.limits_compute,
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


def _compute(section: Mapping[str, Any], path: str) -> Fraction | None:
    value = section.get("compute")
    if value is None:
        return None
    try:
        milli = parse_milli(str(value))
    except QuantityError as error:
        raise QuotaError(f"{path}.compute: {error}; use a percent of one GPU, e.g. compute: '50'") from error
    return Fraction(milli, 1000)


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
    name = metadata.get("name") if isinstance(metadata.get("name"), str) else ""
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
        name=name or "",
        total_requests_compute=_compute(requests, "spec.total.requests"),
        total_limits_compute=_compute(limits, "spec.total.limits"),
        max_request_compute=_compute(max_requests, "spec.single.maxRequests"),
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
