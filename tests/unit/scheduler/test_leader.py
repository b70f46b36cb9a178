"""The leader-election decision (`tfscheduler.core.leader`): who acquires, renews, waits or steps down."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from tfcommon.cluster.model import LeaseRecord
from tfcommon.settings import SchedulerKubernetesSettings
from tfscheduler.core.leader import (
    ElectionTimings,
    Move,
    decide,
    expired,
    released,
    renewal_overdue,
)

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
TIMINGS = ElectionTimings(lease_duration_s=15, renew_deadline_s=10, retry_period_s=2)


def held_by(
    holder: str, *, renewed: datetime = T0, duration_s: int = 15, transitions: int = 3
) -> LeaseRecord:
    return LeaseRecord(
        holder, duration_s, T0 - timedelta(minutes=5), renewed, transitions, resource_version="42"
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_without_a_lease_the_candidate_creates_it_naming_itself() -> None:
    decision = decide(None, identity="a", now=T0, timings=TIMINGS, leading=False)

    assert decision.move is Move.CREATE
    assert decision.record == LeaseRecord("a", 15, T0, T0, 0, resource_version="")


def test_a_live_lease_of_another_holder_makes_a_candidate_wait() -> None:
    decision = decide(held_by("b"), identity="a", now=at(14.9), timings=TIMINGS, leading=False)

    assert decision.move is Move.WAIT
    assert decision.record is None
    assert "b holds the lease" in decision.reason


def test_an_expired_lease_is_taken_over_with_the_version_read_and_one_more_transition() -> None:
    decision = decide(held_by("b"), identity="a", now=at(15), timings=TIMINGS, leading=False)

    assert decision.move is Move.ACQUIRE
    assert decision.record == LeaseRecord("a", 15, at(15), at(15), 4, resource_version="42")
    assert "b's lease expired" in decision.reason


def test_expiry_uses_the_holders_own_lease_duration() -> None:
    short = held_by("b", duration_s=3)

    assert decide(short, identity="a", now=at(2.9), timings=TIMINGS, leading=False).move is Move.WAIT
    assert decide(short, identity="a", now=at(3), timings=TIMINGS, leading=False).move is Move.ACQUIRE


def test_a_released_lease_is_acquired_at_once() -> None:
    free = released(held_by("b"), T0)

    decision = decide(free, identity="a", now=at(0.1), timings=TIMINGS, leading=False)

    assert decision.move is Move.ACQUIRE
    assert decision.record is not None
    assert decision.record.holder_identity == "a"
    assert decision.reason == "the lease is free"


def test_the_holder_renews_keeping_its_acquire_time_and_transitions() -> None:
    lease = held_by("a")

    decision = decide(lease, identity="a", now=at(2), timings=TIMINGS, leading=True)

    assert decision.move is Move.RENEW
    assert decision.record == LeaseRecord("a", 15, lease.acquire_time, at(2), 3, resource_version="42")


def test_a_leader_that_finds_another_holder_steps_down() -> None:
    decision = decide(held_by("b", renewed=at(1)), identity="a", now=at(2), timings=TIMINGS, leading=True)

    assert decision.move is Move.STEP_DOWN
    assert decision.record is None


def test_a_lease_without_times_counts_as_expired() -> None:
    lease = LeaseRecord("b", 15, None, None, 0, "7")

    assert expired(lease, T0)
    assert decide(lease, identity="a", now=T0, timings=TIMINGS, leading=False).move is Move.ACQUIRE


def test_a_leader_steps_down_once_the_renew_deadline_passes_before_its_lease_expires() -> None:
    assert not renewal_overdue(T0, at(9.9), TIMINGS)
    assert renewal_overdue(T0, at(10), TIMINGS)
    assert not expired(held_by("a"), at(10))


def test_release_clears_the_holder_and_keeps_the_history() -> None:
    lease = held_by("a")

    free = released(lease, at(5))

    assert free.holder_identity == ""
    assert free.lease_transitions == lease.lease_transitions
    assert free.resource_version == "42"


def test_an_empty_identity_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="POD_NAME"):
        decide(None, identity="", now=T0, timings=TIMINGS, leading=False)


@pytest.mark.parametrize(
    ("duration", "deadline", "retry"), [(15, 15.0, 2.0), (15, 10.0, 10.0), (15, 20.0, 2.0), (15, 10.0, 0.0)]
)
def test_timings_that_could_let_two_leaders_act_are_refused(
    duration: int, deadline: float, retry: float
) -> None:
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s < lease_duration_s"):
        ElectionTimings(duration, deadline, retry)


def test_the_settings_refuse_a_renew_deadline_longer_than_the_lease_naming_the_variables() -> None:
    with pytest.raises(ValueError, match="TF_SCHEDULER_RENEW_DEADLINE_S < TF_SCHEDULER_LEASE_DURATION_S"):
        SchedulerKubernetesSettings(lease_duration_s=5, renew_deadline_s=8)
    settings = SchedulerKubernetesSettings()
    assert (settings.lease_duration_s, settings.renew_deadline_s, settings.retry_period_s) == (15, 10.0, 2.0)
    assert settings.leader_election
    assert settings.lease_name == "tfpool-scheduler"
