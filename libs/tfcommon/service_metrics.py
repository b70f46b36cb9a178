"""Operational metrics every service records through the OpenTelemetry meter: HTTP latency, consumer
outcomes, redeliveries and lag, and ledger retries.

Each service serves them on its own `/metrics` (the runtime adds the route; Prometheus text from the
SDK's Prometheus reader, installed by `tfcommon.telemetry.setup_telemetry`). Nothing is pushed: a
metrics backend that is down cannot slow or stop a service. Instruments are created on first use from
the global meter, so importing this module opens nothing and records nothing.

- `tf_http_request_duration_seconds` (histogram): `service`, `method`, `route` (the path template),
  `status`;
- `tf_consumer_messages_total`: `service`, `consumer`, `outcome` (acked, terminated, retry, ...);
- `tf_consumer_redeliveries_total`: `service`, `consumer`;
- `tf_consumer_pending_messages` (gauge, the consumer's lag): messages still waiting after the last
  one fetched, per `service` and `consumer`;
- `tf_consumer_dead_letters_total`: `service`, `consumer` (a node agent's per-node durables without
  their node, so the labels stay bounded), `reason` (`poison`, `exhausted`): messages given up and
  copied to `TF_DEADLETTER`;
- `tf_ledger_retries_total`: `operation` (a transaction Postgres aborted and the ledger tried again).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from functools import cache
from typing import Any

from fastapi import APIRouter, Response
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Observation
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED_ROUTE = "unmatched"
_pending: dict[tuple[str, str], int] = {}


@cache
def _meter() -> metrics.Meter:
    return metrics.get_meter("tfcommon.service_metrics")


REQUEST_DURATION_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.0,
    3.0,
    4.0,
    5.0,
    10.0,
    30.0,
)
"""Upper bounds (seconds) of `tf_http_request_duration_seconds`'s buckets: OpenTelemetry's default
ones are meant for milliseconds (0, 5, 10, ...), which would put every request in the first bucket.
A bound every second up to the webhook's 5 s timeout lets a quantile tell 3 s from 4 s."""


@cache
def _request_duration() -> Histogram:
    return _meter().create_histogram(
        "tf_http_request_duration_seconds",
        unit="s",
        description="HTTP request latency per route",
        explicit_bucket_boundaries_advisory=REQUEST_DURATION_BUCKETS_S,
    )


@cache
def _consumer_messages() -> Counter:
    return _meter().create_counter("tf_consumer_messages", description="consumed messages per outcome")


@cache
def _redeliveries() -> Counter:
    return _meter().create_counter("tf_consumer_redeliveries", description="messages delivered again")


@cache
def _dead_letters() -> Counter:
    return _meter().create_counter(
        "tf_consumer_dead_letters", description="messages given up and copied to TF_DEADLETTER"
    )


@cache
def _ledger_retries() -> Counter:
    return _meter().create_counter("tf_ledger_retries", description="ledger transactions retried")


def _observe_pending(options: CallbackOptions) -> Iterable[Observation]:
    return [
        Observation(pending, {"service": service, "consumer": consumer})
        for (service, consumer), pending in list(_pending.items())
    ]


@cache
def _pending_gauge() -> None:
    _meter().create_observable_gauge(
        "tf_consumer_pending_messages",
        callbacks=[_observe_pending],
        description="messages waiting for the consumer after the last one it fetched (consumer lag)",
    )


def record_consumed(service: str, consumer: str, outcome: str, delivery: int, pending: int) -> None:
    """One consumed message: its outcome, whether it was a redelivery, and the consumer's lag."""
    labels = {"service": service, "consumer": consumer}
    _consumer_messages().add(1, {**labels, "outcome": outcome})
    if delivery > 1:
        _redeliveries().add(1, labels)
    _pending_gauge()
    _pending[(service, consumer)] = pending


def record_dead_letter(service: str, consumer: str, reason: str) -> None:
    """One message a consumer gave up and copied to the dead-letter stream (`consumer`: bounded)."""
    _dead_letters().add(1, {"service": service, "consumer": consumer, "reason": reason})


def record_ledger_retry(operation: str) -> None:
    """A ledger transaction aborted by the database (deadlock, serialization) and tried again."""
    _ledger_retries().add(1, {"operation": operation})


class RequestTimer:
    """ASGI middleware recording `tf_http_request_duration_seconds` for every HTTP request."""

    def __init__(self, app: ASGIApp, service: str) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_with_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            route: Any = scope.get("route")
            record_request_duration(
                self.service,
                scope["method"],
                getattr(route, "path", UNMATCHED_ROUTE),
                status["code"],
                time.perf_counter() - started,
            )


def record_request_duration(service: str, method: str, route: str, status: int, seconds: float) -> None:
    """One request's latency in `tf_http_request_duration_seconds` (for a route served ahead of the
    middleware, which records the others)."""
    _request_duration().record(
        seconds, {"service": service, "method": method, "route": route, "status": str(status)}
    )


def metrics_router() -> APIRouter:
    """`GET /metrics`: everything this process records, in Prometheus text format."""
    router = APIRouter(tags=["metrics"])

    @router.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return router
