"""`tfctl sim replay --learn online`: each pod is placed with a target learned only from the pods that
arrived before it, as the scheduler learns; `--learn trace` learns from the whole pod list up front."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tfcommon.placement import Placement, PluginArgs, TargetWorkload, WorkloadClass
from tfctl.main import main
from tfctl.simulation import (
    OnlineLearning,
    TraceNode,
    TracePod,
    build_nodes,
    learning_for,
    place_arrivals,
    to_request,
)

NODES = [TraceNode(f"node-{i}", 64_000, 262_144, 4, "V100M32") for i in range(6)]
PAST = [
    TracePod(f"small-{i}", 2_000, 8_192, 1, share, "") for i, share in enumerate((250, 500, 250, 500) * 4)
]
FUTURE = [TracePod(f"whole-{i}", 8_000, 16_384, 1, 1000, "") for i in range(16)]


def targets_each_pod_met(learn: str, stream: list[TracePod], known: list[TracePod]) -> list[TargetWorkload]:
    nodes = build_nodes(NODES, 42)
    learning = learning_for(learn, "tfpool", known, nodes, 42)
    met = []
    for _pod, _outcome, _view in place_arrivals(nodes, [(pod.name, pod) for pod in stream], learning):
        met.append(learning.args.target)
    return met


def test_online_learning_never_sees_the_pods_still_to_come() -> None:
    alone = targets_each_pod_met("online", PAST, PAST)
    with_future = targets_each_pod_met("online", PAST + FUTURE, PAST + FUTURE)

    assert with_future[: len(PAST)] == alone
    assert all(
        WorkloadClass.of(to_request(FUTURE[0])) not in dict(target.classes)
        for target in with_future[: len(PAST)]
    )


def test_learning_from_the_whole_trace_does_see_them() -> None:
    """The same comparison for the paper's protocol, so the test above can fail."""
    alone = targets_each_pod_met("trace", PAST, PAST)
    with_future = targets_each_pod_met("trace", PAST + FUTURE, PAST + FUTURE)

    assert with_future[: len(PAST)] != alone


def test_the_first_pod_meets_an_empty_target_and_later_ones_the_arrived_mix() -> None:
    met = targets_each_pod_met("online", PAST, PAST)
    arrived_classes = [WorkloadClass.of(to_request(pod)) for pod in PAST]

    assert met[0].classes == ()
    assert dict(met[1].classes) == {arrived_classes[0]: pytest.approx(1.0)}
    assert set(dict(met[-1].classes)) == set(arrived_classes)


def test_online_learning_places_the_past_alike_whatever_comes_after() -> None:
    nodes = build_nodes(NODES, 42)
    past = [(pod.name, pod) for pod in PAST]
    alone = [
        outcome
        for _pod, outcome, _view in place_arrivals(nodes, past, OnlineLearning("tfpool", PluginArgs(seed=42)))
    ]
    followed = [
        outcome
        for _pod, outcome, _view in place_arrivals(
            nodes, past + [(pod.name, pod) for pod in FUTURE], OnlineLearning("tfpool", PluginArgs(seed=42))
        )
    ]

    assert followed[: len(PAST)] == alone
    assert all(isinstance(outcome, Placement) for outcome in alone)


def test_the_command_replays_with_online_learning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(f"{n.name},64000,262144,4,V100M32\n" for n in NODES)
    )
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
        + "".join(f"{p.name},{p.cpu_milli},{p.memory_mib},1,{p.gpu_milli}\n" for p in PAST + FUTURE)
    )

    argv = ["sim", "replay", "--nodes", str(nodes), "--pods", str(pods), "--policy", "tfpool"]
    code = main([*argv, "--learn", "online", "--json", "--no-progress"])

    run = json.loads(capsys.readouterr().out)
    assert code == 0
    assert run["learn"] == "online"
    assert run["targets_learned"] >= 3
