"""The webhook's I/O shell: `POST /mutate-v1-pod`, the takeover ledger, events and certificate reload.

The route reads the raw AdmissionReview, asks the pure core (`tfwebhook.core`) for a verdict, settles
`enabled-replicas` with the ledger (a dry run only looks, never claims), answers, and queues
`PodAdmitted` for each GPU pod it mutates (never for a dry run). Events leave through one background
publisher in batches, off the request path; the event id derives from the request UID, so a retried
admission is deduplicated by JetStream. A malformed review gets HTTP 400; an unexpected failure gets an
allowed=false review naming the cause, never an HTTP 500.
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
from starlette.types import Receive, Scope, Send
from tfcommon.bus import EventBus
from tfcommon.config import ConfigSource, TfConfig
from tfcommon.events import PodAdmitted

from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, Verdict, admit
from tfwebhook.core.review import (
    MalformedReviewError,
    ReviewRequest,
    encode_review,
    parse_review,
    render_response,
)

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


class VerdictCache:
    """Memoizes `admit` for identical pods (the replicas of one rollout), bounded, oldest out first.

    `admit` is pure, so an identical pod in the same namespace under the same configuration gets the
    same verdict. Verdicts that claim an `enabled-replicas` slot are never cached: they carry the
    request's own slot id. A configuration reload empties the cache.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._config: TfConfig | None = None
        self._entries: dict[tuple[bytes, str, frozenset[tuple[str, str]] | None], Verdict] = {}

    def decide(self, pod: Mapping[str, object], context: AdmissionContext) -> Verdict:
        if self.size <= 0:
            return admit(pod, context)
        if context.config is not self._config:
            self._entries.clear()
            self._config = context.config
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


@dataclass
class AdmissionService:
    """Everything `POST /mutate-v1-pod` needs; `bus` and `takeovers` are None where there is none."""

    config: ConfigSource
    bus: EventBus | None = None
    takeovers: Takeovers | None = None
    namespace_labels: NamespaceLabels = no_namespace_labels
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    verdict_cache_size: int = 512
    _verdicts: VerdictCache = field(init=False)
    _outbox: deque[tuple[str, datetime, Admitted]] = field(default_factory=deque)
    _publisher: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._verdicts = VerdictCache(self.verdict_cache_size)

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
        context = AdmissionContext(
            config=self.config.current(),
            namespace=request.namespace,
            namespace_labels=await self.namespace_labels(request.namespace),
            takeover_slot_id=request.uid,
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
        if not request.dry_run and verdict.is_gpu_pod:
            self._publish(request.uid, verdict)
        return verdict

    def _publish(self, uid: str, verdict: Admitted) -> None:
        """Queue `PodAdmitted`; one publisher task sends the queue in batches off the request path."""
        if self.bus is None:
            return
        self._outbox.append((uid, self.clock(), verdict))
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(self._publish_queued(self.bus))

    async def _publish_queued(self, bus: EventBus) -> None:
        while self._outbox:
            batch = [self._outbox.popleft() for _ in range(min(PUBLISH_BATCH, len(self._outbox)))]
            results = await asyncio.gather(
                *(bus.publish(_pod_admitted(*queued)) for queued in batch), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    log.error(
                        "PodAdmitted not published: %s", result, extra={"event": "webhook.publish_failed"}
                    )

    async def drain(self) -> None:
        """Wait until every queued `PodAdmitted` has been published (on shutdown)."""
        if self._publisher is not None:
            await asyncio.gather(self._publisher, return_exceptions=True)


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


def build_router(service: AdmissionService) -> APIRouter:
    """The router the runtime mounts: `POST /mutate-v1-pod`, answered by `AdmissionEndpoint`."""
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
