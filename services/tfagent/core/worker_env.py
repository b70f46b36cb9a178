"""Environment of a `tfctl run` worker: the GPUs it may see and the limits a limiter library enforces.

Pure: the runner hands in the allocation's GPUs, limits and the cards' capacities; this module returns
the variables. They carry the device plugin's names (`tfagent.core.deviceplugin`), so a limiter reads
the same variables in local and Kubernetes mode. It starts no process and reads no environment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfagent.core.deviceplugin import MIB, nvidia_visible_devices

LIMITED_ISOLATION_MODES = ("soft", "hard")


@dataclass(frozen=True)
class WorkerLimits:
    """What one worker was granted: its GPUs (in order), isolation mode and per-GPU limits (0: none)."""

    gpu_uuids: tuple[str, ...]
    isolation: str
    vram_limit_bytes: int
    tflops_limit_milli: int


def sm_percent_limit(tflops_limit_milli: int, capacities_milli: Sequence[int]) -> int | None:
    """The compute limit as a percent of the smallest granted card (1..100), None when unlimited."""
    if tflops_limit_milli <= 0 or not capacities_milli or min(capacities_milli) <= 0:
        return None
    return min(100, max(1, math.ceil(tflops_limit_milli * 100 / min(capacities_milli))))


def worker_env(
    limits: WorkerLimits, capacity_milli: Mapping[str, int], limiter_library: str | None = None
) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` (and `NVIDIA_VISIBLE_DEVICES`) naming exactly the granted GPUs; for `soft`
    and `hard` isolation also the limit variables, plus `LD_PRELOAD` of the limiter library when the
    operator installed one. `shared` isolation gets whole cards and no limit variables."""
    visible = nvidia_visible_devices(limits.gpu_uuids)
    env = {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}
    if limits.isolation not in LIMITED_ISOLATION_MODES:
        return env
    if limits.vram_limit_bytes > 0:
        env["TF_GPU_MEMORY_LIMIT"] = str(limits.vram_limit_bytes)
        env["TF_CUDA_MEMORY_LIMIT"] = str(limits.vram_limit_bytes // MIB)
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{limits.vram_limit_bytes // MIB}m"
    capacities = [capacity_milli[uuid] for uuid in limits.gpu_uuids if uuid in capacity_milli]
    sm_percent = sm_percent_limit(limits.tflops_limit_milli, capacities)
    if sm_percent is not None:
        env["TF_CUDA_SM_PERCENT_LIMIT"] = str(sm_percent)
        env["CUDA_DEVICE_SM_LIMIT"] = str(sm_percent)
    if limiter_library is not None:
        env["LD_PRELOAD"] = limiter_library
    return env
