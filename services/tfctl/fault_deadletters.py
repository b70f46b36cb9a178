"""The fault campaign's consumer stalled past `max_deliver`: dead-lettered, reconciled, nothing lost.

The campaign runs a durable consumer of its own (`STALLED_CONSUMER`, on `tf.evt.pod.admitted`, which
the webhook publishes for each pod the load admits and no service's durable consumer reads, so a replay
reaches nobody else) through the services' own pull loop (`tfcommon.consumer.run_pull_consumer`). The
fault `stalled consumer` makes its handler fail for `STALL_S` (a dependency down): every message
delivered `max_deliver` times meanwhile is dead-lettered by the loop. Once the consumer has settled, the
fault reconciles as an operator would: each of its dead letters replayed (`tfcommon.deadletter`, what
`tfctl deadletters replay` runs) on its original subject, with its event id. At the end
`unreconciled` names what is wrong: a dead letter left, or a message stored on the subject that the
handler never handled (lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

import nats.errors
from nats.js import JetStreamContext
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.consumer import TransientError, run_pull_consumer
from tfcommon.deadletter import list_dead_letters, replay_dead_letter
from tfcommon.events import Message
from tfcommon.subjects import ConsumerSpec, provision_consumer

from tfctl.fault_nats import until_jetstream_answers
from tfctl.history_check import BusEvent

log = logging.getLogger("tfctl.faults")

STALLED_CONSUMER = ConsumerSpec(
    stream=subjects.EVENTS_STREAM,
    durable="fault-campaign-stalled",
    filter_subjects=(subjects.POD_ADMITTED,),
    description="the fault campaign's consumer whose dependency stalls past max_deliver",
    max_deliver=3,
    backoff_s=(0.5, 1.0),
    deliver_policy="new",
    service="fault-campaign",
)
STALL_S = 4.0
"""How long the handler fails: past its 3 deliveries (0.5 s and 1 s apart) for what arrives early."""
QUIET_LOGGERS = ("tfcommon.consumer", "nats.aio.client")
SETTLE_S = 15.0
RETRY_S = 0.5


@dataclass
class StalledConsumer:
    """The campaign's consumer: fails while `stalled`, else counts each event id it handled."""

    stalled: bool = False
    handled: Counter[str] = field(default_factory=Counter)
    first_sequence: int = 0
    """The stream's next sequence when the consumer was created: it reads what is stored from there."""
    dead_lettered: int = 0
    replayed: int = 0

    async def handle(self, message: Message) -> Sequence[Message]:
        if self.stalled:
            raise TransientError("the campaign's dependency is stalled")
        self.handled[str(message.event_id)] += 1
        return ()

    async def run(self, nats_url: str, stop: asyncio.Event, ready: asyncio.Event) -> None:
        """Consume until `stop`, through NATS restarts (a loop that fails is started again). Its log
        lines (a retry, a dead letter, NATS away) go only where logging is configured: the stall and
        the restarts are the campaign's own doing, not news for the terminal."""
        for name in QUIET_LOGGERS:
            logging.getLogger(name).addHandler(logging.NullHandler())
        bus = await NatsEventBus.connect(nats_url, service="fault-campaign")
        try:
            await until_jetstream_answers(lambda: provision_consumer(bus.js, STALLED_CONSUMER))
            info = await until_jetstream_answers(
                lambda: bus.js.consumer_info(STALLED_CONSUMER.stream, STALLED_CONSUMER.durable)
            )
            self.first_sequence = info.delivered.stream_seq + 1  # a new consumer: the stream's last then
            ready.set()
            while not stop.is_set():
                try:
                    await run_pull_consumer(
                        bus.js,
                        STALLED_CONSUMER,
                        self.handle,
                        bus=bus,
                        service="fault-campaign",
                        stop=stop,
                        fetch_timeout_s=RETRY_S,
                    )
                except (nats.errors.Error, OSError, TimeoutError) as error:
                    log.info("the stalled consumer's loop failed (%s); starting it again", error)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=RETRY_S)
        finally:
            with contextlib.suppress(nats.errors.Error, OSError):
                await bus.close()

    async def stall(self, js: JetStreamContext) -> None:
        """The fault: fail for `STALL_S`, wait until the consumer has settled, replay its dead letters."""
        self.stalled = True
        try:
            await asyncio.sleep(STALL_S)  # the fault itself is the stall, not a synchronisation
        finally:
            self.stalled = False
        await settled(js, SETTLE_S)
        for letter in await until_jetstream_answers(lambda: list_dead_letters(js, STALLED_CONSUMER.durable)):
            self.dead_lettered += 1
            if await until_jetstream_answers(partial(replay_dead_letter, js, letter.sequence)) is not None:
                self.replayed += 1

    async def unreconciled(self, js: JetStreamContext, stored: Sequence[BusEvent]) -> list[str]:
        """After the campaign: dead letters left, and messages of the subject never handled (lost)."""
        await settled(js, SETTLE_S)
        found = [
            f"dead letter {letter.sequence} of {letter.consumer} ({letter.reason}, event {letter.event_id}) "
            "never reconciled"
            for letter in await until_jetstream_answers(
                lambda: list_dead_letters(js, STALLED_CONSUMER.durable)
            )
        ]
        originals = {
            event.message_id
            for event in stored
            if event.subject == subjects.POD_ADMITTED
            and event.sequence >= self.first_sequence
            and ":replay:" not in event.message_id
        }
        found += [
            f"{subjects.POD_ADMITTED} {message_id} never handled by {STALLED_CONSUMER.durable}: lost"
            for message_id in sorted(originals - set(self.handled))
        ]
        return found


async def settled(js: JetStreamContext, within_s: float) -> bool:
    """Whether the stalled consumer has nothing undelivered or unacknowledged (waits up to `within_s`)."""
    deadline = time.monotonic() + within_s
    while True:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            info = await js.consumer_info(STALLED_CONSUMER.stream, STALLED_CONSUMER.durable)
            if not info.num_pending and not info.num_ack_pending:
                return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.25)
