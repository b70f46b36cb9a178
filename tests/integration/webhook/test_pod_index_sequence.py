"""Pod indexes from the ledger's cycling sequence: distinct under concurrency, 0..127 then 0 again."""

from __future__ import annotations

import asyncio
import socket

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from tfcommon.device_slots import POD_INDEX_COUNT
from tfcommon.ledger.urls import ledger_url
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


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_admissions_take_indexes_from_a_drawn_block_without_waiting_for_the_database(
    webhook_engine: AsyncEngine, webhook_database_url: str
) -> None:
    async with webhook_engine.begin() as connection:
        await connection.execute(text("ALTER SEQUENCE pod_index_seq RESTART WITH 0"))
    indices = SequencePodIndices(webhook_engine, block=8)
    assert await indices.take() == 0
    unreachable = create_async_engine(
        ledger_url(webhook_database_url).set(host="127.0.0.1", port=_closed_port())
    )
    indices.engine = unreachable  # from here on, any round trip fails
    try:
        assert [await indices.take() for _ in range(7)] == [1, 2, 3, 4, 5, 6, 7]
        with pytest.raises(OperationalError):
            await indices.take()  # the block is used up: the draw's failure reaches the admission
    finally:
        await unreachable.dispose()


async def test_indexes_drawn_too_long_ago_are_not_handed_out(webhook_engine: AsyncEngine) -> None:
    async with webhook_engine.begin() as connection:
        await connection.execute(text("ALTER SEQUENCE pod_index_seq RESTART WITH 0"))
    now = [0.0]
    indices = SequencePodIndices(webhook_engine, block=8, max_age_s=2.0, clock=lambda: now[0])
    assert [await indices.take(), await indices.take()] == [0, 1]
    now[0] = 2.5
    assert await indices.preview() == 8
    assert await indices.take() == 8
