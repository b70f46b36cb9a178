"""What a node agent reads from the ledger, asked over NATS: the request and reply of
`tf.req.scheduler.node-allocations.<node token>`.

The node agent holds no database credential. At start it asks for its node's open allocations
(restore), and for each `StartWorker` for the allocation the command names; a scheduler replica (queue
group `scheduler`, any replica: it is a ledger read) answers from the ledger with allocations placed on
the node of the subject only. The node is read from the subject, never from the payload, and NATS lets
each agent publish the request for its own node only, so an agent learns nothing of another node's.
Core NATS request/reply: nothing is stored, and a request nobody answers fails at once (no responders)
or after `REQUEST_TIMEOUT_S`. Like the events, payloads are JSON and evolve by optional additions; a
reader ignores fields it does not know.
"""

from __future__ import annotations

from typing import ClassVar
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tfcommon.events import GpuShare, InvalidPayloadError, NodeName, WorkloadRef, node_of_token, node_token

NODE_ALLOCATIONS = "tf.req.scheduler.node-allocations"
"""The request subject's prefix; the node's subject token (`events.node_token`) follows."""
SCHEDULER_QUEUE = "scheduler"
"""The queue group every scheduler replica answers in (one answer per request)."""
REQUEST_TIMEOUT_S = 5.0
"""How long the agent waits for an answer before it treats the scheduler as unavailable."""


def node_allocations_subject(node: str) -> str:
    """The subject on which `node`'s agent asks for its allocations."""
    return f"{NODE_ALLOCATIONS}.{node_token(node)}"


def node_of_subject(subject: str) -> str | None:
    """The node a request subject names; None for a subject that names no single node."""
    prefix = f"{NODE_ALLOCATIONS}."
    token = subject.removeprefix(prefix)
    if token == subject or not token or "." in token:
        return None
    node = node_of_token(token)
    try:
        _NodeOnly(node=node)
    except ValidationError:
        return None
    return node


class _NodeOnly(BaseModel):
    node: NodeName


class NodeAllocationsRequest(BaseModel):
    """What the agent asks: its node's open allocations, or one allocation by id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: ClassVar[str] = NODE_ALLOCATIONS
    schema_version: ClassVar[int] = 1

    allocation_id: UUID | None = Field(
        default=None,
        description="one allocation, in any state, if it is placed on this node; unset: every open "
        "allocation of this node",
    )


class NodeAllocation(BaseModel):
    """One allocation placed on the asking node, as the ledger holds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allocation_id: UUID
    workload: WorkloadRef
    pool: str
    node: str
    shares: tuple[GpuShare, ...]
    qos: str
    isolation: str
    state: str = Field(description="reserved, committed or released")


class NodeAllocationsReply(BaseModel):
    """The scheduler's answer: allocations of the subject's node only, or why it could not read them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: ClassVar[int] = 1

    node: str = Field(description="the node of the request's subject")
    allocations: tuple[NodeAllocation, ...] = Field(
        default=(), description="open ones for a listing; the one asked for when it is on this node"
    )
    error: str | None = Field(
        default=None, description="set when the ledger could not be read (retry) or the request is invalid"
    )


def decode_request(data: bytes) -> NodeAllocationsRequest:
    """The request in `data` (JSON; empty means a listing); raises `InvalidPayloadError` naming the field."""
    try:
        return NodeAllocationsRequest.model_validate_json(data or b"{}", extra="ignore")
    except ValidationError as error:
        raise InvalidPayloadError(f"request on {NODE_ALLOCATIONS}: {_problems(error)}") from error


def decode_reply(data: bytes) -> NodeAllocationsReply:
    """The reply in `data`; raises `InvalidPayloadError` naming the field."""
    try:
        return NodeAllocationsReply.model_validate_json(data, extra="ignore")
    except ValidationError as error:
        raise InvalidPayloadError(f"reply on {NODE_ALLOCATIONS}: {_problems(error)}") from error


def _problems(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or '(payload)'}: {item['msg']}"
        for item in error.errors()
    )
