"""`tfctl get pools|nodes|gpus` tables: one unit per column, headers that say available/total."""

from __future__ import annotations

import re

from tfctl.commands.get import render_table

GIB = 1024**3


def a_gpu(uuid: str, available_tflops_milli: int, available_vram_bytes: int) -> dict[str, object]:
    return {
        "uuid": uuid,
        "node": "node-a",
        "index": 0,
        "model": "H100",
        "phase": "Running",
        "available_tflops_milli": available_tflops_milli,
        "capacity_tflops_milli": 989_400,
        "available_vram_bytes": available_vram_bytes,
        "capacity_vram_bytes": 80 * GIB,
    }


def test_gpus_show_tflops_in_tflops_and_vram_in_gib_as_available_over_total() -> None:
    table = render_table(
        "gpus", [a_gpu("gpu-free", 989_400, 80 * GIB), a_gpu("gpu-busy", 500, 512 * 1024**2)]
    ).splitlines()

    assert re.split(r"\s{2,}", table[0]) == [
        "UUID",
        "NODE",
        "INDEX",
        "MODEL",
        "PHASE",
        "TFLOPS AVAIL/TOTAL",
        "VRAM GiB AVAIL/TOTAL",
    ]
    assert table[1].split()[-2:] == ["989.4/989.4", "80/80"]
    assert table[2].split()[-2:] == ["0.5/989.4", "0.5/80"]  # not 500m/989400m, not 512Mi/80Gi


def test_pools_and_nodes_sum_in_the_same_units() -> None:
    totals = {
        "available_tflops_milli": 1_978_300,
        "capacity_tflops_milli": 1_978_800,
        "available_vram_bytes": 159 * GIB,
        "capacity_vram_bytes": 160 * GIB,
    }
    pools = render_table(
        "pools",
        [
            {
                "name": "default",
                "placement_mode": "CompactFirst",
                "nodes": 1,
                "ready_nodes": 1,
                "gpus": 2,
                **totals,
            }
        ],
    ).splitlines()
    nodes = render_table(
        "nodes",
        [{"name": "node-a", "pool": "default", "schedulable": True, "reason": None, "gpus": 2, **totals}],
    ).splitlines()

    for table in (pools, nodes):
        assert table[0].endswith("TFLOPS AVAIL/TOTAL  VRAM GiB AVAIL/TOTAL")
        assert table[1].split()[-2:] == ["1978.3/1978.8", "159/160"]
