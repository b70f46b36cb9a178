"""The invariants a fault campaign checks, over data already read from the ledger, the bus and the API.

Pure: takes recorded operations, ledger rows and stream message ids; returns violations as sentences
(empty: the invariant held). No I/O, no clock; `tfctl.faults` gathers the data and calls these.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

Outcome = Literal["ok", "fail", "unknown"]
WorkloadKey = tuple[str, str, str]
"""(namespace, name, uid) of one submitted workload incarnation."""


DEFRAG_HOLD_NAMESPACE = "tfpool-defrag"
"""Where the defrag planner's capacity holds live: `hold-<namespace>-<name>` of the workload it moves."""


def defrag_hold_of(workload: WorkloadKey, names: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The (namespace, name) among `names` that `workload` is a defrag capacity hold for, if it is one."""
    namespace, name, _ = workload
    if namespace != DEFRAG_HOLD_NAMESPACE or not name.startswith("hold-"):
        return None
    held = name.removeprefix("hold-")
    return next((candidate for candidate in names if f"{candidate[0]}-{candidate[1]}"[:248] == held), None)


@dataclass(frozen=True)
class Operation:
    """One client call and its result: `ok` (acknowledged), `fail` (surely not done) or `unknown`.

    `kind` is `submit` or `release`; `state` is the scheduler's answer (`placed`, `pending`,
    `refused`) for an acknowledged submission, `released` for a release that closed an allocation.
    """

    kind: Literal["submit", "release"]
    workload: WorkloadKey
    outcome: Outcome
    invoked_at: float
    completed_at: float
    allocation_id: UUID | None = None
    state: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class HistoryRow:
    """One `allocation_history` row (in id order), with the workload its allocation belongs to."""

    id: int
    allocation_id: UUID
    gpu_uuid: str
    kind: str
    tflops_milli: int
    vram_bytes: int
    workload: WorkloadKey
    occurred_at: datetime
    reason: str | None = None
    """Why a share closed (`released`/`evicted` rows), e.g. `preempted by team-a/fault-00042`."""


@dataclass(frozen=True)
class GpuCapacity:
    """A GPU's capacity and the usage the ledger materialised in its row."""

    uuid: str
    capacity_tflops_milli: int
    capacity_vram_bytes: int
    used_tflops_milli: int
    used_vram_bytes: int


@dataclass(frozen=True)
class FinalStatus:
    """Where an acknowledged workload ended: the scheduler's state (None: the API does not know it)
    and the ledger's allocations of that workload (id and whether it is still active)."""

    state: str | None
    reason: str | None
    allocations: Mapping[UUID, bool]


def check_capacity(history: Sequence[HistoryRow], gpus: Mapping[str, GpuCapacity]) -> list[str]:
    """Replay the history in commit order: no GPU ever above capacity or below zero, and the replay
    ends at the usage each GPU row holds."""
    violations: list[str] = []
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in history:
        sign = {"opened": 1, "released": -1, "evicted": -1}.get(row.kind, 0)
        if not sign:
            continue
        usage = used[row.gpu_uuid]
        usage[0] += sign * row.tflops_milli
        usage[1] += sign * row.vram_bytes
        gpu = gpus.get(row.gpu_uuid)
        if gpu is None:
            violations.append(f"history row {row.id}: GPU {row.gpu_uuid} is not in the ledger")
            continue
        if usage[0] > gpu.capacity_tflops_milli or usage[1] > gpu.capacity_vram_bytes:
            violations.append(
                f"history row {row.id}: GPU {row.gpu_uuid} over capacity "
                f"({usage[0]}/{gpu.capacity_tflops_milli} mTFLOPS, {usage[1]}/{gpu.capacity_vram_bytes} B)"
            )
        if usage[0] < 0 or usage[1] < 0:
            violations.append(f"history row {row.id}: GPU {row.gpu_uuid} usage below zero {usage}")
    for gpu in gpus.values():
        replayed = used.get(gpu.uuid, [0, 0])
        if replayed != [gpu.used_tflops_milli, gpu.used_vram_bytes]:
            violations.append(
                f"GPU {gpu.uuid}: replaying the history gives {replayed}, the row holds "
                f"[{gpu.used_tflops_milli}, {gpu.used_vram_bytes}]"
            )
    return violations


def check_single_active(history: Sequence[HistoryRow]) -> list[str]:
    """No workload ever holds two open allocations, and no allocation share opens twice without
    closing in between or closes without being open."""
    violations: list[str] = []
    open_shares: set[tuple[UUID, str]] = set()
    open_by_workload: dict[WorkloadKey, Counter[UUID]] = defaultdict(Counter)
    for row in history:
        share = (row.allocation_id, row.gpu_uuid)
        holders = open_by_workload[row.workload]
        if row.kind == "opened":
            if share in open_shares:
                violations.append(f"history row {row.id}: share {share} opened twice")
            open_shares.add(share)
            holders[row.allocation_id] += 1
            if len(holders) > 1:
                violations.append(
                    f"history row {row.id}: workload {'/'.join(row.workload)} holds allocations "
                    f"{sorted(str(allocation) for allocation in holders)} at once"
                )
        elif row.kind in ("released", "evicted"):
            if share not in open_shares:
                violations.append(f"history row {row.id}: share {share} closed while not open")
            open_shares.discard(share)
            holders[row.allocation_id] -= 1
            if holders[row.allocation_id] <= 0:
                del holders[row.allocation_id]
    return violations


def check_submissions(
    operations: Sequence[Operation],
    finals: Mapping[WorkloadKey, FinalStatus],
    allocated_workloads: Iterable[WorkloadKey],
) -> list[str]:
    """Every acknowledged submission ends with exactly one allocation, an unschedulable verdict or
    evicted (its replacement is a new workload: `tfctl.history_check` follows it); acknowledged
    releases closed theirs; no allocation belongs to a workload (namespace and name) nobody submitted; an
    unacknowledged submission lands at most once."""
    violations: list[str] = []
    submitted = {op.workload for op in operations if op.kind == "submit"}
    acknowledged = {op.workload for op in operations if op.kind == "submit" and op.outcome == "ok"}
    released_ok = {op.workload for op in operations if op.kind == "release" and op.outcome == "ok"}
    release_tried = {op.workload for op in operations if op.kind == "release" and op.outcome != "fail"}
    submitted_names = {workload[:2] for workload in submitted}
    for workload in sorted(set(allocated_workloads) - submitted):
        # Else a replacement of an evicted one (new uid), or the defrag planner's hold for one.
        if workload[:2] not in submitted_names and defrag_hold_of(workload, submitted_names) is None:
            violations.append(f"workload {'/'.join(workload)} has an allocation nobody asked for")
    for workload in sorted(submitted):
        final = finals.get(workload)
        name = "/".join(workload)
        if final is None:
            if workload in acknowledged:
                violations.append(f"acknowledged workload {name} has no final status")
            continue
        if len(final.allocations) > 1:
            violations.append(f"workload {name} has {len(final.allocations)} allocations")
        active = [allocation for allocation, is_active in final.allocations.items() if is_active]
        if workload not in acknowledged:
            continue
        if final.state is None:
            violations.append(f"acknowledged workload {name} is unknown to the scheduler")
        elif final.state == "placed" and len(active) != 1:
            violations.append(f"workload {name} is placed but has {len(active)} active allocations")
        elif final.state in ("pending", "refused") and (final.allocations or not final.reason):
            violations.append(
                f"workload {name} is {final.state} with allocations {len(final.allocations)} and reason "
                f"{final.reason!r}: an unschedulable verdict needs a reason and no allocation"
            )
        elif final.state == "ended" and (active or workload not in release_tried):
            violations.append(f"workload {name} ended without a release or still holds {len(active)}")
        elif final.state == "evicted" and active:
            violations.append(f"workload {name} is evicted but still holds {len(active)} allocations")
        elif final.state not in ("placed", "pending", "refused", "ended", "evicted"):
            violations.append(f"workload {name} ended in unexpected state {final.state!r}")
        if workload in released_ok and (active or final.state not in ("ended", "evicted")):
            violations.append(f"workload {name} was released (acknowledged) but is {final.state}")
    return violations


def check_bus(
    outbox: Mapping[UUID, datetime | None],
    stream_message_ids: Sequence[str],
    consumer_backlogs: Mapping[str, tuple[int, int]],
) -> list[str]:
    """Every outbox event was published and is in the stream exactly once; no message id repeats in
    the stream; every consumer of allocation events has nothing left pending or unacknowledged."""
    violations: list[str] = []
    counts = Counter(stream_message_ids)
    for message_id, count in sorted(counts.items()):
        if count > 1:
            violations.append(f"message id {message_id} is in the stream {count} times")
    for event_id, published_at in sorted(outbox.items(), key=lambda item: str(item[0])):
        if published_at is None:
            violations.append(f"outbox event {event_id} was never published")
        if counts.get(str(event_id), 0) == 0:
            violations.append(f"outbox event {event_id} is missing from the stream")
    for consumer, (pending, unacknowledged) in sorted(consumer_backlogs.items()):
        if pending or unacknowledged:
            violations.append(
                f"consumer {consumer}: {pending} messages never delivered, {unacknowledged} unacknowledged"
            )
    return violations


def check_bill(
    expected_cost: str,
    billed_cost: str,
    expected_share_seconds: Mapping[str, float],
    billed_share_hours: Mapping[str, str],
) -> list[str]:
    """The bill conserves: its total is what the history's intervals cost, and each group's share-hours
    are the sum of its intervals' durations (to the bill's 0.0001 h rounding)."""
    violations: list[str] = []
    if expected_cost != billed_cost:
        violations.append(f"bill total {billed_cost} differs from the history's {expected_cost}")
    for key in sorted(set(expected_share_seconds) | set(billed_share_hours)):
        expected_hours = round(expected_share_seconds.get(key, 0.0) / 3600, 4)
        billed = float(billed_share_hours.get(key, "0"))
        if abs(billed - expected_hours) > 0.00011:
            violations.append(f"{key}: billed {billed} share-hours, the history holds {expected_hours}")
    return violations


def check_views_agree(
    ledger: set[UUID], scheduler: set[UUID], agents: set[UUID], agents_complete: bool
) -> list[str]:
    """The ledger's open allocations, the scheduler's and the node agents' are the same set."""
    violations: list[str] = []
    if not agents_complete:
        violations.append("not every node agent answered")
    for name, view in (("scheduler", scheduler), ("node agents", agents)):
        missing, extra = ledger - view, view - ledger
        if missing:
            violations.append(f"{name} miss {len(missing)} open allocations, e.g. {min(missing)}")
        if extra:
            violations.append(f"{name} hold {len(extra)} allocations the ledger closed, e.g. {min(extra)}")
    return violations
