"""Where the webhook gets each GPU pod's device-plugin index (`tfcommon.device_slots`, 0..127).

`SequencePodIndices` draws from the ledger's cycling Postgres sequence `pod_index_seq` (Alembic revision
`0005_pod_index_sequence`), so every webhook replica shares one counter and an index is reused only
after 127 other GPU pods were admitted. `CyclingPodIndices` is the same counter in memory, for a single
process without a ledger (benchmarks, tests). `preview` tells a dry run which index comes next without
taking it.
"""

from __future__ import annotations

from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine
from tfcommon.device_slots import POD_INDEX_COUNT

SEQUENCE = "pod_index_seq"
_NEXT = sa.text(f"SELECT nextval('{SEQUENCE}')")
_PREVIEW = sa.text(
    f"SELECT CASE WHEN is_called THEN (last_value + 1) % {POD_INDEX_COUNT} ELSE last_value END "
    f"FROM {SEQUENCE}"
)


class PodIndices(Protocol):
    """A shared cycling counter of pod indexes."""

    async def take(self) -> int:
        """The next index, consumed (a real admission)."""
        ...

    async def preview(self) -> int:
        """The index the next `take` would return, without consuming it (a dry run)."""
        ...


class SequencePodIndices:
    """Pod indexes from the ledger's `pod_index_seq`; safe across connections and processes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def take(self) -> int:
        async with self.engine.connect() as connection:
            return int(await connection.scalar(_NEXT) or 0)

    async def preview(self) -> int:
        async with self.engine.connect() as connection:
            return int(await connection.scalar(_PREVIEW) or 0)


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
