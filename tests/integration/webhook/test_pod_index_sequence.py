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
    try:
        assert await indices.preview() == 0
        assert await indices.preview() == 0
        first_round = await asyncio.gather(*(indices.take() for _ in range(POD_INDEX_COUNT)))
        assert sorted(first_round) == list(range(POD_INDEX_COUNT))
        assert await indices.preview() == 0
        assert [await indices.take() for _ in range(3)] == [0, 1, 2]
        assert await indices.preview() == 3
    finally:
        await indices.close()


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
        await indices.close()
        await unreachable.dispose()


async def test_indexes_drawn_too_long_ago_are_not_handed_out(webhook_engine: AsyncEngine) -> None:
    async with webhook_engine.begin() as connection:
        await connection.execute(text("ALTER SEQUENCE pod_index_seq RESTART WITH 0"))
    now = [0.0]
    indices = SequencePodIndices(webhook_engine, block=8, max_age_s=2.0, clock=lambda: now[0])
    try:
        assert [await indices.take(), await indices.take()] == [0, 1]
        now[0] = 2.5
        assert await indices.preview() == 8
        assert await indices.take() == 8
    finally:
        await indices.close()


async def test_a_busy_webhook_draws_larger_blocks_and_a_quiet_one_smaller_again(
    webhook_engine: AsyncEngine,
) -> None:
    now = [0.0]
    indices = SequencePodIndices(webhook_engine, block=8, max_age_s=2.0, clock=lambda: now[0])
    try:
        for _ in range(1000):  # a burst: every draw starts right after the previous one
            await indices.take()
        busy_draws = indices.drawn_blocks
        assert indices.next_block == POD_INDEX_COUNT // 2
        assert busy_draws <= 1000 // (POD_INDEX_COUNT // 2) + 6  # 8, 16, 32, then 64 at a time
        for _ in range(4):  # a quiet spell: a pod every 2.5 s, each finding its block stale
            now[0] += 2.5
            await indices.take()
        assert indices.next_block == 8
    finally:
        await indices.close()


async def test_a_draw_on_the_connection_postgres_ended_is_made_again_on_a_fresh_one(
    webhook_engine: AsyncEngine,
) -> None:
    async with webhook_engine.begin() as connection:
        await connection.execute(text("ALTER SEQUENCE pod_index_seq RESTART WITH 0"))
    now = [0.0]
    indices = SequencePodIndices(webhook_engine, block=8, max_age_s=2.0, clock=lambda: now[0])
    try:
        assert await indices.take() == 0
        async with webhook_engine.begin() as connection:  # Postgres ends the draws' connection
            ended = await connection.scalar(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND query LIKE '%pod_index_seq%'"
                )
            )
        assert ended == 1
        now[0] = 3.0  # the block is stale: the next take must draw
        assert [await indices.take() for _ in range(3)] == [8, 9, 10]
    finally:
        await indices.close()
