"""The figures tables show: TFLOPS always in TFLOPS, VRAM always in GiB, never a Kubernetes suffix."""

from __future__ import annotations

import pytest
from tfcommon.display import gib_text, tflops_text

MIB = 1024**2
GIB = 1024**3


@pytest.mark.parametrize(
    ("milli", "text"),
    [(989_400, "989.4"), (20_000, "20"), (500, "0.5"), (10_350, "10.35"), (1, "0.001"), (0, "0")],
)
def test_tflops_are_shown_in_tflops_exactly(milli: int, text: str) -> None:
    assert tflops_text(milli) == text


@pytest.mark.parametrize(
    ("vram_bytes", "text"),
    [
        (80 * GIB, "80"),
        (512 * MIB, "0.5"),
        (2_778_306_970, "2.59"),  # 2649.6 MiB
        (GIB + 5 * MIB, "1"),  # 1.0049 GiB
        (MIB, "<0.01"),
        (0, "0"),
    ],
)
def test_vram_is_shown_in_gib_to_two_decimals(vram_bytes: int, text: str) -> None:
    assert gib_text(vram_bytes) == text
