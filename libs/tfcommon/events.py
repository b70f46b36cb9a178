"""The wire contract: every event and command that crosses NATS, as versioned, frozen pydantic models.

Rules (DESIGN.md "Events"): one class per subject; facts are past tense (`tf.evt.*`), commands are
imperative (`tf.cmd.*`); evolution adds optional fields only, a breaking change is a new subject.
`docs/events.md` is generated from this module. Cores build these objects; shells publish them.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field


class Message(BaseModel):
    """Base of every message on the bus.

    `event_id` is also the `Nats-Msg-Id` and the CloudEvents `ce-id`, so a republish of the same
    message (after a crash between commit and publish) is dropped by JetStream's duplicate window.
    `cause` is the `event_id` of the message that led to this one.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: ClassVar[str]
    schema_version: ClassVar[int] = 1

    event_id: UUID
    occurred_at: datetime = Field(description="timezone-aware; set by the shell's clock, never by a core")
    cause: UUID | None = None


class Event(Message):
    """A fact that happened (past tense). Any number of subscribers."""


class Command(Message):
    """A request addressed to exactly one service (imperative)."""
