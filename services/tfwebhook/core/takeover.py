"""Which `enabled-replicas` slots still count: the rule that keeps N taken-over pods, never N+1. Pure.

A slot is claimed at admission and named on the pod (`tensor-fusion.ai/takeover-slot`). The scheduler
frees it when it sees the pod gone, but a ReplicaSet creates the replacement of a deleted or evicted pod
as soon as the old one is marked for deletion, often before that. So, when a claim finds the workload
full, the webhook asks the API server for the workload's taken-over pods and frees the slots that no
longer count (`stale_takeover_slots`), then claims again. A slot counts while its pod:

- is listed and neither terminating (no `deletionTimestamp`: deleted, evicted, or on a lost node) nor
  finished (`Succeeded`/`Failed`), as a ReplicaSet counts its replicas; or
- is not listed, was never seen by the scheduler (no pod uid on the slot) and was claimed less than
  `creation_grace_s` ago: its admission may still be on its way to being stored.

A slot whose pod the scheduler saw and the API server no longer lists is gone; one never seen past the
grace never became a pod (another admission step refused it). The held slots must be read before the
pods are listed, so a pod seen by the scheduler after the read cannot be mistaken for a gone one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

CREATION_GRACE_S = 30.0
"""How long a slot whose pod nobody has seen yet counts: the admission chain (every webhook's
`timeoutSeconds` is at most 30) must end before its pod is stored."""


class HeldSlot(Protocol):
    """A slot the ledger holds for the workload (`tfcommon.ledger.takeover.HeldSlot`)."""

    @property
    def slot_id(self) -> str: ...

    @property
    def pod_uid(self) -> str | None: ...

    @property
    def claimed_age_s(self) -> float: ...


@dataclass(frozen=True)
class SlotPod:
    """A pod of the workload as the API server lists it, with the slot it names."""

    slot_id: str
    terminating: bool
    finished: bool

    @property
    def counts(self) -> bool:
        return not self.terminating and not self.finished


def stale_takeover_slots(
    held: Iterable[HeldSlot], listed: Iterable[SlotPod], *, creation_grace_s: float = CREATION_GRACE_S
) -> frozenset[str]:
    """The ids of the `held` slots that no longer count against `enabled-replicas`, given the workload's
    pods `listed` by the API server after `held` was read."""
    pods = {pod.slot_id: pod for pod in listed}
    stale = set()
    for slot in held:
        pod = pods.get(slot.slot_id)
        if pod is not None:
            if not pod.counts:
                stale.add(slot.slot_id)
        elif slot.pod_uid is not None or slot.claimed_age_s >= creation_grace_s:
            stale.add(slot.slot_id)
    return frozenset(stale)
