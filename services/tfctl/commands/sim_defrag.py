"""`tfctl sim defrag`: fill an openb cluster, let pods depart, run one campaign, compare with a bound.

Protocol: place shuffled GPU pods (seeded) with the default policy until `fill` x GPU capacity is
requested; remove a random `depart` share of the placed pods; plan one campaign with the planner core
(no time limit, default threshold) and execute it move by move: a replacement takes its planned
target if it still fits there, else the default policy over the nodes not being drained; one that
fits nowhere is stranded. Every pod has a budget allowing one disruption, given back once its
replacement runs. `bound_nodes_freed` comes from a CP-SAT model (OR-Tools) of the same candidates
with capacity aggregated per GPU model: a relaxation, so it is an upper bound on any plan.
`defrag_benchmark(...)` is what `make bench` calls. Registered under `tfctl sim` next to `sim replay`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tfcommon.cluster.model import LabelRequirement, LabelSelector, PodDisruptionBudget
from tfcommon.placement import (
    DEFAULT_POLICY,
    ClusterView,
    Placement,
    PlacementRequest,
    PluginArgs,
    place,
    policy,
)
from tfcommon.placement.model import WHOLE_GPU_SHARE
from tfdefrag.core.config import DefragConfig
from tfdefrag.core.planner import PoolNode, PoolSnapshot, Worker, gpus_in_use, plan_defrag

from tfctl.simulation import TraceError, TracePod, build_nodes, read_nodes, read_pods, to_request

NOW = datetime(2026, 1, 1, tzinfo=UTC)
BOUND_TIME_LIMIT_S = 20.0


@dataclass(frozen=True)
class DefragBenchResult:
    """What one run measured; `moves_per_bound_pod` = moves / pods the best bound plan had to move."""

    seed: int
    nodes_in_use: int
    nodes_freed: int
    bound_nodes_freed: int
    bound_optimal: bool
    moves: int
    bound_pods_moved: int
    stranded_pods: int
    pdb_violations: int
    seconds: float

    def as_json(self) -> dict[str, Any]:
        ratio = self.moves / self.bound_pods_moved if self.bound_pods_moved else None
        return {
            "seed": self.seed,
            "nodes_in_use": self.nodes_in_use,
            "nodes_freed": self.nodes_freed,
            "bound_nodes_freed": self.bound_nodes_freed,
            "bound_optimal": self.bound_optimal,
            "freed_share_of_bound": (
                round(self.nodes_freed / self.bound_nodes_freed, 4) if self.bound_nodes_freed else None
            ),
            "moves": self.moves,
            "bound_pods_moved": self.bound_pods_moved,
            "moves_per_bound_pod": round(ratio, 4) if ratio is not None else None,
            "stranded_pods": self.stranded_pods,
            "pdb_violations": self.pdb_violations,
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
        help="fill an openb cluster, let pods depart, run one defrag campaign, compare with a bound",
    )
    parser.add_argument(
        "--nodes", type=Path, required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)"
    )
    parser.add_argument("--pods", type=Path, required=True, help="pod list CSV (openb_pod_list_*.csv)")
    parser.add_argument("--fill", type=float, default=0.9, help="share of GPU capacity to request (0..1]")
    parser.add_argument("--depart", type=float, default=0.3, help="share of placed pods that leave [0..1)")
    parser.add_argument("--seed", type=int, default=42, help="seed of the shuffle and the departures")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(handler=handle_sim_defrag)


def handle_sim_defrag(args: argparse.Namespace) -> int:
    if not 0 < args.fill <= 1:
        print(f"--fill is {args.fill}; use a share of capacity in (0, 1], e.g. 0.9", file=sys.stderr)
        return 2
    if not 0 <= args.depart < 1:
        print(f"--depart is {args.depart}; use a share of pods in [0, 1), e.g. 0.3", file=sys.stderr)
        return 2
    try:
        result = defrag_benchmark(args.nodes, args.pods, fill=args.fill, depart=args.depart, seed=args.seed)
    except TraceError as error:
        print(str(error), file=sys.stderr)
        return 2
    document = result.as_json()
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        for key, value in document.items():
            print(f"{key:>22}: {value}")
    return 0


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
    trace_nodes = read_nodes(nodes_csv)
    pods = [pod for pod in read_pods(pods_csv) if pod.gpu_demand]
    started = time.perf_counter()
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
    snapshot = _snapshot(view, placed)
    config = DefragConfig(enabled=True, timezone="UTC", max_duration=timedelta(0))
    plan = plan_defrag(snapshot, config, NOW)
    stranded, moves, violations, freed = _execute(view, plan, placed, profile)
    bound, optimal, bound_moved = pod_bound(snapshot, config, bound_time_limit_s)
    return DefragBenchResult(
        seed=seed,
        nodes_in_use=sum(1 for node in snapshot.nodes if gpus_in_use(node.node)),
        nodes_freed=freed,
        bound_nodes_freed=bound,
        bound_optimal=optimal,
        moves=moves,
        bound_pods_moved=bound_moved,
        stranded_pods=stranded,
        pdb_violations=violations,
        seconds=time.perf_counter() - started,
    )


def _fill(
    view: ClusterView, pods: Sequence[TracePod], profile: Any, fill: float, seed: int
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


def _snapshot(view: ClusterView, placed: dict[str, tuple[PlacementRequest, Placement]]) -> PoolSnapshot:
    workers = tuple(
        Worker(
            namespace="bench",
            name=name,
            node=placement.node,
            request=request,
            uid=name,
            labels={"app": name},
            created_at=NOW - timedelta(days=1),
        )
        for name, (request, placement) in sorted(placed.items())
    )
    return PoolSnapshot(
        pool="default",
        nodes=tuple(PoolNode(node=node) for node in view.nodes.values()),
        workers=workers,
        budgets=(
            PodDisruptionBudget(
                namespace="bench",
                name="every-workload",
                selector=LabelSelector(match_expressions=(LabelRequirement("app", "Exists"),)),
                disruptions_allowed=1,
            ),
        ),
    )


def _execute(
    view: ClusterView, plan: Any, placed: dict[str, tuple[PlacementRequest, Placement]], profile: Any
) -> tuple[int, int, int, int]:
    """Run the plan move by move; returns (stranded, moves, pdb violations, nodes freed)."""
    stranded = moves = violations = freed = 0
    allowed = dict.fromkeys(placed, 1)
    for drain in plan.drains:
        draining = {d.node for d in plan.drains}
        for move in drain.moves:
            request, old = placed[move.name]
            if allowed[move.name] <= 0:
                violations += 1
            allowed[move.name] -= 1
            view.release(old)
            moves += 1
            target = view.nodes[move.to_node]
            outcome = place(request, [target], profile)
            if not isinstance(outcome, Placement):
                others = [node for name, node in view.nodes.items() if name not in draining]
                outcome = place(request, others, profile)
            if isinstance(outcome, Placement):
                view.apply(outcome)
                placed[move.name] = (request, outcome)
                allowed[move.name] += 1
            else:
                stranded += 1
                del placed[move.name]
        if not gpus_in_use(view.nodes[drain.node]):
            freed += 1
    return stranded, moves, violations, freed


def pod_bound(snapshot: PoolSnapshot, config: DefragConfig, time_limit_s: float) -> tuple[int, bool, int]:
    """Upper bound on the nodes any plan could free, from CP-SAT: (bound, proven optimal, pods moved
    by the best solution found). Candidates follow the planner's threshold; capacity is relaxed to
    free GPU shares per GPU model (and idle GPUs for whole-GPU pods) on in-use nodes not freed."""
    from ortools.sat.python import cp_model

    in_use = [n.node for n in snapshot.nodes if gpus_in_use(n.node)]
    threshold = config.utilization_threshold_percent
    candidates = [n for n in in_use if gpus_in_use(n) * 100 <= threshold * len(n.gpus)]
    workers_by_node: dict[str, list[Worker]] = {}
    for worker in snapshot.workers:
        workers_by_node.setdefault(worker.node, []).append(worker)
    models = sorted({gpu.model for node in in_use for gpu in node.gpus})
    model = cp_model.CpModel()
    free = {node.name: model.new_bool_var(f"free[{node.name}]") for node in candidates}
    demand_into: dict[str, list[Any]] = {m: [] for m in models}
    whole_into: dict[str, list[Any]] = {m: [] for m in models}
    for node in candidates:
        for worker in workers_by_node.get(node.name, []):
            request = worker.request
            allowed = [m for m in models if not request.gpu_models or m in request.gpu_models]
            choices = [model.new_bool_var(f"{worker.name}->{m}") for m in allowed]
            model.add(sum(choices) == free[node.name])
            share = request.gpu_share or WHOLE_GPU_SHARE
            for choice, m in zip(choices, allowed, strict=True):
                demand_into[m].append(request.gpu_count * share * choice)
                if share == WHOLE_GPU_SHARE:
                    whole_into[m].append(request.gpu_count * choice)
    for m in models:
        room = []
        idle = []
        for node in in_use:
            share = sum(g.free_share for g in node.gpus if g.model == m)
            idle_gpus = sum(1 for g in node.gpus if g.model == m and g.free_share == WHOLE_GPU_SHARE)
            keep = 1 - free[node.name] if node.name in free else 1
            room.append(share * keep)
            idle.append(idle_gpus * keep)
        model.add(sum(demand_into[m]) <= sum(room))
        model.add(sum(whole_into[m]) <= sum(idle))
    model.maximize(sum(free.values()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = 2
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return len(candidates), False, sum(len(workers_by_node.get(n.name, [])) for n in candidates)
    moved = sum(len(workers_by_node.get(name, [])) for name, var in free.items() if solver.value(var))
    return int(solver.best_objective_bound), status == cp_model.OPTIMAL, moved
