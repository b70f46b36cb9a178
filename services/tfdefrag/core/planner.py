"""The defrag plan: which nodes to drain, where each workload goes, and why every other node stays.

`plan_defrag(snapshot, config, now)` applies every skip rule (each with its recorded reason), orders
candidates emptiest first, and simulates each drain jointly with the placement core: every workload
on the node must fit on nodes that are already in use and at least as utilized, never on empty
nodes, the node itself, or nodes being drained, with every placement filter respected. Accepted
drains change the simulated cluster, so later candidates see the moves planned before them.
Pure: the shell builds the snapshot from the ledger and the cluster; `now` is an argument.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tfcommon.cluster.model import PodDisruptionBudget
from tfcommon.placement import ClusterView, Node, Placement, PlacementRequest, Profile, place, policy

from tfdefrag.core import markers
from tfdefrag.core.config import DefragConfig

DEFAULT_SIMULATION_POLICY = "CompactFirst"


@dataclass(frozen=True)
class Worker:
    """A GPU workload (pod) on a pool node: what it asked for and what the skip rules read."""

    namespace: str
    name: str
    node: str
    request: PlacementRequest
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime | None = None
    allocation_id: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PoolNode:
    """A node of the pool: its placement view (capacity, usage, filters) and its Kubernetes state.

    `labels`/`annotations` are the Kubernetes node's (markers); `gpu_node_labels` are its GPUNode's
    (`do-not-disrupt`). `native_gpu_pods` lists pods that hold a native `nvidia.com/gpu`.
    """

    node: Node
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    gpu_node_labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True
    cordoned: bool = False
    deleting: bool = False
    created_at: datetime | None = None
    native_gpu_pods: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(frozen=True)
class PoolSnapshot:
    """Everything one plan reads about one pool."""

    pool: str
    nodes: tuple[PoolNode, ...]
    workers: tuple[Worker, ...] = ()
    budgets: tuple[PodDisruptionBudget, ...] = ()


class SkipReason(enum.StrEnum):
    """Why a node is not drained; the value is the stable code in events, the API and the CLI."""

    DO_NOT_DISRUPT = "do-not-disrupt"
    DELETING = "deleting"
    CORDONED = "cordoned"
    NOT_READY = "not-ready"
    MARKED_FOR_DELETION = "marked-for-deletion"
    BEING_DRAINED = "being-drained"
    EARLIER_FAILURE = "earlier-failure"
    EMPTY = "empty"
    ABOVE_THRESHOLD = "above-threshold"
    NATIVE_GPU_POD = "native-gpu-pod"
    NO_WORKERS = "no-workers"
    FRESH_WORKER = "fresh-worker"
    MISSING_PDB = "missing-pdb"
    PDB_BLOCKED = "pdb-blocked"
    RECEIVES_MOVES = "receives-moves"
    UNSCHEDULABLE = "unschedulable"


@dataclass(frozen=True)
class NodeSkip:
    """A node left alone: the reason code and a message a user can act on."""

    node: str
    reason: SkipReason
    message: str


@dataclass(frozen=True)
class Move:
    """One workload leaving the source node and where the simulation placed it."""

    namespace: str
    name: str
    uid: str
    from_node: str
    to_node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    tflops_milli: tuple[int, ...]
    vram_bytes: tuple[int, ...]
    allocation_id: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeDrain:
    """A node to empty, with its GPU use before the drain and one move per workload, in order."""

    node: str
    gpus_in_use: int
    gpus_total: int
    moves: tuple[Move, ...]


@dataclass(frozen=True)
class DefragPlan:
    """Nodes to drain (in order) and every other node with its reason."""

    pool: str
    drains: tuple[NodeDrain, ...]
    skipped: tuple[NodeSkip, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "drains": [
                {
                    "node": drain.node,
                    "gpus_in_use": drain.gpus_in_use,
                    "gpus_total": drain.gpus_total,
                    "moves": [
                        {
                            "pod": move.key,
                            "from": move.from_node,
                            "to": move.to_node,
                            "gpu_uuids": list(move.gpu_uuids),
                            "tflops_milli": list(move.tflops_milli),
                            "vram_bytes": list(move.vram_bytes),
                        }
                        for move in drain.moves
                    ],
                }
                for drain in self.drains
            ],
            "skipped": [
                {"node": skip.node, "reason": skip.reason.value, "message": skip.message}
                for skip in self.skipped
            ],
        }


def gpus_in_use(node: Node) -> int:
    """GPUs with any reservation on them (TensorFusion: "not fully available")."""
    return sum(1 for gpu in node.gpus if not gpu.is_idle)


def _at_least_as_utilized(target: Node, source: Node) -> bool:
    return gpus_in_use(target) * len(source.gpus) >= gpus_in_use(source) * len(target.gpus)


def _percent(node: Node) -> int:
    return gpus_in_use(node) * 100 // len(node.gpus) if node.gpus else 0


def _rule_skip(
    pool_node: PoolNode,
    workers: list[Worker],
    snapshot: PoolSnapshot,
    config: DefragConfig,
    now: datetime,
    failed: Mapping[str, str],
) -> NodeSkip | None:
    name = pool_node.name
    node = pool_node.node

    def skip(reason: SkipReason, message: str) -> NodeSkip:
        return NodeSkip(name, reason, message)

    if markers.is_marked(pool_node.gpu_node_labels, markers.DO_NOT_DISRUPT) or markers.is_marked(
        pool_node.labels, markers.DO_NOT_DISRUPT
    ):
        return skip(SkipReason.DO_NOT_DISRUPT, f"labelled {markers.DO_NOT_DISRUPT}=true on its GPUNode")
    if pool_node.deleting:
        return skip(SkipReason.DELETING, "the node is being deleted")
    if pool_node.cordoned:
        return skip(SkipReason.CORDONED, "the node is cordoned")
    if not pool_node.ready:
        return skip(SkipReason.NOT_READY, "the node is not ready")
    if markers.is_marked(pool_node.labels, markers.SHOULD_DELETE):
        return skip(SkipReason.MARKED_FOR_DELETION, f"labelled {markers.SHOULD_DELETE}=true by compaction")
    if name in failed:
        return skip(SkipReason.EARLIER_FAILURE, f"an earlier attempt in this campaign failed: {failed[name]}")
    if markers.is_marked(pool_node.labels, markers.EVICT_SKIP) and (
        pool_node.annotations.get(markers.EVICT_SKIP_POOL, snapshot.pool) == snapshot.pool
    ):
        reason = pool_node.annotations.get(markers.EVICT_SKIP_REASON, "no reason recorded")
        return skip(SkipReason.EARLIER_FAILURE, f"an earlier eviction failed: {reason}")
    in_use = gpus_in_use(node)
    if not node.gpus or in_use == 0:
        return skip(SkipReason.EMPTY, "no GPU in use; empty nodes are left to compaction")
    threshold = config.utilization_threshold_percent
    if in_use * 100 > threshold * len(node.gpus):
        return skip(
            SkipReason.ABOVE_THRESHOLD,
            f"{in_use}/{len(node.gpus)} GPUs in use ({_percent(node)}%) is above the {threshold}% threshold",
        )
    if pool_node.native_gpu_pods:
        return skip(
            SkipReason.NATIVE_GPU_POD,
            f"pod {pool_node.native_gpu_pods[0]} uses a native GPU resource; the node can never be emptied",
        )
    if not workers:
        return skip(SkipReason.NO_WORKERS, "GPUs are in use but no worker pod is known on the node")
    for worker in workers:
        if worker.created_at is None or now - worker.created_at < config.max_duration:
            return skip(
                SkipReason.FRESH_WORKER,
                f"worker {worker.key} is younger than maxDuration ({config.max_duration})",
            )
    for worker in workers:
        covering = [budget for budget in snapshot.budgets if _covers(budget, worker)]
        if not covering:
            return skip(
                SkipReason.MISSING_PDB,
                f"worker {worker.key} is not covered by a PodDisruptionBudget with a non-empty selector; "
                "add one so the workload tolerates a move",
            )
        blocked = next((budget for budget in covering if budget.disruptions_allowed <= 0), None)
        if blocked is not None:
            return skip(
                SkipReason.PDB_BLOCKED,
                f"PodDisruptionBudget {blocked.namespace}/{blocked.name} allows no disruption now "
                f"(worker {worker.key})",
            )
    return None


def _covers(budget: PodDisruptionBudget, worker: Worker) -> bool:
    return (
        budget.namespace == worker.namespace
        and budget.selector is not None
        and not budget.selector.is_empty
        and budget.selector.matches(worker.labels)
    )


def _demand(worker: Worker) -> int:
    request = worker.request
    per_gpu = request.gpu_share or (request.tflops_milli + request.vram_bytes // 1_000_000)
    return request.gpu_count * per_gpu


def plan_defrag(
    snapshot: PoolSnapshot,
    config: DefragConfig,
    now: datetime,
    *,
    failed: Mapping[str, str] | None = None,
    draining: Iterable[str] = (),
    profile: Profile | None = None,
    max_drains: int | None = None,
) -> DefragPlan:
    """Plan one campaign over `snapshot`.

    `failed` maps nodes that failed earlier in this campaign to the reason; `draining` names nodes
    already being drained (never targets). `max_drains` stops after that many accepted drains (the
    executor plans one node at a time); the rest of the candidates are then not reported.
    """
    failed = failed or {}
    draining = set(draining)
    profile = profile or policy(DEFAULT_SIMULATION_POLICY)
    workers_by_node: dict[str, list[Worker]] = {}
    for worker in snapshot.workers:
        workers_by_node.setdefault(worker.node, []).append(worker)
    state: dict[str, Node] = {pool_node.name: pool_node.node for pool_node in snapshot.nodes}
    by_name = {pool_node.name: pool_node for pool_node in snapshot.nodes}
    excluded = draining | {
        pool_node.name
        for pool_node in snapshot.nodes
        if markers.is_marked(pool_node.labels, markers.DEFRAG_SOURCE)
        or markers.is_marked(pool_node.labels, markers.SHOULD_DELETE)
        or pool_node.cordoned
        or pool_node.deleting
        or not pool_node.ready
    }
    skipped: list[NodeSkip] = []
    candidates: list[PoolNode] = []
    for pool_node in sorted(snapshot.nodes, key=lambda n: n.name):
        if pool_node.name in draining or markers.is_marked(pool_node.labels, markers.DEFRAG_SOURCE):
            skipped.append(NodeSkip(pool_node.name, SkipReason.BEING_DRAINED, "the node is being drained"))
            continue
        rule = _rule_skip(pool_node, workers_by_node.get(pool_node.name, []), snapshot, config, now, failed)
        if rule is None:
            candidates.append(pool_node)
        else:
            skipped.append(rule)
    candidates.sort(key=lambda n: (gpus_in_use(n.node) / len(n.node.gpus), n.name))
    drains: list[NodeDrain] = []
    receivers: set[str] = set()
    for candidate in candidates:
        if max_drains is not None and len(drains) >= max_drains:
            break
        if candidate.name in receivers:
            skipped.append(
                NodeSkip(
                    candidate.name,
                    SkipReason.RECEIVES_MOVES,
                    "it receives workloads from a node drained earlier in this campaign",
                )
            )
            continue
        outcome = simulate_drain(
            candidate.name,
            workers_by_node[candidate.name],
            state,
            excluded | {drain.node for drain in drains},
            profile,
        )
        if isinstance(outcome, NodeSkip):
            skipped.append(outcome)
            continue
        moves, state = outcome
        source = by_name[candidate.name].node
        drains.append(NodeDrain(candidate.name, gpus_in_use(source), len(source.gpus), moves))
        receivers |= {move.to_node for move in moves}
    return DefragPlan(snapshot.pool, tuple(drains), tuple(sorted(skipped, key=lambda s: s.node)))


def simulate_drain(
    source_name: str,
    workers: list[Worker],
    state: Mapping[str, Node],
    excluded: set[str],
    profile: Profile,
) -> tuple[tuple[Move, ...], dict[str, Node]] | NodeSkip:
    """Place every worker of `source_name` on eligible targets, jointly (earlier moves count).

    Returns the moves and the new cluster state, or the `UNSCHEDULABLE` skip that explains which
    workload had no place and why each kind of node was not a target.
    """
    source = state[source_name]
    targets: list[Node] = []
    why_not: dict[str, int] = {}
    for name, node in state.items():
        if name == source_name:
            continue
        reason = _target_exclusion(name, node, source, excluded)
        if reason is None:
            targets.append(node)
        else:
            why_not[reason] = why_not.get(reason, 0) + 1
    view = ClusterView(targets)
    moves: list[Move] = []
    for worker in sorted(workers, key=lambda w: (-_demand(w), w.key)):
        outcome = place(worker.request, view, profile)
        if not isinstance(outcome, Placement):
            not_targets = ", ".join(f"{count} {reason}" for reason, count in sorted(why_not.items()))
            return NodeSkip(
                source_name,
                SkipReason.UNSCHEDULABLE,
                f"no place for worker {worker.key}: {outcome.summary()}"
                + (f"; not targets: {not_targets}" if not_targets else ""),
            )
        view.apply(outcome)
        moves.append(
            Move(
                namespace=worker.namespace,
                name=worker.name,
                uid=worker.uid,
                from_node=source_name,
                to_node=outcome.node,
                gpu_indices=outcome.gpu_indices,
                gpu_uuids=outcome.gpu_uuids,
                tflops_milli=outcome.tflops_milli,
                vram_bytes=outcome.vram_bytes,
                allocation_id=worker.allocation_id,
            )
        )
    new_state = dict(state)
    new_state.update(view.nodes)
    return tuple(moves), new_state


def _target_exclusion(name: str, node: Node, source: Node, excluded: set[str]) -> str | None:
    if name in excluded:
        return "being drained, cordoned, not ready or marked"
    if not node.gpus or gpus_in_use(node) == 0:
        return "empty (moving there frees nothing)"
    if not _at_least_as_utilized(node, source):
        return "less utilized than the source"
    return None
