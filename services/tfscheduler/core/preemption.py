"""Preemption: which lower-priority workloads to evict, all on one node, so a pending one fits.

Pure. Priority is the PriorityClass value, then the QoS level (`critical` > `high` > `medium` > `low`).
Only workloads of strictly lower priority are candidates; never one inside its `eviction-protection`
window, never one whose disruption budget allows no disruption. On each node the victims are taken
lowest QoS first, then youngest, until the request fits; victims that turn out unnecessary are given
back. Among nodes the cheapest set wins: lowest highest-victim priority, then the smallest priority
sum, then the fewest victims, then the node name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from tfcommon.events import WorkloadRef
from tfcommon.placement import ClusterView, Node, Placement, PlacementRequest, Profile, place

QOS_RANK: Mapping[str, int] = {"low": 0, "medium": 1, "high": 2, "critical": 3}


@dataclass(frozen=True, order=True)
class Priority:
    """Orders workloads: the PriorityClass value first, then the QoS rank."""

    value: int
    qos_rank: int

    @classmethod
    def of(cls, priority_class_value: int, qos: str) -> Priority:
        return cls(priority_class_value, QOS_RANK.get(qos, QOS_RANK["medium"]))


@dataclass(frozen=True)
class Candidate:
    """A running workload that preemption might evict, with what it holds on its node."""

    allocation_id: object
    workload: WorkloadRef
    priority: Priority
    created_at: datetime
    holding: Placement
    protected_until: datetime | None = None
    disruption_allowed: bool = True

    @property
    def node(self) -> str:
        return self.holding.node


@dataclass(frozen=True)
class PreemptionPlan:
    """Evict `victims` (all on `node`), then reserve `placement` for the preemptor."""

    node: str
    victims: tuple[Candidate, ...]
    placement: Placement


@dataclass(frozen=True)
class NoPreemption:
    """Preemption cannot help; `reason` says why, in words a user can act on."""

    reason: str


def _eviction_order(candidate: Candidate) -> tuple[int, int, float]:
    return (candidate.priority.qos_rank, candidate.priority.value, -candidate.created_at.timestamp())


def _fits(request: PlacementRequest, node: Node, profile: Profile) -> Placement | None:
    outcome = place(request, [node], profile)
    return outcome if isinstance(outcome, Placement) else None


def _plan_on_node(
    request: PlacementRequest, node: Node, victims: list[Candidate], profile: Profile
) -> tuple[tuple[Candidate, ...], Placement] | None:
    view = ClusterView([node])
    chosen: list[Candidate] = []
    placement: Placement | None = None
    for victim in victims:
        view.release(victim.holding)
        chosen.append(victim)
        placement = _fits(request, view.nodes[node.name], profile)
        if placement is not None:
            break
    if placement is None:
        return None
    # Give back victims whose eviction the request does not need (most valuable first).
    for victim in sorted(chosen, key=_eviction_order, reverse=True):
        if len(chosen) == 1:
            break
        view.apply(victim.holding)
        still = _fits(request, view.nodes[node.name], profile)
        if still is None:
            view.release(victim.holding)
        else:
            chosen.remove(victim)
            placement = still
    return tuple(sorted(chosen, key=_eviction_order)), placement


def plan_preemption(
    request: PlacementRequest,
    priority: Priority,
    nodes: Mapping[str, Node],
    candidates: Iterable[Candidate],
    profile: Profile,
    now: datetime,
) -> PreemptionPlan | NoPreemption:
    """The cheapest set of victims on one node that lets `request` fit, or why there is none."""
    by_node: dict[str, list[Candidate]] = {}
    protected = blocked_by_budget = 0
    for candidate in candidates:
        if candidate.priority >= priority:
            continue
        if candidate.protected_until is not None and now < candidate.protected_until:
            protected += 1
            continue
        if not candidate.disruption_allowed:
            blocked_by_budget += 1
            continue
        by_node.setdefault(candidate.node, []).append(candidate)
    best: tuple[tuple[object, ...], PreemptionPlan] | None = None
    for node_name in sorted(by_node):
        node = nodes.get(node_name)
        if node is None or node.cordoned:
            continue
        found = _plan_on_node(request, node, sorted(by_node[node_name], key=_eviction_order), profile)
        if found is None:
            continue
        victims, placement = found
        cost = (
            max(victim.priority for victim in victims),
            sum(victim.priority.value for victim in victims),
            sum(victim.priority.qos_rank for victim in victims),
            len(victims),
            node_name,
        )
        if best is None or cost < best[0]:
            best = (cost, PreemptionPlan(node_name, victims, placement))
    if best is not None:
        return best[1]
    details = []
    if protected:
        details.append(f"{protected} inside their eviction-protection window")
    if blocked_by_budget:
        details.append(f"{blocked_by_budget} whose disruption budget allows no disruption")
    if by_node:
        details.append(
            f"evicting the other lower-priority workloads frees too little on {len(by_node)} node(s)"
        )
    if not details:
        return NoPreemption("preemption: no workload of lower priority to evict")
    return NoPreemption("preemption: not possible: lower-priority workloads " + "; ".join(details))
