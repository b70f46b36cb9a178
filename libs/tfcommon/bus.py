"""Event bus: publishes messages to JetStream (`NatsEventBus`) or to memory (`InMemoryEventBus`).

Both implement the `EventBus` port and pass the same contract tests. Publishing returns only once the
message is stored (JetStream PubAck); the event id is the `Nats-Msg-Id`, so a republish within the
stream's duplicate window stores nothing new. Messages carry CloudEvents attributes and W3C trace
context as headers. `publish_many` publishes a batch pipelined (every message sent, then the
acknowledgements awaited together) and returns each one's outcome; it also takes an `EncodedEvent`, an
event a hot path encoded itself. This module does not consume; see `tfcommon.consumer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import ParseResult

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NoStreamResponseError

from tfcommon.events import Message, decode, encode
from tfcommon.nats_tls import require_tls, verification_failure
from tfcommon.telemetry import inject_trace_context

CLOUDEVENTS_SPEC_VERSION = "1.0"
MSG_ID_HEADER = "Nats-Msg-Id"
PUBLISH_TIMEOUT_S = 5.0
STREAM_PREFIXES = ("tf.evt.", "tf.cmd.")
DEFAULT_INBOX_PREFIX = "_INBOX"
_nats_log = logging.getLogger("nats.aio.client")
"""Where nats-py logs the errors of a connection (its default error callback's logger)."""
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
    nats.errors.ConnectionClosedError,
)
"""Errors of a connection lost or refused, which the client retries on its own: a NATS restart or a
cluster's leader change raises one per reconnection attempt."""


def log_nats_error(error: Exception) -> None:
    """One line for a connection error the client is retrying, a traceback for anything else."""
    if isinstance(error, CONNECTION_ERRORS):
        detail = str(error) or "no detail"
        _nats_log.warning(
            "nats: connection lost or refused, reconnecting (%s: %s)", type(error).__name__, detail
        )
    else:
        _nats_log.error("nats: %s", error, exc_info=error)


def server_address(url: ParseResult | None) -> str:
    """`host:port` of a server URL, without the user and password a URL may carry (for logs)."""
    if url is None or url.hostname is None:
        return "no server"
    return f"{url.hostname}:{url.port}" if url.port is not None else url.hostname


def server_urls(url: str) -> list[str]:
    """The servers of `url` (`TF_NATS_URL`): one URL, or a cluster's several separated by commas, which
    the client tries in turn and reconnects among."""
    return [part.strip() for part in url.split(",") if part.strip()]


def inbox_prefix_for(user: str | None) -> str:
    """The reply-subject prefix of a client: `_INBOX_<user>` for a NATS user, else NATS's `_INBOX`.

    `deploy/nats/nats.conf` lets each user subscribe only to its own `_INBOX_<user>.>`, so no client
    can read the JetStream replies (fetched messages included) addressed to another user. Dots
    become `_`, so that a node agent's `node:<node name>` stays one subject token.
    """
    return f"{DEFAULT_INBOX_PREFIX}_{user.replace('.', '_')}" if user else DEFAULT_INBOX_PREFIX


class UnroutableSubjectError(RuntimeError):
    """No stream stores the subject: the message would be lost, so publishing refuses it."""

    def __init__(self, subject: str) -> None:
        super().__init__(
            f"no JetStream stream stores subject {subject!r}; subjects start with tf.evt. or tf.cmd. "
            "and the streams must be provisioned first (tfcommon.subjects.provision)"
        )


@dataclass(frozen=True, slots=True)
class EncodedEvent:
    """An event already encoded: `payload` is the bytes `encode` gives for its message, built without
    the model on a hot path (the webhook's `PodAdmitted`); `publish_many` sends it as that message."""

    subject: str
    payload: bytes
    event_id: str
    event_type: str
    occurred_at: datetime


class EventBus(Protocol):
    """Where services publish messages. Both methods return once the message is durably stored.

    Publishing a message whose event id was already published (within the duplicate window) is a
    no-op, not an error: this is what makes republishing after a crash safe.
    """

    async def publish(self, event: Message) -> None:
        """Publish `event` on its routing subject, with its event id as the message id."""
        ...

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        *,
        event_id: str,
        event_type: str,
        occurred_at: datetime,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Publish already-encoded bytes (the ledger outbox relay); `headers` are added to ours."""
        ...


async def publish_one(bus: EventBus, event: Message | EncodedEvent) -> None:
    """Publish a typed event, or one already encoded (`EncodedEvent`, through `publish_raw`)."""
    if isinstance(event, EncodedEvent):
        await bus.publish_raw(
            event.subject,
            event.payload,
            event_id=event.event_id,
            event_type=event.event_type,
            occurred_at=event.occurred_at,
        )
    else:
        await bus.publish(event)


def cloudevent_headers(
    *, event_id: str, event_type: str, source: str, occurred_at: datetime
) -> dict[str, str]:
    """The CloudEvents binary-mode headers plus `Nats-Msg-Id` for one message."""
    when = occurred_at if occurred_at.tzinfo is not None else occurred_at.replace(tzinfo=UTC)
    return {
        MSG_ID_HEADER: event_id,
        "ce-specversion": CLOUDEVENTS_SPEC_VERSION,
        "ce-id": event_id,
        "ce-type": event_type,
        "ce-source": source,
        "ce-time": when.isoformat(),
        "content-type": "application/json",
    }


def _headers_for(
    service: str,
    *,
    event_id: str,
    event_type: str,
    occurred_at: datetime,
    extra: Mapping[str, str] | None,
) -> dict[str, str]:
    headers = dict(extra or {})
    headers.update(
        cloudevent_headers(
            event_id=event_id, event_type=event_type, source=f"/tfpool/{service}", occurred_at=occurred_at
        )
    )
    inject_trace_context(headers)
    return headers


async def _discard(nc: Client) -> None:
    """Close a client whose first connection failed: `close()` when it got connected, else its socket
    (nats-py's `close()` waits for a flusher that never started)."""
    if nc.is_connected:
        with contextlib.suppress(Exception):
            await nc.close()
    elif nc._transport is not None:
        nc._transport.close()  # type: ignore[no-untyped-call]


class NatsEventBus:
    """`EventBus` on NATS JetStream. Build with `connect()`; `close()` drains the connection."""

    def __init__(self, nc: Client, js: JetStreamContext, service: str) -> None:
        self.nc = nc
        self.js = js
        self.service = service

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        service: str,
        user: str | None = None,
        password: str | Callable[[], str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> NatsEventBus:
        """Connect to `url` (one server, or several separated by commas: `server_urls`) as `service`
        (the connection name, the CloudEvents source).

        With a `user`, replies arrive on the user's own inbox prefix (`inbox_prefix_for`). With `tls`
        (`nats_tls.client_context`) the connection is TLS only: a server without TLS, a certificate
        the context does not trust or one for another name raises `NatsTlsError` at once, while other
        errors of the first connection are retried until the caller's deadline.
        """
        connected = False

        async def on_error(error: Exception) -> None:
            if not connected and (refused := verification_failure(url, error)) is not None:
                raise refused  # out of nats.connect: a retry would be refused the same way
            log_nats_error(error)

        server = "no server"

        async def on_disconnected() -> None:
            if connected and not nc.is_closed:  # close() calls it too, after marking the client closed
                _nats_log.warning("nats: disconnected from %s, reconnecting", server)

        async def on_reconnected() -> None:
            nonlocal server
            server = server_address(nc.connected_url)
            _nats_log.warning("nats: reconnected to %s", server)

        nc = Client()
        try:
            await nc.connect(
                server_urls(url),
                name=f"tfpool-{service}",
                user=user,
                password=password,
                inbox_prefix=inbox_prefix_for(user),
                max_reconnect_attempts=-1,
                connect_timeout=5,
                tls=tls,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
            )
            if tls is not None:
                require_tls(url, nc._server_info)
        except BaseException:
            await _discard(nc)
            raise
        connected = True
        server = server_address(nc.connected_url)
        return cls(nc, nc.jetstream(timeout=PUBLISH_TIMEOUT_S), service)

    async def publish(self, event: Message) -> None:
        await self.publish_raw(
            event.routing_subject(),
            encode(event),
            event_id=str(event.event_id),
            event_type=event.event_type(),
            occurred_at=event.occurred_at,
        )

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        *,
        event_id: str,
        event_type: str,
        occurred_at: datetime,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        all_headers = _headers_for(
            self.service, event_id=event_id, event_type=event_type, occurred_at=occurred_at, extra=headers
        )
        try:
            await self.js.publish(subject, payload, headers=all_headers, timeout=PUBLISH_TIMEOUT_S)
        except NoStreamResponseError as error:
            raise UnroutableSubjectError(subject) from error

    async def publish_many(self, events: Sequence[Message | EncodedEvent]) -> list[BaseException | None]:
        """Publish `events` pipelined: each is handed to the connection (in order) before any
        acknowledgement is awaited, and the acknowledgements are awaited together under one
        `PUBLISH_TIMEOUT_S`, without a task or a timer per message. Returns each event's outcome, in
        order: None once stored, else the error (`UnroutableSubjectError`; a `TimeoutError` when no
        acknowledgement came in time, though the message may be stored: publishing it again is a no-op
        within the duplicate window)."""
        pending: list[asyncio.Future[Any] | BaseException] = []
        try:
            for event in events:
                try:
                    encoded = _encoded(event)
                    headers = _headers_for(
                        self.service,
                        event_id=encoded.event_id,
                        event_type=encoded.event_type,
                        occurred_at=encoded.occurred_at,
                        extra=None,
                    )
                    pending.append(
                        await self.js.publish_async(encoded.subject, encoded.payload, headers=headers)
                    )
                except Exception as error:  # the connection refused it: the others still go
                    pending.append(error)
            futures = [ack for ack in pending if isinstance(ack, asyncio.Future)]
            if futures:
                await asyncio.wait(futures, timeout=PUBLISH_TIMEOUT_S)
        finally:
            for ack in pending:
                if isinstance(ack, asyncio.Future) and not ack.done():
                    ack.cancel()  # releases its slot in the client's pending acknowledgements
        return [_outcome(ack, event) for ack, event in zip(pending, events, strict=True)]

    async def close(self) -> None:
        """Drain subscriptions and pending publishes, then close. Safe to call twice."""
        if not self.nc.is_closed:
            await self.nc.drain()


def _encoded(event: Message | EncodedEvent) -> EncodedEvent:
    if isinstance(event, EncodedEvent):
        return event
    return EncodedEvent(
        event.routing_subject(), encode(event), str(event.event_id), event.event_type(), event.occurred_at
    )


def _outcome(ack: asyncio.Future[Any] | BaseException, event: Message | EncodedEvent) -> BaseException | None:
    if isinstance(ack, BaseException):
        return ack
    if ack.cancelled():
        return TimeoutError(
            f"no JetStream acknowledgement within {PUBLISH_TIMEOUT_S:g}s for {event.event_id}"
        )
    error = ack.exception()
    if isinstance(error, NoStreamResponseError):
        subject = event.subject if isinstance(event, EncodedEvent) else event.routing_subject()
        return UnroutableSubjectError(subject)
    return error


@dataclass(frozen=True)
class StoredMessage:
    """A message as `InMemoryEventBus` stored it: subject, bytes and headers."""

    subject: str
    payload: bytes
    headers: Mapping[str, str]

    def decoded(self) -> Message:
        return decode(self.subject, self.payload)


class InMemoryEventBus:
    """`EventBus` in memory for pure unit tests; drops a repeated event id as JetStream would."""

    def __init__(self, service: str = "test") -> None:
        self.service = service
        self.stored: list[StoredMessage] = []
        self._seen_ids: set[str] = set()

    async def publish(self, event: Message) -> None:
        await self.publish_raw(
            event.routing_subject(),
            encode(event),
            event_id=str(event.event_id),
            event_type=event.event_type(),
            occurred_at=event.occurred_at,
        )

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        *,
        event_id: str,
        event_type: str,
        occurred_at: datetime,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not subject.startswith(STREAM_PREFIXES):
            raise UnroutableSubjectError(subject)
        if event_id in self._seen_ids:
            return
        self._seen_ids.add(event_id)
        all_headers = _headers_for(
            self.service, event_id=event_id, event_type=event_type, occurred_at=occurred_at, extra=headers
        )
        self.stored.append(StoredMessage(subject, payload, all_headers))

    async def publish_many(self, events: Sequence[Message | EncodedEvent]) -> list[BaseException | None]:
        """`publish` each event in order (`publish_raw` an `EncodedEvent`); each one's outcome (None
        once stored, else the error)."""
        outcomes: list[BaseException | None] = []
        for event in events:
            try:
                await publish_one(self, event)
            except Exception as error:
                outcomes.append(error)
            else:
                outcomes.append(None)
        return outcomes

    def messages(self) -> list[Message]:
        """Every stored message, decoded, in publish order."""
        return [stored.decoded() for stored in self.stored]
