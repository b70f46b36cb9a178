"""The `enabled-replicas` slots on Postgres: the pod uid the scheduler records, the held slots with their
age, and a claim that frees the slots found stale in the same transaction (`tfcommon.ledger.takeover`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from tfcommon.ledger.takeover import TakeoverLedger
from tfcommon.ledger.urls import ledger_url

pytestmark = pytest.mark.integration


@pytest.fixture
async def takeovers(ledger_database_url: str) -> AsyncIterator[TakeoverLedger]:
    engine: AsyncEngine = create_async_engine(ledger_url(ledger_database_url))
    try:
        yield TakeoverLedger(engine)
    finally:
        await engine.dispose()


def a_workload() -> str:
    return f"team/ReplicaSet/llm-{uuid4().hex[:8]}/hash"


async def test_held_slots_carry_the_pod_uid_once_the_scheduler_recorded_it(takeovers: TakeoverLedger) -> None:
    workload = a_workload()
    assert await takeovers.claim("slot-a", workload, 2)
    assert await takeovers.claim("slot-b", workload, 2)

    assert await takeovers.record_pod("slot-a", "pod-uid-a") is True
    assert await takeovers.record_pod("slot-a", "another-uid") is False
    assert await takeovers.record_pod("no-such-slot", "pod-uid") is False

    held = {slot.slot_id: slot for slot in await takeovers.held_slots(workload)}
    assert set(held) == {"slot-a", "slot-b"}
    assert held["slot-a"].pod_uid == "pod-uid-a"
    assert held["slot-b"].pod_uid is None
    assert all(0 <= slot.claimed_age_s < 60 for slot in held.values())
    assert await takeovers.held_slots(a_workload()) == []


async def test_a_claim_of_a_full_workload_is_granted_once_its_stale_slot_is_freed(
    takeovers: TakeoverLedger,
) -> None:
    workload, other = a_workload(), a_workload()
    assert await takeovers.claim("old", workload, 1)
    assert await takeovers.claim("theirs", other, 1)
    assert not await takeovers.claim("replacement", workload, 1)

    assert not await takeovers.claim("replacement", workload, 1, stale={"theirs"})
    assert await takeovers.held(other) == 1, "a stale id of another workload is never freed"
    assert await takeovers.claim("replacement", workload, 1, stale={"old"})

    assert [slot.slot_id for slot in await takeovers.held_slots(workload)] == ["replacement"]
    assert await takeovers.claim("replacement", workload, 1, stale={"replacement"}), "a reinvoked admission"
    assert await takeovers.held(workload) == 1
