"""`tf_system_allocations_released_total` labels a release with a code from a closed set, never with
the event's free-text reason, so arbitrary reasons cannot multiply the series without limit."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tfcommon.events import AllocationReleased, WorkloadRef
from tfmetrics.core.release_reasons import RELEASE_REASON_CODES, release_reason_code
from tfmetrics.exporter import SeriesBoard
from tfmetrics.handlers import count_events_handler


class RecordingCounter:
    def __init__(self) -> None:
        self.added: list[dict[str, str]] = []

    def add(self, amount: int, attributes: dict[str, str]) -> None:
        self.added.append(attributes)


def released(reason: str, *, evicted: bool = False) -> AllocationReleased:
    return AllocationReleased(
        event_id=uuid4(),
        occurred_at=datetime(2026, 12, 4, tzinfo=UTC),
        allocation_id=uuid4(),
        workload=WorkloadRef(namespace="team-a", name="trainer-0"),
        node="node-1",
        reason=reason,
        evicted=evicted,
    )


@pytest.mark.parametrize(
    ("reason", "evicted", "code"),
    [
        ("pod deleted", False, "deleted"),
        ("pod gone while the scheduler was down", False, "deleted"),
        ("workload-deleted", False, "deleted"),
        ("pod succeeded", False, "completed"),
        ("pod failed", False, "completed"),
        ("binding to node-7 failed: node not found", False, "binding-failed"),
        ("worker stopped: exited with code 1", False, "worker-stopped"),
        ("defrag hold released: pod already gone", False, "defrag-hold"),
        ("preempted by team-b/urgent-0 (priority 90)", True, "evicted"),
        ("something nobody planned for", False, "other"),
    ],
)
def test_each_reason_the_services_release_with_has_its_code(reason: str, evicted: bool, code: str) -> None:
    assert release_reason_code(reason, evicted=evicted) == code


@given(reason=st.text(), evicted=st.booleans())
def test_any_reason_yields_a_code_of_the_closed_set(reason: str, evicted: bool) -> None:
    assert release_reason_code(reason, evicted=evicted) in RELEASE_REASON_CODES


def test_the_counter_sees_codes_only_however_many_distinct_reasons_arrive() -> None:
    counter = RecordingCounter()
    counters: dict[str, Any] = {"tf_system_allocations_released": counter}
    handle = count_events_handler(SeriesBoard(counters=counters))

    async def feed() -> None:
        for number in range(500):
            await handle(released(f"binding to node-{number} failed: {uuid4()}"))
            await handle(released(f"free text {number}"))

    asyncio.run(feed())

    values = {attributes["reason"] for attributes in counter.added}
    assert len(counter.added) == 1000
    assert values == {"binding-failed", "other"}
    assert all(set(attributes) == {"reason"} for attributes in counter.added)
