"""`stale_takeover_slots`: which `enabled-replicas` slots stop counting, so a replacement is taken over."""

from __future__ import annotations

from dataclasses import dataclass

from tfwebhook.core.takeover import CREATION_GRACE_S, SlotPod, stale_takeover_slots


@dataclass(frozen=True)
class Held:
    slot_id: str
    pod_uid: str | None = "uid"
    claimed_age_s: float = 600.0


def running(slot_id: str) -> SlotPod:
    return SlotPod(slot_id, terminating=False, finished=False)


def test_a_running_pod_keeps_its_slot() -> None:
    assert stale_takeover_slots([Held("a")], [running("a")]) == frozenset()


def test_a_terminating_pod_frees_its_slot_while_it_is_still_listed() -> None:
    """`kubectl delete pod`, an eviction or a lost node: the ReplicaSet already counts it out."""
    listed = [SlotPod("a", terminating=True, finished=False)]

    assert stale_takeover_slots([Held("a")], listed) == {"a"}


def test_a_finished_pod_frees_its_slot() -> None:
    listed = [SlotPod("a", terminating=False, finished=True)]

    assert stale_takeover_slots([Held("a")], listed) == {"a"}


def test_a_pod_the_scheduler_saw_and_the_api_no_longer_lists_is_gone() -> None:
    assert stale_takeover_slots([Held("a", claimed_age_s=0.5)], []) == {"a"}


def test_a_slot_just_claimed_whose_pod_is_not_stored_yet_still_counts() -> None:
    """Two admissions at once: the other pod's slot must not be freed before its pod exists."""
    held = [Held("a", pod_uid=None, claimed_age_s=CREATION_GRACE_S - 1)]

    assert stale_takeover_slots(held, []) == frozenset()


def test_a_slot_never_seen_past_the_grace_never_became_a_pod() -> None:
    held = [Held("a", pod_uid=None, claimed_age_s=CREATION_GRACE_S)]

    assert stale_takeover_slots(held, []) == {"a"}
    assert stale_takeover_slots(held, [], creation_grace_s=CREATION_GRACE_S + 1) == frozenset()


def test_only_the_gone_slots_of_several_are_freed() -> None:
    held = [Held("live"), Held("deleted"), Held("gone"), Held("creating", pod_uid=None, claimed_age_s=1)]
    listed = [
        running("live"),
        SlotPod("deleted", terminating=True, finished=False),
        running("other-workload"),
    ]

    assert stale_takeover_slots(held, listed) == {"deleted", "gone"}


def test_listed_pods_holding_no_slot_of_the_workload_change_nothing() -> None:
    assert (
        stale_takeover_slots([], [running("x"), SlotPod("y", terminating=True, finished=False)])
        == frozenset()
    )
