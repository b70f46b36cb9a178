"""`tfctl sim replay` end to end on a small generated trace in the openb format."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from tfctl.main import main
from tfctl.simulation import read_pods, replay_benchmark

pytestmark = pytest.mark.integration

NODE_HEADER = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]
POD_HEADER = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase"]


def write_trace(folder: Path) -> tuple[Path, Path]:
    rng = random.Random(3)
    nodes = folder / "nodes.csv"
    with nodes.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(NODE_HEADER)
        for i in range(50):
            model = ["G2", "T4", "V100M32"][i % 3]
            writer.writerow([f"node-{i:03d}", 64_000, 262_144, 4, model])
    pods = folder / "pods.csv"
    with pods.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(POD_HEADER)
        for i in range(300):
            num_gpu = rng.choice([0, 1, 1, 1, 2])
            milli = rng.choice([230, 470, 810, 1000]) if num_gpu == 1 else (1000 if num_gpu else 0)
            spec = rng.choice(["", "", "", "T4", "V100M16|V100M32"]) if num_gpu else ""
            writer.writerow(
                [
                    f"pod-{i:04d}",
                    rng.choice([2000, 6000, 12_000]),
                    8192,
                    num_gpu,
                    milli,
                    spec,
                    "LS",
                    "Running",
                ]
            )
    return nodes, pods


def test_replay_prints_one_json_object_per_policy_and_seed_and_draws_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)
    plot = tmp_path / "curve.png"
    argv = ["sim", "replay", "--nodes", str(nodes), "--pods", str(pods), "--json", "--plot", str(plot)]
    argv += ["--policy", "tfpool", "--policy", "bestfit", "--seed", "1", "--seed", "2"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    runs = [json.loads(line) for line in captured.out.splitlines()]
    assert [(run["policy"], run["seed"]) for run in runs] == [
        ("tfpool", 1),
        ("tfpool", 2),
        ("bestfit", 1),
        ("bestfit", 2),
    ]
    for run in runs:
        assert run["gpus"] == 200
        assert 0 < run["allocated_at_100"] <= run["allocated_at_130"] <= 1
        assert run["unallocated_gpus_at_130"] == pytest.approx(200 * (1 - run["allocated_at_130"]), abs=0.1)
        assert 0 <= run["fragmentation_rate_at_90"] <= 1
        assert run["failed_pods"] > 0, "130% of capacity cannot all fit"
        assert run["placements_per_second"] > 0
        assert max(int(percent) for percent in run["curve"]) == 130
        assert all(0 <= value <= 1 for value in run["curve"].values())
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert "pod" in captured.err, "a progress bar on stderr"


def test_replay_prints_a_table_for_people(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = write_trace(tmp_path)
    argv = ["sim", "replay", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--no-progress"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].split()[:4] == ["policy", "seed", "alloc@100", "alloc@130"]
    assert captured.out.splitlines()[1].split()[:2] == ["fgd", "42"]
    assert captured.err == ""


def test_replay_is_reproducible_and_the_benchmark_function_summarizes(tmp_path: Path) -> None:
    nodes, pods = write_trace(tmp_path)
    first = replay_benchmark(nodes, pods, policies=("fgd", "random"), seeds=(5,))
    second = replay_benchmark(nodes, pods, policies=("fgd", "random"), seeds=(5,))
    strip = [
        {k: v for k, v in run.items() if k not in ("seconds", "placements_per_second")}
        for run in first["runs"]
    ]
    assert strip == [
        {k: v for k, v in run.items() if k not in ("seconds", "placements_per_second")}
        for run in second["runs"]
    ]
    assert set(first["summary"]) == {"fgd", "random"}
    assert first["summary"]["fgd"]["allocated_at_130"] == first["runs"][0]["allocated_at_130"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            ("nodes", "sn,cpu_milli,gpu\nx,1,1\n"), "missing columns memory_mib, model", id="node-columns"
        ),
        pytest.param(
            ("pods", ",".join(POD_HEADER) + "\np,1,1,1,0,,LS,Running\n"), "gpu_milli is 0", id="pod-milli"
        ),
        pytest.param(
            ("pods", ",".join(POD_HEADER) + "\np,lots,1,0,0,,LS,Running\n"),
            "cpu_milli is 'lots'",
            id="pod-int",
        ),
    ],
)
def test_a_bad_trace_is_refused_with_the_file_row_and_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str], message: str
) -> None:
    nodes, pods = write_trace(tmp_path)
    target = nodes if change[0] == "nodes" else pods
    target.write_text(change[1])
    assert main(["sim", "replay", "--nodes", str(nodes), "--pods", str(pods), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert str(target) in error
    assert message in error


def test_unknown_policy_and_bad_inflation_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)
    base = ["sim", "replay", "--nodes", str(nodes), "--pods", str(pods), "--no-progress"]
    assert main([*base, "--policy", "tetris"]) == 2
    assert "unknown policy tetris; use one of" in capsys.readouterr().err
    assert main([*base, "--inflate", "0"]) == 2
    assert "--inflate is 0.0" in capsys.readouterr().err
    assert main(["sim", "replay", "--nodes", str(tmp_path / "none.csv"), "--pods", str(pods)]) == 2
    assert "cannot open" in capsys.readouterr().err


def test_arrivals_stop_before_passing_the_inflated_capacity(tmp_path: Path) -> None:
    from tfctl.simulation import arrivals

    _, pods_csv = write_trace(tmp_path)
    pods = read_pods(pods_csv)
    stream = arrivals(pods, 200_000, 1.3, seed=9)
    assert [name for name, _ in stream[: len(pods)]] != [pod.name for pod in pods], "shuffled"
    assert sorted(name for name, _ in stream[: len(pods)]) == sorted(pod.name for pod in pods)
    requested = sum(pod.gpu_demand for _, pod in stream)
    assert 1.3 * 200_000 - 2000 < requested <= 1.3 * 200_000


def test_table_turns_replay_lines_into_the_benchmark_markdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = write_trace(tmp_path)
    argv = ["sim", "replay", "--nodes", str(nodes), "--pods", str(pods), "--json", "--no-progress"]
    assert main([*argv, "--policy", "tfpool", "--policy", "bestfit", "--seed", "1", "--seed", "2"]) == 0
    runs = [{"trace": "default", **json.loads(line)} for line in capsys.readouterr().out.splitlines()]
    results = tmp_path / "results.jsonl"
    results.write_text("\n".join(json.dumps(run) for run in runs) + "\n")
    assert main(["sim", "table", str(results)]) == 0
    table = capsys.readouterr().out
    tfpool = sum(run["allocated_at_130"] for run in runs if run["policy"] == "tfpool") / 2
    assert "| tfpool | 1, 2 | " in table
    assert f"**{100 * tfpool:.2f}%**" in table
    assert "| default | " in table
    assert "95.39%" in table, "the published FGD figure for the default trace"
    results.write_text("{not json\n")
    assert main(["sim", "table", str(results)]) == 2
    assert ":1: not JSON" in capsys.readouterr().err
