"""`SteppedClock`: a `now()` a test sets by hand, for services that take a clock."""

from __future__ import annotations

from datetime import datetime


class SteppedClock:
    """Returns `now` until the test assigns another time to it."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now
