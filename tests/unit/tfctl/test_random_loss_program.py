"""The slow link's random-loss filter program (`tfctl.fault_network.random_loss_program`), as tc reads it.

The kernel runs it on every packet: `A = rand` (classic BPF's ancillary load `SKF_AD_OFF + SKF_AD_RANDOM`),
then `A > threshold` decides. A packet matches (is dropped) when its 32-bit random number lands in the
top `percent` of the range, so the threshold must leave exactly that share above it.
"""

from __future__ import annotations

import pytest
from tfctl.fault_network import random_loss_program

SKF_AD_RANDOM_LOAD = (1 << 32) - 0x1000 + 56
BPF_LD_W_ABS, BPF_JMP_JGT_K, BPF_RET_K = 0x20, 0x25, 0x06


def instructions(program: str) -> list[tuple[int, ...]]:
    count, *parts = program.split(",")
    decoded = [tuple(int(field) for field in part.split()) for part in parts]
    assert len(decoded) == int(count)
    return decoded


@pytest.mark.parametrize("percent", [0.5, 5.0, 30.0, 99.0])
def test_the_program_drops_the_top_percent_of_the_kernels_random_numbers(percent: float) -> None:
    load, compare, matched, not_matched = instructions(random_loss_program(percent))
    assert load == (BPF_LD_W_ABS, 0, 0, SKF_AD_RANDOM_LOAD)
    code, jump_if_above, jump_otherwise, threshold = compare
    assert (code, jump_if_above, jump_otherwise) == (BPF_JMP_JGT_K, 0, 1)
    assert matched == (BPF_RET_K, 0, 0, 0xFFFFFFFF)  # -1: the filter's classid, the dropping class
    assert not_matched == (BPF_RET_K, 0, 0, 0)
    dropped_share = (0xFFFFFFFF - threshold) / 0xFFFFFFFF
    assert dropped_share == pytest.approx(percent / 100, abs=1e-9)


@pytest.mark.parametrize("percent", [0.0, 100.0, -1.0, 150.0])
def test_a_loss_outside_0_to_100_percent_is_refused(percent: float) -> None:
    with pytest.raises(ValueError, match="loss percent must be above 0 and below 100"):
        random_loss_program(percent)
