"""The environment a `tfctl run` worker gets: exactly its GPUs, and the limits for soft/hard isolation."""

from __future__ import annotations

import pytest
from tfagent.core.worker_env import WorkerLimits, sm_percent_limit, worker_env

GIB = 1024**3
H100_MILLI = 989_000
GPU_A, GPU_B = "gpu-1f0e2d3c-0000-4000-8000-00000000000a", "gpu-1f0e2d3c-0000-4000-8000-00000000000b"


def _limits(isolation: str = "soft", vram_gib: int = 16, tflops_milli: int = 20_000) -> WorkerLimits:
    return WorkerLimits((GPU_A, GPU_B), isolation, vram_gib * GIB, tflops_milli)


def test_visible_devices_are_the_granted_gpus_in_nvml_spelling_and_order() -> None:
    env = worker_env(_limits(), {GPU_A: H100_MILLI, GPU_B: H100_MILLI})

    expected = f"GPU-{GPU_A[4:]},GPU-{GPU_B[4:]}"
    assert env["CUDA_VISIBLE_DEVICES"] == expected
    assert env["NVIDIA_VISIBLE_DEVICES"] == expected


@pytest.mark.parametrize("isolation", ["soft", "hard"])
def test_soft_and_hard_isolation_set_the_device_plugins_limit_variables(isolation: str) -> None:
    env = worker_env(_limits(isolation), {GPU_A: H100_MILLI, GPU_B: H100_MILLI})

    assert env["TF_GPU_MEMORY_LIMIT"] == str(16 * GIB)
    assert env["TF_CUDA_MEMORY_LIMIT"] == "16384"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "16384m"
    assert env["TF_CUDA_SM_PERCENT_LIMIT"] == env["CUDA_DEVICE_SM_LIMIT"] == "3"
    assert "LD_PRELOAD" not in env


def test_shared_isolation_gets_whole_cards_and_no_limits() -> None:
    env = worker_env(_limits("shared"), {GPU_A: H100_MILLI}, limiter_library="/opt/libvgpu.so")

    assert set(env) == {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}


def test_an_installed_limiter_library_is_preloaded() -> None:
    env = worker_env(_limits(), {GPU_A: H100_MILLI}, limiter_library="/opt/libvgpu.so")

    assert env["LD_PRELOAD"] == "/opt/libvgpu.so"


def test_no_compute_limit_without_a_limit_or_a_known_capacity() -> None:
    assert "TF_CUDA_SM_PERCENT_LIMIT" not in worker_env(_limits(tflops_milli=0), {GPU_A: H100_MILLI})
    assert "TF_CUDA_SM_PERCENT_LIMIT" not in worker_env(_limits(), {})


@pytest.mark.parametrize(
    ("limit_milli", "capacities", "percent"),
    [
        pytest.param(20_000, [100_000], 20, id="a fifth of the card"),
        pytest.param(1, [100_000], 1, id="never below one percent"),
        pytest.param(250_000, [100_000], 100, id="never above the whole card"),
        pytest.param(50_000, [100_000, 200_000], 50, id="the smallest card bounds it"),
        pytest.param(0, [100_000], None, id="no limit"),
        pytest.param(10_000, [], None, id="unknown capacity"),
    ],
)
def test_compute_limit_is_a_percent_of_the_smallest_card(
    limit_milli: int, capacities: list[int], percent: int | None
) -> None:
    assert sm_percent_limit(limit_milli, capacities) == percent
