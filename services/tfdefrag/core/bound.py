"""How many nodes any defrag campaign could free: an upper bound from CP-SAT (OR-Tools).

`global_bound(snapshot, config, now)` maximizes the nodes emptied when every node the skip rules
allow (whatever its utilization: no threshold) may be drained and each of its pods may move to any
node in use that stays, wherever it fits. It keeps the planner's rules: pods move only to empty the
node they are on, never onto an empty or excluded node (cordoned, not ready, being drained,
marked), and nodes whose pods a budget blocks stay. A campaign that moves pods one at a time ends in
such a state, so the optimum of this model bounds what any plan frees.

The model is a relaxation, so its bound stays an upper bound:
- a node's GPUs are counted in thousandths of a card (`_thousandths`, rounded down); items of at
  least `t` thousandths must fit the room of the GPUs with at least `t` free, in share and in
  count, for every size `t` (the per-GPU packing itself is not modelled);
- pods of one request shape are one class, with CPU and memory split into at most
  `CPU_BUCKETS` buckets that count at their smallest pod (exact when a shape has that few sizes); the
  CPU and memory the freed nodes' pods ask for must fit the room left on the kept nodes in total.

CP-SAT stops at its time limit and reports the best solution it found and the best bound it proved;
the gap between them is what the bound still leaves open. A plan given as `hint` starts the search.
Pure: the solver runs in-process with a time limit and no I/O.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from tfcommon.placement import Gpu, Node, PlacementRequest, Profile, policy
from tfcommon.placement.filters import MaxWorkersPerNode
from tfcommon.placement.model import WHOLE_GPU_SHARE

from tfdefrag.core.config import DefragConfig
from tfdefrag.core.planner import (
    DEFAULT_SIMULATION_POLICY,
    DefragPlan,
    PoolSnapshot,
    Worker,
    classify_nodes,
    excluded_targets,
    gpus_in_use,
)

DEFAULT_TIME_LIMIT_S = 20.0
CPU_BUCKETS = 4
"""CPU and memory sizes kept apart per request shape; a shape with more is merged into this many."""


@dataclass(frozen=True)
class DefragBound:
    """The solver's result. `nodes_freed_bound`: no campaign frees more (the best bound proven);
    `best_nodes_freed`: the best solution of the model found within the time limit, which moves
    `best_pods_moved` pods; `optimal`: the two met. `drainable`: in-use nodes the skip rules let be
    drained with no threshold."""

    nodes_in_use: int
    drainable: int
    nodes_freed_bound: int
    best_nodes_freed: int
    best_pods_moved: int
    optimal: bool
    seconds: float

    @property
    def gap(self) -> float:
        """(bound - best solution) / bound: how far the best solution may be from the optimum."""
        if self.nodes_freed_bound <= 0:
            return 0.0
        return (self.nodes_freed_bound - self.best_nodes_freed) / self.nodes_freed_bound


@dataclass(frozen=True)
class _Class:
    """Pods of one shape and CPU/memory bucket: the request with the bucket's smallest CPU and memory."""

    key: tuple[object, ...]
    request: PlacementRequest


def global_bound(
    snapshot: PoolSnapshot,
    config: DefragConfig,
    now: datetime,
    *,
    profile: Profile | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    hint: DefragPlan | None = None,
    workers: int = 2,
) -> DefragBound:
    """Solve the model described in the module docstring over `snapshot` (`config` gives every rule
    but the threshold; `profile` the placement filters, the planner's by default)."""
    from ortools.sat.python import cp_model

    profile = profile or policy(DEFAULT_SIMULATION_POLICY)
    drainable_nodes, _skipped = classify_nodes(
        snapshot, replace(config, utilization_threshold_percent=100), now
    )
    drainable = {pool_node.name for pool_node in drainable_nodes}
    excluded = excluded_targets(snapshot)
    in_use = [pool_node.node for pool_node in snapshot.nodes if gpus_in_use(pool_node.node)]
    class_of = _classes(snapshot.workers)
    pods_on: dict[str, Counter[tuple[object, ...]]] = defaultdict(Counter)
    asked: dict[str, tuple[int, int]] = {}
    for worker in snapshot.workers:
        pods_on[worker.node][class_of[worker.key].key] += 1
        cpu, memory = asked.get(worker.node, (0, 0))
        asked[worker.node] = (cpu + worker.request.cpu_milli, memory + worker.request.memory_bytes)
    classes = {found.key: found for found in class_of.values()}

    model = cp_model.CpModel()
    free = {name: model.new_bool_var(f"free[{name}]") for name in sorted(drainable)}

    def keep(name: str) -> Any:
        return 1 - free[name] if name in free else 1

    moved_in: dict[tuple[object, ...], list[Any]] = defaultdict(list)
    placed: dict[tuple[tuple[object, ...], str], Any] = {}
    for node in in_use:
        if node.name in excluded:
            continue
        taken = _receiver(model, node, classes.values(), profile, keep(node.name))
        for key, variable in taken.items():
            moved_in[key].append(variable)
            placed[key, node.name] = variable
    for key in classes:
        leaving = [
            counts[key] * free[name] for name, counts in pods_on.items() if name in free and counts[key]
        ]
        model.add(sum(moved_in[key]) == sum(leaving))
    kept_cpu = sum(node.free_cpu_milli * keep(node.name) for node in in_use if node.name not in excluded)
    kept_memory = sum(
        node.free_memory_bytes * keep(node.name) for node in in_use if node.name not in excluded
    )
    model.add(sum(asked.get(name, (0, 0))[0] * variable for name, variable in free.items()) <= kept_cpu)
    model.add(sum(asked.get(name, (0, 0))[1] * variable for name, variable in free.items()) <= kept_memory)
    _add_totals_by_size(model, in_use, excluded, free, keep, snapshot.workers, class_of)
    model.maximize(sum(free.values()))
    if hint is not None:
        _add_hint(model, hint, free, placed, class_of)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    solver.parameters.symmetry_level = 0
    solver.parameters.cp_model_presolve = False  # on a pool of 1,000 nodes presolve alone outlasts the limit
    status = solver.solve(model)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    best = {name for name, variable in free.items() if found and solver.value(variable)}
    bound = int(solver.best_objective_bound + 1e-6) if found else len(free)
    return DefragBound(
        nodes_in_use=len(in_use),
        drainable=len(free),
        nodes_freed_bound=bound,
        best_nodes_freed=len(best),
        best_pods_moved=sum(sum(pods_on[name].values()) for name in best),
        optimal=status == cp_model.OPTIMAL,
        seconds=solver.wall_time,
    )


def _classes(workers: Sequence[Worker]) -> dict[str, _Class]:
    """Each worker's class: its request shape (everything but CPU and memory) and a CPU/memory bucket."""
    by_shape: dict[tuple[object, ...], list[Worker]] = defaultdict(list)
    for worker in workers:
        by_shape[worker.request.key[2:]].append(worker)
    class_of: dict[str, _Class] = {}
    for shape, members in by_shape.items():
        sizes = sorted({(w.request.cpu_milli, w.request.memory_bytes) for w in members})
        per_bucket = -(-len(sizes) // CPU_BUCKETS)
        bucket_of = {size: position // per_bucket for position, size in enumerate(sizes)}
        smallest: dict[int, tuple[int, int]] = {}
        for cpu, memory in sizes:
            bucket = bucket_of[cpu, memory]
            low_cpu, low_memory = smallest.get(bucket, (cpu, memory))
            smallest[bucket] = (min(low_cpu, cpu), min(low_memory, memory))
        for worker in members:
            bucket = bucket_of[worker.request.cpu_milli, worker.request.memory_bytes]
            cpu, memory = smallest[bucket]
            request = replace(
                worker.request, name=f"class-{len(class_of)}", cpu_milli=cpu, memory_bytes=memory
            )
            class_of[worker.key] = _Class((shape, bucket), request)
    return class_of


def _thousandths(request: PlacementRequest, gpu: Gpu) -> int:
    """What one pod takes of `gpu` in thousandths, rounded down in TFLOPS and VRAM and the smaller
    kept, so that pods that fit together never sum above the card's `free_share`."""
    if gpu.tflops_milli <= 0 or gpu.vram_bytes <= 0:
        return 0
    by_tflops = request.tflops_on(gpu) * WHOLE_GPU_SHARE // gpu.tflops_milli
    by_vram = request.vram_on(gpu) * WHOLE_GPU_SHARE // gpu.vram_bytes
    return min(by_tflops, by_vram)


def _receiver(
    model: Any, node: Node, classes: Iterable[_Class], profile: Profile, keep: Any
) -> dict[tuple[object, ...], Any]:
    """The pods of each class `node` may take (0 when it is freed) and its capacity constraints."""
    free_shares = [gpu.free_share for gpu in node.gpus]
    taken: dict[tuple[object, ...], Any] = {}
    sizes: dict[tuple[object, ...], tuple[int, int]] = {}
    room_for_pods = 0
    for found in classes:
        request = found.request
        if not all(node_filter.admits(request, node) for node_filter in profile.node_filters):
            continue
        demands = [
            _thousandths(request, gpu)
            for gpu in node.gpus
            if all(f.admits(request, node, gpu) for f in profile.gpu_filters if f.applies(request))
        ]
        if len(demands) < request.gpu_count:
            continue
        demand = min(demands)
        most = _most(node, request, demand, free_shares)
        if most <= 0:
            continue
        taken[found.key] = model.new_int_var(0, most, f"into[{node.name}]")
        sizes[found.key] = (request.gpu_count, demand)
        room_for_pods += most
    if not taken:
        return taken
    requests = {found.key: found.request for found in classes if found.key in taken}
    model.add(
        sum(requests[key].cpu_milli * variable for key, variable in taken.items())
        <= node.free_cpu_milli * keep
    )
    model.add(
        sum(requests[key].memory_bytes * variable for key, variable in taken.items())
        <= node.free_memory_bytes * keep
    )
    worker_limit = next((f.limit for f in profile.node_filters if isinstance(f, MaxWorkersPerNode)), None)
    if worker_limit is not None:
        room_for_pods = min(room_for_pods, max(0, worker_limit - node.workers))
    model.add(sum(taken.values()) <= room_for_pods * keep)
    for size in sorted({demand for _count, demand in sizes.values() if demand > 0}):
        large = [(count, demand, taken[key]) for key, (count, demand) in sizes.items() if demand >= size]
        room = sum(share for share in free_shares if share >= size)
        slots = sum(share // size for share in free_shares)
        model.add(sum(count * demand * variable for count, demand, variable in large) <= room * keep)
        model.add(sum(count * variable for count, _demand, variable in large) <= slots * keep)
    return taken


def _most(node: Node, request: PlacementRequest, demand: int, free_shares: list[int]) -> int:
    """Most pods of `request` the node could take alone, by GPU room, CPU and memory."""
    slots = (
        sum(share // demand for share in free_shares) if demand > 0 else len(free_shares) * WHOLE_GPU_SHARE
    )
    most = slots // max(request.gpu_count, 1)
    if request.cpu_milli > 0:
        most = min(most, node.free_cpu_milli // request.cpu_milli)
    if request.memory_bytes > 0:
        most = min(most, node.free_memory_bytes // request.memory_bytes)
    return most


def _add_totals_by_size(
    model: Any,
    in_use: Sequence[Node],
    excluded: set[str],
    free: dict[str, Any],
    keep: Any,
    workers: Sequence[Worker],
    class_of: dict[str, _Class],
) -> None:
    """The per-node size constraints summed over the pool, for every size: implied by them, but they
    give the solver's linear relaxation the whole picture at once (a much tighter bound early)."""
    receivers = [node for node in in_use if node.name not in excluded]
    gpus = [gpu for node in receivers for gpu in node.gpus]
    if not gpus:
        return
    least: dict[tuple[object, ...], int] = {}
    for found in class_of.values():
        if found.key not in least:
            least[found.key] = min(_thousandths(found.request, gpu) for gpu in gpus)
    leaving: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for worker in workers:
        if worker.node in free:
            leaving[worker.node].append((worker.request.gpu_count, least[class_of[worker.key].key]))
    for size in sorted({demand for demand in least.values() if demand > 0}):
        room = sum(
            keep(node.name) * sum(gpu.free_share for gpu in node.gpus if gpu.free_share >= size)
            for node in receivers
        )
        slots = sum(keep(node.name) * sum(gpu.free_share // size for gpu in node.gpus) for node in receivers)
        model.add(
            sum(
                free[name] * sum(count * demand for count, demand in pods if demand >= size)
                for name, pods in leaving.items()
            )
            <= room
        )
        model.add(
            sum(
                free[name] * sum(count for count, demand in pods if demand >= size)
                for name, pods in leaving.items()
            )
            <= slots
        )


def _add_hint(
    model: Any,
    plan: DefragPlan,
    free: dict[str, Any],
    placed: dict[tuple[tuple[object, ...], str], Any],
    class_of: dict[str, _Class],
) -> None:
    """Start the search from `plan`: its drained nodes freed, each move counted on its target."""
    drained = {drain.node for drain in plan.drains}
    counts: Counter[tuple[tuple[object, ...], str]] = Counter(
        (class_of[move.key].key, move.to_node)
        for drain in plan.drains
        for move in drain.moves
        if move.key in class_of
    )
    for name, variable in free.items():
        model.add_hint(variable, name in drained)
    for slot, variable in placed.items():
        model.add_hint(variable, counts.get(slot, 0))
