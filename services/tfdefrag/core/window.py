"""Campaign windows: which cron tick is due, in the pool's IANA time zone, across DST changes.

A tick's window is `[tick, tick + maxDuration]`. The anchor (`lastDefragTime`) is the tick of the last
campaign (or missed window); a tick at or before it never runs again, so a restart neither repeats
nor skips a campaign. When clocks fall back, a wall-clock time that occurs twice is one tick, not
two; when they spring forward, a tick inside the gap runs at the first valid time after it (croniter).
Pure: `now` and `anchor` are arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter


@dataclass(frozen=True)
class Window:
    """A campaign's window (UTC): it starts at the cron tick and must stop by `deadline`."""

    start: datetime
    deadline: datetime


@dataclass(frozen=True)
class WindowDecision:
    """`window` to run now (None: nothing due); `advance_anchor_to` set when a window was missed."""

    window: Window | None = None
    advance_anchor_to: datetime | None = None


def _is_repeated_wall_time(tick: datetime, zone: ZoneInfo) -> bool:
    """True for the second occurrence of a wall-clock time during a fall-back hour."""
    first = tick.replace(tzinfo=None).replace(tzinfo=zone, fold=0)
    return first.utcoffset() != tick.utcoffset()


def latest_tick(schedule: str, zone_name: str, now: datetime) -> datetime:
    """The most recent tick at or before `now`, in the zone, skipping repeated wall-clock times."""
    zone = ZoneInfo(zone_name)
    ticks = croniter(schedule, now.astimezone(zone) + timedelta(seconds=1))
    while True:
        tick: datetime = ticks.get_prev(datetime)
        if not _is_repeated_wall_time(tick, zone):
            return tick


def next_tick(schedule: str, zone_name: str, after: datetime) -> datetime:
    """The first tick strictly after `after`, skipping repeated wall-clock times."""
    zone = ZoneInfo(zone_name)
    ticks = croniter(schedule, after.astimezone(zone))
    while True:
        tick: datetime = ticks.get_next(datetime)
        if not _is_repeated_wall_time(tick, zone):
            return tick


def due_window(
    schedule: str,
    zone_name: str,
    max_duration: timedelta,
    anchor: datetime | None,
    now: datetime,
) -> WindowDecision:
    """Decide whether a cron campaign is due now (TensorFusion's rule, with the latest tick winning).

    Without an anchor, a tick within the last `max_duration` is still due.
    """
    effective_anchor = anchor if anchor is not None else now - max_duration - timedelta(minutes=1)
    # Aware arithmetic in a local zone is wall-clock arithmetic; durations are real time, so use UTC.
    tick = latest_tick(schedule, zone_name, now).astimezone(UTC)
    if tick <= effective_anchor:
        return WindowDecision()
    deadline = tick + max_duration
    if now <= deadline:
        return WindowDecision(window=Window(start=tick, deadline=deadline))
    return WindowDecision(advance_anchor_to=tick)
