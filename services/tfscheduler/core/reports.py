"""What the scheduler tells the world about a workload it could not place. Pure: events are built
from values the shell passes in (time and ids included)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from uuid import UUID, uuid5

from tfcommon.events import WorkloadRef, WorkloadUnschedulable
from tfcommon.placement import Rejection


def unschedulable_summary(
    rejection: Rejection | None,
    blocked: Mapping[str, str],
    *,
    quota_reason: str | None = None,
    preemption_reason: str | None = None,
) -> str:
    """One line: the placement core's summary, then the quota and preemption reasons when present.

    Nodes the view holds as cordoned for another cause (heartbeats, defrag) are named by that cause.
    """
    parts: list[str] = []
    if rejection is not None:
        reasons = dict(rejection.reasons)
        cordoned = reasons.pop("node cordoned", 0)
        causes: dict[str, int] = {}
        for reason in blocked.values():
            causes[reason] = causes.get(reason, 0) + 1
        if cordoned and sum(causes.values()) == cordoned:
            reasons.update(causes)
        elif cordoned:
            reasons["node cordoned"] = cordoned
        ordered = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
        parts.append(
            Rejection(
                rejection.request_name, rejection.nodes_total, tuple(ordered), rejection.policy
            ).summary()
        )
    if quota_reason:
        parts.append(quota_reason)
    if preemption_reason:
        parts.append(preemption_reason)
    return "; ".join(parts)


def unschedulable_event(
    workload: WorkloadRef,
    pool: str,
    summary: str,
    rejection: Rejection | None,
    *,
    attempt: UUID,
    now: datetime,
    cause: UUID | None = None,
) -> WorkloadUnschedulable:
    """`tf.evt.workload.unschedulable`; `attempt` makes the event id (one event per attempt)."""
    return WorkloadUnschedulable(
        event_id=uuid5(attempt, "unschedulable"),
        occurred_at=now,
        cause=cause,
        workload=workload,
        pool=pool,
        summary=summary,
        gpus_considered=rejection.nodes_total if rejection else 0,
        reasons=dict(rejection.reasons) if rejection else {},
    )
