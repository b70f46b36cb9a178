"""Pull-consumer loop: fetch in batches, run a handler, publish the events it returns, then ack.

Outcome -> action, per message:
- decoded, handled, returned messages published -> `ack` (last, so a crash before it redelivers and the
  idempotent handler's events are dropped as duplicates by their message ids);
- payload fails validation (poison) -> dead-lettered, then `term` ("terminated"), never redelivered;
- `TransientError` or a connection error -> `nak(delay)` with the consumer's backoff; after
  `max_deliver` deliveries -> dead-lettered, then `term` ("exhausted");
- any other exception -> logged with its traceback, then treated as transient (bounded by `max_deliver`).
Dead-lettered: copied to `TF_DEADLETTER` with why (`tfcommon.deadletter`), counted in
`tf_consumer_dead_letters_total`; a copy JetStream did not take leaves the message unterminated and
nakked ("dead-letter-failed"), so it is delivered and copied again later, never lost silently.
While a handler runs, `in_progress()` is sent every third of the ack wait so long work is not redelivered.
A fetch the connection or the server refuses for now (connection lost; 503 from a NATS cluster whose
consumer has no leader while it elects one) is retried after `fetch_timeout_s`.
Setting the stop event (SIGTERM) stops fetching; messages already fetched are finished, then it returns.
One structured log line per message. Handlers do the I/O of their service; this loop does the bus's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import ServiceUnavailableError
from opentelemetry import trace

from tfcommon import subjects
from tfcommon.bus import EventBus
from tfcommon.deadletter import DeadLetterReason, dead_letter_headers, dead_letter_subject
from tfcommon.events import InvalidPayloadError, Message, UnknownSubjectError, decode
from tfcommon.service_metrics import record_consumed, record_dead_letter
from tfcommon.subjects import ConsumerSpec
from tfcommon.telemetry import extract_trace_context

Handler = Callable[[Message], Awaitable[Sequence[Message]]]
"""Reacts to one message and returns the messages to publish; must be idempotent (redelivery)."""

DEFAULT_TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.ConnectionClosedError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    ConnectionError,
    TimeoutError,
)

_log = logging.getLogger("tfcommon.consumer")
_tracer = trace.get_tracer("tfcommon.consumer")
DEAD_LETTER_TIMEOUT_S = 5.0


def metric_consumer(spec: ConsumerSpec) -> str:
    """`spec.durable`, but a node agent's per-node durable without its node (`node-agent-run-commands`):
    metric labels stay bounded however many nodes there are."""
    for factory in subjects.PER_NODE_CONSUMERS:
        kind = factory("x").durable.removesuffix("-x")
        if spec.durable.startswith(f"{kind}-") and spec.service == subjects.PER_NODE_SERVICE:
            return kind
    return spec.durable


class TransientError(Exception):
    """Raised by a handler when the work may succeed later (database down, dependency busy).

    The message is redelivered after the consumer's backoff delay, up to `max_deliver` times.
    """


async def _keep_alive(msg: Msg, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        await msg.in_progress()


class _Processor:
    def __init__(
        self,
        spec: ConsumerSpec,
        handler: Handler,
        bus: EventBus,
        service: str,
        transient_errors: tuple[type[BaseException], ...],
        js: JetStreamContext,
    ) -> None:
        self.spec = spec
        self.handler = handler
        self.bus = bus
        self.service = service
        self.js = js
        self.transient_errors: tuple[type[BaseException], ...] = (TransientError, *transient_errors)

    async def process(self, msg: Msg) -> str:
        started = time.monotonic()
        fields: dict[str, object] = {
            "service": self.service,
            "subject": msg.subject,
            "consumer": self.spec.durable,
            "event_id": (msg.headers or {}).get("Nats-Msg-Id"),
            "delivery": msg.metadata.num_delivered,
        }
        context = extract_trace_context(msg.headers)
        with _tracer.start_as_current_span(
            f"process {msg.subject}", context=context, kind=trace.SpanKind.CONSUMER
        ):
            try:
                outcome, level, error = await self._settle(msg, fields)
            except self.transient_errors as settle_error:
                # The ack/nak/term did not reach the server: JetStream redelivers after the ack wait.
                fields["cause_detail"] = f"{type(settle_error).__name__}: {settle_error}"
                outcome, level, error = "settle-failed", logging.WARNING, None
        fields["outcome"] = outcome
        fields["ms"] = round((time.monotonic() - started) * 1000, 1)
        record_consumed(
            self.service, self.spec.durable, outcome, msg.metadata.num_delivered, msg.metadata.num_pending
        )
        _log.log(level, "%s %s", outcome, msg.subject, extra=fields, exc_info=error)
        return outcome

    async def _settle(self, msg: Msg, fields: dict[str, object]) -> tuple[str, int, BaseException | None]:
        try:
            message = decode(msg.subject, msg.data)
        except (UnknownSubjectError, InvalidPayloadError) as error:
            fields["cause_detail"] = str(error)
            return await self._give_up(msg, fields, "poison", str(error), None)
        fields["event_id"] = str(message.event_id)
        fields["cause"] = str(message.cause) if message.cause else None
        try:
            returned = await self._handle(msg, message)
            for event in returned:
                await self.bus.publish(event)
        except self.transient_errors as error:
            return await self._retry(msg, fields, error, logging.WARNING, with_traceback=False)
        except Exception as error:
            return await self._retry(msg, fields, error, logging.ERROR, with_traceback=True)
        fields["published"] = len(returned)
        await msg.ack_sync()
        return "acked", logging.INFO, None

    async def _handle(self, msg: Msg, message: Message) -> Sequence[Message]:
        keep_alive = asyncio.create_task(_keep_alive(msg, self.spec.effective_ack_wait_s / 3))
        try:
            return await self.handler(message)
        finally:
            keep_alive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keep_alive

    async def _retry(
        self,
        msg: Msg,
        fields: dict[str, object],
        error: BaseException,
        level: int,
        *,
        with_traceback: bool,
    ) -> tuple[str, int, BaseException | None]:
        fields["cause_detail"] = f"{type(error).__name__}: {error}"
        delivered = msg.metadata.num_delivered
        if delivered >= self.spec.max_deliver:
            cause = str(fields["cause_detail"])
            return await self._give_up(msg, fields, "exhausted", cause, error if with_traceback else None)
        delay = self.spec.redelivery_delay_s(delivered)
        fields["retry_in_s"] = delay
        await msg.nak(delay=delay)
        return "retry", level, error if with_traceback else None

    async def _give_up(
        self,
        msg: Msg,
        fields: dict[str, object],
        reason: DeadLetterReason,
        detail: str,
        error: BaseException | None,
    ) -> tuple[str, int, BaseException | None]:
        """Copy the message to the dead-letter stream, then terminate it; if the copy fails, nak it so
        that it is delivered (and copied) again."""
        metadata = msg.metadata
        subject = dead_letter_subject(self.spec.service or self.service, self.spec.durable)
        headers = dead_letter_headers(
            dict(msg.headers or {}),
            stream=metadata.stream,
            subject=msg.subject,
            sequence=metadata.sequence.stream,
            consumer=self.spec.durable,
            reason=reason,
            detail=detail,
            deliveries=metadata.num_delivered,
            at=datetime.now(UTC),
        )
        try:
            ack = await self.js.publish(subject, msg.data, headers=headers, timeout=DEAD_LETTER_TIMEOUT_S)
        except (nats.errors.Error, ConnectionError, TimeoutError) as failure:
            fields["dead_letter_error"] = f"{type(failure).__name__}: {failure}"
            delay = self.spec.redelivery_delay_s(metadata.num_delivered)
            fields["retry_in_s"] = delay
            await msg.nak(delay=delay)
            return "dead-letter-failed", logging.ERROR, error
        fields["dead_letter"] = ack.seq
        fields["dead_letter_subject"] = subject
        await msg.term()
        record_dead_letter(self.service, metric_consumer(self.spec), reason)
        return ("terminated" if reason == "poison" else "exhausted"), logging.ERROR, error


async def run_pull_consumer(
    js: JetStreamContext,
    spec: ConsumerSpec,
    handler: Handler,
    *,
    bus: EventBus,
    service: str,
    stop: asyncio.Event,
    batch: int = 16,
    fetch_timeout_s: float = 1.0,
    transient_errors: tuple[type[BaseException], ...] = DEFAULT_TRANSIENT_ERRORS,
    concurrent: bool = False,
) -> None:
    """Consume `spec`'s durable consumer (already provisioned) until `stop` is set.

    The consumer must exist (`tfcommon.subjects.provision`). Returns after the batch in hand is
    finished; shutdown takes at most `fetch_timeout_s` plus that work. Messages never fetched stay in
    the stream for the next consumer. The messages are handled one after another, or, with
    `concurrent`, about `batch` at once (started in their order, the next fetch not waiting for them),
    for a handler whose work batches across messages that arrive together; either way each is settled
    when its own handler returns, and stopping waits for those in hand.
    """
    subscription = await js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
    processor = _Processor(spec, handler, bus, service, transient_errors, js)
    _log.info("consuming", extra={"consumer": spec.durable, "stream": spec.stream, "outcome": "started"})
    handling: set[asyncio.Task[str]] = set()
    try:
        while not stop.is_set():
            while len(handling) >= batch:  # a fetch may hand out more than asked (messages it had queued)
                done, _ = await asyncio.wait(handling, return_when=asyncio.FIRST_COMPLETED)
                handling -= done  # their callbacks, which discard them too, run a turn later
            try:
                fetched = await subscription.fetch(batch - len(handling), timeout=fetch_timeout_s)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's when the deadline ran out first
                continue
            except (nats.errors.ConnectionClosedError, ConnectionError, ServiceUnavailableError) as error:
                _log.warning(
                    "fetch failed; retrying",
                    extra={"consumer": spec.durable, "cause_detail": str(error), "outcome": "fetch-failed"},
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=fetch_timeout_s)
                continue
            for msg in fetched:
                if concurrent:
                    task = asyncio.create_task(processor.process(msg))
                    handling.add(task)
                    task.add_done_callback(handling.discard)
                else:
                    await processor.process(msg)
    finally:
        if handling:
            await asyncio.gather(*handling, return_exceptions=True)
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await subscription.unsubscribe()
        _log.info("stopped consuming", extra={"consumer": spec.durable, "outcome": "stopped"})
