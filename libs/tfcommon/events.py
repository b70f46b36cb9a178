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


class WorkloadRef(BaseModel):
    """Which workload a message is about: a pod (Kubernetes) or a local submission."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    name: str
    uid: str | None = None
    workload: str | None = Field(default=None, description="owning controller's name, else the pod's")


class GpuShare(BaseModel):
    """What one allocation holds on one GPU: requests only (limits are never reserved)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_uuid: str
    tflops_milli: int = Field(ge=0)
    vram_bytes: int = Field(ge=0)


class AllocationCreated(Event):
    """GPU capacity was reserved in the ledger for a workload (one event per allocation)."""

    subject: ClassVar[str] = "tf.evt.allocation.created"

    allocation_id: UUID
    workload: WorkloadRef
    pool: str
    node: str
    shares: tuple[GpuShare, ...]
    qos: str
    isolation: str


class AllocationReleased(Event):
    """An allocation was closed in the ledger (pod gone, finished, evicted or rolled back); sent once."""

    subject: ClassVar[str] = "tf.evt.allocation.released"

    allocation_id: UUID
    workload: WorkloadRef
    node: str
    reason: str
