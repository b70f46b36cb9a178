"""The webhook's I/O shell: `POST /mutate-v1-pod`, the takeover ledger, events and certificate reload.

The route reads the raw AdmissionReview, asks the pure core (`tfwebhook.core`) for a verdict, settles
`enabled-replicas` with the ledger (a dry run only looks, never claims), gives a pod taken over its
device-plugin index (a dry run only previews the next one), answers, and queues `PodAdmitted` for each
GPU pod it mutates (never for a dry run). Events leave through one background publisher in batches,
off the request path, and are retried until JetStream stores them; the event id derives from the
request UID, so a republished or re-admitted event is deduplicated by JetStream. The outbox lives in
memory: it is flushed on shutdown, but a crash loses what it holds. A malformed review gets HTTP 400;
an unexpected failure gets an allowed=false review naming the cause, never an HTTP 500.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

import orjson
from fastapi import APIRouter
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from tfcommon.bus import EventBus
from tfcommon.config import ConfigSource, TfConfig
from tfcommon.events import PodAdmitted
from tfcommon.recommendations import Recommendation

from tfwebhook.core.admission import (
    AdmissionContext,
    Admitted,
    Denied,
    Verdict,
    admit,
    assign_pod_index,
)
from tfwebhook.core.review import (
    MalformedReviewError,
    ReviewRequest,
    encode_review,
    parse_review,
    render_response,
)
from tfwebhook.pod_index import CyclingPodIndices, PodIndices

MUTATE_PATH = "/mutate-v1-pod"
PUBLISH_BATCH = 64
EVENT_NAMESPACE = uuid.UUID("5d7e5e2c-4f5b-4a59-9a59-7466706f6f6c")
log = logging.getLogger("tfwebhook.http")


class Takeovers(Protocol):
    """The `enabled-replicas` ledger as the shell uses it (`tfcommon.ledger.takeover.TakeoverGate`)."""

    async def claim(self, slot_id: str, workload_key: str, limit: int) -> bool: ...

    async def has_room(self, workload_key: str, limit: int, slot_id: str | None = None) -> bool: ...


NamespaceLabels = Callable[[str], Awaitable[Mapping[str, str] | None]]
"""Labels of a namespace for `namespaceSelector` scopes (e.g. from a namespace informer's cache);
None when unknown, and a namespace selector then does not match."""


async def no_namespace_labels(namespace: str) -> Mapping[str, str] | None:
    return None


Recommendations = Callable[[], Mapping[str, Recommendation]]
"""The stored autoscaling recommendations by `namespace/workload`, from memory (never the database on
the admission path: `tfcommon.ledger.recommendations.RecommendationCache.current`)."""


def no_recommendations() -> Mapping[str, Recommendation]:
    return _NO_RECOMMENDATIONS


_NO_RECOMMENDATIONS: Mapping[str, Recommendation] = {}


class VerdictCache:
    """Memoizes `admit` for identical pods (the replicas of one rollout), bounded, oldest out first.

    `admit` is pure, so an identical pod in the same namespace under the same configuration gets the
    same verdict. Verdicts that claim an `enabled-replicas` slot are never cached: they carry the
    request's own slot id. A configuration reload empties the cache.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._config: TfConfig | None = None
        self._recommendations: Mapping[str, Recommendation] = _NO_RECOMMENDATIONS
        self._entries: dict[tuple[bytes, str, frozenset[tuple[str, str]] | None], Verdict] = {}
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
        labels = context.namespace_labels
        key = (
            orjson.dumps(pod),
            context.namespace,
            frozenset(labels.items()) if labels is not None else None,
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
    """Everything `POST /mutate-v1-pod` needs; `bus` and `takeovers` are None where there is none.

    `pod_indices` gives each GPU pod taken over its device-plugin index (a dry run only previews
    one). `PodAdmitted` events wait in a bounded outbox of `outbox_limit` events; failed publishes are
    retried with backoff from `retry_backoff_s` up to `retry_backoff_max_s`, and `drain` flushes the
    outbox on shutdown.
    """

    config: ConfigSource
    bus: EventBus | None = None
    takeovers: Takeovers | None = None
    namespace_labels: NamespaceLabels = no_namespace_labels
    pod_indices: PodIndices = field(default_factory=CyclingPodIndices)
    recommendations: Recommendations = no_recommendations
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    verdict_cache_size: int = 512
    outbox_limit: int = 10_000
    retry_backoff_s: float = 0.05
    retry_backoff_max_s: float = 2.0
    dropped_events: int = 0
    _verdicts: VerdictCache = field(init=False)
    _outbox: deque[tuple[str, datetime, Admitted]] = field(default_factory=deque)
    _publisher: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._verdicts = VerdictCache(self.verdict_cache_size)

    @property
    def pending_events(self) -> int:
        """`PodAdmitted` events answered for but not yet stored by JetStream."""
        return len(self._outbox)

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
            if not granted:
                return Admitted(
                    reason=f"enabled-replicas: {claim.limit} pods of the workload already taken over"
                )
        if verdict.awaiting_pod_index is not None:
            index = await (self.pod_indices.preview() if request.dry_run else self.pod_indices.take())
            verdict = self._verdicts.with_pod_index(verdict, index)
        if not request.dry_run and verdict.is_gpu_pod:
            self._publish(request.uid, verdict)
        return verdict

    def _publish(self, uid: str, verdict: Admitted) -> None:
        """Queue `PodAdmitted`; one publisher task sends the queue in batches off the request path."""
        if self.bus is None:
            return
        if len(self._outbox) >= self.outbox_limit:
            self._outbox.popleft()
            self.dropped_events += 1
            log.error(
                "PodAdmitted outbox full (%d): the oldest event is dropped",
                self.outbox_limit,
                extra={"event": "webhook.publish_dropped"},
            )
        self._outbox.append((uid, self.clock(), verdict))
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(self._publish_queued(self.bus))

    async def _publish_queued(self, bus: EventBus) -> None:
        """Send the outbox until it is empty; a failed event goes back to the front and is retried.

        When the outbox overflows while events wait for a retry, the oldest are dropped and counted.
        """
        backoff = self.retry_backoff_s
        while self._outbox:
            batch = [self._outbox.popleft() for _ in range(min(PUBLISH_BATCH, len(self._outbox)))]
            try:
                if len(batch) == 1:  # no task for a lone event: the common case under light load
                    results: list[BaseException | None] = [
                        await _settled(bus.publish(_pod_admitted(*batch[0])))
                    ]
                else:
                    results = await asyncio.gather(
                        *(bus.publish(_pod_admitted(*queued)) for queued in batch), return_exceptions=True
                    )
            except asyncio.CancelledError:
                self._outbox.extendleft(reversed(batch))  # some may be stored: JetStream dedups them
                raise
            failed = [
                queued
                for queued, result in zip(batch, results, strict=True)
                if isinstance(result, BaseException)
            ]
            if not failed:
                backoff = self.retry_backoff_s
                continue
            log.warning(
                "PodAdmitted not published, retrying %d: %s",
                len(failed),
                next(result for result in results if isinstance(result, BaseException)),
                extra={"event": "webhook.publish_failed"},
            )
            room = max(0, self.outbox_limit - len(self._outbox))
            kept = failed[max(0, len(failed) - room) :]
            self.dropped_events += len(failed) - len(kept)
            self._outbox.extendleft(reversed(kept))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.retry_backoff_max_s)

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Publish every queued `PodAdmitted` (on shutdown), retrying for up to `timeout_s`.

        Events still unpublished at the deadline stay queued and are logged; a later `drain` retries them.
        """
        if self._outbox and self.bus is not None and (self._publisher is None or self._publisher.done()):
            self._publisher = asyncio.get_running_loop().create_task(self._publish_queued(self.bus))
        publisher = self._publisher
        if publisher is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(publisher), timeout=timeout_s)
        except TimeoutError:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
            log.error(
                "%d PodAdmitted events not published before the drain deadline",
                len(self._outbox),
                extra={"event": "webhook.publish_lost"},
            )


async def _settled(publishing: Awaitable[None]) -> BaseException | None:
    """What `asyncio.gather(..., return_exceptions=True)` gives for one publish, without a task."""
    try:
        await publishing
    except Exception as error:
        return error
    return None


def _has_namespace_selector(config: TfConfig) -> bool:
    scope = config.dynamic_config.auto_migration.scope
    if not config.dynamic_config.auto_migration.enable or scope is None:
        return False
    rules = (scope.includes, scope.excludes)
    return any(rule is not None and rule.namespace_selector is not None for rule in rules)


def _pod_admitted(uid: str, occurred_at: datetime, verdict: Admitted) -> PodAdmitted:
    assert verdict.workload is not None
    assert verdict.request is not None
    # Every field is already a validated value (the core built `workload` and `request` as models).
    return PodAdmitted.model_construct(
        event_id=uuid.uuid5(EVENT_NAMESPACE, uid),
        occurred_at=occurred_at,
        workload=verdict.workload,
        request=verdict.request,
        migrated_resource=verdict.migrated_resource,
        patch_operations=len(verdict.patch),
    )


class AdmissionEndpoint:
    """`POST /mutate-v1-pod` as a bare ASGI app: the hot path skips request-object and validation layers."""

    def __init__(self, service: AdmissionService) -> None:
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        status, body = await self.service.review(b"".join(chunks))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


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

    async def watch(self, stopping: asyncio.Event, interval_s: float = 1.0) -> None:
        """Check every `interval_s` until `stopping` is set."""
        while not stopping.is_set():
            self.check()
            try:
                await asyncio.wait_for(stopping.wait(), timeout=interval_s)
            except TimeoutError:
                continue
