"""`tfctl sim defrag` on a small trace: nobody stranded, no budget violated, freed within the bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tfctl.commands.sim_defrag import defrag_benchmark
from tfctl.main import main


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

    assert result.stranded_pods == 0
    assert result.pdb_violations == 0
    assert result.nodes_freed >= 1
    assert result.nodes_freed <= result.bound_nodes_freed
    assert result.moves >= result.nodes_freed


def test_the_command_prints_the_figures_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)

    code = main(["sim", "defrag", "--nodes", str(nodes), "--pods", str(pods), "--seed", "3", "--json"])

    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {"nodes_freed", "moves", "stranded_pods", "pdb_violations", "bound_nodes_freed"} <= set(document)


def test_a_fill_outside_zero_to_one_is_refused_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)

    code = main(["sim", "defrag", "--nodes", str(nodes), "--pods", str(pods), "--fill", "1.5"])

    assert code == 2
    assert "--fill is 1.5; use a share of capacity in (0, 1]" in capsys.readouterr().err
