"""The global defrag bound: the most nodes any campaign could free, on clusters whose answer is known
by hand, and never below what an exhaustive search (or the planner) frees on small random pools."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from defrag_builders import NOW, a_budget, a_node, a_worker
from tfcommon.placement import PlacementRequest
from tfdefrag.core.bound import global_bound
from tfdefrag.core.config import DefragConfig
from tfdefrag.core.planner import PoolNode, PoolSnapshot, Worker, gpus_in_use, plan_defrag

CONFIG = DefragConfig(enabled=True, timezone="UTC")
EVERY_NODE = replace(CONFIG, utilization_threshold_percent=100)


def a_pool(nodes: tuple[PoolNode, ...], workers: tuple[Worker, ...], **changes: object) -> PoolSnapshot:
    return replace(
        PoolSnapshot(pool="default", nodes=nodes, workers=workers, budgets=(a_budget(),)), **changes
    )


def whole_pods_on_two_small_nodes_and_a_half_empty_big_one() -> PoolSnapshot:
    """s1 and s2 (2 GPUs, one whole pod each) fit into big's four idle GPUs; big's four pods fit
    nowhere (two idle GPUs elsewhere): the answer is 2."""
    return a_pool(
        (a_node("s1", (1000, 0)), a_node("s2", (1000, 0)), a_node("big", (1000,) * 4 + (0,) * 4)),
        (
            a_worker("p1", "s1", 1000),
            a_worker("p2", "s2", 1000),
            *(a_worker(f"b{i}", "big", 1000) for i in range(4)),
        ),
    )


def test_small_nodes_empty_into_the_big_one_and_no_more() -> None:
    bound = global_bound(
        whole_pods_on_two_small_nodes_and_a_half_empty_big_one(), CONFIG, NOW, time_limit_s=10
    )

    assert bound.nodes_freed_bound == 2
    assert bound.best_nodes_freed == 2
    assert bound.optimal
    assert bound.gap == 0
    assert bound.best_pods_moved == 2


def test_the_bound_ignores_the_threshold_the_planner_keeps() -> None:
    snapshot = whole_pods_on_two_small_nodes_and_a_half_empty_big_one()

    at_default = plan_defrag(snapshot, CONFIG, NOW)
    bound = global_bound(snapshot, CONFIG, NOW, time_limit_s=10)

    assert at_default.drains == ()  # 1 of 2 GPUs in use is above the 40% threshold
    assert bound.nodes_freed_bound == 2


def test_room_split_across_cards_does_not_hold_a_pod_larger_than_any_piece() -> None:
    """The target has 4 x 300 thousandths free (1,200 in all): two 300 pods fit, one 500 pod does not."""
    target = a_node("target", (700, 700, 700, 700))
    fillers = tuple(a_worker(f"t{i}", "target", 700) for i in range(4))

    fits = a_pool(
        (a_node("src", (300, 300)), target), (a_worker("a", "src", 300), a_worker("b", "src", 300), *fillers)
    )
    too_large = a_pool((a_node("src", (500, 0)), target), (a_worker("a", "src", 500), *fillers))

    assert global_bound(fits, CONFIG, NOW, time_limit_s=10).nodes_freed_bound == 1
    assert global_bound(too_large, CONFIG, NOW, time_limit_s=10).nodes_freed_bound == 0


def test_an_idle_card_behind_exhausted_cpu_takes_nothing() -> None:
    """big has 2 cores left for pods of 4: only s1 and s2 can take each other's pod, so one frees."""
    snapshot = whole_pods_on_two_small_nodes_and_a_half_empty_big_one()
    busy_cpu = replace(snapshot.nodes[2], node=replace(snapshot.nodes[2].node, used_cpu_milli=62_000))
    with_cpu = tuple(
        replace(worker, request=replace(worker.request, cpu_milli=4_000)) for worker in snapshot.workers
    )

    bound = global_bound(
        replace(snapshot, nodes=(*snapshot.nodes[:2], busy_cpu), workers=with_cpu),
        CONFIG,
        NOW,
        time_limit_s=10,
    )

    assert bound.nodes_freed_bound == 1


def test_a_node_whose_budget_allows_no_disruption_is_not_counted() -> None:
    snapshot = whole_pods_on_two_small_nodes_and_a_half_empty_big_one()
    blocked = replace(
        snapshot,
        workers=tuple(
            replace(worker, labels={"app": "frozen"}) if worker.node == "s1" else worker
            for worker in snapshot.workers
        ),
        budgets=(a_budget(), a_budget("frozen", match={"app": "frozen"}, allowed=0)),
    )

    assert global_bound(blocked, CONFIG, NOW, time_limit_s=10).nodes_freed_bound == 1


def test_pods_never_move_onto_an_empty_node() -> None:
    snapshot = a_pool(
        (a_node("src", (1000, 0)), a_node("empty", (0, 0, 0, 0))), (a_worker("p", "src", 1000),)
    )

    assert global_bound(snapshot, CONFIG, NOW, time_limit_s=10).nodes_freed_bound == 0


def test_the_planners_plan_as_a_hint_is_the_first_solution() -> None:
    snapshot = whole_pods_on_two_small_nodes_and_a_half_empty_big_one()
    plan = plan_defrag(snapshot, EVERY_NODE, NOW)

    bound = global_bound(snapshot, CONFIG, NOW, time_limit_s=10, hint=plan)

    assert len(plan.drains) == 2
    assert bound.best_nodes_freed >= len(plan.drains)


SHARES = (250, 500, 750, 1000)


def a_random_pool(seed: int) -> PoolSnapshot:
    rng = random.Random(seed)
    nodes, workers = [], []
    for n in range(rng.randint(2, 5)):
        gpus = [rng.choice(SHARES) if rng.random() < 0.6 else 0 for _ in range(rng.choice((1, 2, 4)))]
        nodes.append(a_node(f"n{n}", tuple(gpus)))
        workers += [a_worker(f"n{n}-g{i}", f"n{n}", share) for i, share in enumerate(gpus) if share]
    return a_pool(tuple(nodes), tuple(workers))


def most_freed_by_search(snapshot: PoolSnapshot) -> int:
    """Try every set of nodes to empty, packing their pods card by card into the other nodes in use."""
    in_use = [pool_node.node for pool_node in snapshot.nodes if gpus_in_use(pool_node.node)]
    pods_on = {
        node.name: [w.request.gpu_share or 0 for w in snapshot.workers if w.node == node.name]
        for node in in_use
    }
    best = 0
    for size in range(1, len(in_use) + 1):
        for freed in itertools.combinations(in_use, size):
            kept = [node for node in in_use if node not in freed]
            room = [gpu.free_share for node in kept for gpu in node.gpus]
            pods = sorted((share for node in freed for share in pods_on[node.name]), reverse=True)
            if _packs(pods, room):
                best = max(best, size)
    return best


def _packs(pods: list[int], room: list[int]) -> bool:
    if not pods:
        return True
    first, rest = pods[0], pods[1:]
    for index, free in enumerate(room):
        if free >= first and free not in room[:index]:
            room[index] -= first
            if _packs(rest, room):
                room[index] += first
                return True
            room[index] += first
    return False


@pytest.mark.parametrize("seed", range(12))
def test_no_campaign_frees_more_than_the_bound(seed: int) -> None:
    snapshot = a_random_pool(seed)

    bound = global_bound(snapshot, CONFIG, NOW, time_limit_s=10)

    assert bound.optimal
    assert most_freed_by_search(snapshot) <= bound.nodes_freed_bound
    assert len(plan_defrag(snapshot, EVERY_NODE, NOW).drains) <= most_freed_by_search(snapshot)


def test_requests_given_in_tflops_and_vram_are_bounded_too() -> None:
    snapshot = whole_pods_on_two_small_nodes_and_a_half_empty_big_one()
    in_tflops = tuple(
        replace(worker, request=PlacementRequest(name=worker.name, tflops_milli=900_000, vram_bytes=70 << 30))
        for worker in snapshot.workers
    )

    assert (
        global_bound(replace(snapshot, workers=in_tflops), CONFIG, NOW, time_limit_s=10).nodes_freed_bound
        == 2
    )
