"""The scheduler's intake: submissions that arrive while a batch is being placed wait together for the
next batch, so that one ledger transaction places many. Each caller still gets its own answer.

`Queued` is one waiting submission with the future its caller awaits; `SubmissionIntake` runs one
drainer at a time, hands it up to `max_batch` queued submissions per call of `place_batch`, and fails
the callers of a batch whose placing raised (the queue goes on), or every waiting caller when it is
cancelled (so that none waits forever on a stopped scheduler).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from uuid import UUID

from tfscheduler.submission import Submission, WorkloadStatus

PlaceBatch = Callable[[list["Queued"]], Awaitable[None]]


@dataclass(frozen=True)
class Queued:
    """One submission waiting for its batch, and the future its caller awaits."""

    submission: Submission
    cause: UUID | None
    future: asyncio.Future[WorkloadStatus]
    owner_uid: str | None = None


class SubmissionIntake:
    """Batches submissions for `place_batch`, which must settle every future of the batch it is given."""

    def __init__(self, place_batch: PlaceBatch, *, max_batch: int, name: str) -> None:
        self._place_batch = place_batch
        self.max_batch = max_batch
        self.name = name
        self._queue: list[Queued] = []
        self._drainer: asyncio.Task[None] | None = None

    async def submit(
        self, submission: Submission, cause: UUID | None, owner_uid: str | None
    ) -> WorkloadStatus:
        future: asyncio.Future[WorkloadStatus] = asyncio.get_running_loop().create_future()
        self._queue.append(Queued(submission, cause, future, owner_uid))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain(), name=f"{self.name}-submissions")
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                await self._place_batch(batch)
            except Exception as error:  # each caller gets the failure; the queue goes on
                fail(batch, error)
            except BaseException:  # cancelled (shutdown): no caller may wait forever
                fail(batch + self._queue, RuntimeError("the scheduler stopped before placing this workload"))
                self._queue = []
                raise


def fail(items: list[Queued], error: BaseException) -> None:
    """Give each waiting caller among `items` the error."""
    for item in items:
        if not item.future.done():
            item.future.set_exception(error)
