"""What `tfctl get workloads` prints and how `tfctl delete workload` finds what a user names."""

from __future__ import annotations

from typing import Any

from tfctl.commands.delete import describe
from tfctl.workloads import find, has_controller, in_namespace, render

PLACED = {
    "id": "3f0c2a51-8f0e-4b7e-9a55-0d6c1f7b2a10",
    "namespace": "ml-serving",
    "name": "llm-7c9d8f6b5-x2x7q",
    "owner": "llm",
    "state": "placed",
    "node": "sim-node-1",
    "gpu_uuids": ["gpu-aaaa", "gpu-bbbb"],
    "gpu_count": 2,
    "reason": None,
}
PENDING = {
    "id": "9b1d3c44-2e6f-4a8b-8c3d-5e7f9a1b2c3d",
    "namespace": "default",
    "name": "big",
    "owner": "big",
    "state": "pending",
    "node": None,
    "gpu_uuids": [],
    "gpu_count": 1,
    "reason": "0/2 nodes fit: 1 node cordoned, 1 insufficient VRAM",
}


def test_the_table_shows_node_gpus_and_gpu_ids_of_placed_and_the_reason_of_pending_workloads() -> None:
    lines = render([PLACED, PENDING]).splitlines()

    assert lines[0].split() == ["NAMESPACE", "NAME", "STATE", "NODE", "GPUS", "GPU-IDS", "REASON"]
    assert lines[1].split() == [
        "ml-serving",
        "llm-7c9d8f6b5-x2x7q",
        "placed",
        "sim-node-1",
        "2",
        "gpu-aaaa,gpu-bbbb",
        "-",
    ]
    assert lines[2].split()[:6] == ["default", "big", "pending", "-", "1", "-"]
    assert lines[2].endswith("0/2 nodes fit: 1 node cordoned, 1 insufficient VRAM")
    assert lines[1].index("placed") == lines[0].index("STATE"), "columns are aligned"


def test_no_workloads_says_how_to_make_one() -> None:
    assert "tfctl submit" in render([])


def test_a_name_is_looked_up_in_its_namespace_and_an_id_in_every_namespace() -> None:
    listed: list[dict[str, Any]] = [PLACED, PENDING]

    assert find(listed, "big", "default") == [PENDING]
    assert find(listed, "big", "ml-serving") == []
    assert find(listed, PLACED["id"].upper(), "default") == [PLACED]
    assert in_namespace(listed, "ml-serving") == [PLACED]
    assert in_namespace(listed, None) == listed


def test_only_a_workload_with_another_owner_has_a_controller() -> None:
    assert has_controller(PLACED)
    assert not has_controller(PENDING)
    assert not has_controller({**PLACED, "owner": None})


def test_a_deletion_says_where_the_replacement_went_or_that_nothing_recreates_it() -> None:
    evicted = {
        **PLACED,
        "action": "evicted",
        "replacement": {"state": "placed", "node": "sim-node-2", "gpu_uuids": ["gpu-cccc"]},
    }
    ended = {**PENDING, "action": "ended", "why": "it was pending", "replacement": None}

    assert describe(evicted) == (
        "workload ml-serving/llm-7c9d8f6b5-x2x7q deleted from sim-node-1; its controller recreated it: "
        "placed on sim-node-2 (gpu-cccc)"
    )
    assert describe(ended) == "workload default/big deleted (it was pending)"
