"""The campaign executor: drains the planned nodes one pod at a time, durably, and says what it did.

One campaign per pool at a time (the store's advisory lock), its progress in Postgres so a restart
resumes it. For each node the core plans, one pod after another: hold the simulated target capacity
in the ledger for the pod's replacement (with an expiry, and whom it is for: the pod's namespace, name
and controller owner uid), evict through the Eviction API, and wait until the replacement is bound
elsewhere. The scheduler places the replacement into the hold (`SqlLedger.claim_hold`), so nothing
else takes that capacity meanwhile; a hold left unclaimed is released once the replacement is placed
elsewhere or not in time, and by expiry after a crash. An eviction a disruption budget still refuses
when the replacement timeout passes (it is asked again until then) or a replacement not placed in
time stops that node: it gets `defrag-evict-skip=true` with the reason and the campaign goes on with
the next candidate. Decisions come from the core. Each eviction's `tf.evt.pod.evicted` is written to
the ledger outbox in the transaction that records the move as evicted (the ledger's outbox relay
publishes it, so neither a bus outage nor a crash loses it); the campaign's progress events go out
on NATS directly (`CampaignDeps.publish`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID, uuid4, uuid5

from tfcommon.cluster import Cluster, Evicted, EvictionBlocked, EvictionResult, NotFound, Pod
from tfcommon.events import (
    DefragCampaignFinished,
    DefragCampaignStarted,
    DefragNodeSkipped,
    Message,
    NodeDrained,
    PodEvicted,
    WorkloadRef,
)
from tfcommon.ledger.port import Ledger
from tfcommon.ledger.records import HoldFor, ReservationRequest, Reserved, ShareRequest
from tfcommon.placement import Profile
from tfcommon.pool_capacity import NO_BOUNDS, PoolCapacity

from tfdefrag.core import markers
from tfdefrag.core.config import DefragConfig
from tfdefrag.core.planner import Move, NodeDrain, SkipReason, plan_defrag
from tfdefrag.snapshot import DEFAULT_NATIVE_GPU_RESOURCES, LoadedPool, load_pool
from tfdefrag.store import CampaignRecord, CampaignStore, MoveRecord

log = logging.getLogger("tfdefrag.campaign")

HOLD_NAMESPACE = UUID("0e7c1f55-9d6b-4b8e-a2a4-6f1f5d0c7b21")
HOLD_WORKLOAD_NAMESPACE = "tfpool-defrag"
Trigger = Literal["cron", "manual", "compaction"]
Outcome = Literal["completed", "deadline", "aborted"]


@dataclass(frozen=True)
class ExecutorSettings:
    """How long to wait for a replacement, how often to look, how long a capacity hold may live."""

    replacement_timeout: timedelta = timedelta(minutes=5)
    poll_interval_s: float = 1.0
    hold_ttl: timedelta = timedelta(minutes=10)
    native_gpu_resources: tuple[str, ...] = DEFAULT_NATIVE_GPU_RESOURCES


@dataclass
class CampaignDeps:
    """What the executor talks to. `publish` sends one message to the bus; `clock` is timezone-aware."""

    cluster: Cluster
    ledger: Ledger
    store: CampaignStore
    publish: Callable[[Message], Awaitable[None]]
    clock: Callable[[], datetime]
    settings: ExecutorSettings = field(default_factory=ExecutorSettings)
    profile: Profile | None = None
    pool_capacity: Callable[[str], PoolCapacity] = lambda pool: NO_BOUNDS
    """A pool's nodeSelector and oversubscription now (`tfcommon.pool_capacity`): the nodes it is read
    with and the virtual capacity moves respect."""


@dataclass(frozen=True)
class CampaignResult:
    """A finished campaign as stored."""

    campaign: CampaignRecord


class _NodeFailedError(Exception):
    def __init__(self, reason: str, *, stranded: int = 0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.stranded = stranded


class _DeadlineReachedError(Exception):
    pass


def _event_id(campaign_id: UUID, *parts: str) -> UUID:
    return uuid5(campaign_id, "/".join(parts))


def _controller_uid(pod: Pod) -> str | None:
    owner = next((o for o in pod.owner_references if o.controller), None)
    return (owner.uid or owner.name) if owner is not None else None


def _siblings(pods: Mapping[str, Pod], pod: Pod) -> list[str]:
    owner = _controller_uid(pod)
    return sorted(
        other.uid
        for other in pods.values()
        if other.namespace == pod.namespace
        and ((owner is not None and _controller_uid(other) == owner) or other.name == pod.name)
    )


class CampaignExecutor:
    """Runs (or resumes) one pool's campaign to its end. Safe with several replicas: they exclude
    each other per pool through the store's lock (`CampaignBusyError`)."""

    def __init__(self, deps: CampaignDeps) -> None:
        self.deps = deps

    async def run(
        self,
        pool: str,
        config: DefragConfig,
        *,
        trigger: Trigger,
        window_start: datetime | None = None,
        deadline: datetime | None = None,
    ) -> CampaignResult:
        """Run a new campaign, or resume the pool's running one; raises `CampaignBusyError` if another
        process holds the pool. A cron campaign advances the pool's anchor to `window_start` at its end."""
        store = self.deps.store
        async with store.pool_lock(pool):
            await self.release_expired_holds()
            campaign = await store.running_campaign(pool)
            if campaign is None:
                await self._clear_evict_skips(pool)
                campaign = await store.open_campaign(
                    uuid4(), pool, trigger, window_start=window_start, deadline_at=deadline, now=self._now()
                )
                loaded = await self._load(pool, None)
                plan = plan_defrag(loaded.snapshot, config, self._now(), profile=self.deps.profile)
                log.info(
                    "defrag campaign started",
                    extra={
                        "campaign": str(campaign.id),
                        "pool": pool,
                        "trigger": trigger,
                        "drains": [drain.node for drain in plan.drains],
                    },
                )
                await self._publish(
                    DefragCampaignStarted(
                        event_id=_event_id(campaign.id, "started"),
                        occurred_at=self._now(),
                        campaign_id=campaign.id,
                        pool=pool,
                        trigger=trigger,
                        deadline_at=deadline,
                        candidate_nodes=len(plan.drains),
                    )
                )
            else:
                log.info("resuming defrag campaign", extra={"campaign": str(campaign.id), "pool": pool})
            outcome = await self._drive(campaign, config)
            await store.finish(campaign.id, outcome, self._now())
            if campaign.trigger == "cron" and campaign.window_start is not None:
                await store.set_last_defrag_time(pool, campaign.window_start, self._now())
            finished = await store.get_campaign(campaign.id)
            assert finished is not None
            await self._publish(
                DefragCampaignFinished(
                    event_id=_event_id(campaign.id, "finished"),
                    occurred_at=self._now(),
                    campaign_id=campaign.id,
                    pool=pool,
                    outcome=outcome,
                    nodes_drained=len(finished.drained_nodes),
                    nodes_skipped=len(finished.skipped_nodes) + len(finished.failed_nodes),
                    pods_evicted=finished.pods_evicted,
                    stranded_pods=finished.stranded_pods,
                    duration_ms=max(0, int((self._now() - finished.started_at).total_seconds() * 1000)),
                )
            )
            return CampaignResult(finished)

    def _now(self) -> datetime:
        return self.deps.clock()

    async def _publish(self, message: Message) -> None:
        await self.deps.publish(message)

    async def _load(self, pool: str, own_source: str | None) -> LoadedPool:
        return await load_pool(
            self.deps.ledger,
            self.deps.cluster,
            pool,
            native_gpu_resources=self.deps.settings.native_gpu_resources,
            own_source=own_source,
            capacity=self.deps.pool_capacity(pool),
        )

    def _past(self, deadline: datetime | None) -> bool:
        return deadline is not None and self._now() >= deadline

    async def _drive(self, campaign: CampaignRecord, config: DefragConfig) -> Outcome:
        store = self.deps.store
        for move in await store.moves(campaign.id):
            if move.state in ("evicting", "evicted"):
                await self._resume_move(campaign, move)
        while True:
            current = await store.get_campaign(campaign.id)
            assert current is not None
            if self._past(current.deadline_at):
                if current.current_node is not None:
                    await self._abandon(current, current.current_node, "campaign deadline reached")
                return "deadline"
            loaded = await self._load(current.pool, current.current_node)
            done = set(current.drained_nodes)
            plan = plan_defrag(
                loaded.snapshot,
                config,
                self._now(),
                failed=current.failed_nodes,
                profile=self.deps.profile,
            )
            new_skips = {
                skip.node: f"{skip.reason.value}: {skip.message}"
                for skip in plan.skipped
                if skip.node not in current.skipped_nodes
                and skip.node not in done
                and skip.node not in current.failed_nodes
                and skip.reason
                not in (SkipReason.EMPTY, SkipReason.RECEIVES_MOVES, SkipReason.ABOVE_THRESHOLD)
            }
            if new_skips:
                await store.record_skips(current.id, new_skips)
                for node, reason in sorted(new_skips.items()):
                    await self._publish(
                        DefragNodeSkipped(
                            event_id=_event_id(current.id, "skipped", node),
                            occurred_at=self._now(),
                            node=node,
                            pool=current.pool,
                            campaign_id=current.id,
                            reason=reason,
                        )
                    )
            drain = next(
                (d for d in plan.drains if d.node == current.current_node),
                next((d for d in plan.drains if d.node not in done), None),
            )
            if drain is None:
                if current.current_node is not None:
                    await self._abandon(current, current.current_node, "no longer drainable after a restart")
                    continue
                return "completed"
            try:
                await self._drain(current, drain, loaded)
            except _DeadlineReachedError:
                await self._abandon(current, drain.node, "campaign deadline reached")
                return "deadline"

    async def _mark_node(self, node: str, marks: tuple[dict[str, str | None], dict[str, str | None]]) -> None:
        labels, annotations = marks
        await self.deps.ledger.set_node_markers(node, labels, annotations)
        if await self.deps.cluster.get_node(node) is not None:
            await self.deps.cluster.patch_node_metadata(node, labels=labels, annotations=annotations)

    async def _drain(self, campaign: CampaignRecord, drain: NodeDrain, loaded: LoadedPool) -> None:
        await self.deps.store.set_current_node(campaign.id, drain.node)
        await self._mark_node(drain.node, markers.source_markers(campaign.pool, self._now()))
        moved = 0
        try:
            for move in drain.moves:
                if self._past(campaign.deadline_at):
                    raise _DeadlineReachedError
                if await self._move(campaign, move, loaded):
                    moved += 1
        except _NodeFailedError as failure:
            await self._fail(campaign, drain.node, failure.reason, stranded=failure.stranded)
            return
        await self._mark_node(drain.node, markers.clear_source_markers())
        await self.deps.store.node_drained(campaign.id, drain.node)
        log.info(
            "node drained", extra={"campaign": str(campaign.id), "node": drain.node, "pods_moved": moved}
        )
        await self._publish(
            NodeDrained(
                event_id=_event_id(campaign.id, "drained", drain.node),
                occurred_at=self._now(),
                node=drain.node,
                pool=campaign.pool,
                campaign_id=campaign.id,
                pods_moved=moved,
            )
        )

    async def _move(self, campaign: CampaignRecord, move: Move, loaded: LoadedPool) -> bool:
        """Evict one pod and wait for its replacement; False when the pod was already gone."""
        deps = self.deps
        pod = loaded.pods.get(move.key) or await deps.cluster.get_pod(move.namespace, move.name)
        if pod is None or pod.node_name != move.from_node:
            return False  # gone already, or the name now belongs to a replacement elsewhere
        hold_id = uuid5(HOLD_NAMESPACE, f"{campaign.id}/{pod.uid}")
        allocation = loaded.allocations.get(move.key)
        hold_expires_at = self._now() + deps.settings.hold_ttl
        reserved = await deps.ledger.reserve_hold(
            ReservationRequest(
                allocation_id=hold_id,
                workload=WorkloadRef(
                    namespace=HOLD_WORKLOAD_NAMESPACE,
                    name=f"hold-{move.namespace}-{move.name}"[:253],
                    uid=str(hold_id),
                    workload=f"{move.namespace}/{move.name}",
                ),
                pool=campaign.pool,
                node=move.to_node,
                shares=tuple(
                    ShareRequest(gpu_uuid=uuid, tflops_milli=tflops, vram_bytes=vram)
                    for uuid, tflops, vram in zip(
                        move.gpu_uuids, move.tflops_milli, move.vram_bytes, strict=True
                    )
                ),
                qos=allocation.qos if allocation is not None else "medium",
                isolation=allocation.isolation if allocation is not None else "soft",
                cause=campaign.id,
            ),
            HoldFor(
                pool=campaign.pool,
                namespace=pod.namespace,
                name=pod.name,
                owner_uid=_controller_uid(pod),
                expires_at=hold_expires_at,
            ),
        )
        if not isinstance(reserved, Reserved):
            raise _NodeFailedError(f"target capacity on {move.to_node} is no longer free for {move.key}")
        await deps.store.add_move(
            campaign.id,
            node=move.from_node,
            pod_namespace=pod.namespace,
            pod_name=pod.name,
            pod_uid=pod.uid,
            owner_uid=_controller_uid(pod),
            siblings_before=_siblings(loaded.pods, pod),
            target_node=move.to_node,
            hold_allocation_id=hold_id,
            hold_expires_at=hold_expires_at,
        )
        result = await self._evict(campaign, pod)
        if isinstance(result, EvictionBlocked):
            await self._release_hold(hold_id, "defrag hold released: eviction refused")
            await deps.store.set_move_state(campaign.id, pod.uid, "failed", self._now(), reason=result.reason)
            raise _NodeFailedError(f"eviction of {move.key} refused: {result.reason}")
        if isinstance(result, NotFound):
            await self._release_hold(hold_id, "defrag hold released: pod already gone")
            await deps.store.set_move_state(
                campaign.id, pod.uid, "placed", self._now(), reason="pod already gone"
            )
            return False
        assert isinstance(result, Evicted)
        evicted = PodEvicted(
            event_id=_event_id(campaign.id, "evicted", pod.uid),
            occurred_at=self._now(),
            workload=WorkloadRef(namespace=pod.namespace, name=pod.name, uid=pod.uid or None),
            node=move.from_node,
            pool=campaign.pool,
            by="defrag",
            reason=f"defrag campaign drains node {move.from_node}; planned target {move.to_node}",
            allocation_id=allocation.allocation_id if allocation is not None else None,
            campaign_id=campaign.id,
        )
        # The move's eviction and its event commit as one: a bus outage or a crash cannot lose the event.
        async with deps.ledger.transaction() as transaction:
            await deps.store.set_move_state(
                campaign.id, pod.uid, "evicted", evicted.occurred_at, connection=transaction.connection
            )
            await transaction.announce(evicted)
        log.info(
            "evicted for defrag; waiting for its replacement",
            extra={
                "campaign": str(campaign.id),
                "pod": move.key,
                "node": move.from_node,
                "target": move.to_node,
            },
        )
        await self._mark_evicted(campaign.pool, pod)
        records = [m for m in await deps.store.moves(campaign.id) if m.pod_uid == pod.uid]
        await self._wait_for_replacement(
            campaign, records[0], self._now() + deps.settings.replacement_timeout
        )
        return True

    async def _evict(self, campaign: CampaignRecord, pod: Pod) -> EvictionResult:
        """Evict through the Eviction API, asking again while a disruption budget refuses (429) until
        the replacement timeout or the campaign's deadline: the disruption controller allows the next
        eviction only once the previous replacement is Ready and counted, a moment after it is bound."""
        until = self._now() + self.deps.settings.replacement_timeout
        if campaign.deadline_at is not None:
            until = min(until, campaign.deadline_at)
        while True:
            result = await self.deps.cluster.evict_pod(pod.namespace, pod.name)
            if not isinstance(result, EvictionBlocked) or self._now() >= until:
                return result
            await asyncio.sleep(self.deps.settings.poll_interval_s)

    async def _mark_evicted(self, pool: str, pod: Pod) -> None:
        """Mark the evicted pod object while it terminates; never a replacement that reuses its name."""
        current = await self.deps.cluster.get_pod(pod.namespace, pod.name)
        if current is None or current.uid != pod.uid:
            return
        labels, annotations = markers.evicted_markers(pool, self._now())
        await self.deps.cluster.patch_pod_metadata(
            pod.namespace,
            pod.name,
            labels=labels,
            annotations=annotations,
            resource_version=current.resource_version,
        )

    async def _resume_move(self, campaign: CampaignRecord, move: MoveRecord) -> None:
        """Finish a move a crash interrupted: forget it if the pod was never evicted, else wait for
        its replacement (from the eviction time, so a restart does not extend the wait), keeping the
        hold for it meanwhile."""
        if move.state == "evicting":
            pod = await self.deps.cluster.get_pod(move.pod_namespace, move.pod_name)
            if pod is not None and pod.uid == move.pod_uid:
                if move.hold_allocation_id is not None:
                    await self._release_hold(
                        move.hold_allocation_id, "defrag hold released: move interrupted"
                    )
                await self.deps.store.set_move_state(
                    campaign.id, move.pod_uid, "failed", self._now(), reason="interrupted before eviction"
                )
                return
        started = move.evicted_at or self._now()
        try:
            await self._wait_for_replacement(campaign, move, started + self.deps.settings.replacement_timeout)
        except _NodeFailedError as failure:
            await self._fail(campaign, move.node, failure.reason, stranded=failure.stranded)

    async def _wait_for_replacement(
        self, campaign: CampaignRecord, move: MoveRecord, until: datetime
    ) -> None:
        if campaign.deadline_at is not None:
            until = min(until, campaign.deadline_at)
        key = f"{move.pod_namespace}/{move.pod_name}"
        while True:
            placed_on = await self._replacement_node(move)
            if placed_on is not None:
                if move.hold_allocation_id is not None:  # a no-op when the replacement claimed it
                    await self._release_hold(
                        move.hold_allocation_id, f"defrag hold released: replacement placed on {placed_on}"
                    )
                await self.deps.store.set_move_state(
                    campaign.id, move.pod_uid, "placed", self._now(), placed_on=placed_on
                )
                log.info(
                    "replacement placed",
                    extra={"campaign": str(campaign.id), "pod": key, "node": placed_on},
                )
                return
            if self._now() >= until:
                reason = f"replacement for {key} was not placed in time"
                if move.hold_allocation_id is not None:
                    await self._release_hold(move.hold_allocation_id, f"defrag hold released: {reason}")
                await self.deps.store.set_move_state(
                    campaign.id, move.pod_uid, "failed", self._now(), reason=reason
                )
                raise _NodeFailedError(reason, stranded=1)
            await asyncio.sleep(self.deps.settings.poll_interval_s)

    async def _replacement_node(self, move: MoveRecord) -> str | None:
        known = set(move.siblings_before) | {move.pod_uid}
        for pod in await self.deps.cluster.list_pods(namespace=move.pod_namespace):
            same_workload = (move.owner_uid is not None and _controller_uid(pod) == move.owner_uid) or (
                pod.name == move.pod_name
            )
            if (
                same_workload
                and pod.uid not in known
                and pod.node_name
                and pod.node_name != move.node
                and pod.deleting_since is None
            ):
                return pod.node_name
        return None

    async def _release_hold(self, hold_id: UUID, reason: str) -> None:
        """Give the hold's capacity back unless the replacement claimed it already (then a no-op)."""
        await self.deps.ledger.release(hold_id, reason)
        await self.deps.store.hold_released(hold_id)

    async def release_expired_holds(self) -> int:
        """Release capacity holds left by a crash once they expire; returns how many were released.

        Both the holds the planner's moves record and those the ledger itself says expired: a crash
        between reserving a hold and recording its move leaves a hold only the ledger knows."""
        expired: set[UUID] = set()
        for move in await self.deps.store.unreleased_holds():
            if move.hold_allocation_id is None:
                continue
            if move.hold_expires_at is None or move.hold_expires_at <= self._now():
                expired.add(move.hold_allocation_id)
        expired |= {hold.allocation.allocation_id for hold in await self.deps.ledger.expired_holds()}
        for hold_id in sorted(expired):
            await self.deps.ledger.release(hold_id, "defrag hold expired")
            await self.deps.store.hold_released(hold_id)
        return len(expired)

    async def _fail(self, campaign: CampaignRecord, node: str, reason: str, *, stranded: int = 0) -> None:
        log.warning(
            "defrag leaves node %s: %s",
            node,
            reason,
            extra={"campaign": str(campaign.id), "node": node, "stranded": stranded},
        )
        await self._mark_node(node, markers.clear_source_markers())
        await self._mark_node(node, markers.evict_skip_markers(campaign.pool, reason, self._now()))
        await self.deps.store.node_failed(campaign.id, node, reason, stranded=stranded)
        await self._publish(
            DefragNodeSkipped(
                event_id=_event_id(campaign.id, "failed", node),
                occurred_at=self._now(),
                node=node,
                pool=campaign.pool,
                campaign_id=campaign.id,
                reason=f"{SkipReason.EARLIER_FAILURE.value}: {reason}",
            )
        )

    async def _abandon(self, campaign: CampaignRecord, node: str, reason: str) -> None:
        await self._mark_node(node, markers.clear_source_markers())
        await self.deps.store.node_failed(campaign.id, node, reason)

    async def _clear_evict_skips(self, pool: str) -> None:
        """Before a new campaign, give every node of the pool a fresh chance. The markers stay visible
        between campaigns so users can see why a node was left (TensorFusion clears them at the end)."""
        kube = {node.name: node for node in await self.deps.cluster.list_nodes()}
        for node in await self.deps.ledger.list_nodes():
            labels = {**node.labels, **(kube[node.name].labels if node.name in kube else {})}
            if node.pool == pool and markers.is_marked(labels, markers.EVICT_SKIP):
                await self._mark_node(node.name, markers.clear_evict_skip_markers())
