"""Dead letters: a message a durable consumer gives up is kept, with why, and can be replayed.

A consumer (`tfcommon.consumer`) gives a message up when its payload cannot be read (reason `poison`)
or when its handler failed on `max_deliver` deliveries (`exhausted`). Before it terminates the message
it copies it to the stream `TF_DEADLETTER` (`subjects.DEADLETTER`), on `tf.dlq.<service>.<consumer>`
(`dead_letter_subject`): the original payload and headers, and `Tf-Dlq-*` headers naming the original
stream, subject, stream sequence and event id (its `Nats-Msg-Id`), the consumer, the reason, the error
and the deliveries. The copy's own `Nats-Msg-Id` is `dlq:<consumer>:<stream>:<sequence>`, so the same
delivery dead-lettered twice (a crash between the copy and the terminate) is stored once. A copy
JetStream does not acknowledge leaves the message unterminated: it is delivered again later and
copied then (the server never gives a message up itself: `ConsumerSpec.config`).

`list_dead_letters` reads them (`tfctl deadletters list`); `replay_dead_letter` publishes one again
on its original subject, with its original payload and headers, hence its event id (consumers are
idempotent by event id), under the `Nats-Msg-Id` `<event id>:replay:<dead-letter sequence>` (the
original id would be dropped inside the duplicate window; replaying the same dead letter twice stores
it once), then deletes the dead letter; `discard_dead_letter` deletes one without replaying it (a
poison message, which would only be dead-lettered again).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from tfcommon import subjects

DeadLetterReason = Literal["poison", "exhausted"]
REASONS: tuple[DeadLetterReason, ...] = ("poison", "exhausted")

MSG_ID = "Nats-Msg-Id"
HEADER_PREFIX = "Tf-Dlq-"
STREAM = HEADER_PREFIX + "Stream"
SUBJECT = HEADER_PREFIX + "Subject"
SEQUENCE = HEADER_PREFIX + "Sequence"
EVENT_ID = HEADER_PREFIX + "Event-Id"
CONSUMER = HEADER_PREFIX + "Consumer"
REASON = HEADER_PREFIX + "Reason"
DETAIL = HEADER_PREFIX + "Detail"
DELIVERIES = HEADER_PREFIX + "Deliveries"
AT = HEADER_PREFIX + "At"
DETAIL_LIMIT = 500
"""Characters of the error kept in `Tf-Dlq-Detail` (one line)."""
HEADERS: tuple[tuple[str, str], ...] = (
    (MSG_ID, "`dlq:<consumer>:<stream>:<sequence>`: the same delivery dead-lettered twice is stored once"),
    (STREAM, "the stream the message was in (`TF_EVENTS`, `TF_COMMANDS`)"),
    (SUBJECT, "its subject, where `tfctl deadletters replay` publishes it again"),
    (SEQUENCE, "its sequence in that stream"),
    (EVENT_ID, "its `Nats-Msg-Id` (the event id)"),
    (CONSUMER, "the durable consumer that gave it up"),
    (
        REASON,
        "`poison` (the payload could not be read) or `exhausted` (the handler failed `max_deliver` times)",
    ),
    (DETAIL, f"the error, on one line (at most {DETAIL_LIMIT} characters)"),
    (DELIVERIES, "how many times it was delivered"),
    (AT, "when it was given up, RFC 3339"),
)
"""Every header a dead letter carries besides the original message's own, with its meaning."""


def dead_letter_subject(service: str, durable: str) -> str:
    """Where the durable consumer `durable` of `service` copies what it gives up."""
    return f"{subjects.DEADLETTER_PREFIX}.{service or 'unknown'}.{durable}"


def replay_message_id(event_id: str, dead_letter_sequence: int) -> str:
    """The `Nats-Msg-Id` of a replay: new to JetStream, the same for the same dead letter."""
    return f"{event_id}:replay:{dead_letter_sequence}"


def dead_letter_headers(
    original: dict[str, str],
    *,
    stream: str,
    subject: str,
    sequence: int,
    consumer: str,
    reason: DeadLetterReason,
    detail: str,
    deliveries: int,
    at: datetime,
) -> dict[str, str]:
    """The copy's headers: the original ones (its `Nats-Msg-Id` kept as `Tf-Dlq-Event-Id`) and why."""
    kept = {key: value for key, value in original.items() if not key.startswith(HEADER_PREFIX)}
    event_id = kept.pop(MSG_ID, "")
    return kept | {
        MSG_ID: f"dlq:{consumer}:{stream}:{sequence}",
        STREAM: stream,
        SUBJECT: subject,
        SEQUENCE: str(sequence),
        EVENT_ID: event_id,
        CONSUMER: consumer,
        REASON: reason,
        DETAIL: " ".join(detail.split())[:DETAIL_LIMIT],
        DELIVERIES: str(deliveries),
        AT: at.astimezone(UTC).isoformat(),
    }


@dataclass(frozen=True)
class DeadLetter:
    """One message in `TF_DEADLETTER`: where it came from, why it was given up, and what it was."""

    sequence: int
    """Its sequence in `TF_DEADLETTER`: the id `tfctl deadletters replay` takes."""
    consumer: str
    reason: str
    detail: str
    stream: str
    subject: str
    original_sequence: int
    event_id: str
    deliveries: int
    dead_lettered_at: datetime | None
    payload: bytes
    headers: dict[str, str]

    def original_headers(self) -> dict[str, str]:
        """The headers the message was published with, less its `Nats-Msg-Id`."""
        return {
            key: value
            for key, value in self.headers.items()
            if not key.startswith(HEADER_PREFIX) and key != MSG_ID
        }

    def as_json(self) -> dict[str, Any]:
        """For `tfctl deadletters list --json`: the payload as text when it is UTF-8."""
        try:
            payload: str | None = self.payload.decode()
        except UnicodeDecodeError:
            payload = None
        return {
            "id": self.sequence,
            "consumer": self.consumer,
            "reason": self.reason,
            "detail": self.detail,
            "stream": self.stream,
            "subject": self.subject,
            "sequence": self.original_sequence,
            "event_id": self.event_id,
            "deliveries": self.deliveries,
            "dead_lettered_at": None if self.dead_lettered_at is None else self.dead_lettered_at.isoformat(),
            "payload": payload,
            "headers": self.original_headers(),
        }


def _as_int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _as_time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def read_dead_letter(sequence: int, headers: dict[str, str], payload: bytes) -> DeadLetter:
    """A stored dead letter from its sequence, headers and payload."""
    return DeadLetter(
        sequence=sequence,
        consumer=headers.get(CONSUMER, ""),
        reason=headers.get(REASON, ""),
        detail=headers.get(DETAIL, ""),
        stream=headers.get(STREAM, ""),
        subject=headers.get(SUBJECT, ""),
        original_sequence=_as_int(headers.get(SEQUENCE)),
        event_id=headers.get(EVENT_ID, ""),
        deliveries=_as_int(headers.get(DELIVERIES)),
        dead_lettered_at=_as_time(headers.get(AT)),
        payload=payload,
        headers=dict(headers),
    )


async def get_dead_letter(js: JetStreamContext, sequence: int) -> DeadLetter | None:
    """The dead letter with this sequence, or None when there is none (replayed, discarded, aged out)."""
    try:
        raw = await js.get_msg(subjects.DEADLETTER_STREAM, seq=sequence)
    except NotFoundError:
        return None
    if raw.seq is None or not (raw.subject or "").startswith(f"{subjects.DEADLETTER_PREFIX}."):
        return None
    return read_dead_letter(raw.seq, dict(raw.headers or {}), raw.data or b"")


async def list_dead_letters(js: JetStreamContext, consumer: str | None = None) -> list[DeadLetter]:
    """Every dead letter kept, oldest first (of one durable consumer when `consumer` is given); none
    when `TF_DEADLETTER` does not exist yet (no consumer has provisioned it)."""
    found: list[DeadLetter] = []
    try:
        info = await js.stream_info(subjects.DEADLETTER_STREAM)
    except NotFoundError:
        return found
    if not info.state.messages:
        return found
    sequence = info.state.first_seq or 1
    while True:
        try:
            raw = await js.get_msg(
                subjects.DEADLETTER_STREAM, seq=sequence, subject=f"{subjects.DEADLETTER_PREFIX}.>", next=True
            )
        except NotFoundError:
            return found
        if raw.seq is None:
            return found
        letter = read_dead_letter(raw.seq, dict(raw.headers or {}), raw.data or b"")
        if consumer is None or letter.consumer == consumer:
            found.append(letter)
        sequence = raw.seq + 1


@dataclass(frozen=True)
class Replayed:
    """A dead letter published again: on `subject` of `stream`, at `sequence` (`duplicate`: JetStream
    already held this replay, so it stored nothing new)."""

    dead_letter: DeadLetter
    stream: str
    sequence: int
    duplicate: bool


async def replay_dead_letter(js: JetStreamContext, sequence: int, *, keep: bool = False) -> Replayed | None:
    """Publish dead letter `sequence` again on its original subject (its payload, headers and event id;
    `replay_message_id` as `Nats-Msg-Id`), then delete it unless `keep`. None when there is no such
    dead letter."""
    letter = await get_dead_letter(js, sequence)
    if letter is None:
        return None
    event_id = letter.event_id or f"dlq-{sequence}"
    headers = letter.original_headers() | {MSG_ID: replay_message_id(event_id, sequence)}
    ack = await js.publish(letter.subject, letter.payload, headers=headers)
    if not keep:
        await discard_dead_letter(js, sequence)
    return Replayed(letter, ack.stream, ack.seq, bool(ack.duplicate))


async def discard_dead_letter(js: JetStreamContext, sequence: int) -> bool:
    """Delete dead letter `sequence`; False when there is none."""
    try:
        return await js.delete_msg(subjects.DEADLETTER_STREAM, sequence)
    except NotFoundError:
        return False
