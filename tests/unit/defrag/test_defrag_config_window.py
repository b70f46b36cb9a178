"""Pool nodeCompaction settings (defaults, errors naming the field) and cron windows across DST."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from tfdefrag.core.config import CompactionConfig, DefragConfig, parse_node_compaction
from tfdefrag.core.window import Window, WindowDecision, due_window

BERLIN = "Europe/Berlin"


def test_defaults_match_tensorfusion() -> None:
    config = parse_node_compaction("training", None)

    assert config == CompactionConfig(pool="training")
    assert config.period == timedelta(minutes=5)
    assert config.defrag == DefragConfig(
        enabled=False,
        schedule="0 3 * * *",
        timezone=None,
        max_duration=timedelta(hours=2),
        utilization_threshold_percent=40,
        source_node_marker_ttl=timedelta(minutes=30),
        evicted_pod_marker_ttl=None,
    )
    assert not config.defrag_enabled


def test_a_full_valid_section_is_read() -> None:
    config = parse_node_compaction(
        "training",
        {
            "period": "1m",
            "defrag": {
                "enabled": True,
                "schedule": "30 2 * * 1-5",
                "timezone": BERLIN,
                "maxDuration": "1h30m",
                "utilizationThresholdPercent": 25,
                "sourceNodeMarkerTTL": "never",
                "evictedPodMarkerTTL": "12h",
            },
        },
    )

    assert config.problems == ()
    assert config.defrag_enabled
    assert config.period == timedelta(minutes=1)
    assert config.defrag.max_duration == timedelta(minutes=90)
    assert config.defrag.source_node_marker_ttl is None
    assert config.defrag.evicted_pod_marker_ttl == timedelta(hours=12)


@pytest.mark.parametrize(
    ("defrag", "field", "fix"),
    [
        pytest.param({"timezone": None}, "defrag.timezone", "set an IANA time zone", id="timezone missing"),
        pytest.param({"timezone": "Mars/Olympus"}, "defrag.timezone", "IANA time zone name", id="bad zone"),
        pytest.param({"schedule": "0 3 * *"}, "defrag.schedule", "5-field cron", id="4-field cron"),
        pytest.param(
            {"schedule": "CRON_TZ=UTC 0 3 * * *"}, "defrag.schedule", "5-field cron", id="tz prefix"
        ),
        pytest.param(
            {"maxDuration": "2 hours"}, "defrag.maxDuration", "positive duration", id="bad duration"
        ),
        pytest.param(
            {"utilizationThresholdPercent": 140}, "defrag.utilizationThresholdPercent", "0 to 100", id="pct"
        ),
        pytest.param({"sourceNodeMarkerTTL": "-1m"}, "defrag.sourceNodeMarkerTTL", "or never", id="ttl"),
        pytest.param({"enabled": "yes"}, "defrag.enabled", "true or false", id="enabled not a bool"),
        pytest.param({"schedul": "0 3 * * *"}, "defrag.schedul", "known fields", id="typo in a field name"),
    ],
)
def test_an_invalid_value_names_the_field_and_the_fix_and_turns_defrag_off(
    defrag: dict[str, Any], field: str, fix: str
) -> None:
    config = parse_node_compaction("training", {"defrag": {"enabled": True, "timezone": "UTC", **defrag}})

    assert not config.defrag_enabled
    [problem] = config.problems
    assert problem.startswith(f"pool training: spec.nodeManagerConfig.nodeCompaction.{field} is ")
    assert fix in problem


def test_an_invalid_period_keeps_the_default_period() -> None:
    config = parse_node_compaction("p", {"period": "soon"})

    assert config.period == timedelta(minutes=5)
    assert "nodeCompaction.period is 'soon'; use a positive duration" in config.problems[0]


def at(offset_hours: int, year: int, month: int, day: int, hour: int, minute: int) -> datetime:
    """A wall-clock time at a fixed UTC offset (+1 CET, +2 CEST), as UTC."""
    zone = timezone(timedelta(hours=offset_hours))
    return datetime(year, month, day, hour, minute, tzinfo=zone).astimezone(UTC)


def test_a_tick_in_the_pool_time_zone_opens_a_window_of_max_duration() -> None:
    now = at(2, 2026, 6, 1, 3, 10)  # 03:10 in Berlin (CEST)

    decision = due_window("0 3 * * *", BERLIN, timedelta(hours=2), None, now)

    assert decision == WindowDecision(
        window=Window(start=at(2, 2026, 6, 1, 3, 0), deadline=at(2, 2026, 6, 1, 5, 0))
    )


def test_a_window_already_run_is_not_repeated_and_a_missed_one_advances_the_anchor() -> None:
    tick = at(2, 2026, 6, 1, 3, 0)

    assert (
        due_window("0 3 * * *", BERLIN, timedelta(hours=2), tick, tick + timedelta(minutes=20))
        == WindowDecision()
    )
    missed = due_window(
        "0 3 * * *", BERLIN, timedelta(hours=2), tick - timedelta(days=1), tick + timedelta(hours=3)
    )
    assert missed == WindowDecision(advance_anchor_to=tick)


def test_the_window_lasts_max_duration_in_real_time_across_spring_forward() -> None:
    # 2026-03-29: Berlin jumps from 02:00 CET to 03:00 CEST. A 01:30 tick plus 2h ends at 04:30 CEST.
    now = at(1, 2026, 3, 29, 1, 45)

    decision = due_window("30 1 * * *", BERLIN, timedelta(hours=2), None, now)

    assert decision.window == Window(start=at(1, 2026, 3, 29, 1, 30), deadline=at(2, 2026, 3, 29, 4, 30))


def test_a_tick_inside_the_skipped_hour_runs_once_at_the_first_valid_time() -> None:
    now = at(2, 2026, 3, 29, 3, 5)

    decision = due_window("30 2 * * *", BERLIN, timedelta(hours=1), at(1, 2026, 3, 28, 2, 30), now)

    assert decision.window is not None
    assert decision.window.start == at(2, 2026, 3, 29, 3, 0)


def test_a_wall_clock_time_repeated_when_clocks_fall_back_runs_once() -> None:
    # 2026-10-25: Berlin goes from 03:00 CEST back to 02:00 CET; 02:30 happens twice.
    first = at(2, 2026, 10, 25, 2, 30)
    assert due_window(
        "30 2 * * *", BERLIN, timedelta(minutes=20), None, first + timedelta(minutes=5)
    ).window == Window(start=first, deadline=first + timedelta(minutes=20))
    second_occurrence = at(1, 2026, 10, 25, 2, 35)

    decision = due_window("30 2 * * *", BERLIN, timedelta(minutes=20), first, second_occurrence)

    assert decision == WindowDecision()
