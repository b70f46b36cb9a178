"""The scheduler's leader election over a `coordination.k8s.io/v1` Lease: the pure decision (client-go's way).

`decide` turns what the Lease says, the time and this candidate's identity into one move (create the
Lease, acquire it, renew it, wait, or step down) and the record to write; `renewal_overdue` says when a
leader that could not renew must stop acting; `released` is the record a leader writes on a clean
shutdown. The caller writes with the Lease's `resourceVersion`, so of two candidates that decide to
acquire at once only one write succeeds. No I/O, no clock: `now` is given.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum

from tfcommon.cluster.model import LeaseRecord


@dataclass(frozen=True)
class ElectionTimings:
    """client-go's three durations: a Lease not renewed for `lease_duration_s` is free; a leader that has
    not renewed for `renew_deadline_s` steps down; candidates and the leader act every `retry_period_s`."""

    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < retry_period_s < renew_deadline_s < lease_duration_s, got "
                f"retry_period_s={self.retry_period_s}, renew_deadline_s={self.renew_deadline_s}, "
                f"lease_duration_s={self.lease_duration_s}: shorten the renew deadline or lengthen the lease"
            )


class Move(Enum):
    CREATE = "create"
    """No Lease yet: create it naming this candidate."""
    ACQUIRE = "acquire"
    """The Lease is free (no holder) or expired: take it over."""
    RENEW = "renew"
    """This candidate holds the Lease: push `renewTime` forward."""
    WAIT = "wait"
    """Another candidate holds a live Lease: try again after the retry period."""
    STEP_DOWN = "step down"
    """This candidate was leading but the Lease now names someone else: stop acting at once."""


@dataclass(frozen=True)
class Decision:
    """A move and, for CREATE, ACQUIRE and RENEW, the record to write (with the version read)."""

    move: Move
    record: LeaseRecord | None
    reason: str


def expired(lease: LeaseRecord, now: datetime) -> bool:
    """True when the holder has not renewed within its own `leaseDurationSeconds`."""
    last = lease.renew_time or lease.acquire_time
    if last is None or lease.lease_duration_s <= 0:
        return True
    return now >= last + timedelta(seconds=lease.lease_duration_s)


def decide(
    lease: LeaseRecord | None, *, identity: str, now: datetime, timings: ElectionTimings, leading: bool
) -> Decision:
    """What `identity` does next given the Lease as read (`None`: there is none) at `now`."""
    if not identity:
        raise ValueError("leader election needs a non-empty identity: set POD_NAME (the downward API)")
    if lease is None:
        fresh = LeaseRecord(identity, timings.lease_duration_s, now, now, 0)
        return Decision(Move.CREATE, fresh, "no lease yet")
    if lease.holder_identity == identity:
        renewed = replace(
            lease,
            lease_duration_s=timings.lease_duration_s,
            acquire_time=lease.acquire_time or now,
            renew_time=now,
        )
        return Decision(Move.RENEW, renewed, "this candidate holds the lease")
    if not lease.holder_identity or expired(lease, now):
        taken = replace(
            lease,
            holder_identity=identity,
            lease_duration_s=timings.lease_duration_s,
            acquire_time=now,
            renew_time=now,
            lease_transitions=lease.lease_transitions + 1,
        )
        reason = (
            "the lease is free" if not lease.holder_identity else f"{lease.holder_identity}'s lease expired"
        )
        return Decision(Move.ACQUIRE, taken, reason)
    held = f"{lease.holder_identity} holds the lease"
    return Decision(Move.STEP_DOWN if leading else Move.WAIT, None, held)


def renewal_overdue(last_renewed: datetime, now: datetime, timings: ElectionTimings) -> bool:
    """True when a leader has gone `renew_deadline_s` without a successful renewal: it must step down
    before its Lease expires and another candidate takes over."""
    return now - last_renewed >= timedelta(seconds=timings.renew_deadline_s)


def released(lease: LeaseRecord, now: datetime) -> LeaseRecord:
    """The record a leader writes on a clean shutdown: no holder, so the next candidate acquires at once."""
    return replace(lease, holder_identity="", lease_duration_s=1, acquire_time=now, renew_time=now)
