"""`tfctl bench kubernetes` at a tiny size (20 pods on 4 KWOK nodes) on a real control plane, Postgres and
NATS: the document has the shape `make bench` relies on, and every pod of each phase was bound, by the
scheduler it names; the caller's `TF_SCHEDULER_*` settings reach the scheduler service. Timings are not
asserted."""

from __future__ import annotations

import json

import pytest
from tfctl.bench_kubernetes import KUBE_SCHEDULER, OUR_SCHEDULER
from tfctl.main import main

pytestmark = pytest.mark.integration

PODS, NODES, GPUS_PER_NODE = 20, 4, 8


def test_every_pod_is_bound_by_the_scheduler_it_names(
    postgres_server_url: str,
    nats_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TF_DATABASE_URL", postgres_server_url)
    monkeypatch.setenv("TF_NATS_URL", nats_url)
    monkeypatch.setenv("TF_SCHEDULER_BIND_CONCURRENCY", "8")
    arguments = ["--pods", str(PODS), "--nodes", str(NODES), "--gpus-per-node", str(GPUS_PER_NODE)]

    code = main(["bench", "kubernetes", *arguments, "--json"])

    assert code == 0
    document = json.loads(capsys.readouterr().out)
    entry = document["targets"]["kubernetes"]
    assert entry["sizes"]["pods"] == PODS
    assert entry["sizes"]["nodes"] == NODES
    result = entry["result"]
    assert result["scheduler_settings"] == {"TF_SCHEDULER_BIND_CONCURRENCY": "8"}, "passed on to the service"
    phases = result["phases"]
    assert list(phases) == ["kube_scheduler_whole", "ours_whole", "ours_fractional"]
    for key, phase in phases.items():
        assert (phase["pods"], phase["bound"], phase["bound_in_api"]) == (PODS, PODS, PODS), key
        assert phase["pods_per_second"] > 0
    kube, whole, fractional = phases.values()
    assert kube["scheduler_names"] == [KUBE_SCHEDULER]
    assert (kube["bound_by_our_service_account"], kube["with_gpu_ids"]) == (0, 0)
    assert kube["most_pods_on_a_node"] <= GPUS_PER_NODE
    for ours in (whole, fractional):
        assert ours["scheduler_names"] == [OUR_SCHEDULER]
        assert ours["bound_by_our_service_account"] == PODS
        assert ours["with_gpu_ids"] == PODS
    assert whole["distinct_gpu_ids"] == PODS  # a whole card each, none given twice
    assert whole["most_pods_on_a_node"] <= GPUS_PER_NODE
    assert fractional["distinct_gpu_ids"] < PODS  # fractional pods share cards
    assert result["ratio_pods_per_second"] == pytest.approx(
        whole["pods_per_second"] / kube["pods_per_second"], rel=0.01
    )
    rates = [found for found in entry["figures"] if found["unit"] == "pods/s"]
    assert [(found["value"], found["baseline_value"]) for found in rates] == [
        (whole["pods_per_second"], kube["pods_per_second"]),
        (fractional["pods_per_second"], kube["pods_per_second"]),
    ]
