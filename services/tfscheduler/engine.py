"""The scheduler's I/O shell: keeps the placement view, places, reserves in the ledger, releases.

One `Scheduler` per process. Decisions come from `tfcommon.placement` and `tfscheduler.core`; this
module loads ledger state, writes reservations (the database refuses over-allocation, so several
scheduler processes stay correct: a refused reservation refreshes the node and places again) and
announces what it decided. Every event it announces goes out through the ledger outbox, in the
transaction that records what it announces: an allocation with `tf.evt.allocation.*`, a verdict with
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

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from uuid import UUID, uuid4, uuid5

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from tfcommon.bus import EventBus
from tfcommon.config import TfConfig
from tfcommon.events import GpuRequest, PodEvicted, WorkloadRef, WorkloadUnschedulable
from tfcommon.ledger import tables
from tfcommon.ledger.records import (
    AllocationRecord,
    GpuRecord,
    HoldRecord,
    InsufficientCapacity,
    NamespaceShare,
    NodeRecord,
    PlacementFacts,
    QuotaHeld,
    ReservationRejected,
    ReservationRequest,
    ReservationResult,
    Reserved,
    ShareRequest,
)
from tfcommon.ledger.sql import BatchAbandonedError, LedgerTransaction, SqlLedger
from tfcommon.node_readiness import HeartbeatSeen, readiness_timeout
from tfcommon.placement import (
    DEFAULT_POLICY,
    ClusterView,
    Node,
    Placement,
    PlacementRequest,
    PlacementRequestError,
    Profile,
    Rejection,
    evaluate,
    place,
)
from tfcommon.placement.gang import place_gang
from tfcommon.placement.registry import POLICIES
from tfcommon.pool_capacity import (
    NO_BOUNDS,
    HostFacts,
    PoolCapacity,
    capacities_of,
    capacity_problems,
    membership_reason,
    over_maximum,
    with_virtual_capacity,
)

from tfscheduler.core.gang import GangCount, gang_reason, timed_out
from tfscheduler.core.lifecycle import Transition, target
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
from tfscheduler.core.reports import unschedulable_event, unschedulable_summary
from tfscheduler.core.view import (
    DEFRAG_SOURCE,
    allocation_id_for,
    build_snapshot,
    node_block_reason,
    placement_of,
    placement_request,
)
from tfscheduler.eviction import Evictor, LocalEvictor, Removal
from tfscheduler.intake import Queued, SubmissionIntake
from tfscheduler.policies import LearnedPolicies
from tfscheduler.submission import Submission, WorkloadStatus
from tfscheduler.workloads import StoredWorkload, WorkloadStore, mark_placed

log = logging.getLogger("tfscheduler")
MAX_PLACE_ATTEMPTS = 8
MIN_FULL_REFRESH_INTERVAL_S = 1.0
MAX_BATCH = 256
REPLACED_KEPT = 2048
"""How many replacements' replaced GPUs `replaced_gpus` remembers (the oldest are forgotten)."""
RECHECK_SLICE = 500
"""Nodes `recheck_nodes` checks between two turns of the event loop."""
"""Most submissions placed together and reserved in one ledger transaction."""


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class _Tentative:
    """A workload placed in the view (not yet in the ledger) within a batch."""

    stored: StoredWorkload
    cause: UUID | None
    outcome: Placement
    request: GpuRequest


@dataclass(frozen=True)
class Active:
    """An active allocation as the scheduler knows it, with what preemption needs."""

    record: AllocationRecord
    priority: Priority
    protected_until: datetime | None
    gang: str | None = None
    """The gang group key of a gang member: preemption never evicts one (it would split the gang)."""


class ActiveAllocations(Mapping[UUID, Active]):
    """The allocations the scheduler holds active, by id. While a view is rebuilt without the engine
    lock (`Scheduler.start`), every id put or dropped meanwhile is noted in the rebuild's journal, so
    that installing the rebuilt view keeps what placement and release did after its ledger read."""

    def __init__(self) -> None:
        self._by_id: dict[UUID, Active] = {}
        self._journals: list[set[UUID]] = []

    def __getitem__(self, allocation_id: UUID) -> Active:
        return self._by_id[allocation_id]

    def __iter__(self) -> Iterator[UUID]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def put(self, allocation_id: UUID, active: Active) -> None:
        for journal in self._journals:
            journal.add(allocation_id)
        self._by_id[allocation_id] = active

    def drop(self, allocation_id: UUID) -> Active | None:
        for journal in self._journals:
            journal.add(allocation_id)
        return self._by_id.pop(allocation_id, None)

    def replace_all(self, by_id: dict[UUID, Active]) -> None:
        self._by_id = by_id

    @contextlib.contextmanager
    def journal(self) -> Iterator[set[UUID]]:
        """The ids put or dropped from now until the block ends."""
        touched: set[UUID] = set()
        self._journals.append(touched)
        try:
            yield touched
        finally:
            self._journals.remove(touched)


@dataclass(frozen=True)
class _RebuiltView:
    """A view built from one ledger snapshot, off the engine lock, waiting to be installed."""

    view: ClusterView
    blocked: dict[str, str]
    ledger_hosts: dict[str, HostFacts]


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
        self.evictor: Evictor = evictor or LocalEvictor()
        """How preemption removes a victim (`tfscheduler.eviction`): local by default; Kubernetes mode
        sets the Eviction API's."""
        self.bus = bus
        self.store = WorkloadStore(ledger.engine)
        self._config = config or TfConfig()
        self.capacities: dict[str, PoolCapacity] = capacities_of(self._config)
        """Each pool's maxResources, oversubscription and nodeSelector (pools that set none left out)."""
        self.hosts: dict[str, HostFacts] | None = None
        """In Kubernetes mode, each node's labels, memory and disk as the API server has them
        (`observe_hosts`); None in local mode, where the ledger's node labels and memory are used."""
        self._ledger_hosts: dict[str, HostFacts] = {}
        self._resettling: asyncio.Task[None] | None = None
        self.quotas: dict[str, NamespaceQuota] = dict(quotas or {})
        self.heartbeat_timeout = heartbeat_timeout
        self.clock = clock
        self.name = name
        self.view = ClusterView()
        self.blocked: dict[str, str] = {}
        self.heartbeat_intervals_ms: dict[str, int] = {}
        self.active = ActiveAllocations()
        self.holds: dict[UUID, HoldRecord] = {}
        self.replaced_gpus: dict[UUID, tuple[str, frozenset[str]]] = {}
        """A replacement's allocation id -> the node and GPUs of the workload it replaces (`evict`)."""
        self.capacity_freed = asyncio.Event()
        self._lock = asyncio.Lock()
        self.policies = LearnedPolicies(lambda pool: placement_mode(self._config, pool), name=name)
        """Each pool's placement policy, learning its target workload from the submissions."""
        self._node_checks: dict[str, _NodeCheck] = {}
        self._last_full_refresh = 0.0
        self.intake = SubmissionIntake(self._submit_batch, max_batch=MAX_BATCH, name=name)
        """Submissions waiting for the next batch."""

    # ------------------------------------------------------------------------------ pool bounds

    @property
    def config(self) -> TfConfig:
        """The configuration placement reads; setting it (a GPUPool edit in Kubernetes mode) applies a
        changed maxResources, oversubscription or nodeSelector to the view at once."""
        return self._config

    @config.setter
    def config(self, config: TfConfig) -> None:
        self._config = config
        capacities = capacities_of(config)
        if capacities != self.capacities:
            self.capacities = capacities
            self._resettle()

    def observe_hosts(self, hosts: Mapping[str, HostFacts]) -> None:
        """The nodes' labels, memory and disk as the API server has them now (Kubernetes mode): a
        change that matters to a pool's nodeSelector or virtual capacity applies to the view at once."""
        known = self.hosts or {}
        self.hosts = dict(hosts)
        if self.capacities and any(
            known.get(name) != facts for name, facts in hosts.items() if name in self.view.nodes
        ):
            self._resettle()

    def _resettle(self) -> None:
        """Rebuild the view with the pools' bounds now in force, then look at the pending work again."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # not started yet: `start()` builds the view with them
        if self._resettling is None or self._resettling.done():
            self._resettling = loop.create_task(self._resettle_now(), name=f"{self.name}-pool-bounds")

    async def _resettle_now(self) -> None:
        await self._full_refresh(locked=False)
        self.capacity_freed.set()

    def _host(self, name: str, ledger_hosts: Mapping[str, HostFacts] | None = None) -> HostFacts:
        known = self.hosts.get(name) if self.hosts is not None else None
        if known is not None:
            return known
        return (self._ledger_hosts if ledger_hosts is None else ledger_hosts).get(name, HostFacts())

    def pool_membership(
        self, name: str, pool: str, ledger_hosts: Mapping[str, HostFacts] | None = None
    ) -> str | None:
        """Why the node is not in its pool (its labels miss the pool's nodeSelector), or None."""
        capacity = self.capacities.get(pool)
        if capacity is None or capacity.selector is None:
            return None
        return membership_reason(pool, capacity, name, self._host(name, ledger_hosts).labels)

    def _bounded(self, node: Node, ledger_hosts: Mapping[str, HostFacts] | None = None) -> Node:
        """`node` with the virtual capacity of its pool's oversubscription (none without it)."""
        oversubscription = self.capacities.get(node.pool, NO_BOUNDS).oversubscription
        return with_virtual_capacity(node, oversubscription, self._host(node.name, ledger_hosts))

    def _pool_used(self, pool: str) -> tuple[int, int]:
        """What the pool's allocations reserve now: (milli-TFLOPS, VRAM bytes)."""
        tflops = vram = 0
        for active in self.active.values():
            if active.record.pool == pool:
                for share in active.record.shares:
                    tflops += share.tflops_milli
                    vram += share.vram_bytes
        return tflops, vram

    def _over_pool_maximum(self, pool: str, placements: Sequence[Placement]) -> str | None:
        """Why reserving `placements` would take the pool above its maxResources, or None."""
        capacity = self.capacities.get(pool)
        if capacity is None or not capacity.capped:
            return None
        demand = (
            sum(sum(p.tflops_milli) for p in placements),
            sum(sum(p.vram_bytes) for p in placements),
        )
        return over_maximum(pool, capacity, self._pool_used(pool), demand)

    def _capped(self, pool: str) -> bool:
        capacity = self.capacities.get(pool)
        return capacity is not None and capacity.capped

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
        await self._full_refresh(locked=False)

    async def _full_refresh(self, *, locked: bool = True) -> None:
        """Rebuild the view, the blocked nodes and the active allocations from one ledger snapshot.
        `locked`: the caller holds the engine lock (then nothing changes until the install)."""
        if locked:
            await self._rebuild_and_install(locked=True)
            return
        if await self._rebuild_and_install(locked=False):
            return
        log.info(
            "the view changed too much during its rebuild; rebuilding under the lock",
            extra={"event": "scheduler.full_refresh"},
        )
        async with self._lock:
            await self._rebuild_and_install(locked=True)

    async def _rebuild_and_install(self, *, locked: bool) -> bool:
        """Read, build (in worker threads), then install under the lock (taken here unless `locked`);
        False when the install could not tell what changed meanwhile (nothing installed)."""
        view_at, version = self.view, self.view.version
        with self.active.journal() as touched:
            facts = await self.ledger.placement_facts()
            stored = await self.store.by_ids(
                [a.allocation_id for a in facts.allocations if a.allocation_id not in self.active]
            )
            rebuilt = await asyncio.to_thread(
                self._rebuild_view, facts, dict(self.heartbeat_intervals_ms), self.clock()
            )
            async with contextlib.nullcontext() if locked else self._lock:
                if not self._install(rebuilt, facts, stored, view_at, version, touched):
                    return False
                await self._refresh_holds()
        self._last_full_refresh = asyncio.get_running_loop().time()
        return True

    def _rebuild_view(
        self, facts: PlacementFacts, heartbeat_intervals_ms: dict[str, int], now: datetime
    ) -> _RebuiltView:
        """The view of `facts` (run in a worker thread: it reads only immutable facts and settings)."""
        ledger_hosts = {
            n.name: HostFacts(labels=n.labels, memory_bytes=n.memory_allocatable_bytes) for n in facts.nodes
        }
        snapshot = build_snapshot(
            facts.nodes,
            facts.gpus,
            facts.allocations,
            now,
            heartbeat_intervals_ms=heartbeat_intervals_ms,
            heartbeat_timeout=self.heartbeat_timeout,
            membership=lambda name, pool: self.pool_membership(name, pool, ledger_hosts),
        )
        view = ClusterView(self._bounded(node, ledger_hosts) for node in snapshot.nodes.values())
        return _RebuiltView(view, dict(snapshot.blocked), ledger_hosts)

    def _install(
        self,
        rebuilt: _RebuiltView,
        facts: PlacementFacts,
        stored: Mapping[UUID, StoredWorkload],
        view_at: ClusterView,
        version: int,
        touched: set[UUID],
    ) -> bool:
        """Install a rebuilt view, keeping the current state of every node changed and every allocation
        put or dropped since its read began; False (nothing installed) when that is no longer known."""
        changed = self.view.changed_since(version) if self.view is view_at else None
        if changed is None:
            return False
        view, blocked, ledger_hosts = rebuilt.view, rebuilt.blocked, rebuilt.ledger_hosts
        for name in changed:
            current = self.view.nodes.get(name)
            if current is None:
                view.remove(name)
            else:
                view.upsert(current)
            reason = self.blocked.get(name)
            if reason is None:
                blocked.pop(name, None)
            else:
                blocked[name] = reason
            host = self._ledger_hosts.get(name)
            if host is not None:
                ledger_hosts[name] = host
        active: dict[UUID, Active] = {}
        for record in facts.allocations:
            allocation_id = record.allocation_id
            if allocation_id in touched:
                continue
            known = self.active.get(allocation_id)
            active[allocation_id] = (
                replace(known, record=record)
                if known is not None
                else self._active(record, stored.get(allocation_id))
            )
        for allocation_id in touched:
            still_active = self.active.get(allocation_id)
            if still_active is not None:
                active[allocation_id] = still_active
        self.active.replace_all(active)
        self.view, self.blocked, self._ledger_hosts = view, blocked, ledger_hosts
        return True

    def _active(self, record: AllocationRecord, stored: StoredWorkload | None) -> Active:
        if stored is None:
            return Active(record, Priority.of(0, record.qos), None)
        submission = stored.submission
        protection = submission.eviction_protection_s
        until = record.created_at + timedelta(seconds=protection) if protection else None
        gang = submission.gang.group_key if submission.gang is not None else None
        return Active(record, Priority.of(submission.priority, submission.request.qos), until, gang)

    async def _rebuild_node(self, name: str) -> None:
        async with self.ledger.engine.connect() as connection:
            node_row = (
                await connection.execute(sa.select(tables.node).where(tables.node.c.name == name))
            ).first()
            gpu_rows = (
                await connection.execute(sa.select(tables.gpu).where(tables.gpu.c.node_name == name))
            ).all()
        if node_row is None:
            self.view.remove(name)
            self.blocked.pop(name, None)
            return
        node = _node_record(node_row)
        self._ledger_hosts[name] = HostFacts(labels=node.labels, memory_bytes=node.memory_allocatable_bytes)
        gpus = [_gpu_record(row) for row in gpu_rows]
        allocations = [a.record for a in self.active.values() if a.record.node == name]
        snapshot = build_snapshot(
            [node],
            gpus,
            allocations,
            self.clock(),
            heartbeat_intervals_ms=self.heartbeat_intervals_ms,
            heartbeat_timeout=self.heartbeat_timeout,
            membership=self.pool_membership,
        )
        self.view.upsert(self._bounded(snapshot.nodes[name]))
        self.blocked.pop(name, None)
        self.blocked.update(snapshot.blocked)

    async def node_changed(self, name: str) -> None:
        """The node's inventory or state changed in the ledger: rebuild it, then retry pending work."""
        async with self._lock:
            await self._rebuild_node(name)
        self.capacity_freed.set()

    def heartbeat(self, node: str, interval_ms: int) -> None:
        self.heartbeat_intervals_ms[node] = interval_ms

    async def recheck_nodes(self) -> None:
        """Re-read node flags and heartbeats from the ledger; block or unblock nodes whose state changed.

        Every second in the service, so it stays light: one query of the columns the check reads (the
        drain marker tested in SQL, no labels or annotations parsed); a node is checked again only when
        one of those changed or its heartbeat is due to go stale, in slices of `RECHECK_SLICE` nodes
        that let the loop serve submissions in between; and the engine lock is taken only to apply what
        changed. (Reading and checking every node record under the lock took 35 ms at 1,000 nodes and
        250 ms at 10,000, a stall every second.)
        """
        async with self.ledger.engine.connect() as connection:
            rows = (await connection.execute(_NODE_STATES)).all()
        holds = await self.ledger.active_holds()
        now = self.clock()
        changed: dict[str, str | None] = {}
        checks: dict[str, _NodeCheck] = {}
        known_checks, blocked, in_view = self._node_checks, self.blocked, self.view.nodes
        intervals, timeout = self.heartbeat_intervals_ms, self.heartbeat_timeout
        for position, row in enumerate(rows):
            if position and position % RECHECK_SLICE == 0:
                await asyncio.sleep(0)
            name, pool, cordoned, ready, heartbeat_at, draining = row
            interval_ms = intervals.get(name, 5_000)
            outside = self.pool_membership(name, pool)
            state = (cordoned, ready, draining, heartbeat_at, interval_ms, timeout, outside)
            known = known_checks.get(name)
            if (
                known is not None
                and known.state == state
                and now < known.until
                and blocked.get(name) == known.reason
                and name in in_view
            ):
                checks[name] = known  # nothing it reads changed, and its heartbeat is not due
                continue
            reason = (
                node_block_reason(
                    _node_state(row), now, heartbeat_interval_ms=interval_ms, heartbeat_timeout=timeout
                )
                or outside
            )
            checks[name] = _NodeCheck(state, reason, self._reason_holds_until(row, interval_ms, now))
            if name not in in_view or reason != blocked.get(name):
                changed[name] = reason
        self._node_checks = checks
        unblocked = False
        async with self._lock:
            self.holds = {hold.allocation.allocation_id: hold for hold in holds}
            for name, reason in changed.items():
                current = self.view.nodes.get(name)
                if current is None:
                    await self._rebuild_node(name)
                    unblocked = True
                    continue
                if reason == self.blocked.get(name):
                    continue
                if reason is None:
                    self.blocked.pop(name)
                    unblocked = True
                else:
                    self.blocked[name] = reason
                self.view.upsert(replace(current, cordoned=reason is not None))
        if unblocked:
            self.capacity_freed.set()

    def _reason_holds_until(self, row: sa.Row[Any], interval_ms: int, now: datetime) -> datetime:
        """When the node's heartbeat goes stale (its reason may change then); never, if stale already."""
        if row.last_heartbeat_at is None:
            return datetime.max.replace(tzinfo=UTC)
        seen = HeartbeatSeen(row.name, row.last_heartbeat_at, interval_ms)
        stale_at: datetime = row.last_heartbeat_at + readiness_timeout(seen, self.heartbeat_timeout)
        return stale_at if now < stale_at else datetime.max.replace(tzinfo=UTC)

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
        now = self.clock()
        owners = {
            allocation_id_for(item.submission.workload): item.owner_uid for item in batch if item.owner_uid
        }
        submitted = [(allocation_id_for(item.submission.workload), item.submission) for item in batch]
        async with self._lock:
            recorded = await self._record_and_place(batch, submitted, owners, now)
            if recorded is None:  # the one-transaction path gave up: record, then place, as two steps
                # Read under the lock, so the states are current (a workload ended meanwhile is not
                # pending), with the holds, so a hold reserved before a submission is seen first.
                stored, _holds = await asyncio.gather(
                    self.store.insert_many(submitted, now), self._refresh_holds()
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
            statuses[workload.allocation_id] = _placed_status(record) if record else _status(workload)
        for item in batch:
            if not item.future.done():
                item.future.set_result(statuses[allocation_id_for(item.submission.workload)])

    async def _record_and_place(
        self,
        batch: list[Queued],
        submitted: list[tuple[UUID, Submission]],
        owners: Mapping[UUID, str],
        now: datetime,
    ) -> tuple[list[tuple[StoredWorkload, UUID | None]], dict[UUID, WorkloadStatus]] | None:
        """Record the batch's submissions, read the holds and reserve every workload that fits at once,
        all in one ledger transaction (one commit); then place the rest one by one. Returns the batch's
        entries and the statuses decided, or None, with nothing written, when the ledger abandoned the
        transaction (a racing writer or a deadlock): the caller then records and places in two steps.
        Call with the lock held."""
        tentative: list[_Tentative] = []
        try:
            async with self.ledger.transaction() as transaction:
                stored = await self.store.insert_many(submitted, now, connection=transaction.connection)
                self.holds = {
                    hold.allocation.allocation_id: hold for hold in await transaction.active_holds()
                }
                entries, fresh = _first_entries(batch, stored)
                self.policies.learn([workload for workload, _cause in fresh])
                fresh, gang_members = _split_gangs(fresh)
                held_ids = {
                    workload.allocation_id
                    for workload, _cause in fresh
                    if self.holds and self._hold_for(workload.submission, owners.get(workload.allocation_id))
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
                self.view.release(t.outcome)
            return None
        except BaseException:
            for t in tentative:
                self.view.release(t.outcome)
            raise
        statuses: dict[UUID, WorkloadStatus] = {}
        alone = await self._settle(tentative, results, alone, owners, statuses)
        if held:
            statuses.update(await self._place_batch(held, announce=True, owners=owners, holds_read=True))
        statuses.update(await self._place_alone(alone, announce=True, owners=owners))
        statuses.update(await self._place_gangs(gang_members, announce=True))
        return entries, statuses

    async def retry_pending(self) -> int:
        """Try every pending workload again (highest priority first); returns how many were placed."""
        pending = await self.store.pending()
        placed = 0
        for start in range(0, len(pending), MAX_BATCH):
            async with self._lock:
                entries: list[tuple[StoredWorkload, UUID | None]] = [
                    (stored, None) for stored in pending[start : start + MAX_BATCH]
                ]
                statuses = await self._place_batch(await self._still_pending(entries), announce=False)
            placed += sum(status.state == "placed" for status in statuses.values())
        return placed

    async def _still_pending(
        self, entries: list[tuple[StoredWorkload, UUID | None]]
    ) -> list[tuple[StoredWorkload, UUID | None]]:
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
        entries: list[tuple[StoredWorkload, UUID | None]],
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
        entries, gang_members = _split_gangs(entries)
        if entries and not holds_read:  # a hold reserved a moment ago must be seen before its replacement
            await self._refresh_holds()
        if self.holds:
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
                    self.view.release(t.outcome)
                raise
            alone = await self._settle(tentative, results, alone, owners, statuses)
        statuses.update(await self._place_alone(alone, announce=announce, refreshed=refreshed, owners=owners))
        statuses.update(await self._place_gangs(gang_members, announce=announce))
        return statuses

    # ------------------------------------------------------------------------------------ gangs

    async def _place_gangs(
        self, members: list[tuple[StoredWorkload, UUID | None]], *, announce: bool
    ) -> dict[UUID, WorkloadStatus]:
        """Place the gangs of `members` (each gang whole: its other pending members too). Lock held."""
        statuses: dict[UUID, WorkloadStatus] = {}
        keys = dict.fromkeys(
            stored.submission.gang.group_key for stored, _c in members if stored.submission.gang
        )
        asked = {stored.allocation_id for stored, _c in members}
        for key in keys:
            statuses.update(await self._place_gang(key, announce=announce, asked=asked))
        return statuses

    async def _place_gang(self, key: str, *, announce: bool, asked: set[UUID]) -> dict[UUID, WorkloadStatus]:
        """Reserve the pending members of gang `key` together, in one ledger transaction, once at least
        min-members of the gang (counting those placed) fit and, in a namespace with a quota, the
        members reserved together fit its totals; otherwise reserve none and keep them pending with the
        gang's numbers or the quota's (announced, when `announce`, for the `asked` members; for the
        others only when their reason changed). A member over the quota's `single` limits is refused
        for good, as a plain workload is. Lock held."""
        statuses: dict[UUID, WorkloadStatus] = {}
        members: list[StoredWorkload] = []
        requests: dict[UUID, GpuRequest] = {}
        for member in await self.store.gang_members(key):
            quota = self.quotas.get(member.submission.workload.namespace)
            request = with_defaults(quota, member.submission.request)
            refusal = check_single(quota, request) if member.state == "pending" else None
            if refusal is not None:
                statuses[member.allocation_id] = await self._refuse(member, refusal.reason, None)
                continue
            members.append(member)
            requests[member.allocation_id] = request
        pending = [member for member in members if member.state == "pending"]
        if not pending:
            return statuses
        gang = pending[0].submission.gang
        assert gang is not None
        placed = len(members) - len(pending)
        expired = timed_out(gang, [member.submitted_at for member in pending], self.clock())
        if len(members) < gang.min_members:
            count = GangCount(live=len(members), placed=placed, fit=None)
            reason = gang_reason(gang, count, expired=expired)
            statuses.update(await self._gang_wait(pending, reason, announce, asked))
            return statuses
        wanted: list[tuple[StoredWorkload, PlacementRequest]] = []
        for member in pending:
            workload = member.submission.workload
            try:
                wanted.append(
                    (
                        member,
                        placement_request(
                            f"{workload.namespace}/{workload.name}",
                            requests[member.allocation_id],
                            tolerations=member.submission.tolerations,
                            node_selector=member.submission.node_selector,
                        ),
                    )
                )
            except PlacementRequestError as error:
                statuses[member.allocation_id] = await self._refuse(member, str(error), None)
        needed = max(gang.min_members - placed, 0)
        outcome = place_gang(
            wanted, self.view, self.profile(pending[0].submission.request.pool), needed=needed
        )
        if not outcome.enough:
            count = GangCount(live=len(members), placed=placed, fit=outcome.fitted)
            statuses.update(
                await self._gang_wait(
                    [member for member, _w in wanted],
                    gang_reason(gang, count, expired=expired),
                    announce,
                    asked,
                )
            )
            return statuses
        over = self._over_pool_maximum(
            pending[0].submission.request.pool, [placement for _member, placement in outcome.placements]
        )
        if over is not None:
            reason = f"gang {key}: {over}"
            statuses.update(await self._gang_wait([member for member, _w in wanted], reason, announce, asked))
            return statuses
        reserved = await self._reserve_gang(key, outcome.placements, requests) if outcome.placements else []
        if not isinstance(reserved, list):
            reason = (
                reserved.reason
                if isinstance(reserved, QuotaHeld)
                else f"gang {key}: the ledger refused part of the gang, so none of it was reserved; retrying"
            )
            statuses.update(await self._gang_wait([member for member, _w in wanted], reason, announce, asked))
            return statuses
        for member, record in reserved:
            self.active.put(record.allocation_id, self._active(record, member))
            statuses[record.allocation_id] = _placed_status(record)
        left = [member for member, _rejection in outcome.rejections]
        if left:
            reason = (
                f"gang {key}: {placed + len(reserved)} members are placed (min {gang.min_members}); "
                "this one does not fit now"
            )
            statuses.update(await self._gang_wait(left, reason, announce, asked))
        if not reserved:
            return statuses
        log.info("gang placed", extra={"gang": key, "placed": len(reserved), "outcome": "placed"})
        self.capacity_freed.set()  # the other members' callers (pods waiting in Kubernetes mode) look again
        return statuses

    async def _reserve_gang(
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
            self.view.apply(placement)
        try:
            async with self.ledger.transaction() as transaction:
                over = await self._gang_over_quota(key, transaction, placements, requests)
                if over is not None:
                    raise _GangOverQuotaError(over)
                results = await transaction.reserve_many(
                    [
                        _reservation(
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
                self.view.release(placement)
            return QuotaHeld(str(error))
        except (_GangRefusedError, BatchAbandonedError) as error:
            log.info("gang reservation refused; nothing reserved", extra={"gang": key, "error": str(error)})
            for _member, placement in placements:
                self.view.release(placement)
            for node in sorted({placement.node for _member, placement in placements}):
                await self._rebuild_node(node)
            return None
        except BaseException:
            for _member, placement in placements:
                self.view.release(placement)
            raise
        return [
            (member, result.allocation)
            for (member, _p), result in zip(placements, results, strict=True)
            if isinstance(result, Reserved)
        ]

    async def _gang_over_quota(
        self,
        key: str,
        transaction: LedgerTransaction,
        placements: Sequence[tuple[StoredWorkload, Placement]],
        requests: Mapping[UUID, GpuRequest],
    ) -> str | None:
        """Why the gang's placements together exceed a namespace quota's totals (`check_total` on the
        sum of their demands, maxWorkers counting each member), read under the namespaces' locks in
        `transaction`; None when they fit or no namespace of theirs has a quota."""
        demands: dict[str, Usage] = {}
        for member, placement in placements:
            namespace = member.submission.workload.namespace
            if namespace in self.quotas:
                demand = self._demand(placement, requests[member.allocation_id])
                demands[namespace] = demands.get(namespace, Usage()) + demand
        if not demands:
            return None
        used = usage_of_shares(await transaction.locked_namespace_shares(sorted(demands)))
        for namespace, demand in sorted(demands.items()):
            over = check_total(self.quotas[namespace], used.get(namespace, Usage()), demand)
            if over is not None:
                return f"gang {key}: {over.reason}"
        return None

    async def _gang_wait(
        self, members: list[StoredWorkload], reason: str, announce: bool, asked: set[UUID]
    ) -> dict[UUID, WorkloadStatus]:
        """Keep gang members pending with `reason`: announced for the `asked` ones when `announce`, and for
        every member whose reason changed (a gang's retry does not announce each member again)."""
        waiting: list[tuple[StoredWorkload, UUID | None, str, Rejection | None]] = [
            (member, None, reason, None) for member in members
        ]
        statuses = await self._wait_many([w for w in waiting if w[0].allocation_id in asked], announce)
        statuses.update(await self._wait_many([w for w in waiting if w[0].allocation_id not in asked], False))
        return statuses

    def _tentatives(
        self, entries: list[tuple[StoredWorkload, UUID | None]]
    ) -> tuple[list[_Tentative], list[tuple[StoredWorkload, UUID | None]]]:
        """Place each entry in order against the view (applied there, not yet in the ledger) when it
        fits without preemption or a refresh; the others, in order, need the full path."""
        tentative: list[_Tentative] = []
        alone: list[tuple[StoredWorkload, UUID | None]] = []
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
            self.view.apply(outcome)
            tentative.append(_Tentative(stored, cause, outcome, request))
        return tentative, alone

    async def _settle(
        self,
        tentative: list[_Tentative],
        results: list[ReservationResult],
        alone: list[tuple[StoredWorkload, UUID | None]],
        owners: Mapping[UUID, str],
        statuses: dict[UUID, WorkloadStatus],
    ) -> list[tuple[StoredWorkload, UUID | None]]:
        """Take the committed reservations of `tentative` into the state and `statuses`; returns
        `alone` with the workloads the ledger refused added (they go the full path)."""
        refused: list[tuple[_Tentative, ReservationResult]] = []
        for t, result in zip(tentative, results, strict=True):
            if isinstance(result, Reserved) and not result.replayed:
                self.active.put(t.stored.allocation_id, self._active(result.allocation, t.stored))
                statuses[t.stored.allocation_id] = _placed_status(result.allocation)
            else:
                refused.append((t, result))
        if not refused:
            return alone
        replayed: list[tuple[_Tentative, AllocationRecord]] = []
        for t, result in refused:
            self.view.release(t.outcome)
            if isinstance(result, Reserved):
                replayed.append((t, result.allocation))
            else:
                alone.append((t.stored, t.cause))
        # Workloads another scheduler placed meanwhile: take its allocation as this one's.
        taken_over = [(t, record) for t, record in replayed if record.state != "released"]
        for t, record in taken_over:
            if record.state == "reserved":
                await self.ledger.commit(record.allocation_id)
            self.active.put(record.allocation_id, self._active(record, t.stored))
            statuses[record.allocation_id] = _placed_status(record)
        for t, record in replayed:
            if record.state == "released":
                statuses[record.allocation_id] = await self._placed(
                    t.stored, Reserved(record, True), t.outcome
                )
        touched = {t.outcome.node for t, _result in refused} | {record.node for _t, record in replayed}
        for node in sorted(touched):
            await self._rebuild_node(node)
        if len(replayed) < len(refused):
            # The view missed ledger changes: a hold reserved since the last read may be one of them.
            await self._refresh_holds()
            if self.holds:
                alone = await self._claim_holds(alone, owners, statuses)
        return alone

    async def _place_alone(
        self,
        alone: list[tuple[StoredWorkload, UUID | None]],
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
            and self._may_full_refresh()
            and any(self._unplaceable(stored) for stored, _cause in alone)
        ):
            await self._full_refresh()
            return await self._place_batch(
                alone, announce=announce, refreshed=True, owners=owners, holds_read=True
            )
        waiting: list[tuple[StoredWorkload, UUID | None, str, Rejection | None]] = []
        for stored, cause in alone:
            verdict = self._unplaceable(stored)
            if verdict is None:
                statuses[stored.allocation_id] = await self._try_place(stored, cause=cause, announce=announce)
            else:
                waiting.append((stored, cause, *verdict))
        statuses.update(await self._wait_many(waiting, announce))
        return statuses

    async def _refresh_holds(self) -> None:
        self.holds = {hold.allocation.allocation_id: hold for hold in await self.ledger.active_holds()}

    def _hold_for(self, submission: Submission, owner_uid: str | None) -> HoldRecord | None:
        """The unexpired hold kept for this workload: same namespace and pool, and the same controller
        owner or (local mode recreates with the same name) the same name."""
        workload = submission.workload
        now = self.clock()
        for hold in self.holds.values():
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
        entries: list[tuple[StoredWorkload, UUID | None]],
        owners: Mapping[UUID, str],
        statuses: dict[UUID, WorkloadStatus],
    ) -> list[tuple[StoredWorkload, UUID | None]]:
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
        self.holds.pop(hold_id, None)  # one replacement per hold, whatever happens next
        submission = stored.submission
        workload = submission.workload
        quota = self.quotas.get(workload.namespace)
        request = with_defaults(quota, submission.request)
        node = self.view.nodes.get(hold.allocation.node)
        if check_single(quota, request) is not None or node is None or node.name in self.blocked:
            return None
        try:
            wanted = placement_request(
                f"{workload.namespace}/{workload.name}",
                request,
                tolerations=submission.tolerations,
                node_selector=submission.node_selector,
            )
        except PlacementRequestError:
            return None
        held = placement_of(hold.allocation, node)
        gpus = {gpu.uuid: gpu for gpu in node.gpus}
        if wanted.gpu_count != len(held.gpu_uuids) or any(uuid not in gpus for uuid in held.gpu_uuids):
            return None
        outcome = replace(
            held,
            request_name=wanted.name,
            tflops_milli=tuple(wanted.tflops_on(gpus[uuid]) for uuid in held.gpu_uuids),
            vram_bytes=tuple(wanted.vram_on(gpus[uuid]) for uuid in held.gpu_uuids),
            policy="defrag-hold",
            limit_tflops_milli=tuple(wanted.limit_tflops_on(gpus[uuid]) for uuid in held.gpu_uuids),
            limit_vram_bytes=tuple(wanted.limit_vram_on(gpus[uuid]) for uuid in held.gpu_uuids),
        )
        if quota is not None:
            used = usage_by_namespace(a.record for a in self.active.values()).get(workload.namespace, Usage())
            if check_total(quota, used, demand_of(outcome, request)) is not None:
                return None
        result = await self.ledger.claim_hold(
            hold_id, _reservation(stored.allocation_id, submission, request, outcome, cause)
        )
        if not isinstance(result, Reserved) or result.replayed:
            return None
        self.active.drop(hold_id)
        self.active.put(stored.allocation_id, self._active(result.allocation, stored))
        await self._rebuild_node(node.name)
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
            self.capacity_freed.set()
        return _placed_status(result.allocation)

    def _unplaceable(self, stored: StoredWorkload) -> tuple[str, Rejection] | None:
        """The unschedulable summary when the workload fits nowhere in the view and preempts nobody;
        None when it may be placed (or needs the full path: a quota, an invalid request)."""
        submission = stored.submission
        workload = submission.workload
        if workload.namespace in self.quotas or self._capped(submission.request.pool):
            return None
        try:
            wanted = placement_request(
                f"{workload.namespace}/{workload.name}",
                submission.request,
                tolerations=submission.tolerations,
                node_selector=submission.node_selector,
            )
        except PlacementRequestError:
            return None
        profile = self.profile(submission.request.pool)
        outcome = self._place(stored, wanted, profile)
        if not isinstance(outcome, Rejection):
            return None
        priority = Priority.of(submission.priority, submission.request.qos)
        plan = plan_preemption(
            wanted, priority, self.view.nodes, self._candidates(priority), profile, self.clock()
        )
        if not isinstance(plan, NoPreemption):
            return None
        return unschedulable_summary(outcome, self.blocked, preemption_reason=plan.reason), outcome

    async def _wait_many(
        self, waiting: list[tuple[StoredWorkload, UUID | None, str, Rejection | None]], announce: bool
    ) -> dict[UUID, WorkloadStatus]:
        """`_wait` for many workloads with a few statements: keep them pending with their reasons."""
        if not waiting:
            return {}
        statuses: dict[UUID, WorkloadStatus] = {}
        existing = await self.ledger.get_allocations([stored.allocation_id for stored, *_rest in waiting])
        reasons = {
            stored.allocation_id: reason
            for stored, _cause, reason, _rejection in waiting
            if stored.allocation_id not in existing
        }
        async with self.ledger.transaction() as transaction:
            kept = await self.store.keep_pending(reasons, self.clock(), connection=transaction.connection)
            await transaction.announce(
                *(
                    self._unschedulable(stored, reason, rejection, cause)
                    for stored, cause, reason, rejection in waiting
                    if stored.allocation_id in kept and (announce or stored.reason != reason)
                )
            )
        for stored, _cause, reason, _rejection in waiting:
            if stored.allocation_id not in kept:
                # Another scheduler placed (or ended) it meanwhile: report what the ledger holds.
                statuses[stored.allocation_id] = await self._status_of(stored.allocation_id)
                continue
            statuses[stored.allocation_id] = _status(
                replace(stored, state=target(Transition.WAIT), reason=reason)
            )
        return statuses

    def _quick_placement(self, stored: StoredWorkload) -> tuple[Placement, GpuRequest] | None:
        """Where the workload goes in the view when nothing special applies (no quota, no pool maximum,
        it fits)."""
        submission = stored.submission
        workload = submission.workload
        if workload.namespace in self.quotas or self._capped(submission.request.pool):
            return None
        try:
            wanted = placement_request(
                f"{workload.namespace}/{workload.name}",
                submission.request,
                tolerations=submission.tolerations,
                node_selector=submission.node_selector,
            )
        except PlacementRequestError:
            return None
        outcome = self._place(stored, wanted, self.profile(submission.request.pool))
        return None if isinstance(outcome, Rejection) else (outcome, submission.request)

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
            return await self._refuse(stored, refusal.reason, cause)
        try:
            wanted = placement_request(
                f"{namespace}/{workload.name}",
                request,
                tolerations=submission.tolerations,
                node_selector=submission.node_selector,
            )
        except PlacementRequestError as error:
            return await self._refuse(stored, str(error), cause)
        profile = self.profile(request.pool)
        priority = Priority.of(submission.priority, request.qos)
        refreshed = False
        for _attempt in range(MAX_PLACE_ATTEMPTS):
            outcome = self._place(stored, wanted, profile)
            if isinstance(outcome, Rejection):
                if not refreshed and self._may_full_refresh():
                    await self._full_refresh()
                    refreshed = True
                    continue
                plan = plan_preemption(
                    wanted, priority, self.view.nodes, self._candidates(priority), profile, self.clock()
                )
                if isinstance(plan, NoPreemption):
                    summary = unschedulable_summary(outcome, self.blocked, preemption_reason=plan.reason)
                    return await self._wait(stored, summary, outcome, cause, announce)
                for victim in plan.victims:
                    await self._evict(victim, workload)
                continue
            over = self._over_pool_maximum(request.pool, [outcome])
            if over is not None:
                return await self._wait(stored, over, None, cause, announce)
            reservation = _reservation(stored.allocation_id, submission, request, outcome, cause)
            if quota is None:
                result = await self._reserve(reservation)
            else:
                checked = await self._reserve_within_quota(reservation, quota, outcome, request)
                if isinstance(checked, QuotaHeld):
                    return await self._wait(stored, checked.reason, None, cause, announce)
                result = checked
            if isinstance(result, Reserved):
                return await self._placed(stored, result, outcome)
            if isinstance(result, InsufficientCapacity | ReservationRejected):
                await self._rebuild_node(outcome.node)
                continue
        return await self._wait(
            stored, "placement kept conflicting with other schedulers; will retry", None, cause, announce
        )

    def _place(
        self, stored: StoredWorkload, wanted: PlacementRequest, profile: Profile
    ) -> Placement | Rejection:
        """`place` in the view, except that a replacement goes on other GPUs than the ones of the workload it
        replaces whenever any fit: an eviction without a cordon does not land it back where it was."""
        replaced = self.replaced_gpus.get(stored.allocation_id)
        node = self.view.nodes.get(replaced[0]) if replaced else None
        if replaced and node is not None:
            self.view.upsert(_with_gpus_full(node, replaced[1]))
            try:
                elsewhere = place(wanted, self.view, profile)
            finally:
                self.view.upsert(node)
            if isinstance(elsewhere, Placement):
                return elsewhere
        return place(wanted, self.view, profile)

    def _place_replacement_elsewhere(self, replacement: Submission, replaced: UUID) -> None:
        """Remember the GPUs the evicted workload held, for `_place` to avoid with its replacement."""
        active = self.active.get(replaced)
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
        demand = self._demand(outcome, request)

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

    def _demand(self, outcome: Placement, request: GpuRequest) -> Usage:
        """What `outcome` adds to its namespace's usage, compute percent sized by the view's GPUs."""
        node = self.view.nodes.get(outcome.node)
        capacity = {gpu.uuid: gpu.tflops_milli for gpu in node.gpus} if node is not None else {}
        return demand_of(outcome, request, [capacity.get(uuid, 0) for uuid in outcome.gpu_uuids])

    def _may_full_refresh(self) -> bool:
        return asyncio.get_running_loop().time() - self._last_full_refresh >= MIN_FULL_REFRESH_INTERVAL_S

    def _candidates(self, below: Priority) -> list[Candidate]:
        """The allocations a workload of priority `below` may preempt: lower priority, not a defrag
        hold (capacity kept for a pod in flight, with no pod to evict), not a gang member (evicting one
        would split its gang), and not one the evictor is not to try again yet."""
        candidates = []
        for active in self.active.values():
            allocation_id = active.record.allocation_id
            if (
                active.priority >= below
                or allocation_id in self.holds
                or active.gang
                or not self.evictor.may_evict(allocation_id)
            ):
                continue
            node = self.view.nodes.get(active.record.node)
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
            return await self._status_of(stored.allocation_id)
        if result.replayed:
            await self._rebuild_node(record.node)
        else:
            self.view.apply(outcome)
        if record.state == "reserved":
            await self.ledger.commit(record.allocation_id)
        self.active.put(record.allocation_id, self._active(record, stored))
        await self.store.transition(stored.allocation_id, Transition.PLACE, None, now)
        return _placed_status(record)

    async def _refuse(self, stored: StoredWorkload, reason: str, cause: UUID | None) -> WorkloadStatus:
        async with self.ledger.transaction() as transaction:
            moved = await self.store.transition(
                stored.allocation_id,
                Transition.REFUSE,
                reason,
                self.clock(),
                connection=transaction.connection,
            )
            if moved:
                await transaction.announce(self._unschedulable(stored, reason, None, cause))
        if not moved:
            return await self._status_of(stored.allocation_id)
        return _status(replace(stored, state=target(Transition.REFUSE), reason=reason))

    async def _wait(
        self,
        stored: StoredWorkload,
        reason: str,
        rejection: Rejection | None,
        cause: UUID | None,
        announce: bool,
    ) -> WorkloadStatus:
        existing = await self.ledger.get_allocation(stored.allocation_id)
        if existing is not None:
            # Another scheduler placed (or ended) this workload meanwhile; report what the ledger holds.
            return await self._status_of(stored.allocation_id)
        async with self.ledger.transaction() as transaction:
            moved = await self.store.transition(
                stored.allocation_id, Transition.WAIT, reason, self.clock(), connection=transaction.connection
            )
            if moved and (announce or stored.reason != reason):
                await transaction.announce(self._unschedulable(stored, reason, rejection, cause))
        if not moved:
            return await self._status_of(stored.allocation_id)
        return _status(replace(stored, state=target(Transition.WAIT), reason=reason))

    def _unschedulable(
        self, stored: StoredWorkload, reason: str, rejection: Rejection | None, cause: UUID | None
    ) -> WorkloadUnschedulable:
        """The verdict's `tf.evt.workload.unschedulable` (one event per attempt), for the outbox in the
        transaction that records the verdict."""
        return unschedulable_event(
            stored.submission.workload,
            stored.submission.request.pool,
            reason,
            rejection,
            attempt=uuid4(),
            now=self.clock(),
            cause=cause,
        )

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
            await self._rebuild_node(victim.node)
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
        self._place_replacement_elsewhere(replacement, allocation_id)
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
                        await self._rebuild_node(record.node)
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
                await self._rebuild_node(active.record.node)
            # Also when a full refresh dropped it from `active` first: the stored state must not stay placed.
            await self.store.transition(allocation_id, Transition.END, reason, self.clock())
        if active is not None:
            self.capacity_freed.set()
        return active is not None

    # ------------------------------------------------------------------------------------ reads

    async def status(self, allocation_id: UUID) -> WorkloadStatus | None:
        stored = await self.store.get(allocation_id)
        return None if stored is None else await self._status_of(allocation_id)

    async def _status_of(self, allocation_id: UUID) -> WorkloadStatus:
        stored = await self.store.get(allocation_id)
        assert stored is not None
        if stored.state == "placed":
            record = await self.ledger.get_allocation(allocation_id)
            if record is not None:
                return WorkloadStatus(
                    id=allocation_id,
                    workload=record.workload,
                    state=target(Transition.PLACE),
                    node=record.node,
                    gpu_uuids=tuple(share.gpu_uuid for share in record.shares),
                )
        return _status(stored)

    def simulate(self, submission: Submission) -> dict[str, object]:
        """Where the workload would go now and why every other node does not fit; changes nothing."""
        quota = self.quotas.get(submission.workload.namespace)
        request = with_defaults(quota, submission.request)
        wanted: PlacementRequest = placement_request(
            f"{submission.workload.namespace}/{submission.workload.name}",
            request,
            tolerations=submission.tolerations,
            node_selector=submission.node_selector,
        )
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


_NODE_STATES = sa.select(
    tables.node.c.name,
    tables.node.c.pool_name,
    tables.node.c.cordoned,
    tables.node.c.ready,
    tables.node.c.last_heartbeat_at,
    sa.or_(
        tables.node.c.labels.has_key(DEFRAG_SOURCE), tables.node.c.annotations.has_key(DEFRAG_SOURCE)
    ).label("draining"),
)
_DRAINING: Mapping[str, str] = {DEFRAG_SOURCE: ""}
_NOTHING: Mapping[str, str] = {}


@dataclass(frozen=True)
class _NodeCheck:
    """What `recheck_nodes` last decided for a node: from what it read (`state`), until when it holds."""

    state: tuple[object, ...]
    reason: str | None
    until: datetime


def _node_state(row: sa.Row[Any]) -> NodeRecord:
    """A node as `node_block_reason` reads it, from one row of `_NODE_STATES` (the drain marker as a
    label when the node carries it in its labels or annotations; nothing else of either)."""
    labels = _DRAINING if row.draining else _NOTHING
    return NodeRecord(
        row.name, row.pool_name, labels, (), _NOTHING, 0, 0, row.cordoned, row.ready, row.last_heartbeat_at
    )


def _with_gpus_full(node: Node, gpu_uuids: frozenset[str]) -> Node:
    """`node` as if nothing were left on the GPUs `gpu_uuids`."""
    gpus = tuple(
        replace(gpu, used_tflops_milli=gpu.tflops_milli, used_vram_bytes=gpu.vram_bytes)
        if gpu.uuid in gpu_uuids
        else gpu
        for gpu in node.gpus
    )
    return replace(node, gpus=gpus)


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


class _GangRefusedError(Exception):
    """The ledger refused part of a gang's reservation: the transaction is rolled back whole."""


class _GangOverQuotaError(Exception):
    """A gang's placements together exceed a namespace quota: the transaction is rolled back whole."""


def _split_gangs(
    entries: list[tuple[StoredWorkload, UUID | None]],
) -> tuple[list[tuple[StoredWorkload, UUID | None]], list[tuple[StoredWorkload, UUID | None]]]:
    """The entries placed one by one, and the gang members (placed a gang at a time)."""
    return (
        [entry for entry in entries if entry[0].submission.gang is None],
        [entry for entry in entries if entry[0].submission.gang is not None],
    )


def _first_entries(
    batch: list[Queued], stored: Mapping[UUID, StoredWorkload]
) -> tuple[list[tuple[StoredWorkload, UUID | None]], list[tuple[StoredWorkload, UUID | None]]]:
    """Each workload of the batch once (its first submission wins), with its stored row and cause;
    and those among them still pending, the ones to place."""
    first_of: set[UUID] = set()
    entries: list[tuple[StoredWorkload, UUID | None]] = []
    for item in batch:
        allocation_id = allocation_id_for(item.submission.workload)
        if allocation_id not in first_of:
            first_of.add(allocation_id)
            entries.append((stored[allocation_id], item.cause))
    return entries, [(workload, cause) for workload, cause in entries if workload.state == "pending"]


def _tentative_reservation(tentative: _Tentative) -> ReservationRequest:
    stored = tentative.stored
    return _reservation(
        stored.allocation_id, stored.submission, tentative.request, tentative.outcome, tentative.cause
    )


def _placed_status(record: AllocationRecord) -> WorkloadStatus:
    return WorkloadStatus(
        id=record.allocation_id,
        workload=record.workload,
        state=target(Transition.PLACE),
        node=record.node,
        gpu_uuids=tuple(share.gpu_uuid for share in record.shares),
    )


def _status(stored: StoredWorkload) -> WorkloadStatus:
    return WorkloadStatus(
        id=stored.allocation_id, workload=stored.submission.workload, state=stored.state, reason=stored.reason
    )


def _reservation(
    allocation_id: UUID,
    submission: Submission,
    gpu_request: GpuRequest,
    outcome: Placement,
    cause: UUID | None,
) -> ReservationRequest:
    return ReservationRequest(
        allocation_id=allocation_id,
        workload=submission.workload,
        pool=submission.request.pool,
        node=outcome.node,
        shares=tuple(
            ShareRequest(
                gpu_uuid=gpu_uuid,
                tflops_milli=tflops,
                vram_bytes=vram,
                limit_tflops_milli=max(gpu_request.tflops_limit_milli, tflops, limit_tflops),
                limit_vram_bytes=max(gpu_request.vram_limit_bytes, vram, limit_vram),
            )
            for gpu_uuid, tflops, vram, limit_tflops, limit_vram in zip(
                outcome.gpu_uuids,
                outcome.tflops_milli,
                outcome.vram_bytes,
                outcome.limit_tflops_milli or outcome.tflops_milli,
                outcome.limit_vram_bytes or outcome.vram_bytes,
                strict=True,
            )
        ),
        qos=submission.request.qos,
        isolation=submission.request.isolation,
        cause=cause,
        eviction_protection_s=submission.eviction_protection_s or None,
    )


def _node_record(row: sa.Row[object]) -> NodeRecord:
    return NodeRecord(
        name=row.name,
        pool=row.pool_name,
        labels=row.labels,
        taints=row.taints,
        annotations=row.annotations,
        cpu_allocatable_milli=row.cpu_allocatable_milli,
        memory_allocatable_bytes=row.memory_allocatable_bytes,
        cordoned=row.cordoned,
        ready=row.ready,
        last_heartbeat_at=row.last_heartbeat_at,
    )


def _gpu_record(row: sa.Row[object]) -> GpuRecord:
    return GpuRecord(
        uuid=row.uuid,
        node=row.node_name,
        index=row._mapping["index"],
        model=row.model,
        vendor=row.vendor,
        capacity_tflops_milli=row.capacity_tflops_milli,
        capacity_vram_bytes=row.capacity_vram_bytes,
        used_tflops_milli=row.used_tflops_milli,
        used_vram_bytes=row.used_vram_bytes,
        phase=row.phase,
        numa_node=row.numa_node,
        version=row.version,
    )
