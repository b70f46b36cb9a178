"""The scheduler's engine: one `Scheduler` per process, composed of its rooms, and what ends a
workload (release, eviction, preemption).

Its rooms: the view room (`tfscheduler.view_keeper`: the placement view kept in step with the ledger),
the placing room (`tfscheduler.placing`: batches, gangs, holds and quotas, reserved in the ledger), the
intake (`tfscheduler.intake`), the learned policies (`tfscheduler.policies`) and the eviction port
(`tfscheduler.eviction`). The database refuses over-allocation, so several scheduler processes stay
correct. Every event the engine announces goes out through the ledger outbox, in the transaction that
records what it announces: an allocation with `tf.evt.allocation.*`, a verdict with
`tf.evt.workload.unschedulable`, an eviction (its release, the workload's state, its replacement) with
`tf.evt.pod.evicted`; so a bus outage fails no submission and neither it nor a crash leaves half of
one. (`Scheduler.bus` is for what is announced without a ledger change: the Kubernetes mode's drift
report of a binding it could not adopt.)

A replacement of a pod the defrag planner evicted goes into the capacity hold kept for it: the ledger
swaps the hold for the replacement's allocation on the same GPUs (`SqlLedger.claim_hold`). The active
holds are kept in memory (`holds`), read with the full view, every node re-check, after a refused
reservation, and by each submission batch, in the transaction that records and reserves it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID, uuid5

from tfcommon.bus import EventBus
from tfcommon.config import TfConfig
from tfcommon.events import PodEvicted, WorkloadRef
from tfcommon.ledger.records import HoldRecord
from tfcommon.ledger.sql import LedgerTransaction, SqlLedger
from tfcommon.placement import (
    DEFAULT_POLICY,
    ClusterView,
    Placement,
    PlacementRequest,
    Profile,
    evaluate,
    place,
)
from tfcommon.placement.registry import POLICIES
from tfcommon.pool_capacity import HostFacts, capacities_of, capacity_problems

from tfscheduler.core.lifecycle import Transition
from tfscheduler.core.preemption import Candidate
from tfscheduler.core.quota import NamespaceQuota, check_single, with_defaults
from tfscheduler.core.reports import unschedulable_summary
from tfscheduler.core.view import allocation_id_for, placement_of, placement_request_of
from tfscheduler.eviction import Evictor, LocalEvictor, Removal
from tfscheduler.intake import Queued, SubmissionIntake
from tfscheduler.placing import MAX_BATCH, Placer
from tfscheduler.policies import LearnedPolicies
from tfscheduler.submission import Submission, WorkloadStatus
from tfscheduler.view_keeper import ActiveAllocations, ViewKeeper
from tfscheduler.workloads import StoredWorkload, WorkloadStore


def utc_now() -> datetime:
    return datetime.now(UTC)


def placement_mode(config: TfConfig, pool: str) -> str:
    """The pool's placement mode: `placement.mode` in its GPUPool spec, else our default policy."""
    pool_config = config.pool(pool)
    extra = (pool_config.spec_template.model_extra or {}) if pool_config else {}
    placement = extra.get("placement") or {}
    mode = placement.get("mode") if isinstance(placement, Mapping) else None
    return str(mode) if mode else DEFAULT_POLICY


def placement_problems(pool: str, spec: Mapping[str, Any]) -> list[str]:
    """What the scheduler cannot read in a GPUPool spec (empty: valid): a `placement.mode` that names no
    policy, an unreadable `capacityConfig.maxResources`/`oversubscription` or `nodeSelector`
    (`tfcommon.pool_capacity`). The check `tfcommon.pool_source` runs before a cluster pool's spec takes
    effect."""
    problems = capacity_problems(pool, spec)
    placement = spec.get("placement")
    mode = placement.get("mode") if isinstance(placement, Mapping) else None
    if mode is None or mode in POLICIES:
        return problems
    return [
        f"pool {pool}: spec.placement.mode: unknown policy {mode!r}; use one of {', '.join(POLICIES)}",
        *problems,
    ]


class Scheduler:
    """Places submitted workloads. Every public coroutine is safe to call concurrently."""

    def __init__(
        self,
        ledger: SqlLedger,
        bus: EventBus,
        *,
        config: TfConfig | None = None,
        quotas: Mapping[str, NamespaceQuota] | None = None,
        heartbeat_timeout: timedelta | None = None,
        clock: Callable[[], datetime] = utc_now,
        name: str = "scheduler",
        evictor: Evictor | None = None,
    ) -> None:
        self.ledger = ledger
        self.bus = bus
        self.store = WorkloadStore(ledger.engine)
        self._config = config or TfConfig()
        self.clock = clock
        self.name = name
        self.keeper = ViewKeeper(
            ledger,
            self.store,
            capacities=capacities_of(self._config),
            heartbeat_timeout=heartbeat_timeout,
            clock=clock,
            name=name,
        )
        """The view room: the placement view, blocked nodes, active allocations and holds."""
        self._lock = self.keeper.lock
        self.capacity_freed = self.keeper.capacity_freed
        self.placer = Placer(
            self.keeper,
            ledger,
            self.store,
            policies=LearnedPolicies(lambda pool: placement_mode(self._config, pool), name=name),
            evictor=evictor or LocalEvictor(),
            evict=self._evict,
            quotas=dict(quotas or {}),
            clock=clock,
        )
        """The placing room: batches, gangs, holds and quotas."""
        self.intake = SubmissionIntake(self._submit_batch, max_batch=MAX_BATCH, name=name)
        """Submissions waiting for the next batch."""

    # ------------------------------------------------------------------------------ the rooms' state

    @property
    def view(self) -> ClusterView:
        return self.keeper.view

    @property
    def blocked(self) -> dict[str, str]:
        """The nodes that take no new work, and why."""
        return self.keeper.blocked

    @property
    def active(self) -> ActiveAllocations:
        return self.keeper.active

    @property
    def holds(self) -> dict[UUID, HoldRecord]:
        return self.keeper.holds

    @property
    def hosts(self) -> dict[str, HostFacts] | None:
        return self.keeper.hosts

    @property
    def heartbeat_timeout(self) -> timedelta | None:
        return self.keeper.heartbeat_timeout

    @heartbeat_timeout.setter
    def heartbeat_timeout(self, timeout: timedelta | None) -> None:
        self.keeper.heartbeat_timeout = timeout

    @property
    def quotas(self) -> dict[str, NamespaceQuota]:
        """Each namespace's quota in force (a GPUResourceQuota edit in Kubernetes mode replaces them)."""
        return self.placer.quotas

    @quotas.setter
    def quotas(self, quotas: dict[str, NamespaceQuota]) -> None:
        self.placer.quotas = quotas

    @property
    def evictor(self) -> Evictor:
        """How preemption removes a victim (`tfscheduler.eviction`): local by default; Kubernetes mode
        sets the Eviction API's."""
        return self.placer.evictor

    @evictor.setter
    def evictor(self, evictor: Evictor) -> None:
        self.placer.evictor = evictor

    @property
    def policies(self) -> LearnedPolicies:
        """Each pool's placement policy, learning its target workload from the submissions."""
        return self.placer.policies

    @policies.setter
    def policies(self, policies: LearnedPolicies) -> None:
        self.placer.policies = policies

    @property
    def config(self) -> TfConfig:
        """The configuration placement reads; setting it (a GPUPool edit in Kubernetes mode) applies a
        changed maxResources, oversubscription or nodeSelector to the view at once."""
        return self._config

    @config.setter
    def config(self, config: TfConfig) -> None:
        self._config = config
        self.keeper.set_capacities(capacities_of(config))

    def observe_hosts(self, hosts: Mapping[str, HostFacts]) -> None:
        """The nodes' labels, memory and disk as the API server has them now (Kubernetes mode): a
        change that matters to a pool's nodeSelector or virtual capacity applies to the view at once."""
        self.keeper.observe_hosts(hosts)

    def pool_membership(self, name: str, pool: str) -> str | None:
        """Why the node is not in its pool (its labels miss the pool's nodeSelector), or None."""
        return self.keeper.pool_membership(name, pool)

    # ------------------------------------------------------------------------------ state loading

    def profile(self, pool: str) -> Profile:
        """The pool's policy, with the target workload learned from the recent submissions."""
        return self.policies.profile(pool)

    @property
    def learned_submissions(self) -> int:
        """How many submissions the learned workload mix has counted since the start."""
        return self.policies.learned_submissions

    async def relearned(self) -> None:
        """Wait until the policies of the last target learned have started."""
        await self.policies.relearned()

    async def start(self) -> None:
        """Rebuild the in-memory view from the ledger (at start, and as a periodic safety net).

        The ledger is read and the view built in worker threads without the engine lock, so placing
        goes on meanwhile (at 10,000 nodes a rebuild is about 2 s of CPU, which used to stall every
        submission); what placing, releasing and node checks changed since the read is kept when the
        new view is installed, under the lock."""
        await self.keeper.full_refresh(locked=False)

    async def node_changed(self, name: str) -> None:
        """The node's inventory or state changed in the ledger: rebuild it, then retry pending work."""
        await self.keeper.node_changed(name)

    def heartbeat(self, node: str, interval_ms: int) -> None:
        self.keeper.heartbeat(node, interval_ms)

    async def recheck_nodes(self) -> None:
        """Re-read node flags and heartbeats from the ledger; block or unblock nodes whose state changed
        (`ViewKeeper.recheck_nodes`)."""
        await self.keeper.recheck_nodes()

    # ---------------------------------------------------------------------------------- placing

    async def submit(
        self, submission: Submission, *, cause: UUID | None = None, owner_uid: str | None = None
    ) -> WorkloadStatus:
        """Place `submission` now, or record it as pending with the reason. Idempotent per workload.

        Submissions that arrive while a batch is being written are placed together: one after another
        against the view, then reserved in one ledger transaction (a refused one is placed again on
        its own). Each caller still gets its own workload's status. `owner_uid` (the pod's controller
        owner) lets a replacement claim the defrag hold kept for the pod it replaces.
        """
        return await self.intake.submit(submission, cause, owner_uid)

    async def _submit_batch(self, batch: list[Queued]) -> None:
        await self.placer.place_submitted(batch)

    async def retry_pending(self) -> int:
        """Try every pending workload again (highest priority first); returns how many were placed."""
        return await self.placer.retry_pending()

    # ---------------------------------------------------------------------------------- eviction

    async def _evict(self, victim: Candidate, preemptor: WorkloadRef) -> None:
        """Remove the victim through the evictor, then record its preemption as one committed fact with
        its event (`_commit_preemption`): with its replacement when the scheduler is its controller."""
        removal = await self.evictor.remove(victim)
        if removal is Removal.REFUSED:
            return
        replaced_by_controller = removal is Removal.REPLACED_BY_CONTROLLER
        await self._commit_preemption(victim, preemptor, pod_evicted=replaced_by_controller)

    async def _commit_preemption(
        self, victim: Candidate, preemptor: WorkloadRef, *, pod_evicted: bool
    ) -> None:
        """Record the preemption of `victim` in one ledger transaction: its allocation released as
        evicted, its workload `evicted`, `tf.evt.pod.evicted` in the outbox and, in local mode, its
        replacement recorded as pending. A transaction that fails changes nothing, in the ledger or in
        memory, and the error propagates. Without `pod_evicted` nothing is recorded unless this
        transaction releases the allocation (another process that released it first ended the
        workload). With `pod_evicted` (Kubernetes: evicted through the API already, its controller
        recreates it) the state and the event are recorded even then. Call with the lock held."""
        allocation_id = UUID(str(victim.allocation_id))
        reason = f"preempted by {preemptor.namespace}/{preemptor.name}"
        stored = None if pod_evicted else await self.store.get(allocation_id)
        replacement = None if stored is None else _replacement_of(stored)
        node = self.view.nodes.get(victim.node)
        now = self.clock()
        event = _pod_evicted(
            allocation_id,
            victim.workload,
            victim.node,
            node.pool if node is not None else "default",
            reason,
            now,
            by="preemption",
            preemptor=preemptor,
        )
        async with self.ledger.transaction() as transaction:
            released = await transaction.release(allocation_id, reason, evicted=True)
            if released or pod_evicted:
                await self._record_eviction(transaction, allocation_id, reason, now, replacement)
                await transaction.announce(event)
        self.active.drop(allocation_id)
        if not released:  # released by another process meanwhile: the view follows the ledger
            await self.keeper.rebuild_node(victim.node)
        elif node is not None:
            self.view.release(victim.holding)

    async def _record_eviction(
        self,
        transaction: LedgerTransaction,
        allocation_id: UUID,
        reason: str,
        now: datetime,
        replacement: Submission | None,
    ) -> None:
        """The workload store's part of an eviction, in the eviction's transaction: the workload
        `evicted` and, when there is one, its replacement pending (an existing one stays as it is)."""
        connection = transaction.connection
        await self.store.transition(allocation_id, Transition.EVICT, reason, now, connection=connection)
        if replacement is not None:
            await self.store.insert_many(
                [(allocation_id_for(replacement.workload), replacement)], now, connection=connection
            )

    async def evict(
        self,
        allocation_id: UUID,
        reason: str,
        *,
        by: Literal["defrag", "preemption", "drain"] = "drain",
        announce: bool = True,
    ) -> WorkloadStatus | None:
        """The local Eviction API: release the placed workload as evicted, then recreate it as a controller
        would (same name, a new uid) and place the replacement now, into the defrag hold kept for its name
        if there is one. Returns the replacement's status; None when the workload is not placed (unknown,
        pending or ended). Evicting it again returns the same replacement. The release, the evicted
        state, the replacement's row and, with `announce`, `tf.evt.pod.evicted` (through the outbox)
        commit in one transaction or not at all (the defrag planner announces its own evictions, with
        the campaign, and passes `announce=False`)."""
        stored = await self.store.get(allocation_id)
        if stored is None:
            return None
        replacement = _replacement_of(stored)
        if stored.state == "evicted":
            return await self.submit(replacement)
        if stored.state != "placed":
            return None
        self.placer.place_replacement_elsewhere(replacement, allocation_id)
        async with self._lock:
            active = self.active.get(allocation_id)
            record = active.record if active else await self.ledger.get_allocation(allocation_id)
            now = self.clock()
            released = False
            if record is not None:
                async with self.ledger.transaction() as transaction:
                    released = await transaction.release(allocation_id, reason, evicted=True)
                    if released:
                        await self._record_eviction(transaction, allocation_id, reason, now, replacement)
                    if released and announce:
                        await transaction.announce(
                            _pod_evicted(
                                allocation_id, record.workload, record.node, record.pool, reason, now, by=by
                            )
                        )
            if released and record is not None:
                self.active.drop(allocation_id)
                node = self.view.nodes.get(record.node)
                if node is not None:
                    self.view.release(placement_of(record, node))
            current = await self.store.get(allocation_id)
        if record is None or current is None or current.state != "evicted":
            return None  # ended (or released by another process) meanwhile
        if released:
            self.capacity_freed.set()
        return await self.submit(replacement)  # an eviction that came first: the same replacement

    # ---------------------------------------------------------------------------------- release

    async def release(self, allocation_id: UUID, reason: str, *, cause: UUID | None = None) -> bool:
        """End the workload: close its allocation once (True the one time it is closed) or drop it from
        the pending queue. Redelivered or concurrent calls change nothing more."""
        async with self._lock:
            released = await self.ledger.release(allocation_id, reason, cause)
            active = self.active.drop(allocation_id)
            if released:
                node = self.view.nodes.get(active.record.node) if active else None
                if active is not None and node is not None:
                    self.view.release(placement_of(active.record, node))
                else:
                    record = await self.ledger.get_allocation(allocation_id)
                    if record is not None:
                        await self.keeper.rebuild_node(record.node)
            await self.store.transition(allocation_id, Transition.END, reason, self.clock())
        if released:
            self.capacity_freed.set()
        return released

    async def released_elsewhere(self, allocation_id: UUID, reason: str) -> bool:
        """Follow a release another process made in the ledger (a node agent, the defrag planner, another
        replica, an operator): give the capacity back in the view, retry pending work, and end the stored
        workload with the ledger's `reason` (only from pending or placed, so an eviction stays one).
        True the one time the view changes; this scheduler's own releases and redelivered events change
        nothing. Nothing is replaced here: whoever evicts queues the replacement (local preemption) or
        the pod's controller recreates it (Kubernetes)."""
        async with self._lock:
            active = self.active.drop(allocation_id)
            self.holds.pop(allocation_id, None)
            if active is not None:
                # Rebuilt, not released in the view: a node rebuilt since the ledger release already
                # shows the capacity free, and releasing it again would count it twice.
                await self.keeper.rebuild_node(active.record.node)
            # Also when a full refresh dropped it from `active` first: the stored state must not stay placed.
            await self.store.transition(allocation_id, Transition.END, reason, self.clock())
        if active is not None:
            self.capacity_freed.set()
        return active is not None

    # ------------------------------------------------------------------------------------ reads

    async def status(self, allocation_id: UUID) -> WorkloadStatus | None:
        stored = await self.store.get(allocation_id)
        return None if stored is None else await self.placer.verdicts.status_of(allocation_id)

    def simulate(self, submission: Submission) -> dict[str, object]:
        """Where the workload would go now and why every other node does not fit; changes nothing."""
        quota = self.quotas.get(submission.workload.namespace)
        request = with_defaults(quota, submission.request)
        wanted: PlacementRequest = placement_request_of(submission, request)
        profile = self.profile(request.pool)
        outcome = place(wanted, self.view, profile)
        nodes: dict[str, object] = {}
        for name in sorted(self.view.nodes):
            if name in self.blocked:
                nodes[name] = {"fits": False, "reason": self.blocked[name]}
                continue
            verdict = evaluate(profile, wanted, self.view.nodes[name])
            nodes[name] = (
                {"fits": False, "reason": verdict}
                if isinstance(verdict, str)
                else {"fits": True, "score": round(verdict.score, 3)}
            )
        single = check_single(quota, request)
        result: dict[str, object] = {"policy": profile.name, "nodes": nodes}
        if single is not None:
            result.update(placed=False, summary=single.reason)
        elif isinstance(outcome, Placement):
            result.update(
                placed=True, node=outcome.node, gpu_uuids=list(outcome.gpu_uuids), score=outcome.score
            )
        else:
            result.update(placed=False, summary=unschedulable_summary(outcome, self.blocked))
        return result


def _pod_evicted(
    allocation_id: UUID,
    workload: WorkloadRef,
    node: str,
    pool: str,
    reason: str,
    now: datetime,
    *,
    by: Literal["defrag", "preemption", "drain"],
    preemptor: WorkloadRef | None = None,
) -> PodEvicted:
    """`tf.evt.pod.evicted` for an allocation, its id derived from the allocation (uuid5 `evicted`): the
    same eviction recorded twice is one event, for the outbox and for consumers."""
    return PodEvicted(
        event_id=uuid5(allocation_id, "evicted"),
        occurred_at=now,
        workload=workload,
        node=node,
        pool=pool,
        by=by,
        reason=reason,
        allocation_id=allocation_id,
        preemptor=preemptor,
    )


def _replacement_of(stored: StoredWorkload) -> Submission:
    """What the local controller recreates after an eviction: the same workload under a new uid, derived
    from the evicted allocation so that evicting twice yields the same replacement."""
    old = stored.submission.workload
    uid = str(uuid5(stored.allocation_id, "replacement"))
    return stored.submission.model_copy(update={"workload": old.model_copy(update={"uid": uid})})
