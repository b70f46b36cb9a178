"""The defrag plan: every skip rule with its recorded reason, joint simulation, smallest first, nodes
that stay as targets before candidates."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from defrag_builders import NOW, a_budget, a_node, a_worker
from tfcommon.cluster.model import LabelSelector
from tfcommon.placement import PlacementRequest
from tfdefrag.core.config import DefragConfig
from tfdefrag.core.planner import DefragPlan, PoolSnapshot, SkipReason, plan_defrag

CONFIG = DefragConfig(enabled=True, timezone="UTC")


def base_snapshot(**changes: Any) -> PoolSnapshot:
    """Node a (1/4 GPUs in use, one worker) can move to node b (3/4 in use)."""
    source = a_node("a", (250, 0, 0, 0))
    target = a_node("b", (750, 750, 750, 0))
    snapshot = PoolSnapshot(
        pool="default",
        nodes=(source, target),
        workers=(a_worker("w1", "a"), a_worker("big-1", "b", 750), a_worker("big-2", "b", 750)),
        budgets=(a_budget(),),
    )
    return replace(snapshot, **changes)


def skip_of(plan: DefragPlan, node: str) -> tuple[SkipReason, str]:
    skip = next(skip for skip in plan.skipped if skip.node == node)
    return skip.reason, skip.message


def test_a_lightly_used_node_is_drained_onto_a_fuller_node() -> None:
    plan = plan_defrag(base_snapshot(), CONFIG, NOW)

    assert [drain.node for drain in plan.drains] == ["a"]
    [move] = plan.drains[0].moves
    assert (move.key, move.from_node, move.to_node, move.gpu_uuids) == ("ml/w1", "a", "b", ("gpu-b-0",))
    assert skip_of(plan, "b")[0] is SkipReason.ABOVE_THRESHOLD


def _with_source(**changes: Any) -> PoolSnapshot:
    snapshot = base_snapshot()
    return replace(snapshot, nodes=(replace(snapshot.nodes[0], **changes), snapshot.nodes[1]))


def _with_worker(**changes: Any) -> PoolSnapshot:
    snapshot = base_snapshot()
    return replace(snapshot, workers=(replace(snapshot.workers[0], **changes), *snapshot.workers[1:]))


SKIP_RULES = [
    pytest.param(
        _with_source(gpu_node_labels={"tensor-fusion.ai/do-not-disrupt": "true"}),
        {},
        SkipReason.DO_NOT_DISRUPT,
        "do-not-disrupt=true on its GPUNode",
        id="do-not-disrupt on the GPUNode",
    ),
    pytest.param(_with_source(cordoned=True), {}, SkipReason.CORDONED, "cordoned", id="cordoned"),
    pytest.param(_with_source(deleting=True), {}, SkipReason.DELETING, "being deleted", id="deleting"),
    pytest.param(_with_source(ready=False), {}, SkipReason.NOT_READY, "not ready", id="not ready"),
    pytest.param(
        _with_source(labels={"tensor-fusion.ai/should-delete": "true"}),
        {},
        SkipReason.MARKED_FOR_DELETION,
        "should-delete",
        id="marked should-delete",
    ),
    pytest.param(
        base_snapshot(),
        {"a": "PodDisruptionBudget ml/serve refused the eviction"},
        SkipReason.EARLIER_FAILURE,
        "refused the eviction",
        id="failed earlier in this campaign",
    ),
    pytest.param(
        _with_source(
            labels={"tensor-fusion.ai/defrag-evict-skip": "true"},
            annotations={
                "tensor-fusion.ai/defrag-evict-skip-pool": "default",
                "tensor-fusion.ai/defrag-evict-skip-reason": "replacement not placed",
            },
        ),
        {},
        SkipReason.EARLIER_FAILURE,
        "replacement not placed",
        id="evict-skip marker for this pool",
    ),
    pytest.param(
        base_snapshot(nodes=(a_node("a", (0, 0, 0, 0)), a_node("b", (750, 750, 750, 0))), workers=()),
        {},
        SkipReason.EMPTY,
        "left to compaction",
        id="empty",
    ),
    pytest.param(
        base_snapshot(nodes=(a_node("a", (250, 250, 0, 0)), a_node("b", (750, 750, 750, 0)))),
        {},
        SkipReason.ABOVE_THRESHOLD,
        "2/4 GPUs in use (50%) is above the 40% threshold",
        id="above the threshold",
    ),
    pytest.param(
        _with_source(native_gpu_pods=("ml/legacy",)),
        {},
        SkipReason.NATIVE_GPU_POD,
        "pod ml/legacy uses a native GPU resource",
        id="native nvidia.com/gpu pod",
    ),
    pytest.param(
        base_snapshot(workers=()), {}, SkipReason.NO_WORKERS, "no worker pod", id="GPUs used, no worker known"
    ),
    pytest.param(
        _with_worker(gang="ml/train"),
        {},
        SkipReason.GANG_MEMBER,
        "worker ml/w1 is a member of gang ml/train; moving it would split the gang",
        id="gang member (never split a gang)",
    ),
    pytest.param(
        _with_worker(created_at=NOW - timedelta(minutes=30)),
        {},
        SkipReason.FRESH_WORKER,
        "worker ml/w1 is younger than maxDuration",
        id="worker younger than maxDuration",
    ),
    pytest.param(
        base_snapshot(budgets=()),
        {},
        SkipReason.MISSING_PDB,
        "not covered by a PodDisruptionBudget",
        id="no budget",
    ),
    pytest.param(
        base_snapshot(budgets=(replace(a_budget(), selector=LabelSelector()),)),
        {},
        SkipReason.MISSING_PDB,
        "add one",
        id="budget with an empty selector counts as none",
    ),
    pytest.param(
        base_snapshot(budgets=(a_budget(namespace="other"),)),
        {},
        SkipReason.MISSING_PDB,
        "non-empty selector",
        id="budget in another namespace",
    ),
    pytest.param(
        base_snapshot(budgets=(a_budget(allowed=0),)),
        {},
        SkipReason.PDB_BLOCKED,
        "PodDisruptionBudget ml/serve allows no disruption now",
        id="budget allows no disruption",
    ),
    pytest.param(
        base_snapshot(nodes=(a_node("a", (250, 0, 0, 0)), a_node("b", (1000, 1000, 1000, 1000)))),
        {},
        SkipReason.UNSCHEDULABLE,
        "no place for worker ml/w1: 0/1 nodes fit",
        id="no room on any target",
    ),
    pytest.param(
        base_snapshot(nodes=(a_node("a", (250, 0, 0, 0)), a_node("b", (0, 0, 0, 0)))),
        {},
        SkipReason.UNSCHEDULABLE,
        "1 empty (moving there frees nothing)",
        id="never onto an empty node",
    ),
    pytest.param(
        _with_worker(request=PlacementRequest(name="w1", gpu_share=250, gpu_models=frozenset({"A100"}))),
        {},
        SkipReason.UNSCHEDULABLE,
        "0/1 nodes fit",
        id="placement filters respected (GPU model)",
    ),
]


@pytest.mark.parametrize(("snapshot", "failed", "reason", "message"), SKIP_RULES)
def test_each_skip_rule_records_its_reason(
    snapshot: PoolSnapshot, failed: dict[str, str], reason: SkipReason, message: str
) -> None:
    plan = plan_defrag(snapshot, CONFIG, NOW, failed=failed)

    assert plan.drains == ()
    recorded_reason, recorded_message = skip_of(plan, "a")
    assert recorded_reason is reason
    assert message in recorded_message


def test_every_workload_must_fit_jointly() -> None:
    source = a_node("a", (500, 500, 0, 0))
    target = a_node("b", (500, 1000, 1000, 1000))
    snapshot = PoolSnapshot(
        pool="default",
        nodes=(source, target),
        workers=(a_worker("w1", "a", 500), a_worker("w2", "a", 500)),
        budgets=(a_budget(),),
    )

    plan = plan_defrag(snapshot, replace(CONFIG, utilization_threshold_percent=50), NOW)

    assert plan.drains == ()
    assert skip_of(plan, "a")[0] is SkipReason.UNSCHEDULABLE


def test_a_node_being_drained_is_never_a_target() -> None:
    plan = plan_defrag(base_snapshot(), CONFIG, NOW, draining={"b"})

    assert plan.drains == ()
    assert skip_of(plan, "b")[0] is SkipReason.BEING_DRAINED
    assert "being drained" in skip_of(plan, "a")[1]


def test_candidates_go_smallest_first_and_a_receiver_is_not_drained() -> None:
    snapshot = PoolSnapshot(
        pool="default",
        nodes=(a_node("a", (250, 250, 0, 0, 0, 0, 0, 0)), a_node("c", (250, 0, 0, 0))),
        workers=(a_worker("w1", "a"), a_worker("w2", "a"), a_worker("w3", "c")),
        budgets=(a_budget(),),
    )

    plan = plan_defrag(snapshot, CONFIG, NOW)

    assert [drain.node for drain in plan.drains] == ["c"]
    assert {move.to_node for move in plan.drains[0].moves} == {"a"}
    assert skip_of(plan, "a")[0] is SkipReason.RECEIVES_MOVES


def test_a_full_small_node_drains_into_a_bigger_less_utilized_node() -> None:
    snapshot = PoolSnapshot(
        pool="default",
        nodes=(a_node("small", (1000,)), a_node("big", (1000, 1000, 1000, 1000, 0, 0, 0, 0))),
        workers=(a_worker("whole", "small", 1000), *(a_worker(f"b{i}", "big", 1000) for i in range(4))),
        budgets=(a_budget(),),
    )

    plan = plan_defrag(snapshot, replace(CONFIG, utilization_threshold_percent=100), NOW)

    assert [drain.node for drain in plan.drains] == ["small"]
    assert plan.drains[0].moves[0].to_node == "big"


def test_nodes_that_stay_receive_before_candidates_still_to_come() -> None:
    """x's pod would pack best onto candidate y; it goes to f, which stays (its worker is fresh), so
    that y can be drained as well."""
    snapshot = PoolSnapshot(
        pool="default",
        nodes=(
            a_node("x", (250, 0)),
            a_node("y", (750, 0, 0, 0)),
            a_node("f", (250, 0, 0, 0)),
        ),
        workers=(
            a_worker("wx", "x"),
            a_worker("wy", "y", 750),
            a_worker("wf", "f", created_at=NOW - timedelta(minutes=1)),
        ),
        budgets=(a_budget(),),
    )

    plan = plan_defrag(snapshot, replace(CONFIG, utilization_threshold_percent=60), NOW)

    assert [drain.node for drain in plan.drains] == ["x", "y"]
    assert {move.to_node for drain in plan.drains for move in drain.moves} == {"f"}
    assert skip_of(plan, "f")[0] is SkipReason.FRESH_WORKER


def test_the_plan_serialises_moves_and_reasons() -> None:
    document = plan_defrag(base_snapshot(), CONFIG, NOW).as_dict()

    assert document["drains"][0]["moves"][0] == {
        "pod": "ml/w1",
        "from": "a",
        "to": "b",
        "gpu_uuids": ["gpu-b-0"],
        "tflops_milli": [247_250],
        "vram_bytes": [250 * 80 * (1 << 30) // 1000],
    }
    assert document["skipped"][0]["reason"] == "above-threshold"
