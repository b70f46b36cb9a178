"""Pod indexes from the ledger's cycling sequence: distinct under concurrency, 0..127 then 0 again."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from tfcommon.device_slots import POD_INDEX_COUNT
from tfwebhook.pod_index import SequencePodIndices

pytestmark = pytest.mark.integration


async def test_concurrent_takes_get_distinct_indexes_and_the_counter_cycles(
    webhook_engine: AsyncEngine,
) -> None:
    async with webhook_engine.begin() as connection:
        await connection.execute(text("ALTER SEQUENCE pod_index_seq RESTART WITH 0"))
    indices = SequencePodIndices(webhook_engine)
    assert await indices.preview() == 0
    assert await indices.preview() == 0
    first_round = await asyncio.gather(*(indices.take() for _ in range(POD_INDEX_COUNT)))
    assert sorted(first_round) == list(range(POD_INDEX_COUNT))
    assert await indices.preview() == 0
    assert [await indices.take() for _ in range(3)] == [0, 1, 2]
    assert await indices.preview() == 3
