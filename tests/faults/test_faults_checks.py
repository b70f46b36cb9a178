"""The fault campaign's invariant checks: each one passes a clean history and names a broken one."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

from tfctl.fault_checks import (
    FinalStatus,
    GpuCapacity,
    HistoryRow,
    Operation,
    WorkloadKey,
    check_bill,
    check_bus,
    check_capacity,
    check_single_active,
    check_submissions,
    check_views_agree,
)

AT = datetime(2026, 12, 1, tzinfo=UTC)
GPU = GpuCapacity("gpu-a", 1000, 100, 0, 0)
POD: WorkloadKey = ("team-a", "pod-1", "uid-1")


def a_row(
    row_id: int, allocation: UUID, kind: str, tflops: int = 600, workload: WorkloadKey = POD
) -> HistoryRow:
    return HistoryRow(row_id, allocation, "gpu-a", kind, tflops, 10, workload, AT)


def a_submit(outcome: str = "ok", state: str | None = "placed", workload: WorkloadKey = POD) -> Operation:
    return Operation("submit", workload, outcome, 0.0, 1.0, state=state)  # type: ignore[arg-type]


def test_capacity_replay_accepts_a_history_that_stays_within_capacity() -> None:
    first, second = uuid4(), uuid4()
    history = [a_row(1, first, "opened"), a_row(2, first, "released"), a_row(3, second, "opened")]
    used = GpuCapacity("gpu-a", 1000, 100, 600, 10)
    assert check_capacity(history, {"gpu-a": used}) == []


def test_capacity_replay_names_the_row_that_went_over_capacity() -> None:
    history = [a_row(1, uuid4(), "opened"), a_row(2, uuid4(), "opened")]
    violations = check_capacity(history, {"gpu-a": GpuCapacity("gpu-a", 1000, 100, 1200, 20)})
    assert len(violations) == 1
    assert violations[0].startswith("history row 2: GPU gpu-a over capacity")


def test_capacity_replay_names_a_gpu_row_that_disagrees_with_its_history() -> None:
    violations = check_capacity([a_row(1, uuid4(), "opened")], {"gpu-a": GPU})
    assert violations == ["GPU gpu-a: replaying the history gives [600, 10], the row holds [0, 0]"]


def test_a_workload_holding_two_allocations_at_once_is_a_violation() -> None:
    history = [a_row(1, uuid4(), "opened", 100), a_row(2, uuid4(), "opened", 100)]
    violations = check_single_active(history)
    assert len(violations) == 1
    assert "team-a/pod-1/uid-1 holds allocations" in violations[0]


def test_a_workload_may_hold_a_new_allocation_after_closing_the_old_one() -> None:
    first, second = uuid4(), uuid4()
    history = [a_row(1, first, "opened"), a_row(2, first, "evicted"), a_row(3, second, "opened")]
    assert check_single_active(history) == []


def test_closing_a_share_twice_is_a_violation() -> None:
    allocation = uuid4()
    history = [
        a_row(1, allocation, "opened"),
        a_row(2, allocation, "released"),
        a_row(3, allocation, "released"),
    ]
    assert check_single_active(history) == [
        f"history row 3: share {(allocation, 'gpu-a')} closed while not open"
    ]


def test_an_acknowledged_placed_submission_with_its_allocation_passes() -> None:
    finals = {POD: FinalStatus("placed", None, {uuid4(): True})}
    assert check_submissions([a_submit()], finals, [POD]) == []


def test_an_acknowledged_submission_the_scheduler_forgot_is_lost() -> None:
    finals = {POD: FinalStatus(None, None, {})}
    assert check_submissions([a_submit()], finals, []) == [
        "acknowledged workload team-a/pod-1/uid-1 is unknown to the scheduler"
    ]


def test_a_pending_submission_needs_a_reason_and_no_allocation() -> None:
    finals = {POD: FinalStatus("pending", None, {})}
    violations = check_submissions([a_submit(state="pending")], finals, [])
    assert len(violations) == 1
    assert "unschedulable verdict needs a reason" in violations[0]


def test_an_allocation_nobody_asked_for_is_a_phantom() -> None:
    stranger: WorkloadKey = ("team-b", "ghost", "uid-9")
    assert check_submissions([], {}, [stranger]) == [
        "workload team-b/ghost/uid-9 has an allocation nobody asked for"
    ]


def test_an_unacknowledged_submission_may_land_but_only_once() -> None:
    once = {POD: FinalStatus(None, None, {uuid4(): True})}
    twice = {POD: FinalStatus(None, None, {uuid4(): True, uuid4(): True})}
    assert check_submissions([a_submit("unknown", None)], once, [POD]) == []
    assert check_submissions([a_submit("unknown", None)], twice, [POD]) == [
        "workload team-a/pod-1/uid-1 has 2 allocations"
    ]


def test_an_acknowledged_release_that_left_the_workload_placed_is_a_violation() -> None:
    release = Operation("release", POD, "ok", 2.0, 3.0, state="released")
    finals = {POD: FinalStatus("placed", None, {uuid4(): True})}
    assert check_submissions([a_submit(), release], finals, [POD]) == [
        "workload team-a/pod-1/uid-1 was released (acknowledged) but is placed"
    ]


def test_the_bus_check_passes_when_every_outbox_event_is_in_the_stream_once() -> None:
    event = uuid4()
    assert check_bus({event: AT}, [str(event), "other"], {"metrics-count-events": (0, 0)}) == []


def test_the_bus_check_names_duplicates_missing_events_and_backlogs() -> None:
    doubled, missing, unpublished = uuid4(), uuid4(), uuid4()
    violations = check_bus(
        {doubled: AT, missing: AT, unpublished: None},
        [str(doubled), str(doubled), str(unpublished)],
        {"metrics-count-events": (2, 1)},
    )
    assert violations == [
        f"message id {doubled} is in the stream 2 times",
        *sorted(
            [
                f"outbox event {missing} is missing from the stream",
                f"outbox event {unpublished} was never published",
            ],
            key=lambda line: line.split()[2],
        ),
        "consumer metrics-count-events: 2 messages never delivered, 1 unacknowledged",
    ]


def test_the_bill_conserves_when_total_and_share_hours_match_the_history() -> None:
    assert check_bill("1.500000", "1.500000", {"team-a/pod-1": 3600.0}, {"team-a/pod-1": "1.0000"}) == []


def test_a_bill_that_lost_time_or_money_is_a_violation() -> None:
    violations = check_bill("1.500000", "1.400000", {"team-a/pod-1": 7200.0}, {"team-a/pod-1": "1.0000"})
    assert violations == [
        "bill total 1.400000 differs from the history's 1.500000",
        "team-a/pod-1: billed 1.0 share-hours, the history holds 2.0",
    ]


def test_views_agree_only_when_the_scheduler_and_agents_hold_the_ledgers_open_allocations() -> None:
    held, closed = uuid4(), uuid4()
    assert check_views_agree({held}, {held}, {held}, agents_complete=True) == []
    assert check_views_agree({held}, {held, closed}, set(), agents_complete=False) == [
        "not every node agent answered",
        f"scheduler hold 1 allocations the ledger closed, e.g. {closed}",
        f"node agents miss 1 open allocations, e.g. {held}",
    ]


def test_the_defrag_planners_hold_for_a_submitted_workload_is_no_allocation_nobody_asked_for() -> None:
    hold: WorkloadKey = ("tfpool-defrag", "hold-team-a-pod-1", "hold-uid")
    stranger: WorkloadKey = ("tfpool-defrag", "hold-team-b-ghost", "hold-uid-2")
    finals = {POD: FinalStatus("placed", None, {uuid4(): True})}
    assert check_submissions([a_submit()], finals, [POD, hold]) == []
    assert check_submissions([a_submit()], finals, [POD, stranger]) == [
        "workload tfpool-defrag/hold-team-b-ghost/hold-uid-2 has an allocation nobody asked for"
    ]
