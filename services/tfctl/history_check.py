"""The fault campaign's history checker: seven figures from the recorded operations, the ledger and the bus.

Pure, in the manner of Jepsen's and etcd's robustness checkers: it takes what the clients recorded
(every call with its acknowledgement and the exact body sent), the ledger's `allocation_history` in id
order, every message in the events stream and the bill the metrics service answered, and returns:

- `acknowledged_operations`: calls answered `ok`;
- `lost`: acknowledged but absent: a placement never in the ledger, a pending workload neither placed,
  still pending nor released by its client, an allocation closed without `tf.evt.allocation.released`
  on the bus, an eviction without `tf.evt.pod.evicted` or without a replacement, a workload the
  scheduler calls `evicted` with no eviction in the ledger history, an acknowledged release that closed
  nothing;
- `doubled`: a share opened twice, a workload (namespace/name) holding two allocations at once, one
  submission landing as two allocations, an allocation announced created under two event ids, a
  message id stored twice in the stream (deliberate republishes excluded);
- `phantom`: present but never requested: an allocation of a workload nobody submitted, of a
  submission that surely never arrived (`fail`), a replacement without an eviction before it (the
  defrag planner's capacity holds, `tfpool-defrag/hold-<namespace>-<name>`, are priced as their
  workload and are no phantom while that workload was submitted), a
  `tf.evt.allocation.created` of an allocation the ledger never opened, a `tf.evt.pod.evicted` of an
  allocation the ledger never evicted;
- `bill_difference`: the billed total minus an oracle computed here, with exact rational arithmetic,
  from the intervals in the history priced with the request each client sent (not the ledger's copy)
  and the documented default prices; never with the project's billing code;
- `self_exits` and `fault_kinds`, passed through;
- `evictions` and `preemptions` (not failures: the load must make them happen): allocations the
  ledger closed as `evicted`, and those of them evicted by preemption (the history's reason
  `preempted by ...`, or `by: preemption` in their `tf.evt.pod.evicted`).

Every count comes with example sentences in `examples` (at most `EXAMPLES` per figure).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any
from uuid import UUID

from tfcommon.events import AllocationCreated, AllocationReleased, PodEvicted

from tfctl.fault_checks import HistoryRow, Operation, WorkloadKey, defrag_hold_of

EXAMPLES = 10
GIB = 1024**3
CLOSING_KINDS = ("released", "evicted")
RELEASED_SUBJECT = AllocationReleased.subject
EVICTED_SUBJECT = PodEvicted.subject
CREATED_SUBJECT = AllocationCreated.subject
PREEMPTED_REASON = "preempted by "
"""How the scheduler's preemption words an eviction in the history (`preempted by <ns>/<name>`)."""
Lineage = tuple[str, str]
"""(namespace, name): a workload and the replacements a controller (or the scheduler) recreates."""


@dataclass(frozen=True)
class OraclePrices:
    """Prices the oracle charges, per QoS: TensorFusion's CRD defaults unless a pool sets its own
    (`docs/billing.md`): $0.0069228 per TFLOPS-hour, $0.01548 per GiB-hour, limits above the
    requests at `limits_over_requests` of those, and `protection_ratio` while eviction protection
    lasts (never for `critical`)."""

    per_tflops_hour: Decimal = Decimal("0.0069228")
    per_vram_gib_hour: Decimal = Decimal("0.01548")
    limits_over_requests: Decimal = Decimal(1)
    protection_ratio: Decimal = Decimal("1.2")


@dataclass(frozen=True)
class BusEvent:
    """One message in the events stream: its stream sequence, subject, `Nats-Msg-Id` and the
    allocation it is about (None for events about none)."""

    sequence: int
    subject: str
    message_id: str
    allocation_id: UUID | None
    evicted_by: str | None = None
    """For `tf.evt.pod.evicted`: what evicted it (`defrag`, `preemption`, `drain`)."""


@dataclass(frozen=True)
class BillPeriod:
    """The period both bills cover, [start, end), the bill's rounding quantum and its total."""

    start: datetime
    end: datetime
    quantum: Decimal
    billed_cost: Decimal


@dataclass
class HistoryFigures:
    """The campaign's seven figures and, per figure, sentences naming what was counted."""

    acknowledged_operations: int = 0
    lost: int = 0
    doubled: int = 0
    phantom: int = 0
    bill_difference: str = "0"
    self_exits: int = 0
    fault_kinds: list[str] = field(default_factory=list)
    evictions: int = 0
    preemptions: int = 0
    oracle_cost: str = "0"
    examples: dict[str, list[str]] = field(default_factory=dict)

    def count(self, figure: str, sentence: str) -> None:
        setattr(self, figure, getattr(self, figure) + 1)
        found = self.examples.setdefault(figure, [])
        if len(found) < EXAMPLES:
            found.append(sentence)

    def as_dict(self) -> dict[str, Any]:
        return {
            "acknowledged_operations": self.acknowledged_operations,
            "lost": self.lost,
            "doubled": self.doubled,
            "phantom": self.phantom,
            "bill_difference": self.bill_difference,
            "self_exits": self.self_exits,
            "fault_kinds": list(self.fault_kinds),
            "evictions": self.evictions,
            "preemptions": self.preemptions,
            "oracle_cost": self.oracle_cost,
            "examples": {key: list(value) for key, value in self.examples.items()},
        }


@dataclass(frozen=True)
class _Interval:
    allocation_id: UUID
    gpu_uuid: str
    workload: WorkloadKey
    opened_at: datetime
    closed_at: datetime | None
    closed_by: str | None
    opened_row: int
    closed_row: int | None
    closed_because: str | None = None


def fault_kind(fault: str) -> str:
    """The kind of an injected fault's name: `sigkill scheduler` -> `sigkill`, `restart nats` ->
    `restart nats`, `partition scheduler from postgres 5s` -> `partition from postgres` (the target of
    a kill, pause or partition is not part of its kind); `a + b` -> `overlapping` (its parts count as
    their own kinds too)."""
    if " + " in fault:
        return "overlapping"
    words = fault.split()
    if len(words) >= 4 and words[0] == "partition" and words[2] == "from":
        return f"partition from {words[3]}"
    if words and words[0] in ("sigkill", "sigstop", "partition", "slow-link"):
        return words[0]
    return " ".join(word for word in words if not word[0].isdigit())


def history_figures(
    operations: Sequence[Operation],
    submissions: Mapping[WorkloadKey, Mapping[str, Any]],
    history: Sequence[HistoryRow],
    bus: Sequence[BusEvent],
    pending_now: Mapping[Lineage, str | None],
    bill: BillPeriod,
    *,
    republished: frozenset[int] = frozenset(),
    final_states: Mapping[WorkloadKey, str | None] | None = None,
    self_exits: int = 0,
    faults: Sequence[str] = (),
    prices: OraclePrices | None = None,
) -> HistoryFigures:
    """The seven figures of one campaign (see the module docstring), with its evictions and preemptions.

    `submissions` holds the body each client sent the scheduler, by workload; `pending_now` the
    workloads the scheduler holds pending at the end with their reasons; `republished` the stream
    sequences the campaign stored again on purpose (a republish after the duplicate window);
    `final_states` the scheduler's state of each submitted workload at the end (`placed`, `evicted`...).
    """
    figures = HistoryFigures(
        acknowledged_operations=sum(1 for op in operations if op.outcome == "ok"),
        self_exits=self_exits,
        fault_kinds=sorted(
            {fault_kind(part) for fault in faults for part in fault.split(" + ")}
            | {fault_kind(fault) for fault in faults}
        ),
    )
    intervals, replay_doubles = _replay(history)
    for sentence in replay_doubles:
        figures.count("doubled", sentence)
    _count_lost(figures, operations, intervals, bus, pending_now)
    _count_evictions(figures, operations, intervals, bus, final_states or {})
    _count_doubled(figures, intervals, bus, republished)
    _count_phantoms(figures, operations, submissions, intervals, bus)
    oracle = bill_oracle(intervals, submissions, bill, prices or OraclePrices())
    figures.oracle_cost = str(oracle)
    figures.bill_difference = str(bill.billed_cost - oracle)
    return figures


def _replay(history: Sequence[HistoryRow]) -> tuple[list[_Interval], list[str]]:
    """Each share's open intervals in commit order, and the rows that break open/close pairing."""
    intervals: list[_Interval] = []
    broken: list[str] = []
    opened: dict[tuple[UUID, str], HistoryRow] = {}
    for row in sorted(history, key=lambda row: row.id):
        share = (row.allocation_id, row.gpu_uuid)
        if row.kind == "opened":
            if share in opened:
                broken.append(f"history row {row.id}: share {share[0]} on {share[1]} opened twice")
                continue
            opened[share] = row
        elif row.kind in CLOSING_KINDS:
            start = opened.pop(share, None)
            if start is None:
                broken.append(f"history row {row.id}: share {share[0]} on {share[1]} closed while not open")
                continue
            intervals.append(
                _Interval(
                    row.allocation_id,
                    row.gpu_uuid,
                    start.workload,
                    start.occurred_at,
                    row.occurred_at,
                    row.kind,
                    start.id,
                    row.id,
                    row.reason,
                )
            )
    for share, start in opened.items():
        intervals.append(
            _Interval(share[0], share[1], start.workload, start.occurred_at, None, None, start.id, None)
        )
    intervals.sort(key=lambda interval: interval.opened_row)
    return intervals, broken


def _announced(bus: Sequence[BusEvent]) -> dict[UUID, set[str]]:
    """Per allocation, the subjects of the events about it on the bus."""
    subjects: dict[UUID, set[str]] = defaultdict(set)
    for event in bus:
        if event.allocation_id is not None:
            subjects[event.allocation_id].add(event.subject)
    return subjects


def _count_lost(
    figures: HistoryFigures,
    operations: Sequence[Operation],
    intervals: Sequence[_Interval],
    bus: Sequence[BusEvent],
    pending_now: Mapping[Lineage, str | None],
) -> None:
    by_allocation: dict[UUID, list[_Interval]] = defaultdict(list)
    by_lineage: dict[Lineage, list[_Interval]] = defaultdict(list)
    for interval in intervals:
        by_allocation[interval.allocation_id].append(interval)
        by_lineage[interval.workload[:2]].append(interval)
    announced = _announced(bus)
    release_tried = {op.workload for op in operations if op.kind == "release" and op.outcome != "fail"}
    for op in operations:
        if op.outcome != "ok":
            continue
        name = "/".join(op.workload)
        if op.kind == "submit" and op.state == "placed":
            if op.allocation_id not in by_allocation:
                figures.count(
                    "lost", f"{name}: acknowledged placed as {op.allocation_id}, never in the ledger"
                )
        elif op.kind == "submit" and op.state == "pending":
            ended = by_lineage.get(op.workload[:2]) or op.workload[:2] in pending_now
            if not ended and op.workload not in release_tried:
                figures.count(
                    "lost", f"{name}: acknowledged pending, neither placed, pending nor released any more"
                )
        elif op.kind == "release" and op.state == "released":
            shares = by_allocation.get(op.allocation_id) if op.allocation_id is not None else None
            if not shares or any(share.closed_at is None for share in shares):
                figures.count("lost", f"{name}: release of {op.allocation_id} acknowledged, still open")
    for lineage, held in by_lineage.items():
        closed = {interval.allocation_id: interval for interval in held if interval.closed_by is not None}
        for allocation_id, interval in closed.items():  # one count per allocation, not per GPU share
            subjects = announced.get(allocation_id, set())
            name = "/".join(lineage)
            if RELEASED_SUBJECT not in subjects:
                figures.count(
                    "lost",
                    f"{name}: allocation {allocation_id} {interval.closed_by} in the ledger without its "
                    f"event on the bus ({RELEASED_SUBJECT})",
                )
            if interval.closed_by != "evicted":
                continue
            if EVICTED_SUBJECT not in subjects:
                figures.count(
                    "lost",
                    f"{name}: allocation {allocation_id} evicted in the ledger (history row "
                    f"{interval.closed_row}) without its event on the bus ({EVICTED_SUBJECT})",
                )
            if not _replaced(interval, held, lineage, pending_now):
                figures.count(
                    "lost",
                    f"{name}: allocation {allocation_id} evicted (history row {interval.closed_row}) and "
                    "never recreated: no replacement placed after it and none pending",
                )


def _count_evictions(
    figures: HistoryFigures,
    operations: Sequence[Operation],
    intervals: Sequence[_Interval],
    bus: Sequence[BusEvent],
    final_states: Mapping[WorkloadKey, str | None],
) -> None:
    """Evictions and preemptions, an acknowledged workload the scheduler calls `evicted` with no
    eviction in the ledger (lost), and an eviction announced that the ledger never made (phantom)."""
    evicted = {interval.allocation_id: interval for interval in intervals if interval.closed_by == "evicted"}
    preempted_on_bus = {
        event.allocation_id
        for event in bus
        if event.subject == EVICTED_SUBJECT and event.evicted_by == "preemption"
    }
    figures.evictions = len(evicted)
    figures.preemptions = sum(
        1
        for allocation_id, interval in evicted.items()
        if allocation_id in preempted_on_bus or (interval.closed_because or "").startswith(PREEMPTED_REASON)
    )
    for op in operations:
        said = final_states.get(op.workload)
        if op.kind != "submit" or op.outcome != "ok" or said != "evicted" or op.allocation_id is None:
            continue
        if op.allocation_id not in evicted:
            figures.count(
                "lost",
                f"{'/'.join(op.workload)}: the scheduler says evicted, but its allocation "
                f"{op.allocation_id} has no eviction in the ledger history",
            )
    for event in bus:
        announced = event.subject == EVICTED_SUBJECT and event.allocation_id is not None
        if announced and event.allocation_id not in evicted:
            figures.count(
                "phantom",
                f"event {event.message_id} announces the eviction of allocation {event.allocation_id}, "
                "which the ledger never evicted",
            )


def _replaced(
    evicted: _Interval, held: Sequence[_Interval], lineage: Lineage, pending_now: Mapping[Lineage, str | None]
) -> bool:
    """An evicted workload's replacement was placed after it, or waits now with a reason."""
    assert evicted.closed_row is not None
    later = any(
        other.allocation_id != evicted.allocation_id and other.opened_row > evicted.closed_row
        for other in held
    )
    return later or lineage in pending_now


def _count_doubled(
    figures: HistoryFigures,
    intervals: Sequence[_Interval],
    bus: Sequence[BusEvent],
    republished: frozenset[int],
) -> None:
    events: list[tuple[int, int, _Interval]] = []
    for interval in intervals:
        events.append((interval.opened_row, 1, interval))
        if interval.closed_row is not None:
            events.append((interval.closed_row, -1, interval))
    holding: dict[Lineage, Counter[UUID]] = defaultdict(Counter)
    for row, change, interval in sorted(events, key=lambda item: (item[0], item[1])):
        held = holding[interval.workload[:2]]
        held[interval.allocation_id] += change
        if held[interval.allocation_id] <= 0:
            del held[interval.allocation_id]
        if change > 0 and len(held) > 1:
            figures.count(
                "doubled",
                f"history row {row}: {'/'.join(interval.workload[:2])} holds {len(held)} allocations at once",
            )
    allocations: dict[WorkloadKey, set[UUID]] = defaultdict(set)
    openings: Counter[UUID] = Counter()
    for interval in intervals:
        allocations[interval.workload].add(interval.allocation_id)
    for allocation_id in {interval.allocation_id for interval in intervals}:
        openings[allocation_id] = len(
            {interval.opened_row for interval in intervals if interval.allocation_id == allocation_id}
        )
    for workload, held_ids in sorted(allocations.items()):
        if len(held_ids) > 1:
            figures.count(
                "doubled", f"{'/'.join(workload)}: one submission landed as {len(held_ids)} allocations"
            )
    stored = Counter(event.message_id for event in bus if event.sequence not in republished)
    for message_id, count in sorted(stored.items()):
        if count > 1:
            figures.count("doubled", f"message id {message_id} stored {count} times in the stream")
    created: dict[UUID, set[str]] = defaultdict(set)
    for event in bus:
        if event.subject == CREATED_SUBJECT and event.allocation_id is not None:
            created[event.allocation_id].add(event.message_id)
    for allocation_id, ids in sorted(created.items(), key=lambda item: str(item[0])):
        gpus = {interval.gpu_uuid for interval in intervals if interval.allocation_id == allocation_id}
        if len(ids) > max(openings.get(allocation_id, 0) // max(len(gpus), 1), 1):
            figures.count(
                "doubled", f"allocation {allocation_id} announced created under {len(ids)} event ids"
            )


def _count_phantoms(
    figures: HistoryFigures,
    operations: Sequence[Operation],
    submissions: Mapping[WorkloadKey, Mapping[str, Any]],
    intervals: Sequence[_Interval],
    bus: Sequence[BusEvent],
) -> None:
    lineages = {workload[:2] for workload in submissions}
    outcomes: dict[WorkloadKey, set[str]] = defaultdict(set)
    for op in operations:
        if op.kind == "submit":
            outcomes[op.workload].add(op.outcome)
    first_eviction: dict[Lineage, int] = {}
    for interval in intervals:
        if interval.closed_by == "evicted" and interval.closed_row is not None:
            lineage = interval.workload[:2]
            first_eviction[lineage] = min(
                first_eviction.get(lineage, interval.closed_row), interval.closed_row
            )
    seen: set[UUID] = set()
    for interval in intervals:
        if interval.allocation_id in seen:
            continue
        seen.add(interval.allocation_id)
        workload, lineage = interval.workload, interval.workload[:2]
        name = "/".join(workload)
        if defrag_hold_of(workload, lineages) is not None:
            continue  # the defrag planner's capacity hold for a submitted workload's replacement
        if lineage not in lineages:
            figures.count("phantom", f"allocation {interval.allocation_id} of {name}, which nobody submitted")
        elif workload in submissions:
            if outcomes.get(workload) == {"fail"}:
                figures.count(
                    "phantom",
                    f"allocation {interval.allocation_id} of {name}, whose submission never arrived",
                )
        elif first_eviction.get(lineage, interval.opened_row) >= interval.opened_row:
            figures.count(
                "phantom",
                f"allocation {interval.allocation_id} of {name}: a replacement with no eviction before it",
            )
    opened = {interval.allocation_id for interval in intervals}
    for event in bus:
        created = event.subject == CREATED_SUBJECT and event.allocation_id is not None
        if created and event.allocation_id not in opened:
            figures.count(
                "phantom",
                f"event {event.message_id} announces allocation {event.allocation_id}, never opened",
            )


def _seconds(delta: timedelta) -> Fraction:
    return Fraction((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds, 1_000_000)


def _request_of(
    workload: WorkloadKey, submissions: Mapping[WorkloadKey, Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    body = submissions.get(workload)
    if body is not None:
        return body
    lineage = defrag_hold_of(workload, {key[:2] for key in submissions}) or workload[:2]
    found = next((body for key, body in submissions.items() if key[:2] == lineage), None)
    if found is not None and lineage != workload[:2]:
        return {**found, "eviction_protection_s": 0}  # a hold is never protected
    return found


def bill_oracle(
    intervals: Sequence[_Interval],
    submissions: Mapping[WorkloadKey, Mapping[str, Any]],
    bill: BillPeriod,
    prices: OraclePrices,
) -> Decimal:
    """What the intervals cost over the bill's period, priced with the request the client sent for
    each workload (a replacement: its original's), rounded half up once to the bill's quantum."""
    total = Fraction(0)
    for interval in intervals:
        body = _request_of(interval.workload, submissions)
        if body is None:
            continue  # a phantom: counted there; nobody asked for it, so no price is known
        request = body["request"]
        held_from = max(interval.opened_at, bill.start)
        held_until = bill.end if interval.closed_at is None else min(interval.closed_at, bill.end)
        if held_until <= held_from:
            continue
        tflops = Fraction(request["tflops_request_milli"], 1000)
        vram = Fraction(request["vram_request_bytes"], GIB)
        above_tflops = Fraction(max(request["tflops_limit_milli"] - request["tflops_request_milli"], 0), 1000)
        above_vram = Fraction(max(request["vram_limit_bytes"] - request["vram_request_bytes"], 0), GIB)
        per_tflops, per_vram = Fraction(prices.per_tflops_hour), Fraction(prices.per_vram_gib_hour)
        ratio = Fraction(prices.limits_over_requests)
        per_hour = (
            tflops * per_tflops
            + vram * per_vram
            + (above_tflops * per_tflops + above_vram * per_vram) * ratio
        )
        seconds = _seconds(held_until - held_from)
        protection_s = int(body.get("eviction_protection_s") or 0)
        if protection_s and request.get("qos", "medium") != "critical":
            protected_end = min(held_until, interval.opened_at + timedelta(seconds=protection_s))
            if protected_end > held_from:
                seconds += _seconds(protected_end - held_from) * (Fraction(prices.protection_ratio) - 1)
        total += per_hour * seconds / 3600
    units = math.floor(total / Fraction(bill.quantum) + Fraction(1, 2))
    return (Decimal(units) * bill.quantum).quantize(bill.quantum)


def count_view_differences(
    figures: HistoryFigures, ledger: set[UUID], scheduler: set[UUID], agents: set[UUID]
) -> None:
    """After convergence: an open allocation the scheduler or an agent lacks is lost to it; one they
    hold that the ledger closed (or never had) is a phantom there."""
    for name, view in (("the scheduler", scheduler), ("the node agents", agents)):
        for allocation_id in sorted(ledger - view, key=str):
            figures.count("lost", f"open allocation {allocation_id} missing from {name}")
        for allocation_id in sorted(view - ledger, key=str):
            figures.count("phantom", f"{name} hold allocation {allocation_id}, which the ledger does not")
