"""`tfctl sim defrag` on a small trace: nobody stranded, no budget violated (and a planner that ignored
the budgets would violate them), freed within the global bound."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from tfcommon.cluster.model import LabelRequirement, LabelSelector, PodDisruptionBudget
from tfctl.commands.sim_defrag import NOW, defrag_benchmark, execute, fill_cluster, snapshot_of
from tfctl.main import main
from tfdefrag.core.config import DefragConfig
from tfdefrag.core.planner import plan_defrag

EVERY_NODE = DefragConfig(enabled=True, timezone="UTC", utilization_threshold_percent=100)


def write_trace(folder: Path) -> tuple[Path, Path]:
    nodes = folder / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"node-{i},64000,262144,4,V100M32\n" for i in range(12)),
        encoding="utf-8",
    )
    pods = folder / "pods.csv"
    rows = [
        f"pod-{i},2000,4096,1,{share},,LS,Running,0,0,0\n" for i, share in enumerate((250, 500, 1000) * 10)
    ]
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        + "".join(rows),
        encoding="utf-8",
    )
    return nodes, pods


def test_a_campaign_frees_nodes_without_stranding_or_violating_budgets(tmp_path: Path) -> None:
    nodes, pods = write_trace(tmp_path)

    result = defrag_benchmark(nodes, pods, fill=0.9, depart=0.5, seed=3, bound_time_limit_s=5)

    for scenario in result.scenarios.values():
        for campaign in (scenario.default, scenario.any_node):
            assert campaign.stranded_pods == 0
            assert campaign.pdb_violations == 0
            assert campaign.nodes_freed <= scenario.bound.nodes_freed_bound
            assert campaign.moves >= campaign.nodes_freed
    assert result.degraded_apps >= 1
    assert result.scenarios["apps"].any_node.nodes_freed >= 1


def test_a_planner_that_ignored_the_budgets_would_violate_them(tmp_path: Path) -> None:
    """The apps' budgets allow one disruption at a time and a degraded app's none. A plan made as if
    every pod could move is executed against the real budgets, with the app of a pod it moves degraded."""
    nodes, pods = write_trace(tmp_path)
    filled = fill_cluster(nodes, pods, fill=0.9, depart=0.5, seed=3)
    anything_goes = PodDisruptionBudget(
        namespace="bench",
        name="anything-goes",
        selector=LabelSelector(match_expressions=(LabelRequirement("app", "Exists"),)),
        disruptions_allowed=1,
    )
    careless = plan_defrag(replace(snapshot_of(filled, "apps"), budgets=(anything_goes,)), EVERY_NODE, NOW)
    moved_app = filled.apps[careless.drains[0].moves[0].name]
    filled = replace(filled, degraded=frozenset({moved_app}))
    snapshot = snapshot_of(filled, "apps")

    careful = plan_defrag(snapshot, EVERY_NODE, NOW)

    assert execute(filled, snapshot, careless, 100).pdb_violations >= 1
    assert execute(filled, snapshot, careful, 100).pdb_violations == 0
    assert moved_app not in {filled.apps[move.name] for drain in careful.drains for move in drain.moves}


def test_the_command_prints_the_figures_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)

    argv = [
        "sim",
        "defrag",
        "--nodes",
        str(nodes),
        "--pods",
        str(pods),
        "--seed",
        "3",
        "--bound-time-limit",
        "5",
    ]
    code = main([*argv, "--json"])

    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert document["bound_kind"] == "global"
    assert document["nodes_freed"] <= document["global_bound_nodes_freed"]
    assert {"moves", "stranded_pods", "pdb_violations", "any_node", "bound_gap", "per_pod"} <= set(document)


def test_a_fill_outside_zero_to_one_is_refused_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)

    code = main(["sim", "defrag", "--nodes", str(nodes), "--pods", str(pods), "--fill", "1.5"])

    assert code == 2
    assert "--fill is 1.5; use a share of capacity in (0, 1]" in capsys.readouterr().err
