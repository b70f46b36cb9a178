"""Gang scheduling, pure part: what the scheduler tells a gang's waiting members, and when it gave up.

A gang (`Submission.gang`) is the live workloads with one group key. None of its members is reserved
before `min_members` of them can be, counting those already placed; then every pending member that
fits is reserved in one ledger transaction (`tfscheduler.gang_placing`, `GangPlacer`). This module
words the verdicts, naming the gang and the numbers, and decides the timeout (`timeout_s` 0 waits
indefinitely), and reads a pod's gang from TensorFusion's annotations (`gang_of`). No I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from tfcommon.cluster.model import Pod
from tfcommon.pod_request import PREFIX, PodRequestError
from tfcommon.pod_spec import parse_duration_s

from tfscheduler.submission import Gang

__all__ = [
    "GANG_ENABLED",
    "GANG_GROUP_KEY",
    "GANG_MIN_MEMBERS",
    "GANG_TIMEOUT",
    "GangCount",
    "gang_of",
    "gang_reason",
    "timed_out",
]

GANG_ENABLED = PREFIX + "gang-enabled"
GANG_MIN_MEMBERS = PREFIX + "gang-min-members"
GANG_TIMEOUT = PREFIX + "gang-timeout"
GANG_GROUP_KEY = PREFIX + "gang-group-key"
GANG_REQUIRED_MEMBERS = PREFIX + "gang-required-members"


def gang_of(pod: Pod) -> Gang | None:
    """The pod's gang when `gang-enabled` is `true`: its group key (`gang-group-key`, else the namespace
    and the controller owner, e.g. the ReplicaSet of a Deployment's pods), `gang-min-members` (else the
    webhook's `gang-required-members`) and `gang-timeout` (a Go duration; `0` or none waits
    indefinitely). Raises `PodRequestError` naming the annotation and a valid value."""
    annotations = pod.annotations
    if (annotations.get(GANG_ENABLED) or "").strip().lower() != "true":
        return None
    key = (annotations.get(GANG_GROUP_KEY) or "").strip()
    if not key:
        owner = next((o for o in pod.owner_references if o.controller), None)
        if owner is None:
            raise PodRequestError(
                f"annotation {GANG_ENABLED}: pod {pod.namespace}/{pod.name} has no controller to group a "
                f"gang by; set {GANG_GROUP_KEY} (e.g. {pod.namespace}/my-job) or create it from a workload"
            )
        key = f"{pod.namespace}/{owner.name}"
    raw_min = annotations.get(GANG_MIN_MEMBERS) or annotations.get(GANG_REQUIRED_MEMBERS)
    if raw_min is None or not raw_min.strip().isdigit() or int(raw_min) < 1:
        raise PodRequestError(
            f"annotation {GANG_MIN_MEMBERS}: {raw_min!r} is not a member count; use a whole number "
            'of at least 1, e.g. "4"'
        )
    return Gang(group_key=key, min_members=int(raw_min), timeout_s=_timeout_s(annotations.get(GANG_TIMEOUT)))


def _timeout_s(raw: str | None) -> int:
    """`gang-timeout` in seconds: 0 (or none) waits indefinitely; a shorter non-zero one is 1 s."""
    text = (raw or "").strip()
    seconds = parse_duration_s(text, key=GANG_TIMEOUT) if text != "0" else 0
    return max(seconds, 1) if any(digit in text for digit in "123456789") else 0


@dataclass(frozen=True)
class GangCount:
    """A gang's members as the scheduler sees them: `live` (pending or placed), `placed`, and how many
    of the pending ones `fit` now together (None when too few members exist to try)."""

    live: int
    placed: int
    fit: int | None


def timed_out(gang: Gang, waiting_since: Sequence[datetime], now: datetime) -> bool:
    """The gang has waited longer than its timeout, counted from its oldest waiting member."""
    if gang.timeout_s == 0 or not waiting_since:
        return False
    return now - min(waiting_since) >= timedelta(seconds=gang.timeout_s)


def gang_reason(gang: Gang, count: GangCount, *, expired: bool) -> str:
    """The pending reason of a gang member that is not reserved: the gang, its quorum and the numbers."""
    needed = max(gang.min_members - count.placed, 0)
    if count.fit is None:
        numbers = f"{count.live} of min {gang.min_members} members exist"
    else:
        pending = count.live - count.placed
        numbers = f"{count.placed + count.fit} of min {gang.min_members} members fit"
        if count.placed:
            numbers += f" ({count.placed} placed, {count.fit} of {pending} pending fit; {needed} needed)"
    if expired:
        return (
            f"gang {gang.group_key} timed out after {gang.timeout_s}s: {numbers}; "
            "no member is reserved before the gang fits (still retried)"
        )
    timeout = "indefinitely" if gang.timeout_s == 0 else f"up to {gang.timeout_s}s"
    return f"gang {gang.group_key} is waiting ({timeout}): {numbers}; none is reserved before min-members fit"
