"""A second look when `enabled-replicas` is full: free the slots of taken-over pods that are gone.

In Kubernetes mode, when the ledger refuses a slot, `TakeoverRecheck.retry` reads the workload's held
slots, then lists its taken-over pods from the API server (a consistent read, so a pod a ReplicaSet is
replacing already shows its `deletionTimestamp`), frees the slots that no longer count
(`tfwebhook.core.takeover.stale_takeover_slots`) and claims again, in one ledger transaction. A dry run
only tells whether that claim would be granted. An API server that fails leaves the refusal as it was.
It costs one ledger read and one label-selected pod list per refused admission of a full workload.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tfcommon.cluster.model import Pod
from tfcommon.pod_spec import COMPONENT, POD_COUNTER_KEY, TAKEOVER_SLOT, WORKLOAD

from tfwebhook.core.admission import WORKER_COMPONENT, TakeoverClaim
from tfwebhook.core.takeover import CREATION_GRACE_S, HeldSlot, SlotPod, stale_takeover_slots

log = logging.getLogger("tfwebhook.takeover")


class ListPods(Protocol):
    """`Cluster.list_pods` as the recheck calls it."""

    def __call__(self, *, namespace: str, labels: Mapping[str, str]) -> Awaitable[list[Pod]]: ...


class SlotLedger(Protocol):
    """The parts of `tfcommon.ledger.takeover.TakeoverLedger` the recheck uses."""

    async def held_slots(self, workload_key: str) -> Sequence[HeldSlot]: ...

    async def claim(
        self, slot_id: str, workload_key: str, limit: int, *, stale: Collection[str] = ()
    ) -> bool: ...


def slot_pods(pods: Sequence[Pod], workload_key: str) -> list[SlotPod]:
    """The listed pods that hold a slot of `workload_key`."""
    return [
        SlotPod(slot_id=slot, terminating=pod.deleting_since is not None, finished=pod.is_finished)
        for pod in pods
        if pod.annotations.get(POD_COUNTER_KEY) == workload_key
        and (slot := pod.annotations.get(TAKEOVER_SLOT))
    ]


@dataclass
class TakeoverRecheck:
    """Frees stale `enabled-replicas` slots (pods from `list_pods`) and claims again through `ledger`."""

    ledger: SlotLedger
    list_pods: ListPods
    creation_grace_s: float = CREATION_GRACE_S

    async def retry(
        self, namespace: str, workload: str | None, claim: TakeoverClaim, *, dry_run: bool
    ) -> bool:
        """Whether `claim`, refused by the ledger, is granted once the slots of gone pods are freed."""
        if claim.slot_id is None or claim.limit <= 0:
            return False
        held = await self.ledger.held_slots(claim.workload_key)
        labels = (
            {COMPONENT: WORKER_COMPONENT}
            if workload is None
            else {COMPONENT: WORKER_COMPONENT, WORKLOAD: workload}
        )
        try:
            pods = await self.list_pods(namespace=namespace, labels=labels)
        except Exception as error:  # the API server being down must not fail admission
            log.warning(
                "taken-over pods of %s not listed: %s",
                claim.workload_key,
                error,
                extra={"event": "webhook.takeover_recheck_failed"},
            )
            return False
        stale = stale_takeover_slots(
            held, slot_pods(pods, claim.workload_key), creation_grace_s=self.creation_grace_s
        )
        if len(held) - len(stale) >= claim.limit:
            return False
        if dry_run:
            return True
        granted = await self.ledger.claim(claim.slot_id, claim.workload_key, claim.limit, stale=stale)
        if granted and stale:
            log.info(
                "enabled-replicas: freed %d slot(s) of %s whose pods are gone or terminating",
                len(stale),
                claim.workload_key,
                extra={"event": "webhook.takeover_slots_freed"},
            )
        return granted
