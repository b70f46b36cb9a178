"""`tfctl recommendations` table: TFLOPS columns always in TFLOPS, VRAM columns always in GiB."""

from __future__ import annotations

import re
from typing import Any

from tfctl.commands.recommendations import render_table

MIB = 1024**2
GIB = 1024**3


def an_item(
    workload: str, *, current: tuple[int, int, int, int], recommended: tuple[int, int, int, int]
) -> dict[str, Any]:
    def values(quantities: tuple[int, int, int, int]) -> dict[str, int]:
        names = ("tflopsRequestMilli", "tflopsLimitMilli", "vramRequestBytes", "vramLimitBytes")
        return dict(zip(names, quantities, strict=True))

    return {
        "workload": workload,
        "qos": "high",
        "gpuCount": 1,
        "current": values(current),
        "recommended": values(recommended),
        "sampleCount": 40,
        "sufficient": True,
        "reason": "high QoS gets the target",
        "expectedSavingPerHour": "0.120000",
    }


def test_a_column_never_mixes_units() -> None:
    body = {
        "recommendations": [
            an_item(
                "ml/small",
                current=(500, 1000, 512 * MIB, GIB),
                recommended=(1000, 2000, 256 * MIB, 512 * MIB),
            ),
            an_item(
                "ml/big",
                current=(20_000, 40_000, 4 * GIB, 8 * GIB),
                recommended=(989_400, 989_400, 80 * GIB, 80 * GIB),
            ),
        ]
    }

    lines = render_table(body).splitlines()

    assert re.split(r"\s{2,}", lines[0])[3:7] == ["TFLOPS NOW", "TFLOPS REC", "VRAM GiB NOW", "VRAM GiB REC"]
    assert lines[1].split()[3:7] == ["0.5/1", "1/2", "0.5/1", "0.25/0.5"]  # not 500m/1 nor 512Mi/1Gi
    assert lines[2].split()[3:7] == ["20/40", "989.4/989.4", "4/8", "80/80"]
    assert lines[3] == "TFLOPS and VRAM are per GPU, request/limit"
    assert lines[4:] == ["ml/small: high QoS gets the target", "ml/big: high QoS gets the target"]
