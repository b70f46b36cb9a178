"""The workload store applies the lifecycle table in SQL (real Postgres): a transition moves a workload
only from the states the table allows, so a late placement or a second scheduler cannot bring a closed
workload back."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from scheduler_builders import a_submission
from tfcommon.ledger.records import Reserved
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation
from tfscheduler.core.lifecycle import Transition
from tfscheduler.core.view import allocation_id_for
from tfscheduler.workloads import WorkloadStore, mark_placed

pytestmark = pytest.mark.integration


async def test_a_transition_moves_a_workload_only_from_the_states_the_table_allows(ledger: SqlLedger) -> None:
    store = WorkloadStore(ledger.engine)
    now = datetime.now(UTC)
    submission = a_submission()
    allocation_id = allocation_id_for(submission.workload)
    assert (await store.insert(allocation_id, submission, now)).state == "pending"

    assert await store.transition(allocation_id, Transition.WAIT, "no GPU free", now)
    assert await store.transition(allocation_id, Transition.PLACE, None, now)
    assert not await store.transition(allocation_id, Transition.WAIT, "late verdict", now)
    assert not await store.transition(allocation_id, Transition.REFUSE, "late refusal", now)
    assert await store.transition(allocation_id, Transition.END, "completed", now)
    for late in (Transition.PLACE, Transition.WAIT, Transition.EVICT, Transition.END):
        assert not await store.transition(allocation_id, late, "late", now), late

    stored = await store.get(allocation_id)
    assert stored is not None
    assert (stored.state, stored.reason) == ("ended", "completed")


async def test_marking_a_batch_placed_leaves_a_closed_workload_closed(ledger: SqlLedger) -> None:
    store = WorkloadStore(ledger.engine)
    now = datetime.now(UTC)
    node, gpus = await a_node_with_gpus(ledger, gpus=1)
    ended, waiting = a_submission(), a_submission()
    ended_id, waiting_id = allocation_id_for(ended.workload), allocation_id_for(waiting.workload)
    await store.insert_many([(ended_id, ended), (waiting_id, waiting)], now)
    for allocation_id in (ended_id, waiting_id):
        request = replace(a_reservation(node, {gpus[0]: (10_000, GIB)}), allocation_id=allocation_id)
        assert isinstance(await ledger.reserve(request), Reserved)
    assert await store.transition(ended_id, Transition.END, "deleted", now)

    async with ledger.engine.begin() as connection:
        result = await connection.execute(mark_placed([ended_id, waiting_id], now))
    assert result.rowcount == 1

    states = {key: (w.state, w.reason) for key, w in (await store.by_ids([ended_id, waiting_id])).items()}
    assert states == {ended_id: ("ended", "deleted"), waiting_id: ("placed", None)}
