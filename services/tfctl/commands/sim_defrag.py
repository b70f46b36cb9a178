"""`tfctl sim defrag`: fill an openb cluster, let pods depart, run defrag campaigns, compare them with
the most nodes any campaign could free.

Protocol: place shuffled GPU pods (seeded) with the default policy until `fill` x GPU capacity is
requested; remove a random `depart` share of the placed pods. The pods left form apps: pods of one
request shape in placement order, a seeded `APP_SIZES` of them per app. Two budget settings:

- `apps` (the headline): one PodDisruptionBudget per app allowing one disruption at a time
  (maxUnavailable 1), so budgets allow fewer disruptions than the app has pods; a seeded
  `DEGRADED_APPS` share of the apps has a replica not ready and allows none;
- `per_pod`: one budget per pod allowing one disruption (the protocol before the apps).

For each, one campaign is planned with the planner core at the default threshold and one with every
node a candidate (threshold 100), and each is executed move by move: a replacement takes its planned
target if it still fits there, else the default policy over the nodes not being drained; one that
fits nowhere is stranded. The executor keeps every budget's count: an eviction takes one disruption
from each budget covering the pod, a replacement that runs gives it back, and an eviction that a
budget has none left for is a PDB violation (the Eviction API would refuse it). Then
`tfdefrag.core.bound.global_bound` bounds the nodes any campaign could free under the same rules
(`bound_kind: "global"`), its search started from the threshold-100 plan.
`defrag_benchmark(...)` is what `make bench` calls. Registered under `tfctl sim` next to `sim replay`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tfcommon.cluster.model import LabelSelector, PodDisruptionBudget
from tfcommon.placement import (
    DEFAULT_POLICY,
    ClusterView,
    Node,
    Placement,
    PlacementRequest,
    PluginArgs,
    Profile,
    place,
    policy,
)
from tfcommon.placement.model import WHOLE_GPU_SHARE
from tfdefrag.core.bound import DefragBound, global_bound
from tfdefrag.core.config import DefragConfig
from tfdefrag.core.planner import (
    BudgetIndex,
    DefragPlan,
    PoolNode,
    PoolSnapshot,
    Worker,
    gpus_in_use,
    plan_defrag,
)

from tfctl.simulation import TraceError, TracePod, build_nodes, read_nodes, read_pods, to_request

NOW = datetime(2026, 1, 1, tzinfo=UTC)
BOUND_TIME_LIMIT_S = 15.0
APP_SIZES = (2, 8)
"""Fewest and most pods per app (drawn uniformly per app)."""
DEGRADED_APPS = 0.1
"""Share of apps whose budget allows no disruption (a replica not ready)."""
ANY_NODE_THRESHOLD = 100
NAMESPACE = "bench"
BUDGET_SETTINGS = ("apps", "per_pod")


@dataclass(frozen=True)
class FilledCluster:
    """The cluster after the fill and the departures: its nodes, the pods on them in placement order
    (name -> request and placement), their apps, the degraded apps, and the policy that placed them."""

    nodes: tuple[Node, ...]
    placed: dict[str, tuple[PlacementRequest, Placement]]
    apps: dict[str, str]
    degraded: frozenset[str]
    profile: Profile


@dataclass(frozen=True)
class CampaignResult:
    """One plan executed move by move."""

    threshold_percent: int
    nodes_freed: int
    moves: int
    stranded_pods: int
    pdb_violations: int
    plan_seconds: float

    def as_json(self) -> dict[str, Any]:
        return {
            "threshold_percent": self.threshold_percent,
            "nodes_freed": self.nodes_freed,
            "moves": self.moves,
            "stranded_pods": self.stranded_pods,
            "pdb_violations": self.pdb_violations,
            "plan_seconds": round(self.plan_seconds, 2),
        }


@dataclass(frozen=True)
class ScenarioResult:
    """One budget setting: the campaign at the default threshold, with every node a candidate, and
    the global bound."""

    budgets: str
    default: CampaignResult
    any_node: CampaignResult
    bound: DefragBound

    def as_json(self) -> dict[str, Any]:
        bound = self.bound
        return {
            "budgets": self.budgets,
            **self.default.as_json(),
            "any_node": self.any_node.as_json(),
            "bound_kind": "global",
            "global_bound_nodes_freed": bound.nodes_freed_bound,
            "bound_best_nodes_freed": bound.best_nodes_freed,
            "bound_best_pods_moved": bound.best_pods_moved,
            "bound_gap": round(bound.gap, 4),
            "bound_optimal": bound.optimal,
            "bound_seconds": round(bound.seconds, 2),
            "drainable_nodes": bound.drainable,
            "freed_share_of_bound": _share(self.default.nodes_freed, bound.nodes_freed_bound),
            "any_node_freed_share_of_bound": _share(self.any_node.nodes_freed, bound.nodes_freed_bound),
        }


@dataclass(frozen=True)
class DefragBenchResult:
    """What one run measured: per budget setting (`BUDGET_SETTINGS`), a `ScenarioResult`."""

    seed: int
    nodes_in_use: int
    pods: int
    apps: int
    degraded_apps: int
    scenarios: dict[str, ScenarioResult]
    seconds: float

    def as_json(self) -> dict[str, Any]:
        """The `apps` setting's figures at the top level, the other settings under their name."""
        headline, *others = self.scenarios.values()
        return {
            "seed": self.seed,
            "nodes_in_use": self.nodes_in_use,
            "pods": self.pods,
            "apps": self.apps,
            "degraded_apps": self.degraded_apps,
            **headline.as_json(),
            **{scenario.budgets: scenario.as_json() for scenario in others},
            "seconds": round(self.seconds, 2),
        }


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `defrag` under the `sim` command that `sim.py` registered (modules register in name order)."""
    sim = subparsers.choices.get("sim")
    if sim is None:
        sim = subparsers.add_parser("sim", help="simulate placement on traces")
        sim.add_subparsers(dest="sim_command", required=True, metavar="SUBCOMMAND")
    commands = next(action for action in sim._actions if isinstance(action, argparse._SubParsersAction))
    register_sim_defrag(commands)


def register_sim_defrag(commands: Any) -> None:
    """Add `defrag` under `tfctl sim` (called from `tfctl sim`'s registration)."""
    parser = commands.add_parser(
        "defrag",
        help="fill an openb cluster, let pods depart, run defrag campaigns, compare with the global bound",
    )
    parser.add_argument(
        "--nodes", type=Path, required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)"
    )
    parser.add_argument("--pods", type=Path, required=True, help="pod list CSV (openb_pod_list_*.csv)")
    parser.add_argument("--fill", type=float, default=0.9, help="share of GPU capacity to request (0..1]")
    parser.add_argument("--depart", type=float, default=0.3, help="share of placed pods that leave [0..1)")
    parser.add_argument("--seed", type=int, default=42, help="seed of the shuffle, departures and apps")
    parser.add_argument(
        "--bound-time-limit",
        type=float,
        default=BOUND_TIME_LIMIT_S,
        help=f"seconds CP-SAT may search per budget setting ({BOUND_TIME_LIMIT_S:g})",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=handle_sim_defrag)


def handle_sim_defrag(args: argparse.Namespace) -> int:
    if not 0 < args.fill <= 1:
        print(f"--fill is {args.fill}; use a share of capacity in (0, 1], e.g. 0.9", file=sys.stderr)
        return 2
    if not 0 <= args.depart < 1:
        print(f"--depart is {args.depart}; use a share of pods in [0, 1), e.g. 0.3", file=sys.stderr)
        return 2
    if not args.bound_time_limit > 0:
        print(
            f"--bound-time-limit is {args.bound_time_limit}; use a number of seconds > 0, e.g. 15",
            file=sys.stderr,
        )
        return 2
    try:
        result = defrag_benchmark(
            args.nodes,
            args.pods,
            fill=args.fill,
            depart=args.depart,
            seed=args.seed,
            bound_time_limit_s=args.bound_time_limit,
        )
    except TraceError as error:
        print(str(error), file=sys.stderr)
        return 2
    document = result.as_json()
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        _print_flat(document)
    return 0


def _print_flat(document: dict[str, Any], prefix: str = "") -> None:
    for key, value in document.items():
        if isinstance(value, dict):
            _print_flat(value, f"{prefix}{key}.")
        else:
            print(f"{prefix + key:>40}: {value}")


def defrag_benchmark(
    nodes_csv: Path,
    pods_csv: Path,
    *,
    fill: float = 0.9,
    depart: float = 0.3,
    seed: int = 42,
    bound_time_limit_s: float = BOUND_TIME_LIMIT_S,
) -> DefragBenchResult:
    """One benchmark run (see the module docstring); raises `TraceError` for unreadable traces."""
    started = time.perf_counter()
    filled = fill_cluster(nodes_csv, pods_csv, fill=fill, depart=depart, seed=seed)
    config = DefragConfig(enabled=True, timezone="UTC", max_duration=timedelta(0))
    scenarios = {}
    for budgets in BUDGET_SETTINGS:
        snapshot = snapshot_of(filled, budgets)
        _plan, default = run_campaign(filled, snapshot, config)
        hint, any_node = run_campaign(
            filled, snapshot, replace(config, utilization_threshold_percent=ANY_NODE_THRESHOLD)
        )
        bound = global_bound(snapshot, config, NOW, time_limit_s=bound_time_limit_s, hint=hint)
        scenarios[budgets] = ScenarioResult(budgets, default, any_node, bound)
    return DefragBenchResult(
        seed=seed,
        nodes_in_use=sum(1 for node in filled.nodes if gpus_in_use(node)),
        pods=len(filled.placed),
        apps=len(set(filled.apps.values())),
        degraded_apps=len(filled.degraded),
        scenarios=scenarios,
        seconds=time.perf_counter() - started,
    )


def fill_cluster(nodes_csv: Path, pods_csv: Path, *, fill: float, depart: float, seed: int) -> FilledCluster:
    """The protocol's cluster: filled, departed, its pods grouped into apps (module docstring)."""
    trace_nodes = read_nodes(nodes_csv)
    pods = [pod for pod in read_pods(pods_csv) if pod.gpu_demand]
    if not pods:
        raise TraceError(f"{pods_csv}: no GPU pods; give a pod list with num_gpu > 0 rows")
    nodes = build_nodes(trace_nodes, seed)
    args = PluginArgs.learned_from(
        (to_request(pod) for pod in pods),
        seed=seed,
        max_cpu_milli=max(node.cpu_milli for node in nodes),
        max_gpu_share=WHOLE_GPU_SHARE * max(len(node.gpus) for node in nodes),
    )
    profile = policy(DEFAULT_POLICY, args)
    view = ClusterView(nodes)
    placed = _fill(view, pods, profile, fill, seed)
    rng = random.Random(f"depart/{seed}")
    for name in rng.sample(sorted(placed), int(depart * len(placed))):
        view.release(placed.pop(name)[1])
    apps = _apps(placed, random.Random(f"apps/{seed}"))
    names = sorted(set(apps.values()))
    degraded = frozenset(random.Random(f"degraded/{seed}").sample(names, round(DEGRADED_APPS * len(names))))
    return FilledCluster(tuple(view.nodes.values()), placed, apps, degraded, profile)


def _fill(
    view: ClusterView, pods: Sequence[TracePod], profile: Profile, fill: float, seed: int
) -> dict[str, tuple[PlacementRequest, Placement]]:
    capacity = WHOLE_GPU_SHARE * sum(len(node.gpus) for node in view.nodes.values())
    rng = random.Random(seed)
    requested = 0
    placed: dict[str, tuple[PlacementRequest, Placement]] = {}
    clone = 0
    while requested + min(pod.gpu_demand for pod in pods) <= fill * capacity:
        pod = pods[rng.randrange(len(pods))]
        if requested + pod.gpu_demand > fill * capacity:
            break
        clone += 1
        request = to_request(pod, f"{pod.name}-{clone}")
        requested += pod.gpu_demand
        outcome = place(request, view, profile)
        if isinstance(outcome, Placement):
            view.apply(outcome)
            placed[request.name] = (request, outcome)
    return placed


def _apps(placed: dict[str, tuple[PlacementRequest, Placement]], rng: random.Random) -> dict[str, str]:
    """Pod name -> app: pods of one request shape in placement order, a drawn `APP_SIZES` per app."""
    apps: dict[str, str] = {}
    open_apps: dict[tuple[object, ...], tuple[str, int]] = {}
    count = 0
    for name, (request, _placement) in placed.items():
        app, room = open_apps.get(request.key, ("", 0))
        if room == 0:
            count += 1
            app, room = f"app-{count}", rng.randint(*APP_SIZES)
        apps[name] = app
        open_apps[request.key] = (app, room - 1)
    return apps


def snapshot_of(filled: FilledCluster, budgets: str) -> PoolSnapshot:
    """The planner's view of `filled` with the budgets of one setting (`BUDGET_SETTINGS`)."""
    if budgets not in BUDGET_SETTINGS:
        raise ValueError(f"budgets is {budgets!r}; use one of {', '.join(BUDGET_SETTINGS)}")
    workers = tuple(
        Worker(
            namespace=NAMESPACE,
            name=name,
            node=placement.node,
            request=request,
            uid=name,
            labels={"app": filled.apps[name], "pod": name},
            created_at=NOW - timedelta(days=1),
        )
        for name, (request, placement) in sorted(filled.placed.items())
    )
    if budgets == "apps":
        pdbs = tuple(
            _budget(app, "app", 0 if app in filled.degraded else 1)
            for app in sorted(set(filled.apps.values()))
        )
    else:
        pdbs = tuple(_budget(name, "pod", 1) for name in sorted(filled.placed))
    return PoolSnapshot(
        pool="default",
        nodes=tuple(PoolNode(node=node) for node in filled.nodes),
        workers=workers,
        budgets=pdbs,
    )


def _budget(selected: str, label: str, allowed: int) -> PodDisruptionBudget:
    return PodDisruptionBudget(
        namespace=NAMESPACE,
        name=f"{label}-{selected}",
        selector=LabelSelector(match_labels={label: selected}),
        disruptions_allowed=allowed,
    )


def run_campaign(
    filled: FilledCluster, snapshot: PoolSnapshot, config: DefragConfig
) -> tuple[DefragPlan, CampaignResult]:
    """Plan one campaign over `snapshot` with the planner core and execute it over a copy of `filled`."""
    started = time.perf_counter()
    plan = plan_defrag(snapshot, config, NOW)
    seconds = time.perf_counter() - started
    return plan, execute(filled, snapshot, plan, config.utilization_threshold_percent, seconds)


def execute(
    filled: FilledCluster,
    snapshot: PoolSnapshot,
    plan: DefragPlan,
    threshold_percent: int,
    plan_seconds: float = 0.0,
) -> CampaignResult:
    """Execute `plan` move by move over a copy of `filled`, counting disruptions against the budgets
    of `snapshot` (module docstring)."""
    view = ClusterView(filled.nodes)
    placed = dict(filled.placed)
    budgets = BudgetIndex(snapshot.budgets)
    workers = {worker.name: worker for worker in snapshot.workers}
    left = {(budget.namespace, budget.name): budget.disruptions_allowed for budget in snapshot.budgets}
    draining = {drain.node for drain in plan.drains}
    stranded = moves = violations = freed = 0
    for drain in plan.drains:
        for move in drain.moves:
            request, old = placed[move.name]
            covering = [(budget.namespace, budget.name) for budget in budgets.covering(workers[move.name])]
            if any(left[key] <= 0 for key in covering):
                violations += 1
            for key in covering:
                left[key] -= 1
            view.release(old)
            moves += 1
            outcome = place(request, [view.nodes[move.to_node]], filled.profile)
            if not isinstance(outcome, Placement):
                others = [node for name, node in view.nodes.items() if name not in draining]
                outcome = place(request, others, filled.profile)
            if isinstance(outcome, Placement):
                view.apply(outcome)
                placed[move.name] = (request, outcome)
                for key in covering:
                    left[key] += 1
            else:
                stranded += 1
                del placed[move.name]
        if not gpus_in_use(view.nodes[drain.node]):
            freed += 1
    return CampaignResult(threshold_percent, freed, moves, stranded, violations, plan_seconds)


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None
