"""The webhook's I/O shell: `POST /mutate-v1-pod`, the takeover ledger, events and certificate reload.

The route reads the raw AdmissionReview, asks the pure core (`tfwebhook.core`) for a verdict, settles
`enabled-replicas` with the ledger (a dry run only looks, never claims), gives a pod taken over its
device-plugin index (a dry run only previews the next one), answers, and queues `PodAdmitted` for each
GPU pod it mutates (never for a dry run). Events leave off the request path through a long-lived
publisher task (`PodAdmittedOutbox`), in batches of up to 64 publishes awaiting their acknowledgements
together (under load, one batch every 5 ms), and are retried until JetStream stores them; the event id
derives from the request UID, so a republished or re-admitted event is deduplicated by JetStream. The
outbox lives in memory: it is flushed on shutdown, but a crash loses what it holds. A malformed review
gets HTTP 400; an unexpected failure gets an allowed=false review naming the cause, never an HTTP 500.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, runtime_checkable

import orjson
from fastapi import APIRouter
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from tfcommon.bus import EncodedEvent, EventBus, publish_one
from tfcommon.config import ConfigProvider, TfConfig
from tfcommon.events import Message, PodAdmitted
from tfcommon.quota import NamespaceQuota
from tfcommon.recommendations import Recommendation
from tfcommon.runtime import request_body
from tfcommon.service_metrics import record_request_duration

from tfwebhook.core.admission import (
    AdmissionContext,
    Admitted,
    Denied,
    Verdict,
    admit,
    assign_pod_index,
)
from tfwebhook.core.profile import WorkloadProfile
from tfwebhook.core.review import (
    MalformedReviewError,
    ReviewRequest,
    encode_review,
    parse_review,
    render_response,
)
from tfwebhook.pod_index import CyclingPodIndices, PodIndices
from tfwebhook.takeover_recheck import TakeoverRecheck

MUTATE_PATH = "/mutate-v1-pod"
PUBLISH_CONCURRENCY = 64
"""Most `PodAdmitted` publishes awaiting their acknowledgements at once: the largest batch."""
BATCH_ABOVE_PER_S = 200.0
"""Admissions a second from which `PodAdmitted` events leave in batches at most every `BATCH_INTERVAL_S`."""
BATCH_INTERVAL_S = 0.005
RATE_WINDOW_S = 0.1
EVENT_NAMESPACE = uuid.UUID("5d7e5e2c-4f5b-4a59-9a59-7466706f6f6c")
log = logging.getLogger("tfwebhook.http")


class Takeovers(Protocol):
    """The `enabled-replicas` ledger as the shell uses it (`tfcommon.ledger.takeover.TakeoverGate`)."""

    async def claim(self, slot_id: str, workload_key: str, limit: int) -> bool: ...

    async def has_room(self, workload_key: str, limit: int, slot_id: str | None = None) -> bool: ...


@runtime_checkable
class PublishesMany(Protocol):
    """A bus that publishes a batch pipelined (`tfcommon.bus.NatsEventBus.publish_many`)."""

    async def publish_many(self, events: Sequence[Message | EncodedEvent]) -> list[BaseException | None]: ...


NamespaceLabels = Callable[[str], Awaitable[Mapping[str, str] | None]]
"""Labels of a namespace for `namespaceSelector` scopes (e.g. from a namespace informer's cache);
None when unknown, and a namespace selector then does not match."""


async def no_namespace_labels(namespace: str) -> Mapping[str, str] | None:
    return None


Recommendations = Callable[[], Mapping[str, Recommendation]]
"""The stored autoscaling recommendations by `namespace/workload`, from memory (never the database on
the admission path: `tfcommon.ledger.recommendations.RecommendationCache.current`)."""


Quotas = Callable[[], Mapping[str, NamespaceQuota]]
"""The GPUResourceQuota of each namespace (`tfwebhook.quotas.WatchedQuotas`)."""


def no_quotas() -> Mapping[str, NamespaceQuota]:
    return {}


Profiles = Callable[[], Mapping[str, WorkloadProfile]]
"""The cluster's WorkloadProfiles by `namespace/name` (`tfwebhook.profiles.WatchedProfiles`): the same
mapping until one changes."""

_NO_PROFILES: Mapping[str, WorkloadProfile] = {}


def no_profiles() -> Mapping[str, WorkloadProfile]:
    return _NO_PROFILES


def no_recommendations() -> Mapping[str, Recommendation]:
    return _NO_RECOMMENDATIONS


_NO_RECOMMENDATIONS: Mapping[str, Recommendation] = {}


class VerdictCache:
    """Memoizes `admit` for identical pods (the replicas of one rollout), bounded, oldest out first.

    `admit` is pure, so an identical pod in the same namespace under the same configuration gets the
    same verdict. Verdicts that claim an `enabled-replicas` slot are never cached: they carry the
    request's own slot id. A configuration reload, or a changed set of WorkloadProfiles, empties the cache.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._config: TfConfig | None = None
        self._recommendations: Mapping[str, Recommendation] = _NO_RECOMMENDATIONS
        self._profiles: Mapping[str, WorkloadProfile] = _NO_PROFILES
        self._entries: dict[
            tuple[bytes, str, frozenset[tuple[str, str]] | None, NamespaceQuota | None], Verdict
        ] = {}
        self._indexed: dict[tuple[int, int], tuple[Admitted, Admitted]] = {}

    def decide(self, pod: Mapping[str, object], context: AdmissionContext) -> Verdict:
        if self.size <= 0:
            return admit(pod, context)
        if context.config is not self._config:
            self._clear()
            self._config = context.config
        if context.recommendations is not self._recommendations:
            if context.recommendations != self._recommendations:
                self._clear()
            self._recommendations = context.recommendations
        if context.profiles is not self._profiles:
            if context.profiles != self._profiles:
                self._clear()
            self._profiles = context.profiles
        labels = context.namespace_labels
        key = (
            orjson.dumps(pod),
            context.namespace,
            frozenset(labels.items()) if labels is not None else None,
            context.quota,
        )
        cached = self._entries.get(key)
        if cached is not None:
            return cached
        verdict = admit(pod, context)
        if isinstance(verdict, Denied) or verdict.takeover is None:
            if len(self._entries) >= self.size:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = verdict
        return verdict

    def _clear(self) -> None:
        self._entries.clear()
        self._indexed.clear()

    def with_pod_index(self, verdict: Admitted, pod_index: int) -> Admitted:
        """`assign_pod_index(verdict, pod_index)`, memoized with its encoded patch for cached verdicts
        (a rollout's replicas cycle through the same 128 indexes)."""
        if self.size <= 0 or verdict.awaiting_pod_index is None or verdict.takeover is not None:
            return assign_pod_index(verdict, pod_index)
        key = (id(verdict), pod_index)
        known = self._indexed.get(key)
        if known is not None and known[0] is verdict:
            return known[1]
        completed = assign_pod_index(verdict, pod_index)
        if len(self._indexed) >= self.size:
            del self._indexed[next(iter(self._indexed))]
        self._indexed[key] = (verdict, completed)  # holding `verdict` keeps its id from being reused
        return completed


@dataclass
class AdmissionService:
    """Everything `POST /mutate-v1-pod` needs; `bus` and `takeovers` are None where there is none, and
    `takeover_recheck` (freeing the slots of gone pods when a workload is full) is None outside a cluster.

    `pod_indices` gives each GPU pod taken over its device-plugin index (a dry run only previews
    one). `PodAdmitted` events wait in a bounded outbox of `outbox_limit` events; failed publishes are
    retried with backoff from `retry_backoff_s` up to `retry_backoff_max_s`, and `drain` flushes the
    outbox on shutdown.
    """

    config: ConfigProvider
    bus: EventBus | None = None
    takeovers: Takeovers | None = None
    takeover_recheck: TakeoverRecheck | None = None
    namespace_labels: NamespaceLabels = no_namespace_labels
    pod_indices: PodIndices = field(default_factory=CyclingPodIndices)
    recommendations: Recommendations = no_recommendations
    quotas: Quotas = no_quotas
    profiles: Profiles = no_profiles
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    verdict_cache_size: int = 512
    outbox_limit: int = 10_000
    retry_backoff_s: float = 0.05
    retry_backoff_max_s: float = 2.0
    _verdicts: VerdictCache = field(init=False)
    _outbox: PodAdmittedOutbox | None = field(init=False)

    def __post_init__(self) -> None:
        self._verdicts = VerdictCache(self.verdict_cache_size)
        self._outbox = (
            None
            if self.bus is None
            else PodAdmittedOutbox(
                self.bus,
                limit=self.outbox_limit,
                retry_backoff_s=self.retry_backoff_s,
                retry_backoff_max_s=self.retry_backoff_max_s,
            )
        )

    @property
    def pending_events(self) -> int:
        """`PodAdmitted` events answered for but not yet stored by JetStream."""
        return 0 if self._outbox is None else self._outbox.pending

    @property
    def dropped_events(self) -> int:
        """`PodAdmitted` events dropped because the outbox was full (JetStream unreachable too long)."""
        return 0 if self._outbox is None else self._outbox.dropped

    async def review(self, body: bytes) -> tuple[int, bytes]:
        """HTTP status and AdmissionReview body for one request body."""
        try:
            request = parse_review(body)
        except MalformedReviewError as error:
            return 400, encode_review({"error": str(error)})
        if not request.is_pod_creation or request.pod is None:
            return 200, encode_review(render_response(request.uid, Admitted()))
        try:
            verdict = await self._decide(request, request.pod)
        except Exception as error:  # a bug must never turn into a 500 that blocks every pod
            log.exception("admission failed", extra={"event": "webhook.admission_failed", "uid": request.uid})
            verdict = Denied(f"internal error while admitting the pod: {type(error).__name__}", code=500)
        return 200, encode_review(render_response(request.uid, verdict))

    async def _decide(self, request: ReviewRequest, pod: Mapping[str, object]) -> Verdict:
        config = self.config.current()
        labels = await self.namespace_labels(request.namespace) if _has_namespace_selector(config) else None
        context = AdmissionContext(
            config=config,
            namespace=request.namespace,
            namespace_labels=labels,
            takeover_slot_id=request.uid,
            recommendations=self.recommendations(),
            quota=self.quotas().get(request.namespace),
            profiles=self.profiles(),
        )
        verdict = self._verdicts.decide(pod, context)
        if not isinstance(verdict, Admitted) or not verdict.patch:
            return verdict
        claim = verdict.takeover
        if claim is not None and claim.slot_id is not None and self.takeovers is not None:
            if request.dry_run:
                granted = await self.takeovers.has_room(claim.workload_key, claim.limit, claim.slot_id)
            else:
                granted = await self.takeovers.claim(claim.slot_id, claim.workload_key, claim.limit)
            if not granted and self.takeover_recheck is not None:
                workload = verdict.workload.workload if verdict.workload is not None else None
                granted = await self.takeover_recheck.retry(
                    request.namespace, workload, claim, dry_run=request.dry_run
                )
            if not granted:
                return Admitted(
                    reason=f"enabled-replicas: {claim.limit} pods of the workload already taken over"
                )
        if verdict.awaiting_pod_index is not None:
            index = await (self.pod_indices.preview() if request.dry_run else self.pod_indices.take())
            verdict = self._verdicts.with_pod_index(verdict, index)
        if not request.dry_run and verdict.is_gpu_pod and self._outbox is not None:
            self._outbox.put((request.uid, self.clock(), verdict))
        return verdict

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Publish every queued `PodAdmitted` (on shutdown), retrying for up to `timeout_s`.

        Events still unpublished at the deadline stay queued and are logged; a later `drain` retries them.
        """
        if self._outbox is not None:
            await self._outbox.drain(timeout_s)


QueuedEvent = tuple[str, datetime, Admitted]
"""A `PodAdmitted` to publish: the request UID (its event id derives from it), when, and the verdict."""


class PodAdmittedOutbox:
    """`PodAdmitted` events answered for but not yet stored by JetStream, and the task that publishes them.

    One publisher task (started by the first `put`, stopped by `drain`) sends the queue in batches of
    up to `PUBLISH_CONCURRENCY` events: every event of a batch is handed to the bus before any
    acknowledgement is awaited, so the connection writes them together and their acknowledgements
    come back together. While admissions arrive at under `BATCH_ABOVE_PER_S` a second, a batch leaves
    as soon as the publisher is free (an idle one wakes at once); above that rate at most one batch
    leaves every `BATCH_INTERVAL_S`, so a steady stream costs one write and one read of
    acknowledgements per interval rather than per event (on both sides: the NATS server's work per
    message falls too), for up to that interval's delay of the event.

    Failed events go back to the front of the queue in their order and publishing pauses, with a
    backoff from `retry_backoff_s` doubling up to `retry_backoff_max_s` while failures go on. At
    `limit` queued events the oldest is dropped and counted in `dropped`.
    """

    def __init__(
        self, bus: EventBus, *, limit: int, retry_backoff_s: float, retry_backoff_max_s: float
    ) -> None:
        self.bus = bus
        self.limit = limit
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.dropped = 0
        self._queue: deque[QueuedEvent] = deque()
        self._publisher: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._backoff_s = retry_backoff_s
        self._paused_until = 0.0
        self._last_batch_at = float("-inf")
        self._window_ends = float("-inf")
        self._in_window = 0
        self._in_last_window = 0
        self._quiet_waiters: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pending(self) -> int:
        """Events not yet stored (queued, or waiting for a retry; not those in flight)."""
        return len(self._queue)

    def put(self, event: QueuedEvent) -> None:
        """Queue `event` (dropping the oldest when full) and make sure the publisher will take it."""
        if len(self._queue) >= self.limit:
            self._queue.popleft()
            self.dropped += 1
            log.error(
                "PodAdmitted outbox full (%d): the oldest event is dropped",
                self.limit,
                extra={"event": "webhook.publish_dropped"},
            )
        self._queue.append(event)
        self._count_arrival(self._running_loop().time())
        self._wake()

    async def drain(self, timeout_s: float) -> None:
        """Publish everything queued within `timeout_s` (logging what is left), then stop the publisher."""
        loop = self._running_loop()
        if self._queue:
            self._wake()
        if self._publisher is None:
            return
        timed_out = False
        if not self._quiet():
            quiet = loop.create_future()
            self._quiet_waiters.append(quiet)
            try:
                await asyncio.wait_for(quiet, timeout=timeout_s)
            except TimeoutError:
                timed_out = True
        publisher, self._publisher = self._publisher, None
        publisher.cancel()
        await asyncio.gather(publisher, return_exceptions=True)
        if timed_out:
            log.error(
                "%d PodAdmitted events not published before the drain deadline",
                len(self._queue),
                extra={"event": "webhook.publish_lost"},
            )

    def _quiet(self) -> bool:
        return not self._queue and self._wakeup is not None

    def _wake(self) -> None:
        """Wake the idle publisher, or start one."""
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)
        if self._publisher is None or self._publisher.done():
            self._publisher = self._running_loop().create_task(self._publish_forever())

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop; the publisher of an earlier loop (a test's, now closed) is forgotten."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._publisher, self._wakeup = None, None
            self._quiet_waiters = []
        return loop

    def _count_arrival(self, now: float) -> None:
        if now >= self._window_ends:
            recent = now < self._window_ends + RATE_WINDOW_S
            self._in_last_window = self._in_window if recent else 0
            self._in_window = 0
            self._window_ends = now + RATE_WINDOW_S
        self._in_window += 1

    def _busy(self) -> bool:
        """Whether admissions arrive at `BATCH_ABOVE_PER_S` or more (this or the last rate window)."""
        return max(self._in_window, self._in_last_window) >= BATCH_ABOVE_PER_S * RATE_WINDOW_S

    async def _publish_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wakeup = loop.create_future()
                if self._quiet_waiters:
                    for waiter in self._quiet_waiters:
                        if not waiter.done():
                            waiter.set_result(None)
                    self._quiet_waiters.clear()
                try:
                    await self._wakeup
                finally:
                    self._wakeup = None
                continue
            now = loop.time()
            due = self._last_batch_at + BATCH_INTERVAL_S if self._busy() else now
            wait = max(self._paused_until, due) - now
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self._last_batch_at = now
            taken = [self._queue.popleft() for _ in range(min(len(self._queue), PUBLISH_CONCURRENCY))]
            await self._publish_batch(taken, loop)

    async def _publish_batch(self, taken: list[QueuedEvent], loop: asyncio.AbstractEventLoop) -> None:
        """Publish `taken` together; the failed ones go back to the queue."""
        batch: list[tuple[QueuedEvent, PodAdmitted | EncodedEvent]] = []
        build = encoded_pod_admitted if isinstance(self.bus, PublishesMany) else _pod_admitted
        for event in taken:
            try:
                batch.append((event, build(*event)))
            except Exception as error:  # a poison event: retrying cannot help, so it is dropped and logged
                self.dropped += 1
                log.error(
                    "PodAdmitted for request %s cannot be built, dropped: %s",
                    event[0],
                    error,
                    extra={"event": "webhook.publish_dropped"},
                )
        try:
            outcomes = await self._publish_all([admitted for _event, admitted in batch], loop)
        except asyncio.CancelledError:
            # All go back (one may be stored already: JetStream dedups the retry).
            self._queue.extendleft(reversed([event for event, _admitted in batch]))
            raise
        failed = [
            (event, outcome)
            for (event, _admitted), outcome in zip(batch, outcomes, strict=True)
            if isinstance(outcome, BaseException)
        ]
        if failed:
            self._retry([event for event, _outcome in failed], failed[0][1], loop.time())
        elif batch:
            self._backoff_s = self.retry_backoff_s

    async def _publish_all(
        self, events: list[PodAdmitted | EncodedEvent], loop: asyncio.AbstractEventLoop
    ) -> Sequence[BaseException | None]:
        """Each event's outcome: through the bus's `publish_many` where it has one (the events
        encoded here), else a `publish` each, all at once."""
        if isinstance(self.bus, PublishesMany):
            return await self.bus.publish_many(events)
        publishes = [loop.create_task(publish_one(self.bus, event)) for event in events]
        try:
            return await asyncio.gather(*publishes, return_exceptions=True)
        except asyncio.CancelledError:
            for publish in publishes:
                publish.cancel()
            raise

    def _retry(self, events: list[QueuedEvent], error: BaseException, now: float) -> None:
        """Put failed events back at the front, in order (those that fit), and pause publishing."""
        room = max(0, self.limit - len(self._queue))
        self.dropped += max(0, len(events) - room)
        self._queue.extendleft(reversed(events[:room]))
        log.warning(
            "%d PodAdmitted not published, retrying in %.2fs: %s",
            len(events),
            self._backoff_s,
            error,
            extra={"event": "webhook.publish_failed"},
        )
        self._paused_until = now + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self.retry_backoff_max_s)


def _has_namespace_selector(config: TfConfig) -> bool:
    scope = config.dynamic_config.auto_migration.scope
    if not config.dynamic_config.auto_migration.enable or scope is None:
        return False
    rules = (scope.includes, scope.excludes)
    return any(rule is not None and rule.namespace_selector is not None for rule in rules)


def event_id(uid: str) -> uuid.UUID:
    """The `PodAdmitted` event id of admission request `uid`: `uuid.uuid5(EVENT_NAMESPACE, uid)`,
    computed without `uuid.UUID`'s slower bytes-and-version constructor."""
    digest = hashlib.sha1(_EVENT_NAMESPACE_BYTES + uid.encode(), usedforsecurity=False).digest()
    return uuid.UUID(int=(int.from_bytes(digest[:16]) & _UUID_VERSION_MASK) | _UUID_VERSION_5)


_EVENT_NAMESPACE_BYTES = EVENT_NAMESPACE.bytes
_UUID_VERSION_MASK = ~((0xF000 << 64) | (0xC000 << 48))
_UUID_VERSION_5 = (5 << 76) | (0x8000 << 48)


def _pod_admitted(uid: str, occurred_at: datetime, verdict: Admitted) -> PodAdmitted:
    assert verdict.workload is not None
    assert verdict.request is not None
    # Validated, and still cheaper than `model_construct`: `workload` and `request` are models already.
    return PodAdmitted(
        event_id=event_id(uid),
        occurred_at=occurred_at,
        workload=verdict.workload,
        request=verdict.request,
        migrated_resource=verdict.migrated_resource,
        patch_operations=len(verdict.patch),
    )


_POD_ADMITTED_TYPE = PodAdmitted.event_type()


def encoded_pod_admitted(uid: str, occurred_at: datetime, verdict: Admitted) -> EncodedEvent:
    """The `PodAdmitted` of `_pod_admitted(uid, occurred_at, verdict)` encoded without building it:
    the same bytes as `encode` gives for that model (its fields in order, the request without an
    unset `compute_percent_limit`), from the verdict's workload and request, validated already."""
    workload, request = verdict.workload, verdict.request
    if workload is None or request is None:
        raise ValueError("a PodAdmitted needs the verdict's workload and request")
    requested = request.__dict__
    if requested["compute_percent_limit"] is None:
        requested = {name: value for name, value in requested.items() if name != "compute_percent_limit"}
    identifier = str(event_id(uid))
    payload = orjson.dumps(
        {
            "event_id": identifier,
            "occurred_at": occurred_at,
            "cause": None,
            "workload": workload.__dict__,
            "request": requested,
            "migrated_resource": verdict.migrated_resource,
            "patch_operations": len(verdict.patch),
        },
        option=orjson.OPT_UTC_Z,
    )
    return EncodedEvent(PodAdmitted.subject, payload, identifier, _POD_ADMITTED_TYPE, occurred_at)


ADMISSION_METRICS_SERVICE = "webhook"
"""The `service` label of the admission route's `tf_http_request_duration_seconds` samples."""


class AdmissionEndpoint:
    """`POST /mutate-v1-pod` as a bare ASGI app: the hot path skips request-object and validation layers.

    It records its own latency in `tf_http_request_duration_seconds` (route `/mutate-v1-pod`), which the
    middleware it skips would otherwise record: the alert on latency near the API server's timeout
    reads it."""

    def __init__(self, service: AdmissionService) -> None:
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        status, body = await self.service.review(await request_body(receive))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        record_request_duration(
            ADMISSION_METRICS_SERVICE, "POST", MUTATE_PATH, status, time.perf_counter() - started
        )


def front_routes(service: AdmissionService) -> dict[tuple[str, str], ASGIApp]:
    """`POST /mutate-v1-pod` as a raw route the runtime serves ahead of FastAPI's middleware stack."""
    return {("POST", MUTATE_PATH): AdmissionEndpoint(service)}


def build_router(service: AdmissionService) -> APIRouter:
    """The router mounted on the FastAPI app: `POST /mutate-v1-pod`, answered by `AdmissionEndpoint`
    (reached only where the app is served without `front_routes`)."""
    router = APIRouter()
    router.routes.append(
        Route(MUTATE_PATH, AdmissionEndpoint(service), methods=["POST"], name="mutate-v1-pod")
    )
    return router


def _signature(*paths: Path) -> tuple[tuple[int, int, int], ...] | None:
    try:
        return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in (os.stat(path) for path in paths))
    except OSError:
        return None


CERTIFICATE_CHECK_S = 1.0
"""How often the serving certificate's files are checked for a rotation."""


class CertificateReloader:
    """Loads a rotated certificate and key into the live server `ssl.SSLContext` (new connections).

    `check()` compares the files' signatures (mtime, size, inode: a Secret update swaps a symlink);
    a pair that does not load (half-written, mismatched) is retried at the next check while the old
    certificate keeps serving.
    """

    def __init__(self, context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file
        self.last_error: str | None = None
        self._signature = _signature(cert_file, key_file)

    def check(self) -> bool:
        """Reload when the files changed; True when a new certificate was loaded."""
        signature = _signature(self.cert_file, self.key_file)
        if signature is None or signature == self._signature:
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            self.last_error = str(error)
            log.warning("certificate not reloaded yet: %s", error, extra={"event": "webhook.tls_reload"})
            return False
        self._signature = signature
        self.last_error = None
        log.info("certificate reloaded", extra={"event": "webhook.tls_reload", "outcome": "ok"})
        return True

    async def round(self) -> None:
        """One `check`, as the round of a runtime timer (every `CERTIFICATE_CHECK_S`)."""
        self.check()
