"""Where the webhook gets each GPU pod's device-plugin index (`tfcommon.device_slots`, 0..127).

`SequencePodIndices` draws from the ledger's cycling Postgres sequence `pod_index_seq` (Alembic revision
`0005_pod_index_sequence`), so every webhook replica shares one counter; it draws a block of indexes per
round trip, ahead of need, so an admission does not wait for the database. `CyclingPodIndices` is the
same counter in memory, for a single process without a ledger (benchmarks, tests). `preview` tells a
dry run which index comes next without taking it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from tfcommon.device_slots import POD_INDEX_COUNT

SEQUENCE = "pod_index_seq"
_NEXT_BLOCK = sa.text(f"SELECT nextval('{SEQUENCE}') FROM generate_series(1, :count)")
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
    """Pod indexes from the ledger's `pod_index_seq`, drawn `block` at a time; safe across processes.

    `take` hands out drawn indexes from memory and draws the next block in the background once half
    of one is left, so an admission waits for the database only when a burst empties the block (or
    the first pod after a quiet spell). Indexes drawn more than `max_age_s` ago are dropped unused, so
    an index is handed out within `max_age_s` of being drawn and the sequence's cycle keeps spreading
    pods that start together over different indexes. A failed background draw is logged; the next
    `take` that finds no index draws itself and raises the database's error.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        block: int = 8,
        max_age_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.block = block
        self.max_age_s = max_age_s
        self.clock = clock
        self._drawn: deque[tuple[float, int]] = deque()
        self._drawing: asyncio.Task[None] | None = None

    async def take(self) -> int:
        while True:
            self._drop_stale()
            if self._drawn:
                index = self._drawn.popleft()[1]
                if len(self._drawn) <= self.block // 2:
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
            self._drawing = asyncio.get_running_loop().create_task(self._draw())
            self._drawing.add_done_callback(_log_failed_draw)
        return self._drawing

    async def _draw(self) -> None:
        async with self.engine.connect() as connection:
            drawn = (await connection.execute(_NEXT_BLOCK, {"count": self.block})).scalars().all()
        now = self.clock()
        self._drawn.extend((now, int(index)) for index in drawn)


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
