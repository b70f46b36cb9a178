"""The defrag plan: which nodes to drain, where each workload goes, and why every other node stays.

`plan_defrag(snapshot, config, now)` applies every skip rule (each with its recorded reason), orders
candidates smallest first (`drain_order`), and simulates each drain jointly with the placement core:
every workload on the node must fit on nodes that are in use, never on empty nodes, the node itself,
or nodes being drained, with every placement filter respected. Nodes that stay anyway are tried
before candidates still to come, which lose their own drain when they receive. Accepted drains change
the simulated cluster, so later candidates see the moves planned before them.
Pure: the shell builds the snapshot from the ledger and the cluster; `now` is an argument.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tfcommon.cluster.model import PodDisruptionBudget
from tfcommon.placement import (
    ClusterView,
    Node,
    Placement,
    PlacementRequest,
    Profile,
    Rejection,
    place,
    policy,
)
from tfcommon.placement.model import WHOLE_GPU_SHARE

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
    gang: str | None = None
    """The gang group key when the pod is a gang member (`tensor-fusion.ai/gang-enabled`): never moved."""

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
    GANG_MEMBER = "gang-member"
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


def used_thousandths(node: Node) -> int:
    """GPU share reserved on the node, in thousandths of a card summed over its GPUs."""
    return sum(WHOLE_GPU_SHARE - gpu.free_share for gpu in node.gpus)


def drain_order(node: Node) -> tuple[int, int, str]:
    """Candidates go smallest first: fewest GPUs, then least share in use, then by name. Freeing a
    node takes its pods' room elsewhere and its own free room away; small nodes cost least of both."""
    return (len(node.gpus), used_thousandths(node), node.name)


def _percent(node: Node) -> int:
    return gpus_in_use(node) * 100 // len(node.gpus) if node.gpus else 0


class BudgetIndex:
    """The disruption budgets of a snapshot, found by the labels they select: `covering(worker)` lists
    those with a non-empty selector that match the worker, without scanning every budget."""

    def __init__(self, budgets: Iterable[PodDisruptionBudget]) -> None:
        self._by_label: dict[tuple[str, str, str], list[PodDisruptionBudget]] = {}
        self._scanned: list[PodDisruptionBudget] = []
        for budget in budgets:
            selector = budget.selector
            if selector is None or selector.is_empty:
                continue
            if selector.match_labels:
                first = min(selector.match_labels.items())
                self._by_label.setdefault((budget.namespace, *first), []).append(budget)
            else:
                self._scanned.append(budget)

    def covering(self, worker: Worker) -> list[PodDisruptionBudget]:
        found = [
            budget
            for label in worker.labels.items()
            for budget in self._by_label.get((worker.namespace, *label), ())
            if _covers(budget, worker)
        ]
        return found + [budget for budget in self._scanned if _covers(budget, worker)]


def _rule_skip(
    pool_node: PoolNode,
    workers: list[Worker],
    budgets: BudgetIndex,
    config: DefragConfig,
    now: datetime,
    failed: Mapping[str, str],
    pool: str,
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
        pool_node.annotations.get(markers.EVICT_SKIP_POOL, pool) == pool
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
    gang_member = next((worker for worker in workers if worker.gang is not None), None)
    if gang_member is not None:
        return skip(
            SkipReason.GANG_MEMBER,
            f"worker {gang_member.key} is a member of gang {gang_member.gang}; moving it would split the "
            "gang, so its node is left alone",
        )
    for worker in workers:
        if worker.created_at is None or now - worker.created_at < config.max_duration:
            return skip(
                SkipReason.FRESH_WORKER,
                f"worker {worker.key} is younger than maxDuration ({config.max_duration})",
            )
    for worker in workers:
        covering = budgets.covering(worker)
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


def _demand(worker: Worker, source: Node) -> int:
    """How large a worker is, to move the largest first; a compute-percent worker counts the TFLOPS its
    percent is of the source node's card."""
    request = worker.request
    tflops = request.tflops_milli
    if request.compute_percent is not None and source.gpus:
        tflops = request.tflops_on(source.gpus[0])
    per_gpu = request.gpu_share or (tflops + request.vram_bytes // 1_000_000)
    return request.gpu_count * per_gpu


def excluded_targets(snapshot: PoolSnapshot, draining: Iterable[str] = ()) -> set[str]:
    """Nodes that never receive a move: being drained (or marked a defrag source), marked for
    deletion, cordoned, being deleted or not ready."""
    return set(draining) | {
        pool_node.name
        for pool_node in snapshot.nodes
        if markers.is_marked(pool_node.labels, markers.DEFRAG_SOURCE)
        or markers.is_marked(pool_node.labels, markers.SHOULD_DELETE)
        or pool_node.cordoned
        or pool_node.deleting
        or not pool_node.ready
    }


def classify_nodes(
    snapshot: PoolSnapshot,
    config: DefragConfig,
    now: datetime,
    *,
    failed: Mapping[str, str] | None = None,
    draining: Iterable[str] = (),
) -> tuple[list[PoolNode], list[NodeSkip]]:
    """The nodes every skip rule lets through (in `drain_order`), and the others with their reason."""
    failed = failed or {}
    draining = set(draining)
    workers_by_node = _workers_by_node(snapshot)
    budgets = BudgetIndex(snapshot.budgets)
    skipped: list[NodeSkip] = []
    candidates: list[PoolNode] = []
    for pool_node in sorted(snapshot.nodes, key=lambda n: n.name):
        if pool_node.name in draining or markers.is_marked(pool_node.labels, markers.DEFRAG_SOURCE):
            skipped.append(NodeSkip(pool_node.name, SkipReason.BEING_DRAINED, "the node is being drained"))
            continue
        workers = workers_by_node.get(pool_node.name, [])
        rule = _rule_skip(pool_node, workers, budgets, config, now, failed, snapshot.pool)
        if rule is None:
            candidates.append(pool_node)
        else:
            skipped.append(rule)
    candidates.sort(key=lambda n: drain_order(n.node))
    return candidates, skipped


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

    Candidates are simulated in `drain_order`. A drain's pods go first to nodes that stay whatever
    the campaign does (in use and not candidates, or candidates that could not be drained or already
    receive), and only when those have no room to candidates still to come, which then receive and
    are not drained themselves. `failed` maps nodes that failed earlier in this campaign to the
    reason; `draining` names nodes already being drained (never targets). `max_drains` stops after
    that many accepted drains (the executor plans one node at a time); the rest of the candidates
    are then not reported.
    """
    profile = profile or policy(DEFAULT_SIMULATION_POLICY)
    candidates, skipped = classify_nodes(snapshot, config, now, failed=failed, draining=draining)
    workers_by_node = _workers_by_node(snapshot)
    targets = _Targets(snapshot, excluded_targets(snapshot, draining), {c.name for c in candidates})
    drains: list[NodeDrain] = []
    for candidate in candidates:
        if max_drains is not None and len(drains) >= max_drains:
            break
        if targets.receives(candidate.name):
            skipped.append(
                NodeSkip(
                    candidate.name,
                    SkipReason.RECEIVES_MOVES,
                    "it receives workloads from a node drained earlier in this campaign",
                )
            )
            continue
        outcome = targets.drain(candidate.name, workers_by_node[candidate.name], profile)
        if isinstance(outcome, NodeSkip):
            skipped.append(outcome)
            continue
        source = candidate.node
        drains.append(NodeDrain(candidate.name, gpus_in_use(source), len(source.gpus), outcome))
    return DefragPlan(snapshot.pool, tuple(drains), tuple(sorted(skipped, key=lambda s: s.node)))


def _workers_by_node(snapshot: PoolSnapshot) -> dict[str, list[Worker]]:
    workers_by_node: dict[str, list[Worker]] = {}
    for worker in snapshot.workers:
        workers_by_node.setdefault(worker.node, []).append(worker)
    return workers_by_node


class _Targets:
    """The simulated cluster a plan places into: nodes that stay (`settled`) and candidates not
    simulated yet (`pending`). A drain is tried on both views and undone when a pod has no place."""

    def __init__(self, snapshot: PoolSnapshot, excluded: set[str], candidates: set[str]) -> None:
        self.excluded = excluded
        self.not_targets: dict[str, int] = {}
        settled: list[Node] = []
        pending: list[Node] = []
        for pool_node in snapshot.nodes:
            node = pool_node.node
            reason = _target_exclusion(pool_node.name, node, excluded)
            if reason is not None:
                self.not_targets[reason] = self.not_targets.get(reason, 0) + 1
            elif pool_node.name in candidates:
                pending.append(node)
            else:
                settled.append(node)
        self.settled = ClusterView(settled)
        self.pending = ClusterView(pending)

    def receives(self, name: str) -> bool:
        """Whether the candidate took moves (or failed) and now stays."""
        return name in self.settled.nodes

    def drain(self, source: str, workers: list[Worker], profile: Profile) -> tuple[Move, ...] | NodeSkip:
        """Place every worker of `source` jointly (earlier moves count); on success the source leaves
        the cluster and the candidates that received are settled, else nothing changes and the
        source is settled (it stays, so later drains may use it)."""
        node = self.pending.nodes[source]
        self.pending.remove(source)
        placed: list[tuple[ClusterView, Placement]] = []
        moves: list[Move] = []
        for worker in sorted(workers, key=lambda w: (-_demand(w, node), w.key)):
            outcome = place(worker.request, self.settled, profile)
            view = self.settled
            if not isinstance(outcome, Placement):
                outcome = place(worker.request, self.pending, profile) if len(self.pending) else outcome
                view = self.pending
            if not isinstance(outcome, Placement):
                for taken_from, placement in reversed(placed):
                    taken_from.release(placement)
                self.settled.upsert(node)
                return self._unschedulable(source, worker, outcome)
            view.apply(outcome)
            placed.append((view, outcome))
            moves.append(_move(worker, source, outcome))
        for view, placement in placed:
            if view is self.pending and placement.node in self.pending.nodes:
                receiver = self.pending.nodes[placement.node]
                self.pending.remove(placement.node)
                self.settled.upsert(receiver)
        return tuple(moves)

    def _unschedulable(self, source: str, worker: Worker, outcome: Rejection) -> NodeSkip:
        not_targets = ", ".join(f"{count} {reason}" for reason, count in sorted(self.not_targets.items()))
        return NodeSkip(
            source,
            SkipReason.UNSCHEDULABLE,
            f"no place for worker {worker.key}: {outcome.summary()}"
            + (f"; not targets: {not_targets}" if not_targets else ""),
        )


def _move(worker: Worker, source: str, placement: Placement) -> Move:
    return Move(
        namespace=worker.namespace,
        name=worker.name,
        uid=worker.uid,
        from_node=source,
        to_node=placement.node,
        gpu_indices=placement.gpu_indices,
        gpu_uuids=placement.gpu_uuids,
        tflops_milli=placement.tflops_milli,
        vram_bytes=placement.vram_bytes,
        allocation_id=worker.allocation_id,
    )


def _target_exclusion(name: str, node: Node, excluded: set[str]) -> str | None:
    if name in excluded:
        return "being drained, cordoned, not ready or marked"
    if not node.gpus or gpus_in_use(node) == 0:
        return "empty (moving there frees nothing)"
    return None
