"""Node readiness from heartbeats: a node is ready while its agent's heartbeats keep arriving.

Pure (no clock, no I/O): the reader (scheduler, metrics) records when it received each
`NodeHeartbeatSent` and asks with its own `now`. Times are the reader's receive times, so clock skew
between nodes does not matter. A node that never sent a heartbeat is not ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

DEFAULT_MISSED_HEARTBEATS = 3
"""Heartbeats a node may miss before it is not ready, when no explicit timeout is configured."""


@dataclass(frozen=True)
class HeartbeatSeen:
    """The last heartbeat a reader received from one node: when, and the interval the agent announced."""

    node: str
    received_at: datetime
    interval_ms: int


def record_heartbeat(
    seen: Mapping[str, HeartbeatSeen], node: str, received_at: datetime, interval_ms: int
) -> dict[str, HeartbeatSeen]:
    """`seen` with `node`'s heartbeat updated; an older (redelivered) heartbeat never moves time back."""
    updated = dict(seen)
    previous = seen.get(node)
    if previous is None or received_at >= previous.received_at:
        updated[node] = HeartbeatSeen(node, received_at, interval_ms)
    return updated


def readiness_timeout(heartbeat: HeartbeatSeen, configured: timedelta | None = None) -> timedelta:
    """The configured timeout, else `DEFAULT_MISSED_HEARTBEATS` times the agent's announced interval."""
    if configured is not None:
        return configured
    return timedelta(milliseconds=heartbeat.interval_ms * DEFAULT_MISSED_HEARTBEATS)


def is_node_ready(heartbeat: HeartbeatSeen | None, now: datetime, timeout: timedelta | None = None) -> bool:
    """True while the last heartbeat is younger than the timeout; False for a node never heard from."""
    if heartbeat is None:
        return False
    return now - heartbeat.received_at < readiness_timeout(heartbeat, timeout)


def not_ready_nodes(
    seen: Mapping[str, HeartbeatSeen], now: datetime, timeout: timedelta | None = None
) -> tuple[str, ...]:
    """The nodes among `seen` whose heartbeats stopped, sorted; the scheduler places nothing there."""
    return tuple(
        sorted(node for node, heartbeat in seen.items() if not is_node_ready(heartbeat, now, timeout))
    )
