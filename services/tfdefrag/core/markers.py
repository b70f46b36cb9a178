"""Defrag marker keys (TensorFusion's spelling) and which markers have outlived their TTL.

Pure: the shell reads labels and annotations, calls `expired_*`, and clears what they return.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

PREFIX = "tensor-fusion.ai/"
DO_NOT_DISRUPT = PREFIX + "do-not-disrupt"
SHOULD_DELETE = PREFIX + "should-delete"
DEFRAG_SOURCE = PREFIX + "defrag-source"
DEFRAG_SOURCE_SINCE = PREFIX + "defrag-source-since"
DEFRAG_SOURCE_POOL = PREFIX + "defrag-source-pool"
DEFRAG_EVICTED = PREFIX + "defrag-evicted"
DEFRAG_EVICTED_SINCE = PREFIX + "defrag-evicted-since"
DEFRAG_EVICTED_POOL = PREFIX + "defrag-evicted-pool"
EVICT_SKIP = PREFIX + "defrag-evict-skip"
EVICT_SKIP_SINCE = PREFIX + "defrag-evict-skip-since"
EVICT_SKIP_POOL = PREFIX + "defrag-evict-skip-pool"
EVICT_SKIP_REASON = PREFIX + "defrag-evict-skip-reason"
MAX_REASON_LENGTH = 256


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, as Kubernetes writes times (`moment` must be timezone-aware)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def source_markers(pool: str, now: datetime) -> tuple[dict[str, str | None], dict[str, str | None]]:
    """(labels, annotations) that mark a node as being drained for `pool`."""
    return {DEFRAG_SOURCE: "true"}, {DEFRAG_SOURCE_SINCE: format_time(now), DEFRAG_SOURCE_POOL: pool}


def clear_source_markers() -> tuple[dict[str, str | None], dict[str, str | None]]:
    return {DEFRAG_SOURCE: None}, {DEFRAG_SOURCE_SINCE: None, DEFRAG_SOURCE_POOL: None}


def evicted_markers(pool: str, now: datetime) -> tuple[dict[str, str | None], dict[str, str | None]]:
    return {DEFRAG_EVICTED: "true"}, {DEFRAG_EVICTED_SINCE: format_time(now), DEFRAG_EVICTED_POOL: pool}


def clear_evicted_markers() -> tuple[dict[str, str | None], dict[str, str | None]]:
    return {DEFRAG_EVICTED: None}, {DEFRAG_EVICTED_SINCE: None, DEFRAG_EVICTED_POOL: None}


def evict_skip_markers(
    pool: str, reason: str, now: datetime
) -> tuple[dict[str, str | None], dict[str, str | None]]:
    return {EVICT_SKIP: "true"}, {
        EVICT_SKIP_SINCE: format_time(now),
        EVICT_SKIP_POOL: pool,
        EVICT_SKIP_REASON: reason[:MAX_REASON_LENGTH],
    }


def clear_evict_skip_markers() -> tuple[dict[str, str | None], dict[str, str | None]]:
    return {EVICT_SKIP: None}, {EVICT_SKIP_SINCE: None, EVICT_SKIP_POOL: None, EVICT_SKIP_REASON: None}


def is_marked(labels: Mapping[str, str], key: str) -> bool:
    return labels.get(key) == "true"


def marker_expired(
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    *,
    label: str,
    since: str,
    ttl: timedelta | None,
    now: datetime,
) -> bool:
    """A marker is expired when present, its TTL is not `never`, and it is older than the TTL.

    A marker without a readable `-since` is treated as expired when a TTL applies (it cannot be aged).
    """
    if not is_marked(labels, label) or ttl is None:
        return False
    marked_at = parse_time(annotations.get(since))
    return marked_at is None or now - marked_at >= ttl
