"""Namespace GPU quotas with `GPUResourceQuota` semantics, counted in exact integers.

Pure. The quota itself, its manifest, defaults and `spec.single` are `tfcommon.quota` (the webhook uses
them too), re-exported here. A quota is keyed by namespace. `spec.single` limits one workload (per-GPU
maxima, GPU count) and a violation never resolves by waiting; `spec.total` bounds the namespace's sum
of requests, limits and workers, and a workload over it waits until usage falls. Unlike TensorFusion,
TFLOPS are counted in milli-TFLOPS (no rounding) and compute-percent requests count the TFLOPS they
reserve. The
compute-percent bounds (`requests.compute`, `limits.compute`, in percent of one GPU) count each share as
the exact fraction of its GPU's TFLOPS it reserves (or may use): a share of 25 of 100 TFLOPS is 25.

`quota_status` is the object's `status` (used, availablePercent, conditions `Ready` and
`AlertThresholdReached`) for a namespace's usage; `alert_percent` says how close the fullest bounded
dimension is to its bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any, Protocol

from tfcommon.events import GpuRequest
from tfcommon.placement import Placement
from tfcommon.placement.from_ledger import AllocationFacts
from tfcommon.quantities import format_bytes, format_milli
from tfcommon.quota import (
    DEFAULT_ALERT_THRESHOLD_PERCENT,
    DEFAULT_MAX_WORKERS,
    NamespaceQuota,
    QuotaError,
    QuotaRefusal,
    check_single,
    format_percent,
    parse_quota,
    with_defaults,
)

__all__ = [
    "DEFAULT_ALERT_THRESHOLD_PERCENT",
    "DEFAULT_MAX_WORKERS",
    "NamespaceQuota",
    "QuotaError",
    "QuotaRefusal",
    "ShareFacts",
    "Usage",
    "alert_percent",
    "alert_reached",
    "check_single",
    "check_total",
    "demand_of",
    "format_percent",
    "parse_quota",
    "quota_status",
    "remaining_after_release",
    "usage_by_namespace",
    "usage_of_shares",
    "with_defaults",
]


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


def demand_of(placement: Placement, request: GpuRequest, capacities: Iterable[int] = ()) -> Usage:
    """What a placed workload adds to its namespace: the reserved requests (compute percent included,
    as the TFLOPS it reserves) and the limits (never below the request) on every chosen GPU; with the
    chosen GPUs' TFLOPS `capacities` (in placement order), the compute percent too."""
    limits = [
        max(request.tflops_limit_milli, t, held)
        for t, held in zip(
            placement.tflops_milli, placement.limit_tflops_milli or placement.tflops_milli, strict=True
        )
    ]
    sized = list(capacities)
    return Usage(
        requests_tflops_milli=sum(placement.tflops_milli),
        requests_vram_bytes=sum(placement.vram_bytes),
        limits_tflops_milli=sum(limits),
        limits_vram_bytes=sum(
            max(request.vram_limit_bytes, v, held)
            for v, held in zip(
                placement.vram_bytes, placement.limit_vram_bytes or placement.vram_bytes, strict=True
            )
        ),
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
