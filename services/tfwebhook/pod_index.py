"""Where the webhook gets each GPU pod's device-plugin index (`tfcommon.device_slots`, 0..127).

`SequencePodIndices` draws from the ledger's cycling Postgres sequence `pod_index_seq` (Alembic revision
`0005_pod_index_sequence`), so every webhook replica shares one counter; it draws a block of indexes per
round trip, ahead of need (larger blocks while admissions come fast), on a connection of the ledger's
pool that it keeps between draws, so an admission does not wait for the database. `CyclingPodIndices` is the
same counter in memory, for a single process without a ledger (benchmarks, tests). `preview` tells a
dry run which index comes next without taking it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from tfcommon.device_slots import POD_INDEX_COUNT

SEQUENCE = "pod_index_seq"
_NEXT_BLOCK_SQL = f"SELECT nextval('{SEQUENCE}') FROM generate_series(1, %s)"
_PREVIEW = sa.text(
    f"SELECT CASE WHEN is_called THEN (last_value + 1) % {POD_INDEX_COUNT} ELSE last_value END "
    f"FROM {SEQUENCE}"
)
log = logging.getLogger("tfwebhook.pod_index")


class PodIndices(Protocol):
    """A shared cycling counter of pod indexes."""

    async def take(self) -> int:
        """The next index, consumed (a real admission)."""
        ...

    async def preview(self) -> int:
        """The index the next `take` would return, without consuming it (a dry run)."""
        ...


class SequencePodIndices:
    """Pod indexes from the ledger's `pod_index_seq`, drawn a block at a time; safe across processes.

    `take` hands out drawn indexes from memory and draws the next block in the background once half
    of one is left, so an admission waits for the database only when a burst empties the block (or
    the first pod after a quiet spell). A block is `block` indexes; while admissions come fast (a
    draw starts within `max_age_s / 8` of the previous one) each draw takes twice the last, up to
    `max_block`, and once they slow down (over `max_age_s / 2` between draws) half, down to `block`:
    a busy webhook makes one round trip per up to `max_block` admissions instead of per `block / 2`.
    Indexes drawn more than `max_age_s` ago are dropped unused, so an index is handed out within
    `max_age_s` of being drawn and the sequence's cycle keeps spreading pods that start together
    over different indexes. A failed background draw is logged; the next `take` that finds no index
    draws itself and raises the database's error.

    Draws run on one connection of `engine`'s pool, kept checked out between draws and used through
    the driver in autocommit mode: a draw is then one round trip, without the pool's checkout ping,
    a transaction or the return's rollback (a fifth of the CPU time per draw). A draw that fails on
    it (Postgres restarted) discards it and is tried once more on a freshly checked-out one; a draw
    after `engine` was replaced checks out one of the new engine. `close` gives it back.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        block: int = 8,
        max_age_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        max_block: int = POD_INDEX_COUNT // 2,
    ) -> None:
        self.engine = engine
        self.block = block
        self.max_block = max(block, max_block)
        self.max_age_s = max_age_s
        self.clock = clock
        self.drawn_blocks = 0
        self._size = block
        self._last_draw_at: float | None = None
        self._drawn: deque[tuple[float, int]] = deque()
        self._drawing: asyncio.Task[None] | None = None
        self._held: tuple[AsyncEngine, AsyncConnection, Any] | None = None

    @property
    def next_block(self) -> int:
        """How many indexes the draw in flight, or the last one, takes."""
        return self._size

    async def take(self) -> int:
        while True:
            self._drop_stale()
            if self._drawn:
                index = self._drawn.popleft()[1]
                if len(self._drawn) <= self._size // 2:
                    _ = self._draw_ahead()  # in the background; the next `take` may await it
                return index
            await asyncio.shield(self._draw_ahead())

    async def preview(self) -> int:
        if self._drawing is not None and not self._drawing.done():
            await asyncio.wait([self._drawing])  # the block in flight comes before the sequence's next value
        self._drop_stale()
        if self._drawn:
            return self._drawn[0][1]
        async with self.engine.connect() as connection:
            return int(await connection.scalar(_PREVIEW) or 0)

    def _drop_stale(self) -> None:
        oldest = self.clock() - self.max_age_s
        while self._drawn and self._drawn[0][0] < oldest:
            self._drawn.popleft()

    def _draw_ahead(self) -> asyncio.Task[None]:
        """The draw in flight, or a new one; its failure is logged here and raised to whoever awaits it."""
        if self._drawing is None or self._drawing.done():
            self._size = self._sized(self.clock())
            self._drawing = asyncio.get_running_loop().create_task(self._draw(self._size))
            self._drawing.add_done_callback(_log_failed_draw)
        return self._drawing

    def _sized(self, now: float) -> int:
        """The size of a draw starting at `now`: doubled after a quick previous draw, halved after a slow
        one."""
        since, self._last_draw_at = (None if self._last_draw_at is None else now - self._last_draw_at), now
        if since is None:
            return self._size
        if since < self.max_age_s / 8:
            return min(self.max_block, self._size * 2)
        if since > self.max_age_s / 2:
            return max(self.block, self._size // 2)
        return self._size

    async def _draw(self, count: int) -> None:
        kept = self._held is not None and self._held[0] is self.engine
        try:
            drawn = await self._next_block(count)
        except Exception:
            if not kept:
                raise
            drawn = await self._next_block(count)  # the kept one broke (Postgres restarted): a fresh one
        self.drawn_blocks += 1
        now = self.clock()
        self._drawn.extend((now, index) for index in drawn)

    async def _next_block(self, count: int) -> list[int]:
        driver = await self._driver_connection()
        try:
            cursor = await driver.execute(_NEXT_BLOCK_SQL, (count,), prepare=True)
            return [int(row[0]) for row in await cursor.fetchall()]
        except BaseException:
            await self._release(invalidate=True)
            raise

    async def _driver_connection(self) -> Any:
        """The driver's connection kept for draws (psycopg, autocommit), checked out from `engine`."""
        if self._held is not None and self._held[0] is not self.engine:
            await self._release(invalidate=False)
        if self._held is None:
            connection = await self.engine.connect()
            try:
                driver: Any = (await connection.get_raw_connection()).driver_connection
                await driver.set_autocommit(True)
            except BaseException:
                await connection.close()
                raise
            self._held = (self.engine, connection, driver)
        return self._held[2]

    async def _release(self, *, invalidate: bool) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        _engine, connection, driver = held
        with contextlib.suppress(Exception):  # a broken connection: the pool discards it either way
            if invalidate:
                await connection.invalidate()
            else:
                await driver.set_autocommit(False)
            await connection.close()

    async def close(self) -> None:
        """Give the connection kept for draws back to the pool (on shutdown)."""
        if self._drawing is not None and not self._drawing.done():
            await asyncio.wait([self._drawing])
        await self._release(invalidate=False)


def _log_failed_draw(draw: asyncio.Task[None]) -> None:
    if not draw.cancelled() and (error := draw.exception()) is not None:
        log.warning("pod indexes not drawn: %s", error, extra={"event": "webhook.pod_index_draw_failed"})


class CyclingPodIndices:
    """Pod indexes from a counter in this process (no ledger): 0, 1, ..., 127, 0, ..."""

    def __init__(self, start: int = 0) -> None:
        self._next = start % POD_INDEX_COUNT

    async def take(self) -> int:
        index = self._next
        self._next = (index + 1) % POD_INDEX_COUNT
        return index

    async def preview(self) -> int:
        return self._next
