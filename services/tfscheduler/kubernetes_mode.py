"""The scheduler's Kubernetes mode: watch pending pods, place them with the engine, annotate, bind, release.

A thin shell over the `Cluster` port and the `Scheduler` engine; what to read from a pod and what to
write on it comes from `tfscheduler.core.binding`. It does not decide placement (the engine does) and
keeps nothing needed for correctness in memory: on start it reconciles the ledger with the cluster
(allocations of pods that are gone are released; bound pods with `gpu-ids` and no ledger row are
adopted and a drift event is published), and the watch starts with a full list, so a restart neither
misses nor double-places a pod (the allocation id is derived from the pod, and reserving it again is a
no-op). Preemption evicts through the Eviction API; a disruption budget's refusal is respected; the
victim's release as evicted and its `tf.evt.pod.evicted` (through the ledger outbox) then commit as one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid5

from tfcommon.cluster import (
    Bound,
    Cluster,
    ClusterError,
    NotFound,
    Pod,
    PodEvent,
    PodEventType,
    PodWatch,
)
from tfcommon.events import DriftDetected
from tfcommon.ledger.records import ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import BatchAbandonedError
from tfcommon.ledger.takeover import TakeoverLedger, release_takeover
from tfcommon.placement import PlacementRequestError
from tfcommon.pool_capacity import HostFacts
from tfcommon.settings import SchedulerKubernetesSettings

from tfscheduler.core.binding import (
    TAKEOVER_SLOT,
    PodRequestError,
    bind_annotations,
    gpu_ids_of,
    pod_work,
    workload_of,
)
from tfscheduler.core.view import allocation_id_for, placement_request
from tfscheduler.engine import Scheduler
from tfscheduler.eviction import ApiEvictor
from tfscheduler.spec_conditions import UnsupportedFieldsReporter
from tfscheduler.status_writer import StatusWriter
from tfscheduler.submission import WorkloadStatus

log = logging.getLogger("tfscheduler.kubernetes")
WATCH_RETRY_S = 1.0
TAKEOVER_SWEEP_GRACE = timedelta(minutes=1)


@dataclass(frozen=True)
class Reconciled:
    """What the start-up reconciliation changed."""

    released: int
    takeover_slots_released: int


def _utc_now() -> datetime:
    return datetime.now(UTC)


class KubernetesMode:
    """Places the pods of `scheduler_name`: one task per pod at a time, `concurrency` pods at once."""

    def __init__(
        self,
        scheduler: Scheduler,
        cluster: Cluster,
        *,
        scheduler_name: str = "tensor-fusion-scheduler",
        status: StatusWriter | None = None,
        concurrency: int = 16,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.scheduler = scheduler
        self.cluster = cluster
        self.scheduler_name = scheduler_name
        self.status = status
        self.clock = clock
        self.pending: dict[str, Pod] = {}
        self._reported: dict[str, str] = {}
        self._latest: dict[str, PodEvent] = {}
        self._busy: set[str] = set()
        self._workers: set[asyncio.Task[None]] = set()
        self._gate = asyncio.Semaphore(concurrency)
        self._cordons: dict[str, bool] = {}
        self._takeovers_recorded: set[str] = set()
        self._cordons_listed_at = -math.inf
        self._cordon_sync: asyncio.Task[int] | None = None
        self._bound: set[str] = set()
        """Uids of pods this process bound: an event from before the binding (the annotation patch's
        `MODIFIED` is often queued while the binding is in flight) is stale and places nothing."""
        self.idle = asyncio.Event()
        self.idle.set()

    # ------------------------------------------------------------------------------------ running

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile, then follow the pod watch until `stop`; reconnects (resuming) after errors."""
        while not stop.is_set():
            try:
                await self.reconcile()
                break
            except ClusterError as error:
                log.warning("reconciliation with the cluster failed, retrying: %s", error)
                await _wait(stop, WATCH_RETRY_S)
        cursor = None
        while not stop.is_set():
            watch = self.cluster.watch_pods(self.scheduler_name, cursor=cursor)
            try:
                while not stop.is_set():
                    event = await _next_or_stop(watch, stop)
                    if event is None:
                        break
                    self.dispatch(event)
            except ClusterError as error:
                log.warning("pod watch failed, resuming: %s", error)
                await _wait(stop, WATCH_RETRY_S)
            finally:
                cursor = watch.cursor
                await watch.aclose()
        await self.drain()

    async def retry_on_freed_capacity(self, stop: asyncio.Event, *, interval_s: float = 10.0) -> None:
        """Try the waiting pods again (highest priority first) whenever the engine frees capacity, and
        every `interval_s` (a refused eviction or a node coming back frees nothing in the ledger)."""
        freed = self.scheduler.capacity_freed
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_wait_any(freed, stop), timeout=interval_s)
            if stop.is_set():
                return
            freed.clear()
            self.retry_pending()

    async def follow_cordons(self, stop: asyncio.Event, *, interval_s: float) -> None:
        """Apply `kubectl cordon` and `uncordon` to placement, checking the nodes every `interval_s`."""
        while not stop.is_set():
            try:
                await self.cordons_listed_after(time.monotonic())
            except ClusterError as error:
                log.warning("reading node cordons failed, retrying: %s", error)
            await _wait(stop, interval_s)

    async def cordons_listed_after(self, moment: float) -> None:
        """Wait until the cordons placement uses come from a node list started after `moment`
        (`time.monotonic()`), so a pod created after `kubectl cordon` never lands on the cordoned node.
        One list at a time, shared by every pod waiting for it; raises `ClusterError` if it fails."""
        while self._cordons_listed_at < moment:
            if self._cordon_sync is None or self._cordon_sync.done():
                self._cordon_sync = asyncio.create_task(self._listed_sync(), name="tf-cordon-sync")
            await asyncio.shield(self._cordon_sync)

    async def _listed_sync(self) -> int:
        started = time.monotonic()
        changed = await self.sync_cordons()
        self._cordons_listed_at = started
        return changed

    async def sync_cordons(self) -> int:
        """Copy a node's cordon (`spec.unschedulable`) to the ledger when it changes in the cluster (or is
        first seen cordoned), so no new pod lands on a cordoned node; returns how many nodes changed.
        The nodes' labels, memory and disk go to the engine too (`Scheduler.observe_hosts`: a GPUPool's
        nodeSelector and virtual capacity read them).

        Only changes are copied: a cordon set in the ledger by other means is left alone until the
        node's own flag changes."""
        known = {node.name: node.cordoned for node in await self.scheduler.ledger.list_nodes()}
        changed = 0
        listed = await self.cluster.list_nodes()
        self.scheduler.observe_hosts(
            {
                node.name: HostFacts(
                    labels=dict(node.labels),
                    memory_bytes=node.allocatable_memory_bytes,
                    disk_bytes=node.allocatable_disk_bytes,
                )
                for node in listed
            }
        )
        for node in listed:
            seen = self._cordons.get(node.name)
            self._cordons[node.name] = node.cordoned
            if node.name not in known or seen == node.cordoned or (seen is None and not node.cordoned):
                continue
            if known[node.name] != node.cordoned:
                changed += await self.scheduler.ledger.set_node_cordoned(node.name, node.cordoned)
        if changed:
            await self.scheduler.recheck_nodes()
        return changed

    def retry_pending(self) -> None:
        """Queue every waiting pod for another placement attempt, highest priority first."""
        waiting = sorted(self.pending.values(), key=lambda pod: -(pod.priority or 0))
        for pod in waiting:
            if pod.uid not in self._latest:
                self.dispatch(PodEvent(PodEventType.MODIFIED, pod))

    def dispatch(self, event: PodEvent) -> None:
        """Handle `event` after any earlier one of the same pod; only its latest state is acted on."""
        uid = event.pod.uid
        self._latest[uid] = event
        if uid in self._busy:
            return
        self._busy.add(uid)
        self.idle.clear()
        worker = asyncio.create_task(self._work(uid), name=f"tf-pod-{uid}")
        self._workers.add(worker)
        worker.add_done_callback(self._workers.discard)

    async def drain(self) -> None:
        """Wait for the pod handlers already started."""
        while self._workers:
            await asyncio.gather(*list(self._workers), return_exceptions=True)

    async def _work(self, uid: str) -> None:
        try:
            while (event := self._latest.pop(uid, None)) is not None:
                if self._to_place(event):
                    try:
                        await self.cordons_listed_after(time.monotonic())
                    except Exception:  # placed on the cordons last read; the pod is not dropped
                        log.exception("reading node cordons before placing failed")
                async with self._gate:
                    try:
                        await self.handle(event)
                    except Exception:
                        log.exception("handling pod %s/%s failed", event.pod.namespace, event.pod.name)
        finally:
            self._busy.discard(uid)
            if not self._busy:
                self.idle.set()

    # ----------------------------------------------------------------------------------- handling

    def _to_place(self, event: PodEvent) -> bool:
        pod = event.pod
        return (
            event.type is not PodEventType.DELETED
            and not pod.is_finished
            and not pod.is_bound
            and pod.deleting_since is None
            and pod.is_pending_for(self.scheduler_name)
        )

    async def handle(self, event: PodEvent) -> None:
        """One pod change: release a gone or finished pod, adopt an unknown bound one, place a pending one."""
        pod = event.pod
        if event.type is PodEventType.DELETED:
            await self.release(pod, "pod deleted")
            return
        if pod.is_finished:
            await self.release(pod, f"pod {pod.phase.lower()}")
            return
        await self._record_takeover(pod)
        if pod.is_bound:
            self.pending.pop(pod.uid, None)
            self._reported.pop(pod.uid, None)
            await self._adopt_if_unknown(pod)
            return
        if pod.uid in self._bound:
            return
        if pod.deleting_since is not None:
            await self.release(pod, "pod deleted before it was placed")
            return
        if pod.is_pending_for(self.scheduler_name):
            await self.schedule(pod)

    async def schedule(self, pod: Pod) -> WorkloadStatus | None:
        """Place, reserve, annotate and bind `pod`; report why when it cannot be placed now."""
        try:
            work = pod_work(pod)
        except PodRequestError as error:
            await self._report(pod, f"pod {pod.namespace}/{pod.name} cannot be placed: {error}")
            return None
        self.pending[pod.uid] = pod
        owner = next((o for o in pod.owner_references if o.controller), None)
        owner_uid = (owner.uid or owner.name) if owner is not None else None
        status = await self.scheduler.submit(work.submission, owner_uid=owner_uid)
        if status.state == "placed" and status.node is not None:
            await self._bind(pod, status)
        elif status.state in ("pending", "refused"):
            await self._report(pod, status.reason or "no GPU fits this pod now")
        else:
            self.pending.pop(pod.uid, None)
        return status

    async def _bind(self, pod: Pod, status: WorkloadStatus) -> None:
        assert status.node is not None
        # One write: the Binding carries `gpu-ids` and `container-gpus`, which the API server sets on the
        # pod together with its node, so no pod is ever bound without them (nor annotated and unbound).
        annotations = {
            key: value for key, value in bind_annotations(pod, status.gpu_uuids).items() if value is not None
        }
        bound = await self.cluster.bind_pod(
            pod.namespace, pod.name, status.node, uid=pod.uid, annotations=annotations
        )
        if isinstance(bound, Bound):
            self._placed(pod)
            return
        if isinstance(bound, NotFound):
            await self._roll_back(pod, status, f"pod gone before binding: {bound.message}")
            return
        current = await self.cluster.get_pod(pod.namespace, pod.name)
        if current is not None and current.uid == pod.uid and current.node_name == status.node:
            self._placed(pod)  # bound already (a replayed event or another replica with the same allocation)
            return
        await self._roll_back(pod, status, f"binding to {status.node} failed: {bound.message}")

    def _placed(self, pod: Pod) -> None:
        self._bound.add(pod.uid)
        self.pending.pop(pod.uid, None)
        self._reported.pop(pod.uid, None)
        if self.status is not None:
            self.status.notify()

    async def _roll_back(self, pod: Pod, status: WorkloadStatus, reason: str) -> None:
        log.info("rolling back %s/%s: %s", pod.namespace, pod.name, reason)
        self.pending.pop(pod.uid, None)
        await self.scheduler.release(status.id, reason)
        if self.status is not None:
            self.status.notify()

    async def _report(self, pod: Pod, message: str) -> None:
        if self._reported.get(pod.uid) == message:
            return
        await self.cluster.report_unschedulable(pod, message, reporter=self.scheduler_name)
        self._reported[pod.uid] = message

    async def _record_takeover(self, pod: Pod) -> None:
        """Write the pod's uid on its takeover slot the first time the pod is seen, so the webhook can
        tell this slot's pod gone from one still being created (`tfwebhook.core.takeover`)."""
        slot = pod.annotations.get(TAKEOVER_SLOT)
        if not slot or pod.uid in self._takeovers_recorded:
            return
        await TakeoverLedger(self.scheduler.ledger.engine).record_pod(slot, pod.uid)
        self._takeovers_recorded.add(pod.uid)

    async def release(self, pod: Pod, reason: str) -> bool:
        """Close the pod's allocation (True the one time it is closed) and free its takeover slot."""
        self._takeovers_recorded.discard(pod.uid)
        self._bound.discard(pod.uid)
        self.pending.pop(pod.uid, None)
        self._reported.pop(pod.uid, None)
        released = await self.scheduler.release(allocation_id_for(workload_of(pod)), reason)
        slot = pod.annotations.get(TAKEOVER_SLOT)
        if slot:
            await release_takeover(self.scheduler.ledger.engine, slot)
        if released and self.status is not None:
            self.status.notify()
        return released

    # ------------------------------------------------------------------------------- reconciling

    async def reconcile(self) -> Reconciled:
        """Release what the ledger holds for pods that are gone or finished, and free their takeover
        slots. (Bound pods without a ledger row are adopted when the watch lists them.)"""
        # Ledger first: a pod listed afterwards cannot be missing from the list by being too new.
        allocations = await self.scheduler.ledger.active_allocations()
        waiting = await self.scheduler.store.pending()
        pods = await self.cluster.list_pods()
        alive = {pod.uid: pod for pod in pods if not pod.is_finished}
        released = 0
        for allocation in allocations:
            uid = allocation.workload.uid
            if uid is None or uid in alive:
                continue
            reason = "pod gone while the scheduler was down"
            released += await self.scheduler.release(allocation.allocation_id, reason)
        for stored in waiting:
            if stored.submission.workload.uid not in alive:
                await self.scheduler.release(stored.allocation_id, "pod gone before it was placed")
        live_slots = {slot for pod in alive.values() if (slot := pod.annotations.get(TAKEOVER_SLOT))}
        slots = await TakeoverLedger(self.scheduler.ledger.engine).sweep(
            live_slots, self.clock() - TAKEOVER_SWEEP_GRACE
        )
        if released and self.status is not None:
            self.status.notify()
        return Reconciled(released=released, takeover_slots_released=slots)

    async def _adopt_if_unknown(self, pod: Pod) -> None:
        gpu_ids = gpu_ids_of(pod)
        if not gpu_ids or pod.node_name is None:
            return
        allocation_id = allocation_id_for(workload_of(pod))
        if allocation_id in self.scheduler.active:
            return
        if await self.scheduler.ledger.get_allocation(allocation_id) is not None:
            return
        await self.adopt(pod, allocation_id, gpu_ids)

    async def adopt(self, pod: Pod, allocation_id: UUID, gpu_ids: tuple[str, ...]) -> bool:
        """Record a bound pod's GPUs (`gpu-ids`) in the ledger and announce a drift event per GPU. An
        adopted pod's allocation (committed: the pod is bound) and its drift events (through the outbox)
        commit in one transaction, so neither a bus outage nor a crash loses them; a pod that cannot be
        adopted changes nothing in the ledger and its events are published directly (the next listing
        publishes them again, with the same ids)."""
        assert pod.node_name is not None
        node = pod.node_name
        try:
            work = pod_work(pod)
            wanted = placement_request(f"{pod.namespace}/{pod.name}", work.submission.request)
        except (PodRequestError, PlacementRequestError) as error:
            wanted, detail = None, f"its annotations cannot be read ({error})"
        else:
            detail = ""
        placed_node = self.scheduler.view.nodes.get(node)
        gpus = {gpu.uuid.lower(): gpu for gpu in placed_node.gpus} if placed_node is not None else {}
        if wanted is not None and all(uuid in gpus for uuid in gpu_ids):
            request = work.submission.request
            shares = tuple(
                ShareRequest(
                    gpu_uuid=gpus[uuid].uuid,
                    tflops_milli=wanted.tflops_on(gpus[uuid]),
                    vram_bytes=wanted.vram_on(gpus[uuid]),
                    limit_tflops_milli=max(request.tflops_limit_milli, wanted.tflops_on(gpus[uuid])),
                    limit_vram_bytes=max(request.vram_limit_bytes, wanted.vram_on(gpus[uuid])),
                )
                for uuid in gpu_ids
            )
            reservation = ReservationRequest(
                allocation_id=allocation_id,
                workload=work.submission.workload,
                pool=request.pool,
                node=node,
                shares=shares,
                qos=request.qos,
                isolation=request.isolation,
                eviction_protection_s=work.submission.eviction_protection_s or None,
            )
            try:
                async with self.scheduler.ledger.transaction() as transaction:
                    [result] = await transaction.reserve_many([reservation], commit=True)
                    if isinstance(result, Reserved):
                        for event in self._drift_events(
                            pod, allocation_id, gpu_ids, "adopted into the ledger"
                        ):
                            await transaction.announce(event)
            except BatchAbandonedError:  # another replica adopted it at this moment; it announces
                return False
            if isinstance(result, Reserved):
                await self.scheduler.start()
                if self.status is not None:
                    self.status.notify()
                return True
            detail = f"could not be adopted: {getattr(result, 'message', result)}"
        elif not detail:
            unknown = [uuid for uuid in gpu_ids if uuid not in gpus]
            detail = f"its GPUs {', '.join(unknown)} are not in the ledger for node {node}"
        for event in self._drift_events(pod, allocation_id, gpu_ids, detail):
            await self.scheduler.bus.publish(event)
        return False

    def _drift_events(
        self, pod: Pod, allocation_id: UUID, gpu_ids: tuple[str, ...], detail: str
    ) -> list[DriftDetected]:
        """One `binding-without-allocation` drift event per GPU of the bound pod, with ids derived from
        its allocation and GPU (the same drift announced again is the same event)."""
        node = pod.node_name
        assert node is not None
        return [
            DriftDetected(
                event_id=uuid5(allocation_id, f"binding-without-allocation/{uuid}"),
                occurred_at=self.clock(),
                node=node,
                gpu_uuid=uuid,
                kind="binding-without-allocation",
                detail=f"pod {pod.namespace}/{pod.name} is bound to {node} with gpu-ids "
                f"{','.join(gpu_ids)} but the ledger had no allocation; {detail}",
                workload=workload_of(pod),
            )
            for uuid in gpu_ids
        ]


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def _wait_any(first: asyncio.Event, second: asyncio.Event) -> None:
    waiters = {asyncio.create_task(first.wait()), asyncio.create_task(second.wait())}
    _done, rest = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for task in rest:
        task.cancel()


async def _next_or_stop(watch: PodWatch, stop: asyncio.Event) -> PodEvent | None:
    following = asyncio.ensure_future(watch.__anext__())
    stopping = asyncio.create_task(stop.wait())
    done, _rest = await asyncio.wait({following, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if following not in done:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await following
        return None
    try:
        return following.result()
    except StopAsyncIteration:
        return None


def open_cluster(settings: SchedulerKubernetesSettings) -> Cluster:
    """The API server from the environment: the pod's service account, else the kubeconfig."""
    from tfcommon.cluster.kubernetes import KubernetesCluster

    return KubernetesCluster.from_environment(
        kubeconfig=str(settings.kubeconfig) if settings.kubeconfig else None, context=settings.kube_context
    )


@dataclass
class KubernetesWiring:
    """Kubernetes mode assembled around one engine: the pod loop, the status writer and their cluster."""

    cluster: Cluster
    mode: KubernetesMode
    status: StatusWriter
    retry_s: float
    owns_cluster: bool

    def tasks(self, stop: asyncio.Event) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        """The service tasks (replacing local mode's `retry-pending`): pods, retries, status, node
        cordons (checked as often as the ledger is polled for status) and the `UnsupportedFields`
        condition of GPUPool, GPUNode and GPUResourceQuota objects."""

        async def pods() -> None:
            try:
                await self.mode.run(stop)
            finally:
                close = getattr(self.cluster, "close", None)
                if self.owns_cluster and callable(close):
                    close()

        return {
            "kubernetes-pods": pods,
            "retry-pending": lambda: self.mode.retry_on_freed_capacity(stop, interval_s=self.retry_s),
            "custom-status": lambda: self.status.run(stop),
            "node-cordons": lambda: self.mode.follow_cordons(stop, interval_s=self.status.poll_interval_s),
            "spec-conditions": lambda: UnsupportedFieldsReporter(self.cluster).run(stop),
        }


def wire_kubernetes(
    scheduler: Scheduler, settings: SchedulerKubernetesSettings, *, cluster: Cluster | None = None
) -> KubernetesWiring:
    """Kubernetes mode for `scheduler`, on `cluster` or the API server from the environment: its
    preemption evicts through the Eviction API (`ApiEvictor`)."""
    opened = cluster or open_cluster(settings)
    scheduler.evictor = ApiEvictor(opened, retry_s=settings.pending_retry_interval_s)
    status = StatusWriter(
        scheduler.ledger,
        opened,
        debounce_s=settings.status_debounce_s,
        poll_interval_s=settings.status_poll_interval_s,
        in_pool=lambda node, pool: scheduler.pool_membership(node, pool) is None,
    )
    mode = KubernetesMode(
        scheduler,
        opened,
        scheduler_name=settings.scheduler_name,
        status=status,
        concurrency=settings.bind_concurrency,
    )
    return KubernetesWiring(opened, mode, status, settings.pending_retry_interval_s, cluster is None)
