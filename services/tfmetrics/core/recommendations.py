"""Autoscaling recommendations from usage samples: percentiles, bounds, and the request per QoS. Pure.

For one workload, the samples are the agents' per-GPU usage reports of its workers over the window
(one sample = one worker on one GPU at one moment). Each resource (TFLOPS, VRAM) gets three bounds,
nearest-rank percentiles plus a safety margin: lower (p50), target (p90) and upper (p95) by default.
As in TensorFusion, the QoS picks the request: `critical` the upper bound, `high` the target, `low` and
`medium` the lower bound. The limit keeps the workload's current limit-to-request ratio (never below
the request). Request and limit never exceed the card the workload runs on (the smallest of its GPUs):
a margin on a full card would ask for more than any such card has. Below `min_samples` the
recommendation repeats the current values and says so.
Integers only (milli-TFLOPS, bytes); no clock: the caller passes `now`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from tfcommon.display import gib_text, tflops_text
from tfcommon.recommendations import Recommendation, workload_key

from tfmetrics.core.billing import BillableShare, PoolPricing, PriceBook, share_cost
from tfmetrics.core.series import GpuState, WorkerShare

MIB = 1024 * 1024
_HOUR_START = datetime(2000, 1, 1, tzinfo=UTC)


class RecommendationPolicyError(ValueError):
    """The recommendation settings are inconsistent; the message names the setting and the fix."""


@dataclass(frozen=True)
class UsagePoint:
    """One worker's use of one GPU at one moment."""

    tflops_milli: int
    vram_bytes: int


@dataclass(frozen=True)
class Card:
    """The GPU a workload runs on, as a bound: its model and capacity (the smallest of its GPUs')."""

    model: str
    tflops_milli: int
    vram_bytes: int


@dataclass(frozen=True)
class CurrentResources:
    """What the workload holds now, per GPU, and where; `card` None when its GPUs are not known."""

    pool: str
    qos: str
    gpu_count: int
    request_tflops_milli: int
    limit_tflops_milli: int
    request_vram_bytes: int
    limit_vram_bytes: int
    card: Card | None = None


@dataclass(frozen=True)
class RecommendationPolicy:
    """Percentiles (1..100), margin in percent, the sample minimum and the floors of a recommendation."""

    min_samples: int = 30
    lower_percentile: int = 50
    target_percentile: int = 90
    upper_percentile: int = 95
    margin_percent: int = 15
    min_tflops_milli: int = 1000
    min_vram_bytes: int = 256 * MIB

    def __post_init__(self) -> None:
        if self.min_samples < 1:
            raise RecommendationPolicyError(f"min_samples: {self.min_samples}; give 1 or more (e.g. 30)")
        if not 1 <= self.lower_percentile <= self.target_percentile <= self.upper_percentile <= 100:
            raise RecommendationPolicyError(
                "percentiles: need 1 <= lower <= target <= upper <= 100, got "
                f"{self.lower_percentile}/{self.target_percentile}/{self.upper_percentile} (e.g. 50/90/95)"
            )
        if self.margin_percent < 0:
            raise RecommendationPolicyError(f"margin_percent: {self.margin_percent}; give 0 or more, e.g. 15")
        if self.min_tflops_milli < 0 or self.min_vram_bytes < 0:
            raise RecommendationPolicyError("min_tflops_milli / min_vram_bytes: give 0 or more")


@dataclass(frozen=True)
class Bounds:
    """Lower, target and upper bound of one resource, margin included."""

    lower: int
    target: int
    upper: int

    def for_qos(self, qos: str) -> int:
        if qos == "critical":
            return self.upper
        if qos == "high":
            return self.target
        return self.lower


def percentile(values: Sequence[int], percent: int) -> int:
    """Nearest-rank percentile: the smallest value with at least `percent`% of the values at or below it."""
    if not values:
        raise ValueError("values: empty; a percentile needs at least one value")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * percent // 100))
    return ordered[min(rank, len(ordered)) - 1]


def _with_margin(value: int, margin_percent: int, floor: int) -> int:
    return max(floor, -(-value * (100 + margin_percent) // 100))


def bounds(values: Sequence[int], policy: RecommendationPolicy, floor: int) -> Bounds:
    """The three bounds of one resource's samples."""
    return Bounds(
        *(
            _with_margin(percentile(values, percent), policy.margin_percent, floor)
            for percent in (policy.lower_percentile, policy.target_percentile, policy.upper_percentile)
        )
    )


def _scaled_limit(request: int, current_request: int, current_limit: int, upper: int) -> int:
    if current_request <= 0:
        return max(request, upper)
    return max(request, -(-request * current_limit // current_request))


def _bound_name(qos: str) -> str:
    return {"critical": "upper bound", "high": "target"}.get(qos, "lower bound")


def recommend(
    workload_key: str,
    samples: Sequence[UsagePoint],
    current: CurrentResources,
    policy: RecommendationPolicy,
    now: datetime,
    window: timedelta,
) -> Recommendation:
    """The recommendation for one workload from its samples over `window`, computed at `now`."""
    count = len(samples)
    if count < policy.min_samples:
        return Recommendation(
            workload_key=workload_key,
            pool=current.pool,
            qos=current.qos,
            gpu_count=current.gpu_count,
            request_tflops_milli=current.request_tflops_milli,
            limit_tflops_milli=current.limit_tflops_milli,
            request_vram_bytes=current.request_vram_bytes,
            limit_vram_bytes=current.limit_vram_bytes,
            **_current_fields(current),
            sample_count=count,
            sufficient=False,
            reason=(
                f"too few samples: {count} in the last {_duration(window)}, {policy.min_samples} needed; "
                "keeping the current values"
            ),
            computed_at=now,
        )
    tflops = bounds([point.tflops_milli for point in samples], policy, policy.min_tflops_milli)
    vram = bounds([point.vram_bytes for point in samples], policy, policy.min_vram_bytes)
    request_tflops = tflops.for_qos(current.qos)
    request_vram = vram.for_qos(current.qos)
    limit_tflops = _scaled_limit(
        request_tflops, current.request_tflops_milli, current.limit_tflops_milli, tflops.upper
    )
    limit_vram = _scaled_limit(request_vram, current.request_vram_bytes, current.limit_vram_bytes, vram.upper)
    percent = {
        "upper bound": policy.upper_percentile,
        "target": policy.target_percentile,
        "lower bound": policy.lower_percentile,
    }[_bound_name(current.qos)]
    reason = (
        f"{current.qos} QoS gets the {_bound_name(current.qos)}: p{percent} of {count} samples in the "
        f"last {_duration(window)} plus {policy.margin_percent}% "
        f"(TFLOPS {tflops_text(request_tflops)}, VRAM {gib_text(request_vram)} GiB); "
        "limits keep the current limit-to-request ratio"
    )
    card = current.card
    if card is not None and (limit_tflops > card.tflops_milli or limit_vram > card.vram_bytes):
        request_tflops, limit_tflops = (
            min(value, card.tflops_milli) for value in (request_tflops, limit_tflops)
        )
        request_vram, limit_vram = (min(value, card.vram_bytes) for value in (request_vram, limit_vram))
        reason += (
            f"; capped at the {card.model} it runs on ({tflops_text(card.tflops_milli)} TFLOPS, "
            f"{gib_text(card.vram_bytes)} GiB)"
        )
    return Recommendation(
        workload_key=workload_key,
        pool=current.pool,
        qos=current.qos,
        gpu_count=current.gpu_count,
        request_tflops_milli=request_tflops,
        limit_tflops_milli=limit_tflops,
        request_vram_bytes=request_vram,
        limit_vram_bytes=limit_vram,
        **_current_fields(current),
        sample_count=count,
        sufficient=True,
        reason=reason,
        computed_at=now,
    )


def _current_fields(current: CurrentResources) -> dict[str, int]:
    return {
        "current_request_tflops_milli": current.request_tflops_milli,
        "current_limit_tflops_milli": current.limit_tflops_milli,
        "current_request_vram_bytes": current.request_vram_bytes,
        "current_limit_vram_bytes": current.limit_vram_bytes,
    }


def _duration(window: timedelta) -> str:
    seconds = int(window.total_seconds())
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _hourly_cost(
    recommendation: Recommendation, book: PriceBook, tflops: tuple[int, int], vram: tuple[int, int]
) -> Fraction:
    share = BillableShare(
        allocation_id="recommendation",
        gpu_uuid="any",
        namespace="",
        pod="",
        workload=recommendation.workload_key,
        qos=recommendation.qos,
        pool=recommendation.pool,
        gpu_model="",
        request_tflops_milli=tflops[0],
        limit_tflops_milli=tflops[1],
        request_vram_bytes=vram[0],
        limit_vram_bytes=vram[1],
        start=_HOUR_START,
    )
    cost, _ = share_cost(share, PoolPricing.constant(book), _HOUR_START, _HOUR_START + timedelta(hours=1))
    return cost * recommendation.gpu_count


def hourly_saving(recommendation: Recommendation, book: PriceBook) -> Decimal:
    """What the workload would save per hour on the pool's current prices (negative: it would cost more)."""
    current = _hourly_cost(
        recommendation,
        book,
        (recommendation.current_request_tflops_milli, recommendation.current_limit_tflops_milli),
        (recommendation.current_request_vram_bytes, recommendation.current_limit_vram_bytes),
    )
    recommended = _hourly_cost(
        recommendation,
        book,
        (recommendation.request_tflops_milli, recommendation.limit_tflops_milli),
        (recommendation.request_vram_bytes, recommendation.limit_vram_bytes),
    )
    difference = current - recommended
    return (Decimal(difference.numerator) / Decimal(difference.denominator)).quantize(Decimal("0.000001"))


def current_resources(
    shares: Iterable[WorkerShare], gpus: Iterable[GpuState] = ()
) -> dict[str, CurrentResources]:
    """What each workload (`namespace/workload`) holds now, from the active GPU shares.

    Per GPU: the largest request and limit among its pods; `gpu_count` is the most GPUs one pod holds.
    The QoS and pool are the most demanding pod's (highest QoS, then pool name). `card` is the smallest
    capacity among the `gpus` its shares are on (None when none of them is in `gpus`).
    """
    by_uuid = {gpu.uuid: gpu for gpu in gpus}
    by_workload: dict[str, dict[str, list[WorkerShare]]] = defaultdict(lambda: defaultdict(list))
    for share in shares:
        by_workload[workload_key(share.namespace, share.workload)][share.allocation_id].append(share)
    result: dict[str, CurrentResources] = {}
    for key, allocations in by_workload.items():
        every = [share for group in allocations.values() for share in group]
        first = max(every, key=lambda share: (_QOS_RANK.get(share.qos, 0), share.pool))
        result[key] = CurrentResources(
            pool=first.pool,
            qos=first.qos,
            gpu_count=max(len(group) for group in allocations.values()),
            request_tflops_milli=max(share.request_tflops_milli for share in every),
            limit_tflops_milli=max(share.limit_tflops_milli for share in every),
            request_vram_bytes=max(share.request_vram_bytes for share in every),
            limit_vram_bytes=max(share.limit_vram_bytes for share in every),
            card=_smallest_card([by_uuid[share.gpu_uuid] for share in every if share.gpu_uuid in by_uuid]),
        )
    return result


def _smallest_card(gpus: Sequence[GpuState]) -> Card | None:
    known = [gpu for gpu in gpus if gpu.capacity_tflops_milli > 0 and gpu.capacity_vram_bytes > 0]
    if not known:
        return None
    return Card(
        model="/".join(sorted({gpu.model for gpu in known})),
        tflops_milli=min(gpu.capacity_tflops_milli for gpu in known),
        vram_bytes=min(gpu.capacity_vram_bytes for gpu in known),
    )


_QOS_RANK = {"low": 0, "medium": 1, "high": 2, "critical": 3}
