"""A pool's `spec.nodeManagerConfig.nodeCompaction` (TensorFusion names and defaults), validated.

`parse_node_compaction(pool, raw)` never raises: each invalid value becomes a problem that names the
field and the fix, and any problem turns defragmentation off for that pool (compaction keeps its
period). Pure: no I/O beyond reading the time-zone database, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

FIELD_PREFIX = "spec.nodeManagerConfig.nodeCompaction"
DEFAULT_PERIOD = timedelta(minutes=5)
DEFAULT_SCHEDULE = "0 3 * * *"
DEFAULT_MAX_DURATION = timedelta(hours=2)
DEFAULT_THRESHOLD_PERCENT = 40
DEFAULT_SOURCE_NODE_MARKER_TTL = timedelta(minutes=30)
NEVER = "never"

_DURATION_PART = re.compile(r"(\d+)(h|m|s)")
_UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}

_Problem = Callable[[str, object, str], None]


@dataclass(frozen=True)
class DefragConfig:
    """`nodeCompaction.defrag`. `timezone` is required when enabled; a TTL of None means never."""

    enabled: bool = False
    schedule: str = DEFAULT_SCHEDULE
    timezone: str | None = None
    max_duration: timedelta = DEFAULT_MAX_DURATION
    utilization_threshold_percent: int = DEFAULT_THRESHOLD_PERCENT
    source_node_marker_ttl: timedelta | None = DEFAULT_SOURCE_NODE_MARKER_TTL
    evicted_pod_marker_ttl: timedelta | None = None


@dataclass(frozen=True)
class CompactionConfig:
    """`nodeCompaction` of one pool. `problems` non-empty means defrag is off until they are fixed."""

    pool: str
    period: timedelta = DEFAULT_PERIOD
    defrag: DefragConfig = field(default_factory=DefragConfig)
    problems: tuple[str, ...] = ()

    @property
    def defrag_enabled(self) -> bool:
        return self.defrag.enabled and not self.problems


def parse_duration(text: str) -> timedelta | None:
    """A Go-style duration such as `5m`, `2h`, `1h30m`, `90s`; None when it is not one."""
    text = text.strip()
    if not text or _DURATION_PART.sub("", text):
        return None
    seconds = sum(int(amount) * _UNIT_SECONDS[unit] for amount, unit in _DURATION_PART.findall(text))
    return timedelta(seconds=seconds)


def parse_node_compaction(pool: str, raw: object) -> CompactionConfig:
    """Validate a pool's raw `nodeCompaction` mapping (None: every default)."""
    problems: list[str] = []

    def problem(name: str, value: object, fix: str) -> None:
        problems.append(f"pool {pool}: {FIELD_PREFIX}.{name} is {value!r}; {fix}")

    section = _mapping(raw, "", problem)
    period = DEFAULT_PERIOD
    if "period" in section:
        parsed = _duration(section["period"])
        if parsed is None or parsed <= timedelta(0):
            problem("period", section["period"], "use a positive duration such as 5m or 1h")
        else:
            period = parsed
    defrag_raw = _mapping(section.get("defrag"), "defrag", problem)
    defrag = _parse_defrag(defrag_raw, problem)
    return CompactionConfig(pool=pool, period=period, defrag=defrag, problems=tuple(problems))


def _parse_defrag(section: Mapping[str, object], problem: _Problem) -> DefragConfig:
    known = {
        "enabled",
        "schedule",
        "timezone",
        "maxDuration",
        "utilizationThresholdPercent",
        "sourceNodeMarkerTTL",
        "evictedPodMarkerTTL",
    }
    for unknown in sorted(set(section) - known):
        problem(f"defrag.{unknown}", section[unknown], f"remove it; known fields: {', '.join(sorted(known))}")
    enabled = section.get("enabled", False)
    if not isinstance(enabled, bool):
        problem("defrag.enabled", enabled, "use true or false")
        enabled = False
    schedule = section.get("schedule", DEFAULT_SCHEDULE)
    if not isinstance(schedule, str) or len(schedule.split()) != 5 or not croniter.is_valid(schedule):
        problem("defrag.schedule", schedule, "use a 5-field cron expression such as '0 3 * * *'")
        schedule = DEFAULT_SCHEDULE
    timezone = section.get("timezone")
    if timezone is None:
        if enabled:
            problem("defrag.timezone", None, "set an IANA time zone such as Europe/Berlin or UTC")
    elif not isinstance(timezone, str) or not _is_time_zone(timezone):
        problem("defrag.timezone", timezone, "use an IANA time zone name such as Europe/Berlin or UTC")
        timezone = None
    max_duration = DEFAULT_MAX_DURATION
    if "maxDuration" in section:
        parsed = _duration(section["maxDuration"])
        if parsed is None or parsed <= timedelta(0):
            problem("defrag.maxDuration", section["maxDuration"], "use a positive duration such as 2h")
        else:
            max_duration = parsed
    threshold = section.get("utilizationThresholdPercent", DEFAULT_THRESHOLD_PERCENT)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or not 0 <= threshold <= 100:
        problem("defrag.utilizationThresholdPercent", threshold, "use a whole number from 0 to 100")
        threshold = DEFAULT_THRESHOLD_PERCENT
    source_ttl = _ttl(section, "sourceNodeMarkerTTL", DEFAULT_SOURCE_NODE_MARKER_TTL, problem)
    evicted_ttl = _ttl(section, "evictedPodMarkerTTL", None, problem)
    return DefragConfig(
        enabled=enabled,
        schedule=schedule,
        timezone=timezone if isinstance(timezone, str) else None,
        max_duration=max_duration,
        utilization_threshold_percent=threshold,
        source_node_marker_ttl=source_ttl,
        evicted_pod_marker_ttl=evicted_ttl,
    )


def _mapping(raw: object, name: str, problem: _Problem) -> Mapping[str, object]:
    if raw is None:
        return {}
    if isinstance(raw, Mapping) and all(isinstance(key, str) for key in raw):
        return raw
    problem(name or "(section)", raw, "use a mapping of fields, as in docs/defrag.md")
    return {}


def _duration(value: object) -> timedelta | None:
    return parse_duration(value) if isinstance(value, str) else None


def _ttl(
    section: Mapping[str, object], name: str, default: timedelta | None, problem: _Problem
) -> timedelta | None:
    if name not in section:
        return default
    value = section[name]
    if isinstance(value, str) and value.strip().lower() == NEVER:
        return None
    parsed = _duration(value)
    if parsed is None or parsed <= timedelta(0):
        problem(f"defrag.{name}", value, "use a positive duration such as 30m, or never")
        return default
    return parsed


def _is_time_zone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True
