"""The scheduler's placing room: decides where submitted workloads go and reserves them in the ledger.

`Placer` places batches (one after another against the view, reserved in one ledger transaction, a
refused one placed again on its own), replacements into the defrag holds kept for them, and
workloads within their namespace's quota and their pool's maximum; a workload that fits nowhere
preempts lower-priority ones (removed and recorded by the engine: `Evict`) or waits, pending with its
reason, announced through the outbox. Gang members go to the gang room (`tfscheduler.gang_placing`,
each gang reserved whole or not at all); verdicts other than a placement are recorded by
`tfscheduler.verdicts`. It reads and changes the view through the view room
(`tfscheduler.view_keeper`), always with its lock held; decisions come from `tfcommon.placement` and
`tfscheduler.core`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy.exc import IntegrityError
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.ledger.records import (
    AllocationRecord,
    HoldRecord,
    InsufficientCapacity,
    NamespaceShare,
    QuotaHeld,
    ReservationRejected,
    ReservationRequest,
    ReservationResult,
    Reserved,
)
from tfcommon.ledger.sql import BatchAbandonedError, SqlLedger
from tfcommon.placement import (
    Placement,
    PlacementRequest,
    PlacementRequestError,
    Profile,
    Rejection,
    place,
)

from tfscheduler.core.lifecycle import Transition
from tfscheduler.core.preemption import Candidate, NoPreemption, Priority, plan_preemption
from tfscheduler.core.quota import (
    NamespaceQuota,
    Usage,
    check_single,
    check_total,
    demand_of,
    usage_by_namespace,
    usage_of_shares,
    with_defaults,
)
from tfscheduler.core.reports import unschedulable_summary
from tfscheduler.core.view import (
    allocation_id_for,
    into_hold,
    placement_of,
    placement_request_of,
    with_gpus_full,
)
from tfscheduler.eviction import Evictor
from tfscheduler.gang_placing import GangPlacer, split_gangs
from tfscheduler.intake import Queued
from tfscheduler.policies import LearnedPolicies
from tfscheduler.submission import Submission, WorkloadStatus
from tfscheduler.verdicts import Entry, Verdicts, Waiting, placed_status, reservation_for, stored_status
from tfscheduler.view_keeper import ViewKeeper, active_of
from tfscheduler.workloads import StoredWorkload, WorkloadStore, mark_placed

log = logging.getLogger("tfscheduler")
MAX_PLACE_ATTEMPTS = 8
MAX_BATCH = 256
"""Most submissions placed together and reserved in one ledger transaction."""
REPLACED_KEPT = 2048
"""How many replacements' replaced GPUs `replaced_gpus` remembers (the oldest are forgotten)."""

Evict = Callable[[Candidate, WorkloadRef], Awaitable[None]]
"""Removes a preemption victim and records its eviction (`Scheduler._evict`); lock held."""


class Placer:
    """Places workloads for one scheduler. Its coroutines are called with the view room's lock held,
    except `place_submitted` and `retry_pending`, which take it. `verdicts` records the workloads kept
    pending or refused, and reads a workload's status (`Verdicts.status_of`: the workload store and the
    ledger only); `gangs` places gang members, with the quotas and policies this placer holds now."""

    def __init__(
        self,
        keeper: ViewKeeper,
        ledger: SqlLedger,
        store: WorkloadStore,
        *,
        policies: LearnedPolicies,
        evictor: Evictor,
        evict: Evict,
        quotas: dict[str, NamespaceQuota],
        clock: Callable[[], datetime],
    ) -> None:
        self.keeper = keeper
        self.ledger = ledger
        self.store = store
        self.policies = policies
        self.evictor = evictor
        self.quotas = quotas
        self.clock = clock
        self._evict = evict
        self.verdicts = Verdicts(ledger, store, clock)
        self.gangs = GangPlacer(
            keeper,
            ledger,
            store,
            self.verdicts,
            quotas=lambda: self.quotas,
            profile=lambda pool: self.policies.profile(pool),
            clock=clock,
        )
        self.replaced_gpus: dict[UUID, tuple[str, frozenset[str]]] = {}
        """A replacement's allocation id -> the node and GPUs of the workload it replaces
        (`Scheduler.evict`)."""

    async def place_submitted(self, batch: list[Queued]) -> None:
        """Place a batch of submissions (the intake's `place_batch`) and settle each caller's future
        with its workload's status."""
        now = self.clock()
        owners = {
            allocation_id_for(item.submission.workload): item.owner_uid for item in batch if item.owner_uid
        }
        submitted = [(allocation_id_for(item.submission.workload), item.submission) for item in batch]
        async with self.keeper.lock:
            recorded = await self._record_and_place(batch, submitted, owners, now)
            if recorded is None:  # the one-transaction path gave up: record, then place, as two steps
                # Read under the lock, so the states are current (a workload ended meanwhile is not
                # pending), with the holds, so a hold reserved before a submission is seen first.
                stored, _holds = await asyncio.gather(
                    self.store.insert_many(submitted, now), self.keeper.refresh_holds()
                )
                entries, fresh = _first_entries(batch, stored)
                self.policies.learn([workload for workload, _cause in fresh])
                statuses = await self._place_batch(fresh, announce=True, owners=owners, holds_read=True)
            else:
                entries, statuses = recorded
        unsettled = [
            workload.allocation_id for workload, _cause in entries if workload.allocation_id not in statuses
        ]
        settled = list((await self.store.by_ids(unsettled)).values())
        records = await self.ledger.get_allocations(
            [workload.allocation_id for workload in settled if workload.state == "placed"]
        )
        for workload in settled:
            record = records.get(workload.allocation_id)
            statuses[workload.allocation_id] = placed_status(record) if record else stored_status(workload)
        for item in batch:
            if not item.future.done():
                item.future.set_result(statuses[allocation_id_for(item.submission.workload)])

    async def _record_and_place(
        self,
        batch: list[Queued],
        submitted: list[tuple[UUID, Submission]],
        owners: Mapping[UUID, str],
        now: datetime,
    ) -> tuple[list[Entry], dict[UUID, WorkloadStatus]] | None:
        """Record the batch's submissions, read the holds and reserve every workload that fits at once,
        all in one ledger transaction (one commit); then place the rest one by one. Returns the batch's
        entries and the statuses decided, or None, with nothing written, when the ledger abandoned the
        transaction (a racing writer or a deadlock): the caller then records and places in two steps.
        Call with the lock held."""
        tentative: list[_Tentative] = []
        try:
            async with self.ledger.transaction() as transaction:
                stored = await self.store.insert_many(submitted, now, connection=transaction.connection)
                self.keeper.holds = {
                    hold.allocation.allocation_id: hold for hold in await transaction.active_holds()
                }
                entries, fresh = _first_entries(batch, stored)
                self.policies.learn([workload for workload, _cause in fresh])
                fresh, gang_members = split_gangs(fresh)
                held_ids = {
                    workload.allocation_id
                    for workload, _cause in fresh
                    if self.keeper.holds
                    and self._hold_for(workload.submission, owners.get(workload.allocation_id))
                }
                held = [entry for entry in fresh if entry[0].allocation_id in held_ids]
                tentative, alone = self._tentatives(
                    [entry for entry in fresh if entry[0].allocation_id not in held_ids]
                )
                results = (
                    await transaction.reserve_many(
                        [_tentative_reservation(t) for t in tentative],
                        commit=True,
                        then=mark_placed([t.stored.allocation_id for t in tentative], self.clock()),
                    )
                    if tentative
                    else []
                )
        except BatchAbandonedError as error:
            log.info("one-transaction batch abandoned; placing in two steps", extra={"error": str(error)})
            for t in tentative:
                self.keeper.view.release(t.outcome)
            return None
        except BaseException:
            for t in tentative:
                self.keeper.view.release(t.outcome)
            raise
        statuses: dict[UUID, WorkloadStatus] = {}
        alone = await self._settle(tentative, results, alone, owners, statuses)
        if held:
            statuses.update(await self._place_batch(held, announce=True, owners=owners, holds_read=True))
        statuses.update(await self._place_alone(alone, announce=True, owners=owners))
        statuses.update(await self.gangs.place_gangs(gang_members, announce=True))
        return entries, statuses

    async def retry_pending(self) -> int:
        """Try every pending workload again (highest priority first); returns how many were placed."""
        pending = await self.store.pending()
        placed = 0
        for start in range(0, len(pending), MAX_BATCH):
            async with self.keeper.lock:
                entries: list[Entry] = [(stored, None) for stored in pending[start : start + MAX_BATCH]]
                statuses = await self._place_batch(await self._still_pending(entries), announce=False)
            placed += sum(status.state == "placed" for status in statuses.values())
        return placed

    async def _still_pending(self, entries: list[Entry]) -> list[Entry]:
        """The entries not ended (or placed) since they were read: a workload deleted between reading
        the queue and taking the lock must not be given an allocation nobody will release. Lock held."""
        current = await self.store.by_ids([stored.allocation_id for stored, _cause in entries])
        return [
            (current[stored.allocation_id], cause)
            for stored, cause in entries
            if stored.allocation_id in current and current[stored.allocation_id].state == "pending"
        ]

    async def _place_batch(
        self,
        entries: list[Entry],
        *,
        announce: bool,
        refreshed: bool = False,
        owners: Mapping[UUID, str] | None = None,
        holds_read: bool = False,
    ) -> dict[UUID, WorkloadStatus]:
        """Place `entries` in order against the view, reserve those that fit in one transaction, and
        place every other one (and any the ledger refused) on its own. Replacements of pods the defrag
        planner evicted go into their holds first (read here unless `holds_read`: the caller read them
        after these entries were submitted). Call with the lock held."""
        owners = owners or {}
        statuses: dict[UUID, WorkloadStatus] = {}
        entries, gang_members = split_gangs(entries)
        if entries and not holds_read:  # a hold reserved a moment ago must be seen before its replacement
            await self.keeper.refresh_holds()
        if self.keeper.holds:
            entries = await self._claim_holds(entries, owners, statuses)
        tentative, alone = self._tentatives(entries)
        if tentative:
            try:
                results = await self.ledger.reserve_many(
                    [_tentative_reservation(t) for t in tentative],
                    commit=True,
                    then=mark_placed([t.stored.allocation_id for t in tentative], self.clock()),
                )
            except BaseException:
                for t in tentative:
                    self.keeper.view.release(t.outcome)
                raise
            alone = await self._settle(tentative, results, alone, owners, statuses)
        statuses.update(await self._place_alone(alone, announce=announce, refreshed=refreshed, owners=owners))
        statuses.update(await self.gangs.place_gangs(gang_members, announce=announce))
        return statuses

    def _tentatives(self, entries: list[Entry]) -> tuple[list[_Tentative], list[Entry]]:
        """Place each entry in order against the view (applied there, not yet in the ledger) when it
        fits without preemption or a refresh; the others, in order, need the full path."""
        tentative: list[_Tentative] = []
        alone: list[Entry] = []
        # Once a workload needs the full path (it may preempt), no lower-priority one jumps ahead of it.
        waiting_priority: Priority | None = None
        for stored, cause in entries:
            priority = Priority.of(stored.submission.priority, stored.submission.request.qos)
            quick = None
            if waiting_priority is None or priority >= waiting_priority:
                quick = self._quick_placement(stored)
            if quick is None:
                alone.append((stored, cause))
                waiting_priority = priority if waiting_priority is None else max(waiting_priority, priority)
                continue
            outcome, request = quick
            self.keeper.view.apply(outcome)
            tentative.append(_Tentative(stored, cause, outcome, request))
        return tentative, alone

    async def _settle(
        self,
        tentative: list[_Tentative],
        results: list[ReservationResult],
        alone: list[Entry],
        owners: Mapping[UUID, str],
        statuses: dict[UUID, WorkloadStatus],
    ) -> list[Entry]:
        """Take the committed reservations of `tentative` into the state and `statuses`; returns
        `alone` with the workloads the ledger refused added (they go the full path)."""
        refused: list[tuple[_Tentative, ReservationResult]] = []
        for t, result in zip(tentative, results, strict=True):
            if isinstance(result, Reserved) and not result.replayed:
                self.keeper.active.put(t.stored.allocation_id, active_of(result.allocation, t.stored))
                statuses[t.stored.allocation_id] = placed_status(result.allocation)
            else:
                refused.append((t, result))
        if not refused:
            return alone
        replayed: list[tuple[_Tentative, AllocationRecord]] = []
        for t, result in refused:
            self.keeper.view.release(t.outcome)
            if isinstance(result, Reserved):
                replayed.append((t, result.allocation))
            else:
                alone.append((t.stored, t.cause))
        # Workloads another scheduler placed meanwhile: take its allocation as this one's.
        taken_over = [(t, record) for t, record in replayed if record.state != "released"]
        for t, record in taken_over:
            if record.state == "reserved":
                await self.ledger.commit(record.allocation_id)
            self.keeper.active.put(record.allocation_id, active_of(record, t.stored))
            statuses[record.allocation_id] = placed_status(record)
        for t, record in replayed:
            if record.state == "released":
                statuses[record.allocation_id] = await self._placed(
                    t.stored, Reserved(record, True), t.outcome
                )
        touched = {t.outcome.node for t, _result in refused} | {record.node for _t, record in replayed}
        for node in sorted(touched):
            await self.keeper.rebuild_node(node)
        if len(replayed) < len(refused):
            # The view missed ledger changes: a hold reserved since the last read may be one of them.
            await self.keeper.refresh_holds()
            if self.keeper.holds:
                alone = await self._claim_holds(alone, owners, statuses)
        return alone

    async def _place_alone(
        self,
        alone: list[Entry],
        *,
        announce: bool,
        refreshed: bool = False,
        owners: Mapping[UUID, str],
    ) -> dict[UUID, WorkloadStatus]:
        """Place each workload that needs the full path (preemption, a refresh, a wait) on its own."""
        statuses: dict[UUID, WorkloadStatus] = {}
        if (
            alone
            and not refreshed
            and self.keeper.may_full_refresh()
            and any(self._unplaceable(stored) for stored, _cause in alone)
        ):
            await self.keeper.full_refresh()
            return await self._place_batch(
                alone, announce=announce, refreshed=True, owners=owners, holds_read=True
            )
        waiting: list[Waiting] = []
        for stored, cause in alone:
            verdict = self._unplaceable(stored)
            if verdict is None:
                statuses[stored.allocation_id] = await self._try_place(stored, cause=cause, announce=announce)
            else:
                waiting.append((stored, cause, *verdict))
        statuses.update(await self.verdicts.wait_many(waiting, announce))
        return statuses

    def _hold_for(self, submission: Submission, owner_uid: str | None) -> HoldRecord | None:
        """The unexpired hold kept for this workload: same namespace and pool, and the same controller
        owner or (local mode recreates with the same name) the same name."""
        workload = submission.workload
        now = self.clock()
        for hold in self.keeper.holds.values():
            held_for = hold.held_for
            if (
                held_for.namespace == workload.namespace
                and held_for.pool == submission.request.pool
                and held_for.expires_at > now
                and (
                    (held_for.owner_uid is not None and held_for.owner_uid == owner_uid)
                    or held_for.name == workload.name
                )
            ):
                return hold
        return None

    async def _claim_holds(
        self,
        entries: list[Entry],
        owners: Mapping[UUID, str],
        statuses: dict[UUID, WorkloadStatus],
    ) -> list[Entry]:
        """Place each entry a hold is kept for into its hold; returns the entries left to place."""
        remaining = []
        for stored, cause in entries:
            hold = self._hold_for(stored.submission, owners.get(stored.allocation_id))
            status = None if hold is None else await self._claim(stored, cause, hold)
            if status is None:
                remaining.append((stored, cause))
            else:
                statuses[stored.allocation_id] = status
        return remaining

    async def _claim(
        self, stored: StoredWorkload, cause: UUID | None, hold: HoldRecord
    ) -> WorkloadStatus | None:
        """Swap `hold` for the workload's allocation on the same GPUs; None when it does not fit the
        hold (more than held, another GPU count, a quota, a blocked node) and goes the normal way."""
        hold_id = hold.allocation.allocation_id
        self.keeper.holds.pop(hold_id, None)  # one replacement per hold, whatever happens next
        submission = stored.submission
        workload = submission.workload
        quota = self.quotas.get(workload.namespace)
        request = with_defaults(quota, submission.request)
        node = self.keeper.view.nodes.get(hold.allocation.node)
        if check_single(quota, request) is not None or node is None or node.name in self.keeper.blocked:
            return None
        try:
            wanted = placement_request_of(submission, request)
        except PlacementRequestError:
            return None
        held = placement_of(hold.allocation, node)
        outcome = into_hold(held, wanted, node)
        if outcome is None:
            return None
        if quota is not None:
            used = usage_by_namespace(a.record for a in self.keeper.active.values()).get(
                workload.namespace, Usage()
            )
            if check_total(quota, used, demand_of(outcome, request)) is not None:
                return None
        result = await self.ledger.claim_hold(
            hold_id, reservation_for(stored.allocation_id, submission, request, outcome, cause)
        )
        if not isinstance(result, Reserved) or result.replayed:
            return None
        self.keeper.active.drop(hold_id)
        self.keeper.active.put(stored.allocation_id, active_of(result.allocation, stored))
        await self.keeper.rebuild_node(node.name)
        await self.store.transition(stored.allocation_id, Transition.PLACE, None, self.clock())
        log.info(
            "replacement placed into its defrag hold",
            extra={
                "workload": f"{workload.namespace}/{workload.name}",
                "hold": str(hold_id),
                "node": node.name,
            },
        )
        if outcome.tflops_milli != held.tflops_milli or outcome.vram_bytes != held.vram_bytes:
            self.keeper.capacity_freed.set()
        return placed_status(result.allocation)

    def _unplaceable(self, stored: StoredWorkload) -> tuple[str, Rejection] | None:
        """The unschedulable summary when the workload fits nowhere in the view and preempts nobody;
        None when it may be placed (or needs the full path: a quota, an invalid request)."""
        attempt = self._plain_attempt(stored)
        if attempt is None or not isinstance(attempt.outcome, Rejection):
            return None
        submission = stored.submission
        priority = Priority.of(submission.priority, submission.request.qos)
        plan = plan_preemption(
            attempt.wanted,
            priority,
            self.keeper.view.nodes,
            self._candidates(priority),
            attempt.profile,
            self.clock(),
        )
        if not isinstance(plan, NoPreemption):
            return None
        summary = unschedulable_summary(attempt.outcome, self.keeper.blocked, preemption_reason=plan.reason)
        return summary, attempt.outcome

    def _quick_placement(self, stored: StoredWorkload) -> tuple[Placement, GpuRequest] | None:
        """Where the workload goes in the view when nothing special applies (no quota, no pool maximum,
        it fits)."""
        attempt = self._plain_attempt(stored)
        if attempt is None or isinstance(attempt.outcome, Rejection):
            return None
        return attempt.outcome, stored.submission.request

    def _plain_attempt(self, stored: StoredWorkload) -> _PlainAttempt | None:
        """The workload placed in the view as submitted (`_place`), when nothing special applies: no
        namespace quota, no pool maximum, a valid request; None otherwise (it needs the full path)."""
        submission = stored.submission
        if submission.workload.namespace in self.quotas or self.keeper.capped(submission.request.pool):
            return None
        try:
            wanted = placement_request_of(submission, submission.request)
        except PlacementRequestError:
            return None
        profile = self.policies.profile(submission.request.pool)
        return _PlainAttempt(wanted, profile, self._place(stored, wanted, profile))

    async def _try_place(
        self, stored: StoredWorkload, *, cause: UUID | None, announce: bool = True
    ) -> WorkloadStatus:
        submission = stored.submission
        workload = submission.workload
        namespace = workload.namespace
        quota = self.quotas.get(namespace)
        request = with_defaults(quota, submission.request)
        refusal = check_single(quota, request)
        if refusal is not None:
            return await self.verdicts.refuse(stored, refusal.reason, cause)
        try:
            wanted = placement_request_of(submission, request)
        except PlacementRequestError as error:
            return await self.verdicts.refuse(stored, str(error), cause)
        profile = self.policies.profile(request.pool)
        priority = Priority.of(submission.priority, request.qos)
        refreshed = False
        for _attempt in range(MAX_PLACE_ATTEMPTS):
            outcome = self._place(stored, wanted, profile)
            if isinstance(outcome, Rejection):
                if not refreshed and self.keeper.may_full_refresh():
                    await self.keeper.full_refresh()
                    refreshed = True
                    continue
                plan = plan_preemption(
                    wanted,
                    priority,
                    self.keeper.view.nodes,
                    self._candidates(priority),
                    profile,
                    self.clock(),
                )
                if isinstance(plan, NoPreemption):
                    summary = unschedulable_summary(
                        outcome, self.keeper.blocked, preemption_reason=plan.reason
                    )
                    return await self.verdicts.wait(stored, summary, outcome, cause, announce)
                for victim in plan.victims:
                    await self._evict(victim, workload)
                continue
            over = self.keeper.over_pool_maximum(request.pool, [outcome])
            if over is not None:
                return await self.verdicts.wait(stored, over, None, cause, announce)
            reservation = reservation_for(stored.allocation_id, submission, request, outcome, cause)
            if quota is None:
                result = await self._reserve(reservation)
            else:
                checked = await self._reserve_within_quota(reservation, quota, outcome, request)
                if isinstance(checked, QuotaHeld):
                    return await self.verdicts.wait(stored, checked.reason, None, cause, announce)
                result = checked
            if isinstance(result, Reserved):
                return await self._placed(stored, result, outcome)
            if isinstance(result, InsufficientCapacity | ReservationRejected):
                await self.keeper.rebuild_node(outcome.node)
                continue
        return await self.verdicts.wait(
            stored, "placement kept conflicting with other schedulers; will retry", None, cause, announce
        )

    def _place(
        self, stored: StoredWorkload, wanted: PlacementRequest, profile: Profile
    ) -> Placement | Rejection:
        """`place` in the view, except that a replacement goes on other GPUs than the ones of the workload it
        replaces whenever any fit: an eviction without a cordon does not land it back where it was."""
        replaced = self.replaced_gpus.get(stored.allocation_id)
        node = self.keeper.view.nodes.get(replaced[0]) if replaced else None
        if replaced and node is not None:
            self.keeper.view.upsert(with_gpus_full(node, replaced[1]))
            try:
                elsewhere = place(wanted, self.keeper.view, profile)
            finally:
                self.keeper.view.upsert(node)
            if isinstance(elsewhere, Placement):
                return elsewhere
        return place(wanted, self.keeper.view, profile)

    def place_replacement_elsewhere(self, replacement: Submission, replaced: UUID) -> None:
        """Remember the GPUs the evicted workload held, for `_place` to avoid with its replacement."""
        active = self.keeper.active.get(replaced)
        if active is None:
            return
        gpus = frozenset(share.gpu_uuid for share in active.record.shares)
        self.replaced_gpus[allocation_id_for(replacement.workload)] = (active.record.node, gpus)
        while len(self.replaced_gpus) > REPLACED_KEPT:
            self.replaced_gpus.pop(next(iter(self.replaced_gpus)))

    async def _reserve(self, reservation: ReservationRequest) -> ReservationResult:
        try:
            return await self.ledger.reserve(reservation, commit=True)
        except IntegrityError:
            # Another scheduler reserved this workload on other GPUs at the same moment and committed
            # first; its outbox row (same event id) refused ours. The workload holds one allocation.
            existing = await self.ledger.get_allocation(reservation.allocation_id)
            if existing is None:
                raise
            return Reserved(allocation=existing, replayed=True)

    async def _reserve_within_quota(
        self, reservation: ReservationRequest, quota: NamespaceQuota, outcome: Placement, request: GpuRequest
    ) -> ReservationResult | QuotaHeld:
        """Reserve only if the namespace's usage in the ledger, read under the namespace's lock in the
        reservation's own transaction, leaves room for it (`SqlLedger.reserve_within_quota`)."""
        demand = self.keeper.namespace_demand(outcome, request)

        def check(shares: Sequence[NamespaceShare]) -> str | None:
            used = usage_of_shares(shares).get(quota.namespace, Usage())
            over = check_total(quota, used, demand)
            return None if over is None else over.reason

        try:
            return await self.ledger.reserve_within_quota(reservation, check, commit=True)
        except IntegrityError:
            existing = await self.ledger.get_allocation(reservation.allocation_id)
            if existing is None:
                raise
            return Reserved(allocation=existing, replayed=True)

    def _candidates(self, below: Priority) -> list[Candidate]:
        """The allocations a workload of priority `below` may preempt: lower priority, not a defrag
        hold (capacity kept for a pod in flight, with no pod to evict), not a gang member (evicting one
        would split its gang), and not one the evictor is not to try again yet."""
        candidates = []
        for active in self.keeper.active.values():
            allocation_id = active.record.allocation_id
            if (
                active.priority >= below
                or allocation_id in self.keeper.holds
                or active.gang
                or not self.evictor.may_evict(allocation_id)
            ):
                continue
            node = self.keeper.view.nodes.get(active.record.node)
            if node is None:
                continue
            candidates.append(
                Candidate(
                    allocation_id=active.record.allocation_id,
                    workload=active.record.workload,
                    priority=active.priority,
                    created_at=active.record.created_at,
                    holding=placement_of(active.record, node),
                    protected_until=active.protected_until,
                )
            )
        return candidates

    async def _placed(self, stored: StoredWorkload, result: Reserved, outcome: Placement) -> WorkloadStatus:
        record = result.allocation
        now = self.clock()
        if record.state == "released":
            await self.store.transition(stored.allocation_id, Transition.END, record.release_reason, now)
            return await self.verdicts.status_of(stored.allocation_id)
        if result.replayed:
            await self.keeper.rebuild_node(record.node)
        else:
            self.keeper.view.apply(outcome)
        if record.state == "reserved":
            await self.ledger.commit(record.allocation_id)
        self.keeper.active.put(record.allocation_id, active_of(record, stored))
        await self.store.transition(stored.allocation_id, Transition.PLACE, None, now)
        return placed_status(record)


@dataclass(frozen=True)
class _Tentative:
    """A workload placed in the view (not yet in the ledger) within a batch."""

    stored: StoredWorkload
    cause: UUID | None
    outcome: Placement
    request: GpuRequest


@dataclass(frozen=True)
class _PlainAttempt:
    """A workload placed in the view as submitted: what was asked, under which profile, and the outcome."""

    wanted: PlacementRequest
    profile: Profile
    outcome: Placement | Rejection


def _first_entries(
    batch: list[Queued], stored: Mapping[UUID, StoredWorkload]
) -> tuple[list[Entry], list[Entry]]:
    """Each workload of the batch once (its first submission wins), with its stored row and cause;
    and those among them still pending, the ones to place."""
    first_of: set[UUID] = set()
    entries: list[Entry] = []
    for item in batch:
        allocation_id = allocation_id_for(item.submission.workload)
        if allocation_id not in first_of:
            first_of.add(allocation_id)
            entries.append((stored[allocation_id], item.cause))
    return entries, [(workload, cause) for workload, cause in entries if workload.state == "pending"]


def _tentative_reservation(tentative: _Tentative) -> ReservationRequest:
    stored = tentative.stored
    return reservation_for(
        stored.allocation_id, stored.submission, tentative.request, tentative.outcome, tentative.cause
    )
