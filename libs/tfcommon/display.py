"""Figures for people: TFLOPS and VRAM in one unit each, so a table column never mixes `500m` with `20`
or `Mi` with `Gi`. Pure.

TFLOPS are shown exactly (milli-TFLOPS have at most three decimals), VRAM in GiB to two decimals (half
even); trailing zeros are dropped (`20`, `989.4`, `2.59`). Quantities a user types or a manifest holds
stay in Kubernetes form (`tfcommon.quantities`).
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

GIB = 1024**3
_GIB_STEP = Decimal("0.01")


def _plain(value: Decimal) -> str:
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def tflops_text(milli: int) -> str:
    """Milli-TFLOPS as TFLOPS: 989400 -> `989.4`, 20000 -> `20`, 500 -> `0.5`."""
    return _plain(Decimal(milli) / 1000)


def gib_text(vram_bytes: int) -> str:
    """Bytes as GiB to two decimals: 80Gi -> `80`, 2649.6 MiB -> `2.59`; a non-zero amount that rounds
    to 0 is `<0.01`, never `0`."""
    gib = (Decimal(vram_bytes) / GIB).quantize(_GIB_STEP, rounding=ROUND_HALF_EVEN)
    if gib == 0 and vram_bytes > 0:
        return "<0.01"
    return _plain(gib)
