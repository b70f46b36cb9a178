"""Gang placement: a gang's pending members are reserved all together, or none of them is.

A gang (`Submission.gang`) is the live workloads with one group key. `GangPlacer.place_gangs` places
each gang of the members it is given whole, its other pending members too: none is reserved before
`min_members` of the gang fit in the view, counting those already placed, and the pool's maximum and,
in a namespace with a quota, the quota's totals for the members together allow them; then every
pending member that fits is reserved in one ledger transaction, committed, with the members marked
placed in it. Otherwise no member is reserved and every one waits, pending with the gang's numbers
or the quota's (`Verdicts.wait_many`); a member over its quota's `single` limits or with an invalid
request is refused for good, as a plain workload is. A refused reservation leaves the view as it
was. The words and the timeout are `tfscheduler.core.gang`'s, the fitting `tfcommon.placement.gang`'s.
Gang members are never preemption victims (`Placer._candidates`). Call with the view room's lock held.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from uuid import UUID

from tfcommon.events import GpuRequest
from tfcommon.ledger.records import AllocationRecord, QuotaHeld, Reserved
from tfcommon.ledger.sql import BatchAbandonedError, LedgerTransaction, SqlLedger
from tfcommon.placement import Placement, PlacementRequest, PlacementRequestError, Profile
from tfcommon.placement.gang import place_gang

from tfscheduler.core.gang import GangCount, gang_reason, timed_out
from tfscheduler.core.quota import (
    NamespaceQuota,
    Usage,
    check_single,
    check_total,
    usage_of_shares,
    with_defaults,
)
from tfscheduler.core.view import placement_request_of
from tfscheduler.submission import WorkloadStatus
from tfscheduler.verdicts import Entry, Verdicts, Waiting, placed_status, reservation_for
from tfscheduler.view_keeper import ViewKeeper, active_of
from tfscheduler.workloads import StoredWorkload, WorkloadStore, mark_placed

log = logging.getLogger("tfscheduler")


class GangPlacer:
    """Places whole gangs for one scheduler. `quotas` and `profile` are read at each placement (the
    engine swaps the quotas and the learned policies while it runs)."""

    def __init__(
        self,
        keeper: ViewKeeper,
        ledger: SqlLedger,
        store: WorkloadStore,
        verdicts: Verdicts,
        *,
        quotas: Callable[[], Mapping[str, NamespaceQuota]],
        profile: Callable[[str], Profile],
        clock: Callable[[], datetime],
    ) -> None:
        self.keeper = keeper
        self.ledger = ledger
        self.store = store
        self.verdicts = verdicts
        self.quotas = quotas
        self.profile = profile
        self.clock = clock

    async def place_gangs(self, members: list[Entry], *, announce: bool) -> dict[UUID, WorkloadStatus]:
        """Place the gangs of `members`, each gang whole; the statuses of the members decided. The
        verdicts of `members` are announced when `announce`; the gangs' other members' only when their
        reason changed (a gang's retry does not announce each member again)."""
        statuses: dict[UUID, WorkloadStatus] = {}
        keys = dict.fromkeys(
            stored.submission.gang.group_key for stored, _c in members if stored.submission.gang
        )
        asked = {stored.allocation_id for stored, _c in members}
        for key in keys:
            statuses.update(await self._place_gang(key, announce=announce, asked=asked))
        return statuses

    async def _place_gang(self, key: str, *, announce: bool, asked: set[UUID]) -> dict[UUID, WorkloadStatus]:
        """Reserve the pending members of gang `key` together once enough of them fit, or none."""
        statuses: dict[UUID, WorkloadStatus] = {}
        members, requests = await self._live_members(key, statuses)
        pending = [member for member in members if member.state == "pending"]
        if not pending:
            return statuses
        gang = pending[0].submission.gang
        assert gang is not None
        pool = pending[0].submission.request.pool
        placed = len(members) - len(pending)
        expired = timed_out(gang, [member.submitted_at for member in pending], self.clock())
        if len(members) < gang.min_members:
            count = GangCount(live=len(members), placed=placed, fit=None)
            reason = gang_reason(gang, count, expired=expired)
            statuses.update(await self._wait(pending, reason, announce, asked))
            return statuses
        wanted: list[tuple[StoredWorkload, PlacementRequest]] = []
        for member in pending:
            try:
                wanted.append(
                    (member, placement_request_of(member.submission, requests[member.allocation_id]))
                )
            except PlacementRequestError as error:
                statuses[member.allocation_id] = await self.verdicts.refuse(member, str(error), None)
        candidates = [member for member, _w in wanted]
        needed = max(gang.min_members - placed, 0)
        outcome = place_gang(wanted, self.keeper.view, self.profile(pool), needed=needed)
        if not outcome.enough:
            count = GangCount(live=len(members), placed=placed, fit=outcome.fitted)
            reason = gang_reason(gang, count, expired=expired)
            statuses.update(await self._wait(candidates, reason, announce, asked))
            return statuses
        over = self.keeper.over_pool_maximum(pool, [placement for _member, placement in outcome.placements])
        if over is not None:
            statuses.update(await self._wait(candidates, f"gang {key}: {over}", announce, asked))
            return statuses
        reserved = await self._reserve(key, outcome.placements, requests) if outcome.placements else []
        if not isinstance(reserved, list):
            reason = (
                reserved.reason
                if isinstance(reserved, QuotaHeld)
                else f"gang {key}: the ledger refused part of the gang, so none of it was reserved; retrying"
            )
            statuses.update(await self._wait(candidates, reason, announce, asked))
            return statuses
        for member, record in reserved:
            self.keeper.active.put(record.allocation_id, active_of(record, member))
            statuses[record.allocation_id] = placed_status(record)
        left = [member for member, _rejection in outcome.rejections]
        if left:
            reason = (
                f"gang {key}: {placed + len(reserved)} members are placed (min {gang.min_members}); "
                "this one does not fit now"
            )
            statuses.update(await self._wait(left, reason, announce, asked))
        if not reserved:
            return statuses
        log.info("gang placed", extra={"gang": key, "placed": len(reserved), "outcome": "placed"})
        # The other members' callers (pods waiting in Kubernetes mode) look again.
        self.keeper.capacity_freed.set()
        return statuses

    async def _live_members(
        self, key: str, statuses: dict[UUID, WorkloadStatus]
    ) -> tuple[list[StoredWorkload], dict[UUID, GpuRequest]]:
        """The gang's live members (pending or placed) and their requests with their quotas' defaults;
        a pending member over its quota's `single` limits is refused for good (its status put in
        `statuses`) and left out."""
        quotas = self.quotas()
        members: list[StoredWorkload] = []
        requests: dict[UUID, GpuRequest] = {}
        for member in await self.store.gang_members(key):
            quota = quotas.get(member.submission.workload.namespace)
            request = with_defaults(quota, member.submission.request)
            refusal = check_single(quota, request) if member.state == "pending" else None
            if refusal is not None:
                statuses[member.allocation_id] = await self.verdicts.refuse(member, refusal.reason, None)
                continue
            members.append(member)
            requests[member.allocation_id] = request
        return members, requests

    async def _reserve(
        self,
        key: str,
        placements: Sequence[tuple[StoredWorkload, Placement]],
        requests: Mapping[UUID, GpuRequest],
    ) -> list[tuple[StoredWorkload, AllocationRecord]] | QuotaHeld | None:
        """Reserve every placement of a gang in one ledger transaction, committed, and mark the members
        placed in it; None, with nothing written and the view as before, when any one is refused.
        In a namespace with a quota the transaction first locks the namespace (as
        `SqlLedger.reserve_within_quota` does) and checks the quota's totals for all the placements
        together: `QuotaHeld`, naming the quota and the numbers, with nothing written, when they exceed
        it. `requests` are the members' requests with the quota's defaults."""
        for _member, placement in placements:
            self.keeper.view.apply(placement)
        try:
            async with self.ledger.transaction() as transaction:
                over = await self._over_quota(key, transaction, placements, requests)
                if over is not None:
                    raise _GangOverQuotaError(over)
                results = await transaction.reserve_many(
                    [
                        reservation_for(
                            member.allocation_id, member.submission, requests[member.allocation_id], p, None
                        )
                        for member, p in placements
                    ],
                    commit=True,
                    then=mark_placed([member.allocation_id for member, _p in placements], self.clock()),
                )
                if not all(isinstance(r, Reserved) and not r.replayed for r in results):
                    raise _GangRefusedError(key)
        except _GangOverQuotaError as error:
            log.info(
                "gang over its namespace quota; nothing reserved", extra={"gang": key, "error": str(error)}
            )
            for _member, placement in placements:
                self.keeper.view.release(placement)
            return QuotaHeld(str(error))
        except (_GangRefusedError, BatchAbandonedError) as error:
            log.info("gang reservation refused; nothing reserved", extra={"gang": key, "error": str(error)})
            for _member, placement in placements:
                self.keeper.view.release(placement)
            for node in sorted({placement.node for _member, placement in placements}):
                await self.keeper.rebuild_node(node)
            return None
        except BaseException:
            for _member, placement in placements:
                self.keeper.view.release(placement)
            raise
        return [
            (member, result.allocation)
            for (member, _p), result in zip(placements, results, strict=True)
            if isinstance(result, Reserved)
        ]

    async def _over_quota(
        self,
        key: str,
        transaction: LedgerTransaction,
        placements: Sequence[tuple[StoredWorkload, Placement]],
        requests: Mapping[UUID, GpuRequest],
    ) -> str | None:
        """Why the gang's placements together exceed a namespace quota's totals (`check_total` on the
        sum of their demands, maxWorkers counting each member), read under the namespaces' locks in
        `transaction`; None when they fit or no namespace of theirs has a quota."""
        quotas = self.quotas()
        demands: dict[str, Usage] = {}
        for member, placement in placements:
            namespace = member.submission.workload.namespace
            if namespace in quotas:
                demand = self.keeper.namespace_demand(placement, requests[member.allocation_id])
                demands[namespace] = demands.get(namespace, Usage()) + demand
        if not demands:
            return None
        used = usage_of_shares(await transaction.locked_namespace_shares(sorted(demands)))
        for namespace, demand in sorted(demands.items()):
            over = check_total(quotas[namespace], used.get(namespace, Usage()), demand)
            if over is not None:
                return f"gang {key}: {over.reason}"
        return None

    async def _wait(
        self, members: list[StoredWorkload], reason: str, announce: bool, asked: set[UUID]
    ) -> dict[UUID, WorkloadStatus]:
        """Keep gang members pending with `reason`: announced for the `asked` ones when `announce`, and for
        every member whose reason changed (a gang's retry does not announce each member again)."""
        waiting: list[Waiting] = [(member, None, reason, None) for member in members]
        statuses = await self.verdicts.wait_many(
            [w for w in waiting if w[0].allocation_id in asked], announce
        )
        statuses.update(
            await self.verdicts.wait_many([w for w in waiting if w[0].allocation_id not in asked], False)
        )
        return statuses


class _GangRefusedError(Exception):
    """The ledger refused part of a gang's reservation: the transaction is rolled back whole."""


class _GangOverQuotaError(Exception):
    """A gang's placements together exceed a namespace quota: the transaction is rolled back whole."""


def split_gangs(entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """The entries placed one by one, and the gang members (placed a gang at a time)."""
    return (
        [entry for entry in entries if entry[0].submission.gang is None],
        [entry for entry in entries if entry[0].submission.gang is not None],
    )
