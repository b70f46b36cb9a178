"""A node whose heartbeats stop is not ready after the timeout; readers use their own receive times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tfcommon.node_readiness import HeartbeatSeen, is_node_ready, not_ready_nodes, record_heartbeat

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_a_node_is_ready_until_three_announced_intervals_pass_without_a_heartbeat() -> None:
    seen = record_heartbeat({}, "node-a", T0, interval_ms=5000)

    assert is_node_ready(seen["node-a"], T0 + timedelta(seconds=14.9))
    assert not is_node_ready(seen["node-a"], T0 + timedelta(seconds=15))


def test_a_configured_timeout_wins_over_the_announced_interval() -> None:
    heartbeat = HeartbeatSeen("node-a", T0, interval_ms=5000)

    assert not is_node_ready(heartbeat, T0 + timedelta(seconds=6), timeout=timedelta(seconds=6))
    assert is_node_ready(heartbeat, T0 + timedelta(seconds=59), timeout=timedelta(seconds=60))


def test_a_node_never_heard_from_is_not_ready() -> None:
    assert not is_node_ready(None, T0)


def test_a_new_heartbeat_makes_the_node_ready_again_and_an_old_one_does_not_move_time_back() -> None:
    seen = record_heartbeat({}, "node-a", T0, interval_ms=1000)
    later = T0 + timedelta(seconds=10)
    assert not_ready_nodes(seen, later) == ("node-a",)

    seen = record_heartbeat(seen, "node-a", later, interval_ms=1000)
    seen = record_heartbeat(seen, "node-a", T0, interval_ms=1000)

    assert not_ready_nodes(seen, later + timedelta(seconds=1)) == ()


def test_only_the_silent_nodes_are_listed() -> None:
    seen = record_heartbeat({}, "node-b", T0, interval_ms=1000)
    seen = record_heartbeat(seen, "node-a", T0 + timedelta(seconds=10), interval_ms=1000)

    assert not_ready_nodes(seen, T0 + timedelta(seconds=11)) == ("node-b",)
