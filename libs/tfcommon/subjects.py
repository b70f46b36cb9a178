"""Every NATS name: subjects, streams and durable consumers, and the idempotent `provision()`.

Subjects are `tf.evt.<entity>.<past-tense-verb>` for facts and `tf.cmd.<service>.<verb>[.<node>]` for
commands (`.<node token>` for a command a node agent sends: `events.FromNodeCommand`); streams
`TF_EVENTS` and `TF_COMMANDS`; durable pull consumers `<service>-<handler>`. The one request/reply
subject, `tf.req.scheduler.node-allocations.<node token>`, is in `tfcommon.node_allocations`.
Subject strings are declared once, on the message classes in `tfcommon.events`; this module names
them for wiring and declares every stream and consumer. Nothing is created implicitly elsewhere.

Each stream is kept on `replicas` servers (`TF_NATS_STREAM_REPLICAS`): a new stream is created with
that many, and an existing one is never given fewer than it has (`stream_replicas`), so a service
starting with the default 1 cannot undo an operator's raise to 3.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from tfcommon import events

log = logging.getLogger("tfcommon.subjects")

EVENTS_STREAM = "TF_EVENTS"
COMMANDS_STREAM = "TF_COMMANDS"
ALL_EVENTS = "tf.evt.>"
ALL_COMMANDS = "tf.cmd.>"
DEADLETTER_STREAM = "TF_DEADLETTER"
DEADLETTER_PREFIX = "tf.dlq"
"""What a durable consumer gives up goes to `TF_DEADLETTER` on `tf.dlq.<service>.<consumer>`
(`DEADLETTER`, `tfcommon.deadletter`)."""

POD_ADMITTED = events.PodAdmitted.subject
WORKLOAD_SUBMITTED = events.WorkloadSubmitted.subject
WORKLOAD_UNSCHEDULABLE = events.WorkloadUnschedulable.subject
ALLOCATION_CREATED = events.AllocationCreated.subject
ALLOCATION_RELEASED = events.AllocationReleased.subject
NODE_REGISTERED = events.NodeRegistered.subject
NODE_HEARTBEAT_SENT = events.NodeHeartbeatSent.subject
GPU_DISCOVERED = events.GpuDiscovered.subject
GPU_DISAPPEARED = events.GpuDisappeared.subject
GPU_USAGE_REPORTED = events.GpuUsageReported.subject
GPU_DRIFT_DETECTED = events.DriftDetected.subject
DEFRAG_CAMPAIGN_STARTED = events.DefragCampaignStarted.subject
DEFRAG_CAMPAIGN_FINISHED = events.DefragCampaignFinished.subject
NODE_DEFRAG_SKIPPED = events.DefragNodeSkipped.subject
POD_EVICTED = events.PodEvicted.subject
NODE_DRAINED = events.NodeDrained.subject
START_WORKER = events.StartWorker.subject
STOP_WORKER = events.StopWorker.subject
DISCOVER_GPUS = events.DiscoverGpus.subject
START_DEFRAG_CAMPAIGN = events.StartDefragCampaign.subject
RELEASE_ALLOCATION = events.ReleaseAllocation.subject

NODE_AGENT_COMMANDS_PREFIX = "tf.cmd.node-agent"


def node_agent_commands(node: str) -> str:
    """Filter subject of every command addressed to `node`'s agent."""
    return f"{NODE_AGENT_COMMANDS_PREFIX}.*.{node}"


def release_allocation(node: str) -> str:
    """The subject on which `node`'s agent asks the scheduler to release an allocation of its node."""
    return f"{RELEASE_ALLOCATION}.{events.node_token(node)}"


@dataclass(frozen=True)
class StreamSpec:
    """A JetStream stream as this project declares it; `provision()` makes the server match it."""

    name: str
    subjects: tuple[str, ...]
    retention: Literal["limits", "workqueue"]
    description: str
    duplicate_window_s: float = 120.0
    max_age_s: float = 0.0
    storage: Literal["file", "memory"] = "file"
    max_bytes: int = -1
    """The most the stream keeps (-1: no limit); past it the oldest messages are dropped."""

    def config(self, replicas: int = 1) -> StreamConfig:
        """The server-side configuration, with the stream kept on `replicas` servers."""
        return StreamConfig(
            name=self.name,
            num_replicas=replicas,
            description=self.description,
            subjects=list(self.subjects),
            retention=RetentionPolicy(self.retention),
            storage=StorageType(self.storage),
            duplicate_window=self.duplicate_window_s,
            max_age=self.max_age_s,
            max_bytes=self.max_bytes,
        )


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer `<service>-<handler>` with explicit acks.

    `backoff_s[n]` is the delay before delivery n+2 (after a nak or an ack timeout); the last value
    repeats. After `max_deliver` deliveries the consumer loop gives the message up: it copies it to
    `TF_DEADLETTER` and terminates it (`tfcommon.deadletter`). The server itself never gives a message
    up (its `max_deliver` is -1), so one that could not be copied yet is delivered again and copied then.
    With a backoff, JetStream uses `backoff_s[n-1]` as the ack wait of delivery n and ignores
    `ack_wait_s`; a handler still working sends `in_progress()` within `effective_ack_wait_s`.
    """

    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    description: str
    ack_wait_s: float = 30.0
    max_deliver: int = 5
    backoff_s: tuple[float, ...] = (1.0, 5.0, 15.0, 30.0)
    max_ack_pending: int = 1000
    deliver_policy: Literal["all", "new"] = "all"
    service: str = field(default="", compare=False)

    def config(self) -> ConsumerConfig:
        single = len(self.filter_subjects) == 1
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            description=self.description,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy(self.deliver_policy),
            ack_wait=self.ack_wait_s,
            # The consumer loop gives up after `max_deliver` (dead-lettered); JetStream never does.
            max_deliver=-1,
            # Beyond the list the last value repeats (and a bounded max_deliver must exceed its length).
            backoff=list(self.backoff_s[: self.max_deliver - 1]) or None,
            filter_subject=self.filter_subjects[0] if single else None,
            filter_subjects=None if single else list(self.filter_subjects),
            max_ack_pending=self.max_ack_pending,
        )

    @property
    def effective_ack_wait_s(self) -> float:
        """The shortest time JetStream waits for an ack (or an in-progress signal) before redelivering."""
        return min(self.backoff_s[: self.max_deliver - 1], default=self.ack_wait_s)

    def redelivery_delay_s(self, num_delivered: int) -> float:
        """How long to wait before redelivering a message that has been delivered `num_delivered` times."""
        if not self.backoff_s:
            return self.ack_wait_s
        return self.backoff_s[min(max(num_delivered, 1), len(self.backoff_s)) - 1]


EVENTS = StreamSpec(
    name=EVENTS_STREAM,
    subjects=(ALL_EVENTS,),
    retention="limits",
    description="Facts (past tense); any number of subscribers; kept 7 days",
    max_age_s=7 * 24 * 3600.0,
)
COMMANDS = StreamSpec(
    name=COMMANDS_STREAM,
    subjects=(ALL_COMMANDS,),
    retention="workqueue",
    description="Commands for exactly one service; removed once acknowledged",
)
STREAMS: tuple[StreamSpec, ...] = (EVENTS, COMMANDS)
DEADLETTER = StreamSpec(
    name=DEADLETTER_STREAM,
    subjects=(f"{DEADLETTER_PREFIX}.>",),
    retention="limits",
    description=(
        "Messages a durable consumer gave up (poison, or max_deliver exhausted), with why, until replayed "
        "or discarded (tfctl deadletters); kept 30 days and at most 64 MiB, the oldest dropped first"
    ),
    max_age_s=30 * 24 * 3600.0,
    max_bytes=64 * 1024 * 1024,
)
"""Provisioned with the services' durable consumers (`provision`), not with `STREAMS`: a node agent's
NATS grant (the auth callout) may create only `TF_EVENTS` and `TF_COMMANDS`."""

SCHEDULER_SCHEDULE_WORKLOAD = ConsumerSpec(
    stream=EVENTS_STREAM,
    durable="scheduler-schedule-workload",
    filter_subjects=(WORKLOAD_SUBMITTED,),
    description="places each submitted workload",
    service="scheduler",
)
SCHEDULER_TRACK_NODES = ConsumerSpec(
    stream=EVENTS_STREAM,
    durable="scheduler-track-nodes",
    filter_subjects=(NODE_REGISTERED, NODE_HEARTBEAT_SENT, GPU_DISCOVERED, GPU_DISAPPEARED),
    description="keeps nodes, GPUs and heartbeats in the ledger and the scheduler's view",
    max_deliver=3,
    backoff_s=(1.0, 5.0),
    service="scheduler",
)
SCHEDULER_TRACK_ALLOCATIONS = ConsumerSpec(
    stream=EVENTS_STREAM,
    durable="scheduler-track-allocations",
    filter_subjects=(ALLOCATION_RELEASED,),
    description="frees in the scheduler's view what other processes release in the ledger",
    deliver_policy="new",
    service="scheduler",
)
SCHEDULER_RELEASE_ALLOCATIONS = ConsumerSpec(
    stream=COMMANDS_STREAM,
    durable="scheduler-release-allocations",
    filter_subjects=(f"{RELEASE_ALLOCATION}.*",),
    description="releases what node agents ask, when open and on the node of the subject",
    max_deliver=30,
    backoff_s=(1.0, 5.0, 15.0, 30.0, 60.0),
    service="scheduler",
)
METRICS_RECORD_USAGE = ConsumerSpec(
    stream=EVENTS_STREAM,
    durable="metrics-record-usage",
    filter_subjects=(GPU_USAGE_REPORTED,),
    description="turns agents' usage samples into series and percentiles",
    max_deliver=3,
    backoff_s=(1.0, 5.0),
    service="metrics",
)
METRICS_COUNT_EVENTS = ConsumerSpec(
    stream=EVENTS_STREAM,
    durable="metrics-count-events",
    filter_subjects=(
        ALLOCATION_CREATED,
        ALLOCATION_RELEASED,
        WORKLOAD_UNSCHEDULABLE,
        POD_EVICTED,
        GPU_DRIFT_DETECTED,
    ),
    description="system counters: allocations, unschedulable, evictions, drift",
    service="metrics",
)
DEFRAG_START_CAMPAIGN = ConsumerSpec(
    stream=COMMANDS_STREAM,
    durable="defrag-planner-start-campaign",
    filter_subjects=(START_DEFRAG_CAMPAIGN,),
    description="starts a campaign on request",
    ack_wait_s=60.0,
    max_deliver=2,
    backoff_s=(10.0,),
    service="defrag-planner",
)
CONSUMERS: tuple[ConsumerSpec, ...] = (
    SCHEDULER_SCHEDULE_WORKLOAD,
    SCHEDULER_TRACK_NODES,
    SCHEDULER_TRACK_ALLOCATIONS,
    SCHEDULER_RELEASE_ALLOCATIONS,
    METRICS_RECORD_USAGE,
    METRICS_COUNT_EVENTS,
    DEFRAG_START_CAMPAIGN,
)
"""Consumers `provision()` creates; per-node ones come from the functions below."""


def _node_token(node: str) -> str:
    # Consumer names may not contain dots; node names (RFC 1123 subdomains) may.
    return events.node_token(node)


def node_agent_run_commands(node: str) -> ConsumerSpec:
    """The durable consumer through which `node`'s agent receives its commands."""
    return ConsumerSpec(
        stream=COMMANDS_STREAM,
        durable=f"node-agent-run-commands-{_node_token(node)}",
        filter_subjects=(node_agent_commands(node),),
        description=f"commands for the agent of node {node}",
        service="node-agent",
    )


def node_agent_track_allocations(node: str) -> ConsumerSpec:
    """The durable consumer through which `node`'s agent follows allocations (it filters by node)."""
    return ConsumerSpec(
        stream=EVENTS_STREAM,
        durable=f"node-agent-track-allocations-{_node_token(node)}",
        filter_subjects=(ALLOCATION_CREATED, ALLOCATION_RELEASED),
        description=f"allocations seen by the agent of node {node}",
        service="node-agent",
    )


PER_NODE_CONSUMERS = (node_agent_run_commands, node_agent_track_allocations)
"""Factories of the consumers each node-agent provisions for its own node."""

PER_NODE_SERVICE = "node-agent"
"""The service whose durable consumers are per node (`PER_NODE_CONSUMERS`)."""


def consumers_of(service: str, node: str | None = None) -> tuple[ConsumerSpec, ...]:
    """The durable consumers `service` runs, and so the only ones it provisions: its entries of
    `CONSUMERS`, plus, for the node-agent given its `node`, that node's `PER_NODE_CONSUMERS`.

    deploy/nats/nats.conf lets each NATS user create and update exactly these (a node-agent: any
    durable but the other services'), so provisioning another service's durable is refused.
    """
    own = [spec for spec in CONSUMERS if spec.service == service]
    if service == PER_NODE_SERVICE and node is not None:
        own += [factory(node) for factory in PER_NODE_CONSUMERS]
    return tuple(own)


class StreamReplicasError(RuntimeError):
    """The NATS server cannot keep a stream on as many servers as `TF_NATS_STREAM_REPLICAS` asks."""


_NOT_CLUSTERED = 10074
"""JetStream's error code for replicas > 1 on a server that is not part of a cluster."""
_NO_PLACEMENT = 10005
"""JetStream's error code for too few servers (peers) to place the replicas on."""
_NAME_IN_USE = 10058
"""JetStream's error code for a stream created meanwhile (by another service) with another config."""


def stream_replicas(wanted: int, existing: int | None) -> int:
    """How many servers provisioning keeps a stream on: `wanted` for a stream that does not exist yet
    (`existing` None), and never fewer than an existing stream already has. Pure."""
    if wanted < 1:
        raise ValueError(f"stream replicas must be 1 or more, not {wanted} (TF_NATS_STREAM_REPLICAS)")
    return wanted if existing is None else max(wanted, existing)


async def _current_replicas(js: JetStreamContext, name: str) -> int | None:
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        return None
    return info.config.num_replicas or 1


async def provision_stream(js: JetStreamContext, spec: StreamSpec, replicas: int = 1) -> None:
    """Create the stream on `replicas` servers, or update it to match `spec` keeping at least the
    replicas it has (safe to run any number of times, from any number of services at once).

    Raises `StreamReplicasError` when the server cannot hold that many copies (a single server, or a
    cluster with fewer servers), naming `TF_NATS_STREAM_REPLICAS` and the fix.
    """
    for attempt in range(3):
        existing = await _current_replicas(js, spec.name)
        target = stream_replicas(replicas, existing)
        try:
            if existing is None:
                await js.add_stream(spec.config(target))
            else:
                await js.update_stream(spec.config(target))
        except APIError as error:
            if error.err_code in (_NOT_CLUSTERED, _NO_PLACEMENT):
                raise StreamReplicasError(
                    f"stream {spec.name}: NATS cannot keep {target} replicas ({error.description}); "
                    f"set TF_NATS_STREAM_REPLICAS to at most the number of NATS servers in the cluster "
                    f"(1 for a single server)"
                ) from error
            # Deleted, or created by another service, since we looked: look again.
            changed_meanwhile = isinstance(error, NotFoundError) or error.err_code == _NAME_IN_USE
            if changed_meanwhile and attempt < 2:
                continue
            raise
        _log_replicas(spec.name, replicas, existing, target)
        return


def _log_replicas(name: str, wanted: int, existing: int | None, target: int) -> None:
    if existing is None:
        message, outcome = "stream created", "created"
    elif existing < target:
        message, outcome = "stream replicas raised", "raised"
    elif wanted < existing:
        message, outcome = "stream keeps more replicas than TF_NATS_STREAM_REPLICAS asks", "kept"
    else:
        message, outcome = "stream up to date", "kept"
    log.info(
        message,
        extra={
            "event": "stream.provisioned",
            "stream": name,
            "outcome": outcome,
            "replicas": target,
            "replicas_before": existing,
            "replicas_wanted": wanted,
        },
    )


async def provision_consumer(js: JetStreamContext, spec: ConsumerSpec) -> None:
    """Create the durable consumer, or update it to match `spec` (safe to run any number of times)."""
    # CONSUMER.CREATE with no action creates, or updates when the configuration changed.
    await js.add_consumer(spec.stream, spec.config())


async def provision(
    js: JetStreamContext,
    *,
    streams: Iterable[StreamSpec] = STREAMS,
    consumers: Iterable[ConsumerSpec] = CONSUMERS,
    replicas: int = 1,
) -> None:
    """Create or update the streams, then the durable consumers, and with any consumer but a node
    agent's the dead-letter stream (`DEADLETTER`) they write to; idempotent, applies changed config.

    The defaults create everything (a single trusted user, tests); a service passes
    `consumers=consumers_of(service)`, since its NATS user may create only its own durables, and
    `replicas` from `TF_NATS_STREAM_REPLICAS` (new streams get that many; none loses any).
    """
    consumers = tuple(consumers)
    for stream in streams:
        await provision_stream(js, stream, replicas)
    if any(consumer.service != PER_NODE_SERVICE for consumer in consumers):
        await provision_stream(js, DEADLETTER, replicas)
    for consumer in consumers:
        await provision_consumer(js, consumer)
