"""Bills from allocation intervals, with TensorFusion's pricing formula, exact and in decimal money.

Pure: takes intervals, prices and a period; returns a `Bill`. No clock, no I/O, no floats. Amounts are
computed exactly (rational arithmetic, to the microsecond) and rounded once per bill to `quantum`; the
rounding is shared out over the groups by largest remainder (ties by key), so the groups always add up
to the total. Formula (per GPU share, per second):

    ( tflops_req * P_tflops + vram_req_gib * P_vram
      + (tflops_lim - tflops_req) * P_tflops * limitsOverRequests
      + (vram_lim_gib - vram_req_gib) * P_vram * limitsOverRequests ) / 3600
    * evictionProtectionPriceRatio   while the eviction-protection window is open (never for critical)

A workload on N GPUs has N shares, so the GPU count multiplies naturally. A QoS the pool does not price
costs 0 and the bill says so in `notes`. A group holding a GPU model without a dedicated price has no
dedicated cost and no savings (None, with the model in `unpriced_models`), never a made-up 0.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Literal, get_args

GroupBy = Literal["namespace", "workload", "pod", "qos", "pool"]
GROUP_BY_CHOICES: tuple[GroupBy, ...] = get_args(GroupBy)

GIB = 1024**3
SECONDS_PER_HOUR = 3600
DEFAULT_EVICTION_PROTECTION_PRICE_RATIO = Decimal("1.2")
_MICROSECONDS_PER_SECOND = 1_000_000


class BillingInputError(ValueError):
    """A billing input is malformed; the message names the field and the fix."""


@dataclass(frozen=True)
class QosPrice:
    """Unit prices of one QoS level: per FP16-TFLOPS-hour and per GiB-of-VRAM-hour of the requests,
    and the fraction of those prices charged for the part of the limits above the requests."""

    per_tflops_hour: Decimal
    per_vram_gib_hour: Decimal
    limits_over_requests: Decimal = Decimal(1)

    def __post_init__(self) -> None:
        for name in ("per_tflops_hour", "per_vram_gib_hour", "limits_over_requests"):
            value = getattr(self, name)
            if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
                raise BillingInputError(f"{name}: {value!r} must be a finite Decimal, zero or more")


@dataclass(frozen=True)
class PriceBook:
    """A pool's prices per QoS and its eviction-protection surcharge (a ratio below 1 means 1.2, as in
    TensorFusion)."""

    prices: Mapping[str, QosPrice]
    eviction_protection_price_ratio: Decimal = DEFAULT_EVICTION_PROTECTION_PRICE_RATIO

    @property
    def protection_ratio(self) -> Decimal:
        ratio = self.eviction_protection_price_ratio
        return ratio if ratio >= 1 else DEFAULT_EVICTION_PROTECTION_PRICE_RATIO


@dataclass(frozen=True)
class PoolPricing:
    """A pool's price books over time: `books[i]` applies from `starts[i]` (None: since forever) until
    the next start. Starts must be increasing; only the first may be None."""

    books: tuple[tuple[datetime | None, PriceBook], ...]

    def __post_init__(self) -> None:
        if not self.books:
            raise BillingInputError("books: empty; a pool needs at least one price book")
        starts = [start for start, _ in self.books]
        if any(start is None for start in starts[1:]):
            raise BillingInputError("books: only the first price book may apply since forever (start None)")
        dated = [start for start in starts if start is not None]
        if any(later <= earlier for earlier, later in itertools.pairwise(dated)):
            raise BillingInputError("books: price changes must be in increasing time order")

    @classmethod
    def constant(cls, book: PriceBook) -> PoolPricing:
        return cls(books=((None, book),))

    def pieces(self, start: datetime, end: datetime) -> list[tuple[datetime, datetime, PriceBook]]:
        """Split [start, end) at price changes; each piece with the book in force during it."""
        result = []
        for index, (book_start, book) in enumerate(self.books):
            book_end = self.books[index + 1][0] if index + 1 < len(self.books) else None
            piece_start = start if book_start is None else max(start, book_start)
            piece_end = end if book_end is None else min(end, book_end)
            if piece_start < piece_end:
                result.append((piece_start, piece_end, book))
        return result


@dataclass(frozen=True)
class BillableShare:
    """One GPU share of one allocation and when it held capacity: [start, end), end None = still held.

    Quantities are per GPU (milli-TFLOPS, bytes). `protected_until` ends the eviction-protection window
    (None: no protection). `gpu_model` prices the dedicated-GPU comparison.
    """

    allocation_id: str
    gpu_uuid: str
    namespace: str
    pod: str
    workload: str
    qos: str
    pool: str
    gpu_model: str
    request_tflops_milli: int
    request_vram_bytes: int
    limit_tflops_milli: int
    limit_vram_bytes: int
    start: datetime
    end: datetime | None = None
    protected_until: datetime | None = None

    def __post_init__(self) -> None:
        for name in ("request_tflops_milli", "request_vram_bytes", "limit_tflops_milli", "limit_vram_bytes"):
            if getattr(self, name) < 0:
                raise BillingInputError(f"{name}: {getattr(self, name)} must be zero or more")
        if self.end is not None and self.end < self.start:
            raise BillingInputError(f"end: {self.end.isoformat()} is before start {self.start.isoformat()}")

    def group_key(self, group_by: GroupBy) -> str:
        if group_by == "namespace":
            return self.namespace
        if group_by == "workload":
            return f"{self.namespace}/{self.workload}"
        if group_by == "pod":
            return f"{self.namespace}/{self.pod}"
        if group_by == "qos":
            return self.qos
        return self.pool


@dataclass(frozen=True)
class BillLine:
    """One group's amounts for the period; `gpu_hours` is share-hours (a share on one GPU for one hour).

    `dedicated_cost` and `savings` are None when one of the group's GPU models (`unpriced_models`) has
    no dedicated price.
    """

    key: str
    cost: Decimal
    dedicated_cost: Decimal | None
    savings: Decimal | None
    gpu_hours: Decimal
    shares: int
    unpriced_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class Bill:
    """What the pool cost over [start, end), per group, beside what whole dedicated GPUs would have cost.

    Invariants: `sum(line.cost) == cost`; when every GPU model is priced (`unpriced_models` empty),
    `sum(line.dedicated_cost) == dedicated_cost` and `savings == dedicated_cost - cost`, exactly;
    otherwise `dedicated_cost` and `savings` are None. Every amount is a multiple of `quantum`.
    """

    start: datetime
    end: datetime
    group_by: GroupBy
    quantum: Decimal
    cost: Decimal
    dedicated_cost: Decimal | None
    savings: Decimal | None
    lines: tuple[BillLine, ...]
    notes: tuple[str, ...] = field(default=())
    unpriced_models: tuple[str, ...] = ()


def _seconds(delta: timedelta) -> Fraction:
    microseconds = (delta.days * 86_400 + delta.seconds) * _MICROSECONDS_PER_SECOND + delta.microseconds
    return Fraction(microseconds, _MICROSECONDS_PER_SECOND)


def _hourly_rate(share: BillableShare, price: QosPrice) -> Fraction:
    tflops_price = Fraction(price.per_tflops_hour)
    vram_price = Fraction(price.per_vram_gib_hour)
    ratio = Fraction(price.limits_over_requests)
    request_tflops = Fraction(share.request_tflops_milli, 1000)
    request_vram = Fraction(share.request_vram_bytes, GIB)
    above_tflops = Fraction(max(share.limit_tflops_milli - share.request_tflops_milli, 0), 1000)
    above_vram = Fraction(max(share.limit_vram_bytes - share.request_vram_bytes, 0), GIB)
    return (
        request_tflops * tflops_price
        + request_vram * vram_price
        + above_tflops * tflops_price * ratio
        + above_vram * vram_price * ratio
    )


def _clip(share: BillableShare, start: datetime, end: datetime) -> tuple[datetime, datetime] | None:
    held_from = max(share.start, start)
    held_until = end if share.end is None else min(share.end, end)
    return (held_from, held_until) if held_from < held_until else None


def share_cost(
    share: BillableShare, pricing: PoolPricing | None, start: datetime, end: datetime
) -> tuple[Fraction, set[str]]:
    """The exact pool cost of `share` over [start, end), and notes on anything priced at 0."""
    clipped = _clip(share, start, end)
    if clipped is None:
        return Fraction(0), set()
    if pricing is None:
        return Fraction(0), {f"pool {share.pool!r} has no pricing: its allocations cost 0"}
    total = Fraction(0)
    notes: set[str] = set()
    for piece_start, piece_end, book in pricing.pieces(*clipped):
        price = book.prices.get(share.qos)
        if price is None:
            notes.add(f"pool {share.pool!r} prices no QoS {share.qos!r}: those allocations cost 0")
            continue
        rate = _hourly_rate(share, price) / SECONDS_PER_HOUR
        protected_seconds = Fraction(0)
        if share.protected_until is not None and share.qos != "critical":
            protected_end = min(piece_end, share.protected_until)
            if protected_end > piece_start:
                protected_seconds = _seconds(protected_end - piece_start)
        plain_seconds = _seconds(piece_end - piece_start) - protected_seconds
        total += rate * (plain_seconds + protected_seconds * Fraction(book.protection_ratio))
    return total, notes


def dedicated_cost(
    share: BillableShare, gpu_cost_per_hour: Mapping[str, Decimal], start: datetime, end: datetime
) -> Fraction | None:
    """The exact cost of a whole dedicated GPU of the share's model over the time the share was held;
    None when the model has no price."""
    clipped = _clip(share, start, end)
    if clipped is None:
        return Fraction(0)
    hourly = gpu_cost_per_hour.get(share.gpu_model)
    if hourly is None:
        return None
    return Fraction(hourly) * _seconds(clipped[1] - clipped[0]) / SECONDS_PER_HOUR


def unpriced_note(models: Iterable[str]) -> str:
    """Why a bill has no dedicated cost or savings, naming the models and the setting that prices them."""
    names = sorted(set(models))
    example = ", ".join(f'"{name}": "<price per hour>"' for name in names)
    return (
        f"no dedicated price for GPU model {', '.join(repr(name) for name in names)}: dedicated cost and "
        f"savings are unknown; set TF_GPU_COST_PER_HOUR on the metrics service, e.g. '{{{example}}}'"
    )


def _round_half_up(amount: Fraction, quantum: Fraction) -> int:
    """`amount` in whole quanta, halves away from zero (amounts here are never negative)."""
    return (
        int((amount / quantum) + Fraction(1, 2))
        if amount >= 0
        else -int((-amount / quantum) + Fraction(1, 2))
    )


def allocate_rounded(exact: Mapping[str, Fraction], quantum: Decimal) -> tuple[Decimal, dict[str, Decimal]]:
    """Round the total of `exact` once, then share it out so the parts add up to it exactly.

    Each part gets its amount rounded down; the quanta left over go to the parts with the largest
    remainders (ties: smallest key first). Amounts must not be negative.
    """
    step = Fraction(quantum)
    total_units = _round_half_up(sum(exact.values(), Fraction(0)), step)
    floors = {key: int(amount // step) for key, amount in exact.items()}
    left_over = total_units - sum(floors.values())
    by_remainder = sorted(exact, key=lambda key: (-(exact[key] - floors[key] * step), key))
    for key in by_remainder[:left_over]:
        floors[key] += 1
    return _money(total_units, quantum), {key: _money(units, quantum) for key, units in floors.items()}


def _money(units: int, quantum: Decimal) -> Decimal:
    return (Decimal(units) * quantum).quantize(quantum)


def _validate_period(start: datetime, end: datetime, quantum: Decimal) -> None:
    if start.utcoffset() is None or end.utcoffset() is None:
        raise BillingInputError("from/to: give timezone-aware times, e.g. 2026-11-01T00:00:00Z")
    if end <= start:
        raise BillingInputError(f"to: {end.isoformat()} must be after from {start.isoformat()}")
    if not quantum.is_finite() or quantum <= 0:
        raise BillingInputError(f"quantum: {quantum} must be a positive amount such as 0.01")


def compute_bill(
    shares: Iterable[BillableShare],
    pricing: Mapping[str, PoolPricing],
    gpu_cost_per_hour: Mapping[str, Decimal],
    *,
    start: datetime,
    end: datetime,
    group_by: GroupBy,
    quantum: Decimal = Decimal("0.01"),
) -> Bill:
    """Bill every share's time inside [start, end), grouped by `group_by`; see `Bill` for invariants.

    `pricing` maps a pool name to its prices over time; `gpu_cost_per_hour` maps a GPU model to the
    hourly price of a whole dedicated GPU. Raises `BillingInputError` for a bad period or group.
    """
    _validate_period(start, end, quantum)
    if group_by not in GROUP_BY_CHOICES:
        raise BillingInputError(f"groupBy: {group_by!r} is not one of {', '.join(GROUP_BY_CHOICES)}")
    pool_costs: dict[str, Fraction] = defaultdict(Fraction)
    dedicated_costs: dict[str, Fraction] = defaultdict(Fraction)
    unpriced: dict[str, set[str]] = defaultdict(set)
    seconds: dict[str, Fraction] = defaultdict(Fraction)
    share_counts: dict[str, int] = defaultdict(int)
    notes: set[str] = set()
    for share in shares:
        clipped = _clip(share, start, end)
        if clipped is None:
            continue
        key = share.group_key(group_by)
        cost, cost_notes = share_cost(share, pricing.get(share.pool), start, end)
        dedicated = dedicated_cost(share, gpu_cost_per_hour, start, end)
        pool_costs[key] += cost
        if dedicated is None:
            unpriced[key].add(share.gpu_model)
        else:
            dedicated_costs[key] += dedicated
        seconds[key] += _seconds(clipped[1] - clipped[0])
        share_counts[key] += 1
        notes |= cost_notes
    total, line_costs = allocate_rounded(pool_costs, quantum)
    priced = {key: amount for key, amount in dedicated_costs.items() if key not in unpriced}
    dedicated_total, line_dedicated = allocate_rounded(priced, quantum)
    every_unpriced = tuple(sorted(set().union(*unpriced.values())))
    if every_unpriced:
        notes.add(unpriced_note(every_unpriced))
    lines = tuple(
        BillLine(
            key=key,
            cost=line_costs[key],
            dedicated_cost=line_dedicated.get(key),
            savings=None if key in unpriced else line_dedicated[key] - line_costs[key],
            gpu_hours=_hours(seconds[key]),
            shares=share_counts[key],
            unpriced_models=tuple(sorted(unpriced.get(key, ()))),
        )
        for key in sorted(pool_costs)
    )
    return Bill(
        start=start,
        end=end,
        group_by=group_by,
        quantum=quantum,
        cost=total,
        dedicated_cost=None if every_unpriced else dedicated_total,
        savings=None if every_unpriced else dedicated_total - total,
        lines=lines,
        notes=tuple(sorted(notes)),
        unpriced_models=every_unpriced,
    )


def _hours(seconds: Fraction) -> Decimal:
    hours = seconds / SECONDS_PER_HOUR
    return (Decimal(hours.numerator) / Decimal(hours.denominator)).quantize(Decimal("0.0001"))
