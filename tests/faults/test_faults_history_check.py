"""The history checker's figures: a clean history counts nothing; each kind of broken history is
counted where it belongs (lost, doubled, phantom) and the bill is checked against an exact oracle."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

from tfctl.fault_checks import HistoryRow, Operation, WorkloadKey
from tfctl.history_check import (
    BillPeriod,
    BusEvent,
    HistoryFigures,
    count_view_differences,
    fault_kind,
    history_figures,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)
POD: WorkloadKey = ("team-a", "fault-00001", "uid-1")
REPLACEMENT: WorkloadKey = ("team-a", "fault-00001", "uid-2")
GIB = 1024**3
QUANTUM = Decimal("0.000001")
BODY: dict[str, Any] = {
    "workload": {"namespace": POD[0], "name": POD[1], "uid": POD[2]},
    "request": {
        "pool": "default",
        "tflops_request_milli": 100_000,
        "tflops_limit_milli": 100_000,
        "vram_request_bytes": 16 * GIB,
        "vram_limit_bytes": 16 * GIB,
    },
}
ONE_HOUR_COST = Decimal("0.939960")
"""100 TFLOPS x $0.0069228 + 16 GiB x $0.01548 for one hour."""


def a_row(
    row_id: int,
    allocation: UUID,
    kind: str,
    at_s: float,
    workload: WorkloadKey = POD,
    reason: str | None = None,
) -> HistoryRow:
    return HistoryRow(
        row_id, allocation, "gpu-a", kind, 100_000, 16 * GIB, workload, T0 + timedelta(seconds=at_s), reason
    )


def placed(allocation: UUID, workload: WorkloadKey = POD, outcome: str = "ok") -> Operation:
    return Operation("submit", workload, outcome, 0.0, 0.1, allocation_id=allocation, state="placed")  # type: ignore[arg-type]


def released(allocation: UUID) -> Operation:
    return Operation("release", POD, "ok", 1.0, 1.1, allocation_id=allocation, state="released")


def an_event(
    sequence: int,
    subject: str,
    allocation: UUID | None,
    message_id: str | None = None,
    evicted_by: str | None = None,
) -> BusEvent:
    return BusEvent(sequence, subject, message_id or str(uuid4()), allocation, evicted_by)


def check(
    operations: Sequence[Operation],
    history: Sequence[HistoryRow],
    bus: Sequence[BusEvent],
    billed: Decimal = ONE_HOUR_COST,
    *,
    submissions: dict[WorkloadKey, dict[str, Any]] | None = None,
    pending: dict[tuple[str, str], str | None] | None = None,
    republished: frozenset[int] = frozenset(),
    final_states: dict[WorkloadKey, str | None] | None = None,
) -> HistoryFigures:
    return history_figures(
        operations,
        {POD: BODY} if submissions is None else submissions,
        history,
        bus,
        pending or {},
        BillPeriod(T0, T0 + timedelta(hours=2), QUANTUM, billed),
        republished=republished,
        final_states=final_states,
        faults=["sigkill scheduler", "sigkill webhook", "sigstop scheduler 5s", "restart nats"],
        self_exits=0,
    )


def a_released_hour() -> tuple[UUID, list[Operation], list[HistoryRow], list[BusEvent]]:
    allocation = uuid4()
    operations = [placed(allocation), released(allocation)]
    history = [a_row(1, allocation, "opened", 0), a_row(2, allocation, "released", 3600)]
    bus = [
        an_event(1, "tf.evt.allocation.created", allocation),
        an_event(2, "tf.evt.allocation.released", allocation),
    ]
    return allocation, operations, history, bus


def test_a_clean_history_counts_nothing_and_the_oracle_bills_exactly_what_was_held() -> None:
    _, operations, history, bus = a_released_hour()
    figures = check(operations, history, bus)
    assert (figures.acknowledged_operations, figures.lost, figures.doubled, figures.phantom) == (2, 0, 0, 0)
    assert figures.oracle_cost == "0.939960"
    assert figures.bill_difference == "0.000000"
    assert figures.fault_kinds == ["restart nats", "sigkill", "sigstop"]
    assert figures.examples == {}


def test_a_bill_that_differs_from_the_oracle_by_a_millionth_is_a_difference() -> None:
    _, operations, history, bus = a_released_hour()
    assert check(operations, history, bus, billed=ONE_HOUR_COST + QUANTUM).bill_difference == "0.000001"


def test_the_oracle_charges_the_protection_surcharge_only_while_protection_lasts() -> None:
    _, operations, history, bus = a_released_hour()
    protected = {**BODY, "eviction_protection_s": 1800}
    figures = check(operations, history, bus, submissions={POD: protected})
    # Half the hour at 1.2 times the price: 0.93996 x 1.1.
    assert figures.oracle_cost == "1.033956"


def test_an_acknowledged_placement_absent_from_the_ledger_is_lost() -> None:
    figures = check([placed(uuid4())], [], [], billed=Decimal(0))
    assert figures.lost == 1
    assert "never in the ledger" in figures.examples["lost"][0]


def test_an_acknowledged_release_that_left_the_allocation_open_is_lost() -> None:
    allocation = uuid4()
    history = [a_row(1, allocation, "opened", 0)]
    bus = [an_event(1, "tf.evt.allocation.created", allocation)]
    figures = check([placed(allocation), released(allocation)], history, bus, billed=2 * ONE_HOUR_COST)
    assert figures.lost == 1
    assert "still open" in figures.examples["lost"][0]


def test_a_release_committed_without_its_event_on_the_bus_is_lost() -> None:
    _, operations, history, bus = a_released_hour()
    figures = check(operations, history, bus[:1])
    assert figures.lost == 1
    assert "without its event on the bus" in figures.examples["lost"][0]


PREEMPTED = "preempted by team-b/fault-00002"


def an_hour_then_preempted(allocation: UUID) -> tuple[list[HistoryRow], list[BusEvent]]:
    """What the ledger outbox commits for a preemption: the release as evicted, with
    `tf.evt.allocation.released` and `tf.evt.pod.evicted` (`by: preemption`)."""
    history = [a_row(1, allocation, "opened", 0), a_row(2, allocation, "evicted", 3600, reason=PREEMPTED)]
    bus = [
        an_event(1, "tf.evt.allocation.created", allocation),
        an_event(2, "tf.evt.allocation.released", allocation),
        an_event(3, "tf.evt.pod.evicted", allocation, evicted_by="preemption"),
    ]
    return history, bus


def test_an_eviction_whose_replacement_never_came_is_lost() -> None:
    # The defect of issue 20: the victim released as evicted, its replacement never queued.
    allocation = uuid4()
    history, bus = an_hour_then_preempted(allocation)
    figures = check([placed(allocation)], history, bus)
    assert (figures.lost, figures.evictions, figures.preemptions) == (1, 1, 1)
    assert "never recreated" in figures.examples["lost"][0]


def test_an_eviction_without_its_pod_evicted_event_is_lost_though_the_release_was_announced() -> None:
    # The defect's other half: the release's outbox event went out, the direct publish of
    # tf.evt.pod.evicted failed. The replacement is pending, so only the event is missing.
    allocation = uuid4()
    history, bus = an_hour_then_preempted(allocation)
    figures = check([placed(allocation)], history, bus[:2], pending={POD[:2]: "0/4 GPUs fit"})
    assert figures.lost == 1
    assert "without its event on the bus (tf.evt.pod.evicted)" in figures.examples["lost"][0]
    assert figures.preemptions == 1, "the ledger's reason alone says it was a preemption"


def test_a_workload_the_scheduler_calls_evicted_with_no_eviction_in_the_ledger_is_lost() -> None:
    _, operations, history, bus = a_released_hour()
    figures = check(operations, history, bus, final_states={POD: "evicted"})
    assert figures.lost == 1
    assert "has no eviction in the ledger history" in figures.examples["lost"][0]
    assert check(operations, history, bus, final_states={POD: "ended"}).lost == 0


def test_an_eviction_announced_that_the_ledger_never_made_is_a_phantom() -> None:
    allocation, operations, history, bus = a_released_hour()
    figures = check(operations, history, [*bus, an_event(3, "tf.evt.pod.evicted", allocation)])
    assert figures.phantom == 1
    assert "which the ledger never evicted" in figures.examples["phantom"][0]
    assert (figures.evictions, figures.preemptions) == (0, 0)


def test_an_eviction_replaced_later_or_pending_now_loses_nothing() -> None:
    allocation, replacement = uuid4(), uuid4()
    history = [
        a_row(1, allocation, "opened", 0),
        a_row(2, allocation, "evicted", 1800, reason="defrag campaign drains node sim-node-0"),
        a_row(3, replacement, "opened", 1800, REPLACEMENT),
        a_row(4, replacement, "released", 3600, REPLACEMENT),
    ]
    bus = [
        an_event(1, "tf.evt.pod.evicted", allocation, evicted_by="defrag"),
        an_event(2, "tf.evt.allocation.released", replacement),
        an_event(3, "tf.evt.allocation.created", allocation),
        an_event(4, "tf.evt.allocation.created", replacement),
        an_event(5, "tf.evt.allocation.released", allocation),
    ]
    figures = check([placed(allocation)], history, bus, final_states={POD: "evicted"})
    assert (figures.lost, figures.doubled, figures.phantom, figures.bill_difference) == (0, 0, 0, "0.000000")
    assert (figures.evictions, figures.preemptions) == (1, 0)
    pending_replacement = check(
        [placed(allocation)],
        history[:2],
        [bus[0], bus[2], bus[4]],
        billed=ONE_HOUR_COST / 2,
        pending={POD[:2]: "0/4 GPUs fit"},
    )
    assert pending_replacement.lost == 0


def test_a_share_opened_twice_and_two_allocations_at_once_are_doubled() -> None:
    first, second = uuid4(), uuid4()
    history = [
        a_row(1, first, "opened", 0),
        a_row(2, first, "opened", 10),
        a_row(3, second, "opened", 20),
    ]
    bus = [an_event(1, "tf.evt.allocation.created", first), an_event(2, "tf.evt.allocation.created", second)]
    figures = check([placed(first)], history, bus, billed=Decimal(0))
    assert figures.doubled == 3
    assert "opened twice" in figures.examples["doubled"][0]
    assert any("holds 2 allocations at once" in line for line in figures.examples["doubled"])
    assert any("one submission landed as 2 allocations" in line for line in figures.examples["doubled"])


def test_a_message_stored_twice_is_doubled_unless_the_campaign_republished_it() -> None:
    allocation, operations, history, bus = a_released_hour()
    again = an_event(3, bus[1].subject, allocation, bus[1].message_id)
    assert check(operations, history, [*bus, again]).doubled == 1
    assert check(operations, history, [*bus, again], republished=frozenset({3})).doubled == 0


def test_an_allocation_announced_created_under_two_event_ids_is_doubled() -> None:
    allocation, operations, history, bus = a_released_hour()
    figures = check(operations, history, [*bus, an_event(3, "tf.evt.allocation.created", allocation)])
    assert figures.doubled == 1
    assert "under 2 event ids" in figures.examples["doubled"][0]


def test_allocations_nobody_asked_for_are_phantoms() -> None:
    stranger: WorkloadKey = ("team-b", "ghost", "uid-9")
    never_arrived, ghost = uuid4(), uuid4()
    history = [a_row(1, never_arrived, "opened", 0), a_row(2, ghost, "opened", 0, stranger)]
    bus = [
        an_event(1, "tf.evt.allocation.created", never_arrived),
        an_event(2, "tf.evt.allocation.created", ghost),
        an_event(3, "tf.evt.allocation.created", uuid4()),
    ]
    figures = check([placed(never_arrived, outcome="fail")], history, bus, billed=2 * ONE_HOUR_COST)
    assert figures.phantom == 3
    assert [line.split(",")[-1].split(":")[-1].strip() for line in figures.examples["phantom"]][:2] == [
        "whose submission never arrived",
        "which nobody submitted",
    ]
    assert "never opened" in figures.examples["phantom"][2]


def test_a_replacement_without_an_eviction_before_it_is_a_phantom() -> None:
    allocation = uuid4()
    history = [
        a_row(1, allocation, "opened", 0, REPLACEMENT),
        a_row(2, allocation, "released", 3600, REPLACEMENT),
    ]
    bus = [an_event(1, "tf.evt.allocation.released", allocation)]
    figures = check([], history, bus)
    assert figures.phantom == 1
    assert "no eviction before it" in figures.examples["phantom"][0]


def test_views_that_miss_or_keep_allocations_count_as_lost_and_phantom() -> None:
    held, closed = uuid4(), uuid4()
    figures = HistoryFigures()
    count_view_differences(figures, {held}, {held, closed}, set())
    assert (figures.lost, figures.phantom) == (1, 1)


def test_fault_kinds_drop_the_target_of_a_kill_a_pause_or_a_partition() -> None:
    assert fault_kind("sigkill node-agent-sim-node-1") == "sigkill"
    assert fault_kind("sigstop scheduler 5s") == "sigstop"
    assert fault_kind("republish after duplicate window") == "republish after duplicate window"
    assert fault_kind("partition node-agent-sim-node-2 5s") == "partition"
    assert fault_kind("partition scheduler from nats 5s") == "partition from nats"
    assert fault_kind("partition scheduler from postgres 5s") == "partition from postgres"


def test_a_pending_submission_its_client_released_is_not_lost() -> None:
    pending = Operation("submit", POD, "ok", 0.0, 0.1, allocation_id=uuid4(), state="pending")
    release = Operation(
        "release", POD, "ok", 1.0, 1.1, allocation_id=pending.allocation_id, state="already-released"
    )
    assert check([pending], [], [], billed=Decimal(0)).lost == 1
    assert check([pending, release], [], [], billed=Decimal(0)).lost == 0
    assert fault_kind("sigkill scheduler + pg_terminate_backend") == "overlapping"


def test_the_defrag_planners_hold_for_a_submitted_workload_is_priced_as_it_and_no_phantom() -> None:
    _, operations, history, bus = a_released_hour()
    hold: WorkloadKey = ("tfpool-defrag", f"hold-{POD[0]}-{POD[1]}", "hold-uid")
    stranger: WorkloadKey = ("tfpool-defrag", "hold-team-b-nobody", "hold-uid-2")
    held, other = uuid4(), uuid4()
    history += [a_row(3, held, "opened", 0, hold), a_row(4, held, "released", 3600, hold)]
    bus += [an_event(3, "tf.evt.allocation.released", held)]
    figures = check(operations, history, bus, billed=2 * ONE_HOUR_COST)
    assert (figures.phantom, figures.lost, figures.bill_difference) == (0, 0, "0.000000")
    history += [a_row(5, other, "opened", 0, stranger)]
    assert check(operations, history, bus, billed=2 * ONE_HOUR_COST).phantom == 1
