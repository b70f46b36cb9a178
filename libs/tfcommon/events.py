"""The wire contract: every event and command that crosses NATS, as versioned, frozen pydantic models.

Rules (DESIGN.md "Events"): one class per subject; facts are past tense (`tf.evt.*`), commands are
imperative (`tf.cmd.*`); evolution adds optional fields only, a breaking change is a new subject.
`docs/events.md` is generated from this module. Cores build these objects; shells publish them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal
from uuid import UUID, uuid5

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    ValidationError,
    model_serializer,
)

NodeName = Annotated[
    str,
    StringConstraints(
        max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ),
]
"""A Kubernetes node name (RFC 1123 subdomain); safe as the last tokens of a NATS subject."""

QosLevel = Literal["low", "medium", "high", "critical"]
IsolationMode = Literal["shared", "soft", "hard", "partitioned"]


class Message(BaseModel):
    """Base of every message on the bus.

    `event_id` is also the `Nats-Msg-Id` and the CloudEvents `ce-id`, so a republish of the same
    message (after a crash between commit and publish) is dropped by JetStream's duplicate window.
    `cause` is the `event_id` of the message that led to this one.

    Strict writer, tolerant reader: building a message with an unknown field fails (a producer's typo
    never reaches the wire), while `decode` ignores fields it does not know, so a reader of schema v1
    keeps accepting payloads a newer producer extended with optional fields (additive evolution).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    subject: ClassVar[str]
    schema_version: ClassVar[int] = 1
    producers: ClassVar[tuple[str, ...]] = ()

    event_id: UUID = Field(description="unique id; also the Nats-Msg-Id and the CloudEvents ce-id")
    occurred_at: datetime = Field(description="timezone-aware; set by the shell's clock, never by a core")
    cause: UUID | None = Field(default=None, description="event_id of the message that led to this one")

    @classmethod
    def event_type(cls) -> str:
        """The CloudEvents `ce-type`: the subject and the schema version, e.g. `tf.evt.pod.admitted.v1`."""
        return f"{cls.subject}.v{cls.schema_version}"

    def routing_subject(self) -> str:
        """The NATS subject this message is published on (node commands append their node)."""
        return self.subject


class Event(Message):
    """A fact that happened (past tense). Any number of subscribers."""


class Command(Message):
    """A request addressed to exactly one service (imperative)."""


class NodeCommand(Command):
    """A command for the node-agent of one node, published on `<subject>.<node>`.

    Each agent's durable consumer filters on its own node, so exactly one agent receives it.
    """

    node: NodeName = Field(description="the node whose agent must act; also the last subject tokens")

    def routing_subject(self) -> str:
        return f"{self.subject}.{self.node}"


def node_token(node: str) -> str:
    """`node` as one NATS subject token: its dots become `_` (a node name never holds `_`, so the token
    names one node only; `node_of_token` reads it back)."""
    return node.replace(".", "_")


def node_of_token(token: str) -> str:
    """The node name a subject token (`node_token`) stands for."""
    return token.replace("_", ".")


class FromNodeCommand(Command):
    """A command a node agent sends about its own node, published on `<subject>.<node token>` (the node
    name as one subject token, dots as `_`: `node_token`).

    NATS lets each agent publish it for its own node only, and `decode` refuses a payload whose `node`
    is not the subject's, so the receiver acts for the node the subject names.
    """

    node: NodeName = Field(description="the node whose agent sends it; also the subject's last token")

    def routing_subject(self) -> str:
        return f"{self.subject}.{node_token(self.node)}"


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
    producers: ClassVar[tuple[str, ...]] = ("scheduler (through the ledger outbox)",)

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
    producers: ClassVar[tuple[str, ...]] = ("scheduler (through the ledger outbox)",)

    allocation_id: UUID
    workload: WorkloadRef
    node: str
    reason: str
    evicted: bool = Field(
        default=False, description="the workload was evicted (preemption, defrag, drain), not ended by itself"
    )


class GpuRequest(BaseModel):
    """What a workload asks for, per GPU: requests are reserved, limits only bound usage (and billing)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pool: str = Field(description="GPU pool name")
    gpu_count: int = Field(default=1, ge=1, description="GPUs wanted, each with these amounts")
    tflops_request_milli: int = Field(ge=0, description="TFLOPS reserved per GPU x 1000")
    tflops_limit_milli: int = Field(ge=0, description="compute limit per GPU, TFLOPS x 1000")
    vram_request_bytes: int = Field(ge=0, description="VRAM reserved per GPU")
    vram_limit_bytes: int = Field(ge=0, description="VRAM limit per GPU")
    compute_percent_request: int | None = Field(
        default=None, ge=0, le=100, description="set when the workload asked in percent of a GPU"
    )
    compute_percent_limit: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="compute limit in percent of each GPU, with a percent request (unset: the request)",
    )
    gpu_model: str | None = Field(default=None, description="required GPU model, e.g. H100; any if unset")
    qos: QosLevel = Field(default="medium", description="QoS class: priority and price")
    isolation: IsolationMode = Field(default="soft", description="how limits are enforced")

    @model_serializer(mode="wrap")
    def _without_unset_percent_limit(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An unset `compute_percent_limit` is left out, so a request without one is sent exactly as
        before the field was added."""
        data: dict[str, Any] = handler(self)
        if data.get("compute_percent_limit") is None:
            data.pop("compute_percent_limit", None)
        return data


# ----------------------------------------------------------------------------------------- workloads


class PodAdmitted(Event):
    """The admission webhook admitted a GPU pod (mutated it for the pool); never sent for dry runs."""

    subject: ClassVar[str] = "tf.evt.pod.admitted"
    producers: ClassVar[tuple[str, ...]] = ("webhook",)

    workload: WorkloadRef = Field(description="the workload this is about")
    request: GpuRequest = Field(description="what it asks for, per GPU")
    migrated_resource: str | None = Field(
        default=None, description="device-plugin resource converted to GPU shares, e.g. nvidia.com/gpu"
    )
    patch_operations: int = Field(ge=0, description="number of JSONPatch operations in the response")


class WorkloadSubmitted(Event):
    """A GPU workload is pending placement (a watched pod, `tfctl submit` or `tfctl run`)."""

    subject: ClassVar[str] = "tf.evt.workload.submitted"
    producers: ClassVar[tuple[str, ...]] = ("scheduler",)

    workload: WorkloadRef = Field(description="the workload this is about")
    request: GpuRequest = Field(description="what it asks for, per GPU")
    source: Literal["kubernetes", "local"] = Field(description="a watched pod or a local submission")
    priority: int = Field(default=0, description="PriorityClass value; QoS orders ties")


class WorkloadUnschedulable(Event):
    """No GPU set fits the workload now; `summary` is the placement core's "0/N GPUs fit: ..." text."""

    subject: ClassVar[str] = "tf.evt.workload.unschedulable"
    producers: ClassVar[tuple[str, ...]] = ("scheduler",)

    workload: WorkloadRef = Field(description="the workload this is about")
    pool: str = Field(description="GPU pool name")
    summary: str = Field(description='e.g. "0/3 GPUs fit: 2 insufficient VRAM, 1 wrong GPU model"')
    gpus_considered: int = Field(ge=0, description="GPUs the placement core examined")
    reasons: dict[str, int] = Field(default_factory=dict, description="rejection reason -> GPU count")


# ---------------------------------------------------------------------------------- nodes and GPUs


class NodeRegistered(Event):
    """A node-agent started (or restarted) and announced its node; GPUs follow as `GpuDiscovered`."""

    subject: ClassVar[str] = "tf.evt.node.registered"
    producers: ClassVar[tuple[str, ...]] = ("node-agent",)

    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    pool: str = Field(description="GPU pool name")
    gpu_count: int = Field(ge=0, description="GPUs on the node")
    simulated: bool = Field(description="true when the GPUs are simulated (--fake-gpus), not NVML")
    driver_version: str | None = Field(default=None, description="NVIDIA driver version")
    cuda_version: str | None = Field(default=None, description="CUDA driver API version")
    agent_url: str | None = Field(default=None, description="base URL of the agent's hypervisor API")


class GpuDiscovered(Event):
    """A node-agent found a GPU (at start, on its rediscovery timer or on request); sent every time."""

    subject: ClassVar[str] = "tf.evt.gpu.discovered"
    producers: ClassVar[tuple[str, ...]] = ("node-agent",)

    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    pool: str = Field(description="GPU pool name")
    gpu_uuid: str = Field(description="lower case, e.g. gpu-1f0e...")
    index: int = Field(ge=0, description="NVML index on the node")
    model: str = Field(description="GPU model as in the GPU model table, e.g. H100")
    vendor: str = Field(default="nvidia", description="GPU vendor")
    capacity_tflops_milli: int = Field(ge=0, description="dense FP16 tensor TFLOPS x 1000")
    capacity_vram_bytes: int = Field(ge=0, description="total VRAM")
    pci_bus_id: str | None = Field(default=None, description="PCI bus id, e.g. 00000000:17:00.0")
    numa_node: int | None = Field(default=None, description="NUMA node of the GPU")
    nvlink_peers: tuple[str, ...] = Field(default=(), description="UUIDs of GPUs linked by NVLink")
    mig_enabled: bool = Field(default=False, description="MIG mode is on")
    simulated: bool = Field(default=False, description="true for simulated GPUs (--fake-gpus)")


class GpuDisappeared(Event):
    """A GPU seen before is missing from discovery; readers mark it `Unknown`, never delete it."""

    subject: ClassVar[str] = "tf.evt.gpu.disappeared"
    producers: ClassVar[tuple[str, ...]] = ("node-agent",)

    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    gpu_uuid: str = Field(description="lower-case GPU UUID")


class NodeHeartbeatSent(Event):
    """A node-agent is alive; readers mark the node not ready when these stop for their timeout."""

    subject: ClassVar[str] = "tf.evt.node.heartbeat-sent"
    producers: ClassVar[tuple[str, ...]] = ("node-agent",)

    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    pool: str = Field(description="GPU pool name")
    gpu_count: int = Field(ge=0, description="GPUs on the node")
    interval_ms: int = Field(gt=0, description="how often the agent sends heartbeats")


class GpuUsage(BaseModel):
    """One GPU's sample; names follow TensorFusion's `tf_gpu_usage` (quantities as integers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uuid: str = Field(description="lower-case GPU UUID")
    compute_percentage: float = Field(ge=0, description="percent of the GPU's compute in use")
    compute_tflops_milli: int = Field(ge=0, description="tf_gpu_usage.compute_tflops x 1000")
    memory_bytes: int = Field(ge=0, description="VRAM in use")
    memory_percentage: float = Field(ge=0, description="percent of the GPU's VRAM in use")
    temperature: int = Field(description="degrees Celsius")
    power_usage: int = Field(ge=0, description="watts")
    rx: int = Field(ge=0, description="PCIe receive, KB/s")
    tx: int = Field(ge=0, description="PCIe transmit, KB/s")


class WorkerUsage(BaseModel):
    """One workload's use of one GPU; names follow TensorFusion's `tf_worker_usage`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uuid: str = Field(description="GPU UUID")
    namespace: str = Field(description="the pod's namespace (`local` for tfctl run)")
    pod_name: str = Field(description="the pod (or local workload) name")
    workload: str = Field(description="the owning workload's name")
    worker: str = Field(description="worker id (the pod, or the `tfctl run` process)")
    allocation_id: UUID | None = Field(default=None, description="the ledger allocation, if any")
    compute_percentage: float = Field(ge=0, description="percent of the GPU's compute in use")
    compute_tflops_milli: int = Field(ge=0, description="TFLOPS in use x 1000")
    memory_bytes: int = Field(ge=0, description="VRAM in use")
    memory_percentage: float = Field(ge=0, description="of the workload's VRAM limit")


class GpuUsageReported(Event):
    """One node's usage samples for one interval, batched: every GPU and every worker on it."""

    subject: ClassVar[str] = "tf.evt.gpu.usage-reported"
    producers: ClassVar[tuple[str, ...]] = ("node-agent",)

    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    pool: str = Field(description="GPU pool name")
    sampled_at: datetime = Field(description="when the samples were taken (agent clock)")
    interval_ms: int = Field(gt=0, description="sampling interval")
    simulated: bool = Field(default=False, description="true for simulated GPUs (--fake-gpus)")
    gpus: tuple[GpuUsage, ...] = Field(default=(), description="one sample per GPU (tf_gpu_usage)")
    workers: tuple[WorkerUsage, ...] = Field(
        default=(), description="one sample per workload and GPU (tf_worker_usage)"
    )


class DriftDetected(Event):
    """What runs on a GPU disagrees with the ledger: an unallocated process, VRAM over its limit, or a
    bound pod with no ledger row (adopted by the scheduler)."""

    subject: ClassVar[str] = "tf.evt.gpu.drift-detected"
    producers: ClassVar[tuple[str, ...]] = ("node-agent", "scheduler")

    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    gpu_uuid: str = Field(description="lower-case GPU UUID")
    kind: Literal["process-without-allocation", "vram-over-limit", "binding-without-allocation"] = Field(
        description="which disagreement"
    )
    detail: str = Field(description="human-readable explanation, with the figures")
    workload: WorkloadRef | None = Field(default=None, description="the workload involved, if known")
    pid: int | None = Field(default=None, description="host process id, when a process is involved")
    memory_bytes: int | None = Field(default=None, ge=0, description="VRAM the process or workload uses")
    limit_bytes: int | None = Field(default=None, ge=0, description="its VRAM limit, when over it")


# -------------------------------------------------------------------------------------------- defrag


class DefragCampaignStarted(Event):
    """A defragmentation campaign began for one pool (cron window, manual trigger or compaction)."""

    subject: ClassVar[str] = "tf.evt.defrag-campaign.started"
    producers: ClassVar[tuple[str, ...]] = ("defrag-planner",)

    campaign_id: UUID = Field(description="identifies one campaign across its events")
    pool: str = Field(description="GPU pool name")
    trigger: Literal["cron", "manual", "compaction"] = Field(description="what started it")
    deadline_at: datetime | None = Field(default=None, description="end of the window; None: no limit")
    candidate_nodes: int = Field(ge=0, description="nodes the planner may try to drain")


class DefragCampaignFinished(Event):
    """A campaign ended: all candidates handled, its deadline passed, or it was aborted."""

    subject: ClassVar[str] = "tf.evt.defrag-campaign.finished"
    producers: ClassVar[tuple[str, ...]] = ("defrag-planner",)

    campaign_id: UUID = Field(description="identifies one campaign across its events")
    pool: str = Field(description="GPU pool name")
    outcome: Literal["completed", "deadline", "aborted"] = Field(description="how it ended")
    nodes_drained: int = Field(ge=0, description="nodes freed of every GPU workload")
    nodes_skipped: int = Field(ge=0, description="candidates left alone (see DefragNodeSkipped)")
    pods_evicted: int = Field(ge=0, description="evictions performed")
    stranded_pods: int = Field(ge=0, description="evicted pods whose replacement was not placed")
    duration_ms: int = Field(ge=0, description="wall time of the campaign")


class DefragNodeSkipped(Event):
    """The planner left a candidate node alone (or stopped draining it), with the reason."""

    subject: ClassVar[str] = "tf.evt.node.defrag-skipped"
    producers: ClassVar[tuple[str, ...]] = ("defrag-planner",)

    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    pool: str = Field(description="GPU pool name")
    campaign_id: UUID | None = Field(default=None, description="the campaign, when one caused it")
    reason: str = Field(description="why, in words a user can act on")


class PodEvicted(Event):
    """A workload was evicted (defrag move, preemption or drain); its allocation is released separately."""

    subject: ClassVar[str] = "tf.evt.pod.evicted"
    producers: ClassVar[tuple[str, ...]] = (
        "defrag-planner (through the ledger outbox)",
        "scheduler (through the ledger outbox)",
    )

    workload: WorkloadRef = Field(description="the workload this is about")
    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    pool: str = Field(description="GPU pool name")
    by: Literal["defrag", "preemption", "drain"] = Field(description="what evicted it")
    reason: str = Field(description="why, in words a user can act on")
    allocation_id: UUID | None = Field(default=None, description="the ledger allocation, if any")
    campaign_id: UUID | None = Field(default=None, description="the campaign, when one caused it")
    preemptor: WorkloadRef | None = Field(default=None, description="the workload that needed the room")


class NodeDrained(Event):
    """Every GPU workload left a node during a campaign; the node is free."""

    subject: ClassVar[str] = "tf.evt.node.drained"
    producers: ClassVar[tuple[str, ...]] = ("defrag-planner",)

    node: NodeName = Field(description="Kubernetes node name (or the local node's name)")
    pool: str = Field(description="GPU pool name")
    campaign_id: UUID | None = Field(default=None, description="the campaign, when one caused it")
    pods_moved: int = Field(ge=0, description="workloads evicted from it and placed elsewhere")


# ------------------------------------------------------------------------------------------ commands


class StartWorker(NodeCommand):
    """Start a command on this node with the GPUs of an allocation already reserved in the ledger.

    The agent checks that the allocation is open, on this node and holds `gpu_uuids`, sets
    `CUDA_VISIBLE_DEVICES` to `gpu_uuids` plus the limit variables, logs the command's output, and
    releases the allocation in the ledger when the process ends. Idempotent per `allocation_id`: a
    redelivery starts nothing new. Sent by operators' tools with the `tfctl` NATS user.
    """

    subject: ClassVar[str] = "tf.cmd.node-agent.start-worker"
    producers: ClassVar[tuple[str, ...]] = ("tfctl",)

    allocation_id: UUID = Field(description="the ledger allocation")
    workload: WorkloadRef = Field(description="the workload this is about")
    gpu_uuids: tuple[str, ...] = Field(min_length=1, description="CUDA_VISIBLE_DEVICES, in order")
    argv: tuple[str, ...] = Field(min_length=1, description="the command and its arguments")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    working_dir: str | None = Field(default=None, description="working directory; the agent's if unset")
    tflops_limit_milli: int = Field(ge=0, description="compute limit per GPU, TFLOPS x 1000")
    vram_limit_bytes: int = Field(ge=0, description="VRAM limit per GPU")
    isolation: IsolationMode = Field(default="soft", description="how limits are enforced")


class StopWorker(NodeCommand):
    """Stop the worker of an allocation on this node (signal, then kill after the grace period).

    Idempotent: stopping a worker that already ended does nothing (its allocation was released when it
    ended). Sent by operators' tools with the `tfctl` NATS user.
    """

    subject: ClassVar[str] = "tf.cmd.node-agent.stop-worker"
    producers: ClassVar[tuple[str, ...]] = ("tfctl",)

    allocation_id: UUID = Field(description="the ledger allocation")
    signal: int = Field(default=15, ge=1, le=64, description="POSIX signal number sent first")
    grace_ms: int = Field(default=10_000, ge=0, description="wait before SIGKILL")
    reason: str = Field(description="why, in words a user can act on")


class DiscoverGpus(NodeCommand):
    """Rediscover this node's GPUs now and announce the node and its GPUs again, as at start-up
    (`tf.evt.node.registered`, `tf.evt.gpu.discovered`, `tf.evt.gpu.disappeared` for GPUs gone)."""

    subject: ClassVar[str] = "tf.cmd.node-agent.discover-gpus"
    producers: ClassVar[tuple[str, ...]] = ("tfctl",)


class ReleaseAllocation(FromNodeCommand):
    """Close an allocation of this node in the ledger: the worker a `StartWorker` started on it ended
    (or the agent found it left over after a restart). The node agent holds no database credential, so
    the scheduler releases it, through the ledger (history, `tf.evt.allocation.released` through the
    outbox), and only while the allocation is open and placed on the node of the subject; otherwise it
    logs why and releases nothing. Idempotent: a repeat releases nothing more. `cause` is the
    `StartWorker` command's `event_id` (none after a restart), kept as the release's cause in the ledger.
    """

    subject: ClassVar[str] = "tf.cmd.scheduler.release-allocation"
    producers: ClassVar[tuple[str, ...]] = ("node-agent",)

    allocation_id: UUID = Field(description="the ledger allocation")
    reason: str = Field(min_length=1, description="why it ends, in words; the ledger's release reason")


class StartDefragCampaign(Command):
    """Start a defragmentation campaign for a pool now (`tfctl defrag run --pool NAME --now`)."""

    subject: ClassVar[str] = "tf.cmd.defrag-planner.start-campaign"
    producers: ClassVar[tuple[str, ...]] = ("tfctl",)

    pool: str = Field(description="GPU pool name")
    max_duration_ms: int | None = Field(default=None, gt=0, description="None: the pool's configured window")


# ------------------------------------------------------------------------------------------ registry


class UnknownSubjectError(ValueError):
    """No message class is registered for a subject."""


class InvalidPayloadError(ValueError):
    """A payload is not valid JSON or does not match its subject's schema (a poison message)."""


def _concrete_message_types() -> dict[str, type[Message]]:
    found: dict[str, type[Message]] = {}
    pending: list[type[Message]] = [Message]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        subject = cls.__dict__.get("subject")
        if isinstance(subject, str):
            if subject in found and found[subject] is not cls:
                raise RuntimeError(f"two message classes use subject {subject}: {found[subject]}, {cls}")
            found[subject] = cls
    return dict(sorted(found.items()))


MESSAGE_TYPES: dict[str, type[Message]] = _concrete_message_types()
"""Every concrete message class by its subject (commands to or from a node by their subject without
the node)."""


def message_type_for(subject: str) -> type[Message]:
    """The class of the message published on `subject`; node-suffixed command subjects resolve too."""
    exact = MESSAGE_TYPES.get(subject)
    if exact is not None:
        return exact
    for base, cls in MESSAGE_TYPES.items():
        if issubclass(cls, NodeCommand | FromNodeCommand) and subject.startswith(base + "."):
            return cls
    raise UnknownSubjectError(
        f"no message type is registered for subject {subject!r}; "
        "known subjects are listed in docs/events.md (tfcommon.events.MESSAGE_TYPES)"
    )


def decode(subject: str, data: bytes) -> Message:
    """Validate `data` (JSON) as the message registered for `subject`.

    Raises `UnknownSubjectError` or `InvalidPayloadError`; both messages name the subject and the fix.
    A command to or from a node whose payload names another node than its subject is invalid. Fields
    the model does not know, at any depth, are ignored (a newer producer's optional additions); a
    missing or ill-typed known field is still invalid.
    """
    cls = message_type_for(subject)
    try:
        message = cls.model_validate_json(data, extra="ignore")
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc']) or '(payload)'}: {item['msg']}"
            for item in error.errors()
        )
        raise InvalidPayloadError(
            f"payload on {subject!r} is not a valid {cls.__name__} (schema v{cls.schema_version}): {problems}"
        ) from error
    if message.routing_subject() != subject:
        raise InvalidPayloadError(
            f"payload on {subject!r} is addressed to {message.routing_subject()!r}; "
            "publish node commands on their own node's subject"
        )
    return message


def encode(message: Message) -> bytes:
    """The JSON bytes published for `message` (what `decode` reads back)."""
    return message.model_dump_json().encode()


def derived_event_id(cause: UUID, message_type: type[Message], discriminator: str = "") -> UUID:
    """A deterministic id for the event a handler emits in reaction to `cause`.

    A redelivered trigger yields the same id, so JetStream's duplicate window drops the repeat.
    Use `discriminator` when one cause yields several events of the same type (e.g. the GPU UUID).
    """
    return uuid5(cause, f"{message_type.event_type()}/{discriminator}")
